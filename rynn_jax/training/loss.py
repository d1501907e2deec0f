"""Conditional flow matching loss of RynnWorld-Teleop (paper Sec. 3.4), TI2V style.

    z_t = (1 − σ)·z_0 + σ·ε,   target v = ε − z_0,   L = ‖v_Θ(z_t, t, z_ref, c) − (ε − z_0)‖²

σ per sample from the shifted distribution (shift 5: mostly noisy levels, as Wan samples). Frame 0
is the clean reference-image latent at t = 0 (the TI2V condition) and is left out of the loss.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rynn_jax.diffusion.schedules import NUM_TRAIN_TIMESTEPS
from rynn_jax.models.dit import WanDiT
from rynn_jax.training.config import LossConfig

Batch = dict[str, jax.Array]


def sample_sigmas(rng: jax.Array, batch_size: int, shift: float) -> jax.Array:
    """(B,) float32 in (0, 1): u ~ U(0, 1) warped by shift·u / (1 + (shift − 1)·u)."""
    u = jax.random.uniform(rng, (batch_size,), jnp.float32)
    return shift * u / (1.0 + (shift - 1.0) * u)


def noised_inputs(batch: Batch, rng: jax.Array, cfg: LossConfig
                  ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(z_t, per-frame timesteps (B, T) in [0, 1000], target velocity, per-frame loss weight (T,))."""
    z0 = batch["video_latents"].astype(jnp.float32)
    b, t = z0.shape[:2]
    rng_sigma, rng_noise = jax.random.split(rng)
    sigma_b = sample_sigmas(rng_sigma, b, cfg.shift)
    # Drawn as (B, rest) and reshaped: same values, but XLA:CPU compiles partitionable threefry
    # over a rank-5 shape ~20× slower (7 s for a tiny batch on jax 0.10).
    eps = jax.random.normal(rng_noise, (b, z0[0].size), jnp.float32).reshape(z0.shape)
    s = sigma_b[:, None, None, None, None]
    z_t = (1.0 - s) * z0 + s * eps
    t_bf = jnp.broadcast_to(sigma_b[:, None] * NUM_TRAIN_TIMESTEPS, (b, t))
    frame_w_t = jnp.ones((t,), jnp.float32)
    if cfg.exclude_first_frame:
        ref = batch["img_latent"].astype(jnp.float32)  # (B, 1, H, W, C): VAE of frame 0 alone
        z_t = z_t.at[:, :1].set(ref)
        t_bf = t_bf.at[:, 0].set(0.0)
        frame_w_t = frame_w_t.at[0].set(0.0)
    return z_t, t_bf, eps - z0, frame_w_t


def cfm_loss(model: WanDiT, batch: Batch, rng: jax.Array, cfg: LossConfig) -> jax.Array:
    """Mean squared velocity error over the predicted frames (scalar, float32). With a control
    branch, updates its running statistics (model state) as a side effect."""
    z_t, t_bf, target, frame_w_t = noised_inputs(batch, rng, cfg)
    control = batch["control_video_latents"] if cfg.use_control else None
    gt = batch["video_latents"] if cfg.use_control else None
    v = model(z_t, t_bf, batch["text_embedding"], control, gt_latent_bthwc=gt, train=cfg.use_control)
    se_bt = jnp.square(v - target).mean(axis=(2, 3, 4))
    return (se_bt * frame_w_t).sum() / (se_bt.shape[0] * frame_w_t.sum())
