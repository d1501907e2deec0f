"""The trained causal student as serving finds it: its weights directory and how to stream it.

An exported student (`python -m rynn_jax.distill.export`) is a converted-weights directory (the DiT,
`load_dit`'s layout, with its control statistics) plus `student.json`, the serving layout it was
distilled for: cache blocks and length, denoising steps, chunk length (re-anchoring), and the
pixel resolution of the latents it was trained on. `StreamingSession` built from it
(`serving.assemble.serving_session`) streams exactly what distillation trained.

The bundled weights: `<repo>/weights/synthetic/{student,autoencoder}` (or under `$RYNN_JAX_WEIGHTS`),
the synthetic world's student and autoencoder, used by `serve.py demo`, `serve.py generate` and
`assemble.streaming_session` when no `--dit/--vae` is given; beside them, once trained
(configs/synthetic_decoder.py:tae), `tiny_decoder/`, the real-time decoder of the autoencoder's
latents (`--decoder tiny`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from rynn_jax import converted_weights
from rynn_jax.models.causal import CausalConfig
from rynn_jax.serving.block_step import StepConfig

SPEC_FILE = "student.json"
WEIGHTS_ENV = "RYNN_JAX_WEIGHTS"  # a directory holding student/ and autoencoder/ (tests, other checkouts)
BUNDLED_ROOT = Path(__file__).resolve().parents[2] / "weights" / "synthetic"
TINY_DECODER = "tiny_decoder"  # under the bundled root: the autoencoder's trained tiny decoder


@dataclasses.dataclass(frozen=True, kw_only=True)
class StudentSpec:
    causal: CausalConfig  # blocks, cache length (1 sink + window) and policy it was distilled with
    steps: StepConfig  # its denoising schedule (num_steps, shift, solver)
    chunk_frames: int | None  # latent frames per re-anchored chunk (None: a rolling cache, never)
    resolution: tuple[int, int] | None = None  # (H, W) of the video its latents came from

    def to_json(self) -> dict:
        return {"causal": dataclasses.asdict(self.causal),
                "steps": {k: getattr(self.steps, k) for k in ("num_steps", "shift", "solver")},
                "chunk_frames": self.chunk_frames,
                "resolution": list(self.resolution) if self.resolution else None}

    @classmethod
    def from_json(cls, raw: dict) -> StudentSpec:
        res = raw.get("resolution")
        return cls(causal=CausalConfig(**raw["causal"]), steps=StepConfig(**raw["steps"]),
                   chunk_frames=raw["chunk_frames"], resolution=tuple(res) if res else None)


def write_spec(directory: str | os.PathLike[str], spec: StudentSpec) -> None:
    Path(directory, SPEC_FILE).write_text(json.dumps(spec.to_json(), indent=1))


def read_spec(directory: str | os.PathLike[str]) -> StudentSpec | None:
    """The directory's serving spec, None when it has none (a plain converted DiT)."""
    path = Path(directory, SPEC_FILE)
    if not path.is_file():
        return None
    try:
        return StudentSpec.from_json(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a student spec ({type(e).__name__}: {e})") from None


@dataclasses.dataclass(frozen=True)
class Bundled:
    student: str  # exported student directory
    autoencoder: str  # converted autoencoder directory
    spec: StudentSpec


@dataclasses.dataclass(frozen=True)
class BundledTeacher:
    teacher: str  # converted DiT directory (bidirectional, with its control statistics)
    autoencoder: str


def weights_root() -> Path:
    return Path(os.environ.get(WEIGHTS_ENV) or BUNDLED_ROOT)


def _bundled_pair(root: str | os.PathLike[str] | None, network: str) -> tuple[str, str] | None:
    """`root/network` and `root/autoencoder` (root default `weights_root()`) when both are
    converted-weights directories, else None."""
    root = Path(root) if root is not None else weights_root()
    net, autoencoder = root / network, root / "autoencoder"
    if not (converted_weights.is_converted_dir(net) and converted_weights.is_converted_dir(autoencoder)):
        return None
    return str(net), str(autoencoder)


def find_bundled(root: str | os.PathLike[str] | None = None) -> Bundled | None:
    """The bundled student + autoencoder under `root` (default `weights_root()`), or None when
    either is missing."""
    pair = _bundled_pair(root, "student")
    spec = read_spec(pair[0]) if pair else None
    return Bundled(*pair, spec) if spec is not None else None


def find_bundled_teacher(root: str | os.PathLike[str] | None = None) -> BundledTeacher | None:
    """The bundled teacher + autoencoder under `root` (default `weights_root()`), or None."""
    pair = _bundled_pair(root, "teacher")
    return BundledTeacher(*pair) if pair else None


def bundled_tiny_decoder(root: str | os.PathLike[str] | None = None) -> str | None:
    """The trained tiny decoder of the bundled autoencoder's latents (`root/tiny_decoder`, a
    `tae_weights.save_tae` directory; root default `weights_root()`), or None when absent."""
    from rynn_jax.models.tae_weights import MODEL_FILE

    path = (Path(root) if root is not None else weights_root()) / TINY_DECODER
    return str(path) if (path / converted_weights.CONFIG_FILE).is_file() and (path / MODEL_FILE).is_file() else None


def absent_message(root: str | os.PathLike[str] | None = None) -> str:
    root = Path(root) if root is not None else weights_root()
    return (f"no bundled weights ({root}/student and {root}/autoencoder): using tiny random networks, "
            "the frames will be noise")
