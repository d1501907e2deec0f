"""Action-control branch of RynnWorld-Teleop (paper Eq. 3): the skeleton video's latent enters the
DiT as extra patch tokens added to the video tokens.

    add    : x = PatchEmbed_z(z_t) + α · PatchEmbed_c(e_c),  e_c = (c − μ_c) / σ_c · σ_z + μ_z
    concat : x = PatchEmbed_z(z_t) + PatchEmbed_c(c)  (the ablation; one Conv3d over [z; c] channels
             is exactly this sum, so the two layouts are the same function)

PatchEmbed_c is zero-initialised and α starts at 0.1, so a freshly added branch leaves the base
model's output unchanged. μ_c, σ_c are running per-channel statistics of control latents (EMA,
momentum 0.01), kept as model state (`ControlStats`, not a parameter) and saved in checkpoints.
μ_z, σ_z come from the ground-truth video latent during training (per sample and channel) and
default to 0 / 0.8 at inference, when there is no ground truth.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from rynn_jax.models.layers import param, patchify_embed


class ControlStats(nnx.Variable):
    """Running statistics: model state updated in training, never touched by the optimizer."""


class ControlBranch(nnx.Module):
    def __init__(self, cfg, *, rngs: nnx.Rngs):
        self.cfg = cfg
        pt, ph, pw = cfg.patch_size
        c = cfg.control_channels
        if cfg.control == "add" and c != cfg.in_channels:
            raise ValueError(f"additive control aligns the control latent channel by channel to the video "
                             f"latent: control_channels ({c}) must equal in_channels ({cfg.in_channels})")
        zeros = nnx.initializers.zeros_init()
        self.embed = param(rngs, zeros, (pt, ph, pw, c, cfg.dim), cfg.param_dtype,
                            ("patch", "patch", "patch", "in_channels", "embed"))
        self.embed_bias = param(rngs, zeros, (cfg.dim,), cfg.param_dtype, ("embed",))
        if cfg.control == "add":
            self.gate = param(rngs, nnx.initializers.constant(cfg.control_gate_init), (), cfg.param_dtype, ())
            self.mean = ControlStats(jnp.zeros((c,), jnp.float32))
            self.std = ControlStats(jnp.ones((c,), jnp.float32))

    def align(self, c_bthwc: jax.Array, gt_latent_bthwc: jax.Array | None, train: bool) -> jax.Array:
        """e_c: the control latent moved onto the video-latent distribution (float32)."""
        cfg = self.cfg
        c = c_bthwc.astype(jnp.float32)
        if train:
            m = cfg.control_stats_momentum
            batch_mean = c.mean(axis=(0, 1, 2, 3))
            batch_std = c.std(axis=(0, 1, 2, 3))
            self.mean[...] = (1 - m) * self.mean[...] + m * jax.lax.stop_gradient(batch_mean)
            self.std[...] = (1 - m) * self.std[...] + m * jax.lax.stop_gradient(batch_std)
        if gt_latent_bthwc is not None:
            z = jax.lax.stop_gradient(gt_latent_bthwc.astype(jnp.float32))
            mu_z = z.mean(axis=(1, 2, 3), keepdims=True)
            sigma_z = z.std(axis=(1, 2, 3), keepdims=True)
        else:
            mu_z, sigma_z = cfg.control_prior_mean, cfg.control_prior_std
        return (c - self.mean[...]) / (self.std[...] + 1e-6) * sigma_z + mu_z

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
        return self.gate[...].astype(jnp.float32) * embed(self.align(c_bthwc, gt_latent_bthwc, train))
