"""Flow-matching loss of RynnWorld-4D: the three modalities denoised together.

    z_t^m = (1 − σ)·z_0^m + σ·ε      one ε for RGB, depth and flow (the release's shared noise)
    L = L_rgb + L_depth + λ_flow·L_flow,   L_m = ‖v_m − (ε − z_0^m)‖² over frames 1.. (frame 0 is the
    clean condition of each modality at t = 0: the RGB, depth and white-flow latents)

σ per sample from the shifted distribution (`loss.sample_sigmas`, as the 2D model). Branch dropout
(per sample, probability `branch_dropout`): depth or flow (never RGB), chosen evenly, has frames
1.. replaced by fresh noise; its loss is kept, as the release keeps it. The release draws one coin
per batch; per sample is the same expectation with less variance. With `rgb_decay_steps` > 0 the
RGB injection of bidirectional JA is scaled by a cosine from 1 at step 0 to 0 at that step. A
model with a control branch (our teleop extension) reads the skeleton latent and, as the teacher's
loss does, updates the branch's running statistics from the clean RGB latent.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rynn_jax.diffusion.schedules import NUM_TRAIN_TIMESTEPS
from rynn_jax.models.dit4d import WanDiT4D
from rynn_jax.training.config import World4DLossConfig
from rynn_jax.training.loss import sample_sigmas

Batch = dict[str, jax.Array]
# (clip latents, frame-0 latent) per modality in a batch
KEYS = {"rgb": ("video_latents", "img_latent"), "depth": ("depth_latents", "depth_img_latent"),
        "flow": ("flow_latents", "flow_img_latent")}
TRAIN_KEYS = tuple(k for pair in KEYS.values() for k in pair) + ("text_embedding",)
CONTROL_KEY = "control_video_latents"  # the skeleton video's latent, beside the RGB record


def train_keys(model_cfg) -> tuple[str, ...]:
    """The batch keys the loss reads for a WanDiT4DConfig: the control latent too with a branch."""
    return TRAIN_KEYS + ((CONTROL_KEY,) if model_cfg.base.control != "none" else ())


def rgb_decay(step: jax.Array, decay_steps: int) -> jax.Array:
    """0.5·(1 + cos(π·min(step / decay_steps, 1))); 1 throughout when decay_steps is 0."""
    if decay_steps <= 0:
        return jnp.float32(1.0)
    progress = jnp.minimum(step.astype(jnp.float32) / decay_steps, 1.0)
    return 0.5 * (1.0 + jnp.cos(jnp.pi * progress))


def world4d_loss(model: WanDiT4D, batch: Batch, rng: jax.Array, cfg: World4DLossConfig,
                 step: jax.Array) -> jax.Array:
    z0 = {m: batch[clip].astype(jnp.float32) for m, (clip, _) in KEYS.items()}
    b, t = z0["rgb"].shape[:2]
    rng_sigma, rng_noise, rng_drop, rng_which, rng_fresh = jax.random.split(rng, 5)
    sigma = sample_sigmas(rng_sigma, b, cfg.shift)
    eps = jax.random.normal(rng_noise, (b, z0["rgb"][0].size), jnp.float32).reshape(z0["rgb"].shape)
    s = sigma[:, None, None, None, None]
    z_t = {m: ((1.0 - s) * z + s * eps).at[:, :1].set(batch[KEYS[m][1]].astype(jnp.float32)) for m, z in z0.items()}
    if cfg.branch_dropout > 0:
        hit = jax.random.bernoulli(rng_drop, cfg.branch_dropout, (b,))
        pick_depth = jax.random.bernoulli(rng_which, 0.5, (b,))
        fresh = jax.random.normal(rng_fresh, (b, eps[0].size), jnp.float32).reshape(eps.shape)
        for m, chosen in (("depth", hit & pick_depth), ("flow", hit & ~pick_depth)):
            z_t[m] = jnp.where(chosen[:, None, None, None, None], z_t[m].at[:, 1:].set(fresh[:, 1:]), z_t[m])
    t_bf = jnp.broadcast_to(sigma[:, None] * NUM_TRAIN_TIMESTEPS, (b, t)).at[:, 0].set(0.0)
    controlled = model.base.control is not None
    v = model(z_t["rgb"], z_t["depth"], z_t["flow"], t_bf, batch["text_embedding"],
              batch[CONTROL_KEY] if controlled else None, rgb_decay=rgb_decay(step, cfg.rgb_decay_steps),
              gt_latent_bthwc=batch["video_latents"] if controlled else None, train=controlled)
    per = [jnp.mean(jnp.square(vm[:, 1:] - (eps[:, 1:] - z0[m][:, 1:]))) for m, vm in zip(KEYS, v)]
    return per[0] + per[1] + cfg.flow_weight * per[2]
