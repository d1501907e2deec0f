"""Trained checkpoint → converted-weights directory (the next stage's `ckpt.init_from`, or serving).

    python -m rynn_jax.training.export_weights --config configs/stage1_lora.py --set ckpt.dir=runs/s1 \\
        --out weights/stage1 [--raw]

Takes the newest readable step of the run, uses the EMA weights (unless `--raw` or the run kept
none), folds LoRA adapters into their kernels, and writes a plain `WanDiT` (control branch included)
— or a RynnWorld-4D model (`load_dit4d`; the next stage's `ckpt.init_from`) —
in the `rynn_jax.converted_weights` layout that `load_dit` and `ckpt.init_from` read; an add-plus model's
running statistics go beside the weights in `control_stats.json` (models/control.py), which
`load_dit`, `ckpt.init_from` and distillation's teacher read back.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Sequence

import jax
import numpy as np
from flax import nnx

from rynn_jax import converted_weights, errors, sharding
from rynn_jax.atomic import atomic_dir
from rynn_jax.models import control
from rynn_jax.models.dit4d import WanDiT4DConfig
from rynn_jax.training import checkpointing, config as config_lib, input as input_lib, lora, optim, preflight
from rynn_jax.training import state as state_lib


def export_weights(cfg: config_lib.TrainConfig, out_dir: str, use_ema: bool = True,
                   dtype: str = "float32") -> int:
    """Writes `out_dir` with the weights stored as `dtype` ("bfloat16" halves the files; loaders cast
    back to the model's param_dtype); returns the exported step."""
    if not cfg.ckpt.dir:
        raise errors.UsageError("ckpt.dir: not set", fix="--set ckpt.dir=RUN/ckpt, the training run to export")
    preflight.check_checkpoint_dir(cfg.ckpt.dir, "ckpt.dir")
    errors.writable_dir(out_dir, "--out")
    mesh = sharding.make_mesh(cfg.mesh)
    tx = optim.make_optimizer(cfg.optim, cfg.total_steps)
    abstract, shardings = state_lib.state_shardings(cfg, tx, mesh)
    ckpt = checkpointing.Checkpointer(cfg.ckpt)
    state = ckpt.restore_latest(checkpointing.abstract_with_shardings(abstract, shardings),
                                input_lib.make_iterator(cfg))
    ckpt.close()
    if state is None:
        raise errors.MissingFileError(f"ckpt.dir {cfg.ckpt.dir}: no readable checkpoint")
    graphdef = state_lib.split_model(state_lib.abstract_model(cfg), cfg)[0]
    params = state.ema if use_ema and len(jax.tree.leaves(state.ema)) else state.params
    model = nnx.merge(graphdef, params, state.frozen, state.stats)
    if cfg.lora.rank > 0:
        model = lora.merge_lora(model)
    pure = jax.tree.map(lambda x: np.asarray(x, np.float32),  # LoRA's frozen base may be bf16
                        nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    if dtype != "float32":
        pure = jax.tree.map(lambda x: np.asarray(x, dtype), pure)
    write_dit_dir(out_dir, pure, cfg.model, state.stats)
    return int(state.step)


def write_dit_dir(out_dir: str, pure: dict, model_cfg, stats, extra: Callable[[str], None] | None = None) -> None:
    """The converted-weights directory `load_dit` reads, written atomically (a cut export never
    looks like a finished one): the weights (`pure`, in their storage dtype; the recorded config
    says float32, what loaders cast back to), add-plus's running statistics `stats` as a record
    beside them, and whatever `extra(tmp_dir)` adds."""
    if isinstance(model_cfg, WanDiT4DConfig):
        model_cfg = dataclasses.replace(model_cfg, base=dataclasses.replace(model_cfg.base, param_dtype="float32"))
    else:
        model_cfg = dataclasses.replace(model_cfg, param_dtype="float32")
    dit_cfg = model_cfg.base if isinstance(model_cfg, WanDiT4DConfig) else model_cfg  # holds the control branch
    with atomic_dir(out_dir) as tmp:
        converted_weights.save_params(tmp, pure, model_cfg)
        if dit_cfg.control == "add-plus":
            control.write_stats(os.path.join(tmp, control.STATS_FILE), control.stats_of(stats), dit_cfg)
        if extra is not None:
            extra(tmp)


def main(argv: Sequence[str] | None = None) -> None:
    p = errors.ArgumentParser(prog="python -m rynn_jax.training.export_weights", description=__doc__)
    p.add_argument("--config", required=True, help="the run's recipe file under configs/")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="the run's overrides, ckpt.dir at least (repeatable)")
    p.add_argument("--out", required=True, help="converted-weights directory to write")
    p.add_argument("--raw", action="store_true", help="export the raw (not EMA) weights")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="storage dtype of the exported weights")
    a = p.parse_args(argv)
    cfg = config_lib.apply_overrides(config_lib.load_config(a.config), a.set)
    step = export_weights(cfg, a.out, use_ema=not a.raw, dtype=a.dtype)
    print(f"exported step {step} of {cfg.ckpt.dir} → {a.out}")


if __name__ == "__main__":
    sys.exit(errors.run(main))
