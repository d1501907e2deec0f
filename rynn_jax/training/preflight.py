"""Checks a training or distillation config against the file system before anything is built.

Everything here is cheap (no JAX arrays, no compiling): files and directories exist and hold what
they should, the converted weights' architecture is the config's, the output directories can be
written, and the step counts make sense. Failures are `rynn_jax.errors` user errors naming the
config field, so `train.py` / `distill.py` stop in well under a second instead of after a compile.
"""

from __future__ import annotations

import glob
import os
from typing import Any

from rynn_jax import errors
from rynn_jax.training.config import World4DLossConfig

# The fields that fix parameter shapes: converted weights must agree on them with the recipe.
SHAPE_FIELDS = ("dim", "num_layers", "num_heads", "ffn_dim", "freq_dim", "in_channels", "out_channels",
                "text_dim", "patch_size")


def check_converted_weights(path: str, field: str, model: Any) -> None:
    """`path` is a `rynn_jax.convert` output whose DiT has `model`'s parameter shapes (a RynnWorld-4D
    `model`: a Wan DiT shaped like its branches, or a 4D export of the same size)."""
    from rynn_jax import converted_weights
    from rynn_jax.models.dit import WanDiTConfig
    from rynn_jax.models.dit4d import WanDiT4DConfig

    errors.existing(path, field, kind="directory")
    if not converted_weights.is_converted_dir(path):
        raise errors.InputError(f"{field} {path}: not a converted model directory (no {converted_weights.PARAMS_DIR}/ "
                                f"and {converted_weights.CONFIG_FILE})", fix="make one with python -m rynn_jax.convert")
    try:
        if isinstance(model, WanDiT4DConfig):
            model = model.base
            if converted_weights.saved_class(path) == WanDiT4DConfig.__name__:  # a previous stage's export
                have = converted_weights.load_config(path, WanDiT4DConfig).base
            else:
                have = converted_weights.load_config(path, WanDiTConfig)
        else:
            have = converted_weights.load_config(path, WanDiTConfig)
    except (ValueError, TypeError, OSError) as e:
        raise errors.InputError(f"{field} {path}: unreadable {converted_weights.CONFIG_FILE} ({e})") from None
    diff = [f"{k} {getattr(have, k)} (config {getattr(model, k)})" for k in SHAPE_FIELDS
            if getattr(have, k) != getattr(model, k)]
    if diff:
        raise errors.UsageError(f"{field} {path}: a different architecture: {', '.join(diff)}",
                                fix="pick the recipe that matches these weights")


def check_checkpoint_dir(path: str, field: str) -> None:
    """`path` is a training run's checkpoint directory with at least one finished step."""
    errors.existing(path, field, kind="directory")
    steps = [n for n in os.listdir(path) if n.isdigit() and os.path.isdir(os.path.join(path, n))]
    if not steps:
        raise errors.InputError(f"{field} {path}: no finished checkpoint step in it",
                                fix="point it at a run's ckpt directory")


def check_4d_shard(path: str, field: str, keys: tuple[str, ...]) -> None:
    """The first record of a shard holds the latents RynnWorld-4D trains on (`keys`, the 4D loss's:
    `loss4d.train_keys`)."""
    from rynn_jax.data import shards

    try:
        record = shards.first_record(path)
    except (OSError, ValueError, RuntimeError) as e:
        raise errors.InputError(f"{field} {path}: unreadable shard ({e})") from None
    missing = [k for k in keys if record is not None and k not in record]
    if record is None or missing:
        raise errors.InputError(f"{field} {path}: " + ("no records" if record is None else
                                f"records lack {', '.join(missing)}"
                                + (" (RGB-only shards)" if "depth_latents" in missing else "")),
                                fix="pre-encode with python -m rynn_jax.data.preencode --geometry")


def check(cfg: Any) -> None:
    """Every cheap check of a `TrainConfig` or `DistillConfig`; raises the first failure."""
    if cfg.total_steps < 1:
        raise errors.UsageError(f"total_steps={cfg.total_steps}: must be ≥ 1")
    if cfg.ckpt.every < 1 or cfg.ckpt.keep < 1 or cfg.log.every < 1:
        raise errors.UsageError(f"ckpt.every={cfg.ckpt.every}, ckpt.keep={cfg.ckpt.keep}, log.every={cfg.log.every}: "
                                "each must be ≥ 1")
    accum = getattr(cfg, "grad_accum", 1)
    if cfg.data.batch_size < 1 or cfg.data.batch_size % accum:
        raise errors.UsageError(f"data.batch_size={cfg.data.batch_size}: must be a positive multiple of "
                                f"grad_accum={accum}")
    if cfg.data.text_len != cfg.model.text_len:
        raise errors.UsageError(f"data.text_len={cfg.data.text_len} differs from model.text_len={cfg.model.text_len}")
    if cfg.data.kind == "latents":
        if not cfg.data.sources:
            raise errors.UsageError("data.sources is empty: data.kind='latents' needs {name: shard glob}",
                                    fix="or use data.kind=synthetic")
        for name, pattern in sorted(cfg.data.sources.items()):
            if not glob.glob(pattern):
                raise errors.MissingFileError(f"data.sources[{name!r}] {pattern}: no shard files match",
                                              fix="write them with python -m rynn_jax.data.preencode")
            if isinstance(getattr(cfg, "loss", None), World4DLossConfig):  # as input.train_keys decides
                from rynn_jax.training.loss4d import train_keys
                check_4d_shard(sorted(glob.glob(pattern))[0], f"data.sources[{name!r}]", train_keys(cfg.model))
        unknown = sorted(set(cfg.data.weights) - set(cfg.data.sources))
        if unknown:
            raise errors.UsageError(f"data.weights names sources not in data.sources: {unknown}")
    if cfg.ckpt.init_from:  # RynnWorld-4D starts from a Wan DiT (its branches' architecture) or a 4D export
        check_converted_weights(cfg.ckpt.init_from, "ckpt.init_from", cfg.model)
    if getattr(cfg, "phase", "") == "dmd" and cfg.student_from:
        from rynn_jax import converted_weights
        if converted_weights.is_converted_dir(cfg.student_from):  # exported student weights
            check_converted_weights(cfg.student_from, "student_from", cfg.model)
        else:  # a phase-A run
            check_checkpoint_dir(cfg.student_from, "student_from")
    if cfg.log.sample_every and cfg.log.sample_vae not in ("", "tiny"):
        errors.existing(cfg.log.sample_vae, "log.sample_vae")
    for field, path in (("ckpt.dir", cfg.ckpt.dir), ("log.dir", cfg.log.dir)):
        if path:
            errors.writable_dir(path, field)
