"""Distribution matching distillation (DMD / DMD2 / Self-Forcing): the generator loss against a
frozen real score (the teacher) and a learned fake score (the critic), and the critic's loss.

Flow-matching convention (schedules.py): x_σ = (1 − σ)·x0 + σ·ε, v = ε − x0, x0-prediction
p(x_σ) = x_σ − σ·v(x_σ). For a generator sample x0, noised to x_σ:

    grad = (p_fake − p_real) / mean|x0 − p_real|        (per sample; everything stop-gradiented)
    loss = ½·mean((x0 − sg(x0 − grad))²)                 so ∂loss/∂x0 = grad / (#elements)

p_fake − p_real ∝ score_real − score_fake (the x0-prediction is Tweedie's formula), so descending
the loss moves x0 along the real score and against the fake one: the reverse-KL gradient. The
normaliser makes the step size independent of how far the teacher is from the sample. Mean
reduction as released (Adam is invariant to the scale). The generic pieces take any array whose
first axis is the sample; the video pieces leave out frame 0 (the clean reference latent).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rynn_jax.diffusion.schedules import NUM_TRAIN_TIMESTEPS
from rynn_jax.models.dit import WanDiT

Batch = dict[str, jax.Array]


# --------------------------------------------------------------------------------------------------
# Generic DMD (any sample shape; used by the video loss and the closed-form toy tests)
# --------------------------------------------------------------------------------------------------


def sample_sigmas(rng: jax.Array, batch: int, shift: float, lo: float = 0.02, hi: float = 0.98) -> jax.Array:
    """(B,) float32: u ~ U(lo, hi) warped by shift·u / (1 + (shift − 1)·u) (released: t ∈ [20, 980])."""
    u = jax.random.uniform(rng, (batch,), jnp.float32, lo, hi)
    return shift * u / (1.0 + (shift - 1.0) * u)


def _per_sample_mean(x: jax.Array, weight: jax.Array | None) -> jax.Array:
    """Mean over all but the first axis, keepdims; `weight` broadcasts against x (0 = left out)."""
    axes = tuple(range(1, x.ndim))
    if weight is None:
        return x.mean(axis=axes, keepdims=True)
    w = jnp.broadcast_to(weight, x.shape).astype(x.dtype)
    return (x * w).sum(axis=axes, keepdims=True) / w.sum(axis=axes, keepdims=True)


def dmd_gradient(x0: jax.Array, p_real: jax.Array, p_fake: jax.Array,
                 weight: jax.Array | None = None) -> jax.Array:
    """(p_fake − p_real) / mean|x0 − p_real| per sample, stop-gradiented, zero where weight is 0."""
    x0, p_real, p_fake = (jax.lax.stop_gradient(a.astype(jnp.float32)) for a in (x0, p_real, p_fake))
    norm = _per_sample_mean(jnp.abs(x0 - p_real), weight)
    grad = (p_fake - p_real) / jnp.maximum(norm, 1e-8)
    if weight is not None:
        grad = grad * jnp.broadcast_to(weight, grad.shape)
    return jnp.nan_to_num(grad)


def dmd_loss(x0: jax.Array, grad: jax.Array, weight: jax.Array | None = None) -> jax.Array:
    """½·mean((x0 − sg(x0 − grad))²) over the weighted elements: ∂/∂x0 = grad / count."""
    x0 = x0.astype(jnp.float32)
    se = jnp.square(x0 - jax.lax.stop_gradient(x0 - grad))
    if weight is None:
        return 0.5 * se.mean()
    w = jnp.broadcast_to(weight, se.shape).astype(se.dtype)
    return 0.5 * (se * w).sum() / w.sum()


# --------------------------------------------------------------------------------------------------
# Video: real score = teacher, fake score = critic, both bidirectional over the whole chunk
# --------------------------------------------------------------------------------------------------


def frame_weight(num_frames: int) -> jax.Array:
    """(1, T, 1, 1, 1): frame 0 (the reference latent, pinned) takes no part in any loss."""
    return jnp.ones((num_frames,), jnp.float32).at[0].set(0.0)[None, :, None, None, None]


def noise_chunk(x0: jax.Array, ref_b1hwc: jax.Array, sigma_b: jax.Array, rng: jax.Array
                ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(x_σ, per-frame timesteps (B, T), ε); frame 0 is the clean reference at t = 0 (TI2V)."""
    b, t = x0.shape[:2]
    eps = jax.random.normal(rng, (b, x0[0].size), jnp.float32).reshape(x0.shape)  # rank-2 draw: fast on CPU
    s = sigma_b[:, None, None, None, None]
    x_t = ((1.0 - s) * x0 + s * eps).at[:, :1].set(ref_b1hwc.astype(jnp.float32))
    t_bf = jnp.broadcast_to(sigma_b[:, None] * NUM_TRAIN_TIMESTEPS, (b, t)).at[:, 0].set(0.0)
    return x_t, t_bf, eps


def x0_prediction(model: WanDiT, x_t: jax.Array, t_bf: jax.Array, ctx_bsk: jax.Array,
                  control: jax.Array | None) -> jax.Array:
    """p(x_σ) = x_σ − σ·v(x_σ), float32 (control statistics in inference mode: no ground truth)."""
    v = model(x_t, t_bf, ctx_bsk, control)
    sigma = (t_bf / NUM_TRAIN_TIMESTEPS)[:, :, None, None, None]
    return x_t - sigma * v


def real_score(teacher: WanDiT, x_t: jax.Array, t_bf: jax.Array, batch: Batch, control: jax.Array | None,
               guidance_scale: float) -> jax.Array:
    """Teacher x0-prediction, p_cond + g·(p_cond − p_uncond) (released g = 0: one call, no CFG)."""
    ctx = batch["text_embedding"]
    if guidance_scale == 0.0:
        return x0_prediction(teacher, x_t, t_bf, ctx, control)
    uncond = batch.get("uncond_text_embedding", jnp.zeros_like(ctx))
    both = lambda a: jnp.concatenate([a, a], axis=0)
    p = x0_prediction(teacher, both(x_t), both(t_bf), jnp.concatenate([ctx, jnp.broadcast_to(uncond, ctx.shape)]),
                      None if control is None else both(control))
    p_cond, p_uncond = jnp.split(p, 2, axis=0)
    return p_cond + guidance_scale * (p_cond - p_uncond)


def generator_loss(x0: jax.Array, teacher: WanDiT, critic: WanDiT, batch: Batch, rng: jax.Array, *,
                   control: jax.Array | None, shift: float, min_sigma: float, max_sigma: float,
                   guidance_scale: float) -> tuple[jax.Array, dict[str, jax.Array]]:
    """DMD loss of generator samples x0 (B, T, H, W, C) (differentiable), with scalar diagnostics.
    The teacher and critic see a stop-gradiented x_σ; their parameters must come in stop-gradiented."""
    b = x0.shape[0]
    rng_sigma, rng_noise = jax.random.split(rng)
    sigma_b = sample_sigmas(rng_sigma, b, shift, min_sigma, max_sigma)
    x_t, t_bf, _ = noise_chunk(jax.lax.stop_gradient(x0), batch["img_latent"], sigma_b, rng_noise)
    p_real = jax.lax.stop_gradient(real_score(teacher, x_t, t_bf, batch, control, guidance_scale))
    p_fake = jax.lax.stop_gradient(x0_prediction(critic, x_t, t_bf, batch["text_embedding"], control))
    w = frame_weight(x0.shape[1])
    grad = dmd_gradient(x0, p_real, p_fake, w)
    loss = dmd_loss(x0, grad, w)
    aux = {"dmd_grad_norm": jnp.sqrt(jnp.square(grad).mean()),
           "real_fake_gap": _per_sample_mean(jnp.abs(p_fake - p_real), w).mean()}
    return loss, aux


def critic_loss(critic: WanDiT, x0: jax.Array, batch: Batch, rng: jax.Array, *, control: jax.Array | None,
                shift: float, min_sigma: float, max_sigma: float) -> jax.Array:
    """Flow matching of the critic on (stop-gradiented) generator samples: the fake score."""
    x0 = jax.lax.stop_gradient(x0.astype(jnp.float32))
    rng_sigma, rng_noise = jax.random.split(rng)
    sigma_b = sample_sigmas(rng_sigma, x0.shape[0], shift, min_sigma, max_sigma)
    x_t, t_bf, eps = noise_chunk(x0, batch["img_latent"], sigma_b, rng_noise)
    v = critic(x_t, t_bf, batch["text_embedding"], control)
    w = frame_weight(x0.shape[1])
    se = jnp.square(v - (eps - x0)) * w
    return se.sum() / (jnp.broadcast_to(w, se.shape).sum())


def regression_loss(x0: jax.Array, z0: jax.Array) -> jax.Array:
    """Mean squared error of generator samples x0 against the clip's ground-truth latents z0
    (B, T, H, W, C), frames 1.. (frame 0 is the pinned reference): `DMDConfig.objective="regression"`."""
    w = frame_weight(x0.shape[1])
    se = jnp.square(x0.astype(jnp.float32) - jax.lax.stop_gradient(z0.astype(jnp.float32))) * w
    return se.sum() / jnp.broadcast_to(w, se.shape).sum()
