"""Distillation checkpoint → the student's serving directory (what `serve.py` loads by default).

    python -m rynn_jax.distill.export --config configs/synthetic_distill.py:dmd --out weights/synthetic/student \\
        [--dtype bfloat16] [--resolution 128x224] [--raw]

Takes the newest readable step of the run at `ckpt.dir` (phase A or B), the EMA student (unless
`--raw` or the run kept none), and writes a converted-weights directory (`load_dit`'s layout, the
control statistics beside it, as `training.export_weights` writes the teacher) plus the serving
spec `student.json` (`serving.student.StudentSpec`): the recipe's cache blocks and length, its
step schedule, and a chunk length of the full cache (re-anchored every `1 + window_frames` latent
frames, the clips it was distilled on).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx

from rynn_jax import errors, sharding
from rynn_jax.distill import config as config_lib
from rynn_jax.distill import state as state_lib
from rynn_jax.serving.student import StudentSpec, write_spec
from rynn_jax.training import checkpointing, preflight
from rynn_jax.training.config import apply_overrides
from rynn_jax.training.export_weights import write_dit_dir


def spec_of(cfg: config_lib.DistillConfig, resolution: tuple[int, int] | None = None) -> StudentSpec:
    """How the recipe's student is streamed: its causal layout and steps, one chunk per full cache."""
    chunk = cfg.causal.cache_frames if cfg.causal.policy == "full" else None
    return StudentSpec(causal=cfg.causal, steps=cfg.student_steps, chunk_frames=chunk, resolution=resolution)


def export_student(cfg: config_lib.DistillConfig, out_dir: str, *, use_ema: bool = True, dtype: str = "float32",
                   resolution: tuple[int, int] | None = None) -> int:
    """Writes `out_dir` (weights stored as `dtype`; loaders cast back to float32); returns the step."""
    if not cfg.ckpt.dir:
        raise errors.UsageError("ckpt.dir: not set", fix="--set ckpt.dir=RUN/ckpt, the distillation run to export")
    preflight.check_checkpoint_dir(cfg.ckpt.dir, "ckpt.dir")
    errors.writable_dir(out_dir, "--out")
    mesh = sharding.make_mesh(cfg.mesh)
    tx_s, tx_c = state_lib.make_optimizers(cfg)
    (_, abstract), (_, shardings) = state_lib.state_shardings(cfg, tx_s, tx_c, mesh)
    ckpt = checkpointing.Checkpointer(cfg.ckpt)
    state = ckpt.restore_latest(checkpointing.abstract_with_shardings(abstract, shardings), None)
    ckpt.close()
    if state is None:
        raise errors.MissingFileError(f"ckpt.dir {cfg.ckpt.dir}: no readable checkpoint")
    params = state.ema if use_ema and len(state.ema) else state.student
    pure = jax.tree.map(lambda x: np.asarray(x, dtype), nnx.to_pure_dict(params))
    # the (frozen) statistics it was distilled with beside the weights, and its serving spec
    write_dit_dir(out_dir, pure, cfg.model, state.stats, extra=lambda tmp: write_spec(tmp, spec_of(cfg, resolution)))
    return int(state.step)


def main(argv: Sequence[str] | None = None) -> None:
    p = errors.ArgumentParser(prog="python -m rynn_jax.distill.export", description=__doc__)
    p.add_argument("--config", required=True, help="the run's recipe (configs/…py[:phase])")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="the run's overrides (repeatable)")
    p.add_argument("--out", required=True, help="student directory to write")
    p.add_argument("--raw", action="store_true", help="export the raw (not EMA) student")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="storage dtype")
    p.add_argument("--resolution", type=errors.height_width, default=None,
                   help="HxW of the video behind the training latents (serving's default size)")
    a = p.parse_args(argv)
    cfg = apply_overrides(config_lib.load_config(a.config), a.set)
    step = export_student(cfg, a.out, use_ema=not a.raw, dtype=a.dtype, resolution=a.resolution)
    print(f"exported step {step} of {cfg.ckpt.dir} → {a.out}")


if __name__ == "__main__":
    sys.exit(errors.run(main))
