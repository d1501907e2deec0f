"""Input data: EgoDex / VITRA / robot-teleop readers, latent pre-encoding, grain pipelines.

  clips.py      ClipConfig, the 16 fps timeline, the sample schema
  video.py      PyAV decode / resize + crop / intrinsics update / write
  skeleton.py   ARKit → MediaPipe-21 names, world → camera, projection, 2D/depth skeleton
  source.py     ClipSource: episode scan → clip index, per-clip loading under the bad-data policy
  egodex.py, vitra.py, robot.py   the three on-disk formats
  errors.py     DataError, skip counter, strict mode
  shards.py     ArrayRecord latent shards (atomic writes, npz records)
  preencode.py  offline VAE pre-encoding CLI (python -m rynn_jax.data.preencode)
  pipeline.py   grain: shuffle, per-process sharding, mixture, batching, prefetch, device_put, state
  fixtures.py   tiny synthetic episodes in each exact format (tests, benchmarks)
  geometry_video.py   depth / flow ↔ the RGB videos RynnWorld-4D encodes (metres, pixels)
  world4d_release.py  the released RynnWorld-4D sample layout: manifest, latents, RGB/depth/flow MP4s
  formats/      robot-layout episodes ↔ LeRobot v3 and RLDS (export CLI, LeRobotSource, RldsSource)
"""

import importlib

# Names re-exported here, imported on first use (PEP 562): importing one submodule (e.g. the action
# statistics of robot.py for the policy) does not pull in grain and the readers' decoders.
_EXPORTS = {
    "ClipConfig": "clips", "ClipRef": "clips", "EgoDexSource": "egodex", "SKIPPED": "errors", "DataError": "errors",
    "LoaderConfig": "pipeline", "batch_sharding": "pipeline", "device_iterator": "pipeline",
    "latent_dataset": "pipeline", "mixture": "pipeline", "pixel_dataset": "pipeline", "restore_state": "pipeline",
    "save_state": "pipeline", "to_device": "pipeline", "RobotSource": "robot", "VitraSource": "vitra",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
