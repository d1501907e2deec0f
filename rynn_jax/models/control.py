"""Action-control branch of RynnWorld-Teleop (paper Eq. 3): the skeleton video's latent enters the
DiT as extra patch tokens added to the video tokens. The modes carry the released code's names:

    add      : x = PatchEmbed_z(z_t) + α · PatchEmbed_c(c)                      (no alignment)
    add-plus : x = PatchEmbed_z(z_t) + α · PatchEmbed_c(e_c),  e_c = (c − μ_c) / σ_c · σ_z + μ_z
    concat   : x = PatchEmbed_z(z_t) + PatchEmbed_c(c)  (the ablation; one Conv3d over [z; c] channels
               is exactly this sum, so the two layouts are the same function)

PatchEmbed_c is zero-initialised and α starts at 0.1, so a freshly added branch leaves the base
model's output unchanged. `WanDiT(..., null_control=True)` switches the branch off at run time (the
null condition): the output is then the base model's, bit for bit.

Statistics (add-plus), as the released training code computes them: per channel, pooled over the
whole batch (B, T, H, W); σ is the unbiased standard deviation plus 1e-8 (`batch_stats`).
  - μ_c, σ_c: running statistics of the control latent. The first training batch's statistics are
    the start, then `running ← running + m·(batch − running)` with m = `control_stats_momentum`
    (0.01). Training aligns with the running values after this update; eval never updates them.
  - μ_z, σ_z in training: the batch statistics of the clean ground-truth video latent.
  - μ_z, σ_z without ground truth (serving, streaming, distillation's teacher): the release uses
    cached statistics of clean video latents. We keep them the same way as μ_c, σ_c — running
    statistics of the clean video latents, updated by the same rule in every training step — and
    use those. With `control_video_stats="prior"` the fixed prior (`control_prior_mean`,
    `control_prior_std`, default 0 / 0.8) is used instead. When no video statistics were ever
    recorded, μ_z, σ_z fall back to the control's own μ_c, σ_c (as the release does), so e_c = c.
    A model that never trained with add-plus has recorded nothing: μ_c, σ_c are then the fresh
    record's 0 / 1 and e_c = c exactly (plain "add"), whatever the batch or block split.

The running statistics are model state (`ControlStats`, never trained by the optimizer), kept in the
training state; a model *file* holds the weights alone, as the release's do, and the statistics travel
in a separate record (`STATS_FILE`, written by `write_stats`, read by `read_stats`; float32 values
written as JSON floats, so they read back exactly):

    {"control": {"mean": [C floats], "std": [C floats], "count": int, "momentum": float},
     "video":   {"mean": [C floats], "std": [C floats], "count": int, "momentum": float}}

`count` is the number of batches folded in (0 = never recorded); "video" may be absent.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rynn_jax.models.layers import param, patchify_embed

MODES = ("none", "add", "add-plus", "concat")
STATS_FILE = "control_stats.json"  # the statistics record beside a converted model's weights
_RECORDS = {"control": "control_stats", "video": "video_stats"}  # record name → module attribute


class ControlStats(nnx.Variable):
    """Running statistics: model state updated in training, never touched by the optimizer."""


def batch_stats(x_bthwc: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-channel (mean, unbiased std + 1e-8) pooled over every axis but the last, float32."""
    x = x_bthwc.astype(jnp.float32)
    axes = tuple(range(x.ndim - 1))
    return x.mean(axis=axes), x.std(axis=axes, ddof=1) + 1e-8


def align(c_bthwc: jax.Array, mean_c: jax.Array, std_c: jax.Array, mean_z: jax.Array | float,
          std_z: jax.Array | float) -> jax.Array:
    """e_c = (c − μ_c) / σ_c · σ_z + μ_z (float32), the one alignment formula of add-plus."""
    return (c_bthwc.astype(jnp.float32) - mean_c) / std_c * std_z + mean_z


class RunningStats(nnx.Module):
    """Per-channel running mean/std and the number of batches folded in."""

    def __init__(self, channels: int):
        self.mean = ControlStats(jnp.zeros((channels,), jnp.float32))
        self.std = ControlStats(jnp.ones((channels,), jnp.float32))
        self.count = ControlStats(jnp.zeros((), jnp.int32))

    @property
    def recorded(self) -> jax.Array:
        return self.count[...] > 0

    def update(self, mean: jax.Array, std: jax.Array, momentum: float) -> None:
        """The first batch's statistics start the record; later ones move it by `momentum`."""
        mean, std = jax.lax.stop_gradient(mean), jax.lax.stop_gradient(std)
        move = lambda run, new: jnp.where(self.recorded, run + momentum * (new - run), new)  # noqa: E731
        self.mean[...] = move(self.mean[...], mean)
        self.std[...] = move(self.std[...], std)
        self.count[...] = self.count[...] + 1

    def value_or(self, mean: jax.Array, std: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The recorded statistics, or (mean, std) when none were ever recorded."""
        return (jnp.where(self.recorded, self.mean[...], mean), jnp.where(self.recorded, self.std[...], std))


class ControlBranch(nnx.Module):
    def __init__(self, cfg, *, rngs: nnx.Rngs):
        self.cfg = cfg
        pt, ph, pw = cfg.patch_size
        c = cfg.control_channels
        if cfg.control == "add-plus" and c != cfg.in_channels:
            raise ValueError(f"control='add-plus' aligns the control latent channel by channel to the video "
                             f"latent: control_channels ({c}) must equal in_channels ({cfg.in_channels})")
        zeros = nnx.initializers.zeros_init()
        self.embed = param(rngs, zeros, (pt, ph, pw, c, cfg.dim), cfg.param_dtype,
                            ("patch", "patch", "patch", "in_channels", "embed"))
        self.embed_bias = param(rngs, zeros, (cfg.dim,), cfg.param_dtype, ("embed",))
        if cfg.control in ("add", "add-plus"):
            self.gate = param(rngs, nnx.initializers.constant(cfg.control_gate_init), (), cfg.param_dtype, ())
        if cfg.control == "add-plus":
            self.control_stats = RunningStats(c)
            self.video_stats = RunningStats(c)

    def align(self, c_bthwc: jax.Array, gt_latent_bthwc: jax.Array | None, train: bool) -> jax.Array:
        """e_c of add-plus (float32). `train` folds this batch into the running statistics (then
        `gt_latent_bthwc`, the clean video latent, is required); eval only reads them."""
        cfg = self.cfg
        if train:
            if gt_latent_bthwc is None:
                raise ValueError("control='add-plus' in training needs the clean video latent (gt_latent_bthwc)")
            mean_z, std_z = batch_stats(jax.lax.stop_gradient(gt_latent_bthwc))
            self.control_stats.update(*batch_stats(c_bthwc), cfg.control_stats_momentum)
            self.video_stats.update(mean_z, std_z, cfg.control_stats_momentum)
            return align(c_bthwc, self.control_stats.mean[...], self.control_stats.std[...], mean_z, std_z)
        mean_c, std_c = self.control_stats.mean[...], self.control_stats.std[...]  # 0 / 1 if never recorded
        if gt_latent_bthwc is not None:
            mean_z, std_z = batch_stats(jax.lax.stop_gradient(gt_latent_bthwc))
        elif cfg.control_video_stats == "prior":
            mean_z, std_z = cfg.control_prior_mean, cfg.control_prior_std
        else:
            mean_z, std_z = self.video_stats.value_or(mean_c, std_c)
        return align(c_bthwc, mean_c, std_c, mean_z, std_z)

    def __call__(self, c_bthwc: jax.Array, gt_latent_bthwc: jax.Array | None = None,
                 train: bool = False) -> jax.Array:
        """Control tokens (B, L, D) to add to the video tokens."""
        cfg = self.cfg
        if c_bthwc.shape[-1] != cfg.control_channels:
            raise ValueError(f"control latent has {c_bthwc.shape[-1]} channels, expected {cfg.control_channels}")
        embed = lambda x: patchify_embed(x, self.embed[...], self.embed_bias[...], cfg.patch_size,  # noqa: E731
                                         jnp.dtype(cfg.dtype)).astype(jnp.float32)
        if cfg.control == "concat":
            return embed(c_bthwc)
        e_c = self.align(c_bthwc, gt_latent_bthwc, train) if cfg.control == "add-plus" else c_bthwc
        return self.gate[...].astype(jnp.float32) * embed(e_c)


# --------------------------------------------------------------------------------------------------
# The statistics record (a JSON file beside the weights)
# --------------------------------------------------------------------------------------------------


def default_stats(cfg) -> dict[str, Any]:
    """The pure dict of a fresh branch's statistics (nothing recorded): {} unless add-plus."""
    if cfg.control != "add-plus":
        return {}
    return {attr: nnx.to_pure_dict(nnx.state(RunningStats(cfg.control_channels))) for attr in _RECORDS.values()}


def _branch_of(pure: dict) -> dict | None:
    """The control branch's node in a pure dict: {"control": …} of a WanDiT, or of the base of a
    RynnWorld-4D model ({"base": {"control": …}}); None without one."""
    return pure.get("control", pure.get("base", {}).get("control"))


def stats_of(model_or_state: Any) -> dict[str, Any]:
    """The statistics (`default_stats` layout) of a WanDiT (or a 4D model with a control branch), or
    of a state holding {"control": …} (or {"base": {"control": …}})."""
    state = model_or_state if isinstance(model_or_state, nnx.State) else nnx.state(model_or_state, ControlStats)
    pure = _branch_of(nnx.to_pure_dict(state))
    return {attr: pure[attr] for attr in _RECORDS.values()}


def write_stats(path: str | os.PathLike[str], values: dict[str, Any], cfg) -> None:
    """Write statistics (`default_stats` layout) as a STATS_FILE record."""
    record = {name: {"mean": [float(v) for v in jax.device_get(values[attr]["mean"])],
                     "std": [float(v) for v in jax.device_get(values[attr]["std"])],
                     "count": int(values[attr]["count"]), "momentum": float(cfg.control_stats_momentum)}
              for name, attr in _RECORDS.items()}
    with open(path, "w") as f:
        json.dump(record, f, indent=1)


def read_stats(path: str | os.PathLike[str], cfg) -> dict[str, Any]:
    """The branch's statistics (`default_stats` layout) from a STATS_FILE record; a missing "video"
    record means none recorded. Raises ValueError naming the file on anything malformed."""
    if cfg.control != "add-plus":
        raise ValueError(f"{path}: control statistics are only used by control='add-plus', not {cfg.control!r}")
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read the control statistics file {path}: {e}") from e
    if not isinstance(record, dict) or "control" not in record or set(record) - set(_RECORDS):
        raise ValueError(f"{path}: a control statistics record has the keys 'control' and optionally "
                         f"'video', got {sorted(record) if isinstance(record, dict) else type(record).__name__}")
    out = default_stats(cfg)
    c = cfg.control_channels
    for name, rec in record.items():
        try:
            mean, std = jnp.asarray(rec["mean"], jnp.float32), jnp.asarray(rec["std"], jnp.float32)
            count = int(rec["count"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: record {name!r} needs mean, std (lists) and count: {e}") from e
        if mean.shape != (c,) or std.shape != (c,):
            raise ValueError(f"{path}: record {name!r} has {mean.shape[-1:]} / {std.shape[-1:]} channels, "
                             f"the model's control latent has {c}")
        if not bool(jnp.all(jnp.isfinite(mean)) & jnp.all(std > 0)) or count < 0:
            raise ValueError(f"{path}: record {name!r} needs finite means, positive stds and count ≥ 0")
        out[_RECORDS[name]] = {"mean": mean, "std": std, "count": jnp.asarray(count, jnp.int32)}
    return out


def stats_file_of(model_dir: str | os.PathLike[str]) -> str | None:
    """The statistics record inside a converted model directory, if it has one."""
    path = os.path.join(model_dir, STATS_FILE)
    return path if os.path.isfile(path) else None


def replace_stats(stats: nnx.State, values: dict[str, Any]) -> nnx.State:
    """`stats` (a state holding {"control": {...statistics}}, or a 4D model's {"base": {"control": …}};
    e.g. a train state's) with `values` (`read_stats` layout) put in, each leaf keeping its dtype and
    device placement."""
    old = nnx.to_pure_dict(stats)
    new = jax.tree.map(lambda v, o: jax.device_put(jnp.asarray(v, o.dtype), getattr(o, "sharding", None)),
                       values, {attr: _branch_of(old)[attr] for attr in values})
    nnx.replace_by_pure_dict(stats, {"control": new} if "control" in old else {"base": {"control": new}})
    return stats


def load_stats_into(stats: nnx.State, model_dir: str | os.PathLike[str], saved_cfg) -> nnx.State:
    """`stats` (a train state's) with the running statistics of the converted add-plus model at
    `model_dir` (config `saved_cfg`), from its STATS_FILE; unchanged when it has none or is not
    add-plus (training then starts them from its first batch)."""
    path = stats_file_of(model_dir) if saved_cfg.control == "add-plus" else None
    if path is None or _branch_of(nnx.to_pure_dict(stats)) is None:
        return stats
    return replace_stats(stats, read_stats(path, saved_cfg))
