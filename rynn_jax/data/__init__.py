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

from rynn_jax.data.clips import ClipConfig, ClipRef
from rynn_jax.data.egodex import EgoDexSource
from rynn_jax.data.errors import SKIPPED, DataError
from rynn_jax.data.pipeline import (
                                    LoaderConfig,
                                    batch_sharding,
                                    device_iterator,
                                    latent_dataset,
                                    mixture,
                                    pixel_dataset,
                                    restore_state,
                                    save_state,
                                    to_device,
)
from rynn_jax.data.robot import RobotSource
from rynn_jax.data.vitra import VitraSource

__all__ = [
    "ClipConfig", "ClipRef", "DataError", "EgoDexSource", "LoaderConfig", "RobotSource", "SKIPPED",
    "VitraSource", "batch_sharding", "device_iterator", "latent_dataset", "mixture", "pixel_dataset",
    "restore_state", "save_state", "to_device",
]
