"""Phase A — causal warm-up: flow matching of the block-causal student with block-wise teacher
forcing (paper §3.5 (a); Table 4: without it PSNR 14.26 instead of 22.25).

The whole chunk is seen twice in one masked forward (`causal.block_causal_forward`): the clean
ground-truth latents as context (t = 0, what the KV cache holds at inference once earlier blocks
are finished) and a noisy copy whose block i attends to the clean blocks < i and to itself. Every
latent frame gets its own σ (shift 5), the target is the velocity ε − x0, frame 0 is the clean
reference latent (t = 0) and takes no part in the loss.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rynn_jax.diffusion.schedules import NUM_TRAIN_TIMESTEPS
from rynn_jax.models import causal
from rynn_jax.models.dit import WanDiT

Batch = dict[str, jax.Array]


def frame_sigmas(rng: jax.Array, batch: int, frames: int, shift: float) -> jax.Array:
    """(B, T) float32: an independent shifted σ per latent frame."""
    u = jax.random.uniform(rng, (batch, frames), jnp.float32)
    return shift * u / (1.0 + (shift - 1.0) * u)


def teacher_forcing_inputs(batch: Batch, rng: jax.Array, shift: float
                           ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(clean context, noisy chunk, per-frame timesteps (B, T), target velocity)."""
    z0 = batch["video_latents"].astype(jnp.float32)
    ref = batch["img_latent"].astype(jnp.float32)
    b, t = z0.shape[:2]
    rng_sigma, rng_noise = jax.random.split(rng)
    sigma_bt = frame_sigmas(rng_sigma, b, t, shift).at[:, 0].set(0.0)
    eps = jax.random.normal(rng_noise, (b, z0[0].size), jnp.float32).reshape(z0.shape)  # rank-2: fast on CPU
    s = sigma_bt[:, :, None, None, None]
    clean = z0.at[:, :1].set(ref)
    noisy = ((1.0 - s) * z0 + s * eps).at[:, :1].set(ref)
    return clean, noisy, sigma_bt * NUM_TRAIN_TIMESTEPS, eps - z0


def warmup_loss(model: WanDiT, batch: Batch, rng: jax.Array, *, frames_per_block: int, shift: float,
                use_control: bool) -> jax.Array:
    """Mean squared velocity error over frames 1.. of the teacher-forced block-causal forward."""
    clean, noisy, t_bf, target = teacher_forcing_inputs(batch, rng, shift)
    control = batch["control_video_latents"] if use_control else None
    v = causal.block_causal_forward(model, clean, jnp.zeros_like(t_bf), batch["text_embedding"], control,
                                    frames_per_block=frames_per_block, noisy_bthwc=noisy, noisy_t_bf=t_bf)
    return jnp.square(v - target)[:, 1:].mean()
