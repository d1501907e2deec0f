"""Periodic sample videos during training: skeleton | generated | ground truth, side by side.

Training reads latents, so all three panels come from the VAE decoder: the control latent (the
rendered skeleton), a clip sampled by the current weights (EMA when kept) from the batch's image
latent and control latent, and the ground-truth video latent. One fixed batch is used throughout,
so successive files show the same clip improving. `make_video_hook` is the part distill.py
shares (its student samples through the causal rollout instead of the bidirectional sampler).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rynn_jax.diffusion import samplers
from rynn_jax.models import vae as vae_lib
from rynn_jax.models.vae import WanVAE
from rynn_jax.training.config import TrainConfig
from rynn_jax.training.state import TrainState


def _to_uint8(video_bthwc: jax.Array) -> np.ndarray:
    return np.asarray(jnp.round((jnp.clip(video_bthwc, -1, 1) + 1) * 127.5), np.uint8)


def load_sample_vae(spec: str, z_dim: int) -> WanVAE:
    """"tiny" → a random tiny VAE with `z_dim` latent channels (CI and smoke runs); otherwise a
    converted or official VAE path."""
    if spec == "tiny":
        cfg = vae_lib.WanVAEConfig.tiny(z_dim=z_dim, latents_mean=(0.0,) * z_dim, latents_std=(1.0,) * z_dim)
        return vae_lib.init_vae(cfg, 0)
    from rynn_jax.models.vae_weights import load_vae

    return load_vae(spec)


def first_clip(batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """The batch's first clip (batch axis kept): what every sample video shows."""
    return {k: jnp.asarray(np.asarray(v)[:1]) for k, v in batch.items()}


def make_video_hook(vae: WanVAE, clip: dict[str, jax.Array], out_dir: str,
                    generate: Callable[[Any], jax.Array]) -> Callable[[int, Any], None]:
    """A loop hook writing `out_dir/sample_{step:07d}.mp4`: skeleton | generate(state) | truth,
    where `generate` maps the loop's state to latents (1, T, H, W, C) of `clip`. The skeleton and
    truth panels are decoded once."""
    if clip["video_latents"].shape[-1] != vae.cfg.z_dim:
        raise ValueError(f"sample VAE has z_dim {vae.cfg.z_dim}, latents have {clip['video_latents'].shape[-1]}")
    vae_graph, vae_state = nnx.split(vae)

    @jax.jit
    def decode(latents):
        return vae_lib.decode(vae_graph, vae_state, latents)

    truth = _to_uint8(decode(clip["video_latents"]))[0]
    skeleton = _to_uint8(decode(clip["control_video_latents"]))[0]

    def hook(step: int, state: Any) -> None:
        from rynn_jax.render.preview import save_video

        generated = _to_uint8(decode(generate(state)))[0]
        if jax.process_index() == 0:
            os.makedirs(out_dir, exist_ok=True)
            save_video(os.path.join(out_dir, f"sample_{step:07d}.mp4"),
                       np.concatenate([skeleton, generated, truth], axis=2), fps=16)

    return hook


def make_sample_hook(cfg: TrainConfig, graphdef: nnx.GraphDef, vae: WanVAE, batch: dict[str, np.ndarray],
                     out_dir: str, num_steps: int = 8, seed: int = 0) -> Callable[[int, TrainState], None]:
    """A `train(cfg, hooks=[...])` hook writing `out_dir/sample_{step:07d}.mp4` (first clip of `batch`),
    sampled by the bidirectional model (EMA weights when kept)."""
    clip = first_clip(batch)
    control = clip["control_video_latents"] if cfg.model.control != "none" else None

    @jax.jit
    def sample(params, frozen, stats):
        model = nnx.merge(graphdef, params, frozen, stats, copy=True)

        def velocity(x, t_bf):
            return model(x, t_bf, clip["text_embedding"], control)

        return samplers.sample(jax.random.key(seed), velocity, clip["video_latents"].shape,
                               num_steps=num_steps, first_frame_latent=clip["img_latent"])

    def generate(state: TrainState) -> jax.Array:
        params = state.ema if len(jax.tree.leaves(state.ema)) else state.params
        return sample(params, state.frozen, state.stats)

    return make_video_hook(vae, clip, out_dir, generate)
