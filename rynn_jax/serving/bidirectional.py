"""Skeleton-conditioned video synthesis with the bidirectional (teacher) model.

One clip: the reference image becomes latent frame 0 (clean, t = 0), the rendered skeleton video
becomes the control latent, and the DiT's velocity field is integrated from noise by the
flow-matching sampler; the VAE decodes the result. Every stage is a jitted pure function of
(graphdef, state, inputs), compiled once per clip shape. An add-plus control branch uses the
statistics stored with the model (models/control.py), as streaming does.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rynn_jax.diffusion import samplers
from rynn_jax.models import fp8
from rynn_jax.models import vae as vae_lib
from rynn_jax.models.dit import WanDiT
from rynn_jax.models.vae import WanVAE


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    num_steps: int = 50  # sampler steps (the reference uses 50)
    shift: float = 5.0  # sigma shift of the flow schedule
    solver: Literal["unipc", "euler"] = "unipc"
    guidance_scale: float = 1.0  # CFG scale; 1 = no unconditional pass (RynnWorld uses an empty prompt)


class VAECodec:
    """A VAE split once (graph, state), so jitted encode/decode calls take its weights as arguments
    (whole clips; the streaming codecs are `serving.codecs`)."""

    def __init__(self, vae: WanVAE):
        self.vae_cfg = vae.cfg
        self._vae_graph, self._vae_state = nnx.split(vae)

    def encode(self, video_bthwc: jax.Array) -> jax.Array:
        return vae_encode(self._vae_graph, self._vae_state, video_bthwc)

    def decode(self, latents_bthwc: jax.Array) -> jax.Array:
        return vae_decode(self._vae_graph, self._vae_state, latents_bthwc)


class SplitModels(VAECodec):
    """A DiT and the VAE whose latents it reads, each split once. The teacher's `WorldModel` and
    RynnWorld-4D's `World4DModel` build on it."""

    def __init__(self, dit, vae: WanVAE, name: str = "DiT"):
        if dit.cfg.in_channels != vae.cfg.z_dim:
            raise ValueError(f"the {name} takes {dit.cfg.in_channels}-channel latents, the VAE makes {vae.cfg.z_dim}")
        super().__init__(vae)
        self.dit_cfg = dit.cfg
        self._dit_graph, self._dit_state = nnx.split(dit)


class WorldModel(SplitModels):
    """The teacher world model: a controlled DiT plus the VAE, split once for jitted calls."""

    def __init__(self, dit: WanDiT, vae: WanVAE):
        if dit.cfg.control == "none":
            raise ValueError("the world model needs a DiT with a control branch (cfg.control='add' or 'add-plus')")
        super().__init__(dit, vae)

    def sample_latents(self, key: jax.Array, image_latent_b1hwc: jax.Array, control_bthwc: jax.Array,
                       context_bsk: jax.Array, sampling: SamplingConfig) -> jax.Array:
        sample = _sample_fp8 if fp8.compiler_options(self.dit_cfg) else _sample
        return sample(self._dit_graph, self._dit_state, key, image_latent_b1hwc, control_bthwc,
                      context_bsk, sampling)

    def generate(self, key: jax.Array, reference_hw3: np.ndarray, skeleton_thw3: np.ndarray,
                 context_sk: np.ndarray, sampling: SamplingConfig = SamplingConfig()) -> np.ndarray:
        """Reference image (H, W, 3) and skeleton video (1+4k, H, W, 3), both uint8 → generated
        video (1+4k, H, W, 3) uint8 whose frame 0 reproduces the reference."""
        return self.generate_batch(key[None], reference_hw3[None], skeleton_thw3[None],
                                   np.asarray(context_sk)[None], sampling)[0]

    def generate_batch(self, keys_b: jax.Array, references_bhw3: np.ndarray, skeletons_bthw3: np.ndarray,
                       contexts_bsk: np.ndarray, sampling: SamplingConfig = SamplingConfig()) -> np.ndarray:
        """`generate` for B clips at once, clip b's noise from keys_b[b] alone (the same video as
        `generate` with that key, up to the rounding of a batched matmul)."""
        if references_bhw3.shape[1:] != skeletons_bthw3.shape[2:] or len(references_bhw3) != len(skeletons_bthw3):
            raise ValueError(f"reference images {references_bhw3.shape} and skeleton videos "
                             f"{skeletons_bthw3.shape} differ in size or batch")
        if keys_b.shape != (len(references_bhw3),):
            raise ValueError(f"one key per clip: {keys_b.shape} keys for {len(references_bhw3)} clips")
        image_latent = self.encode(to_model_range(references_bhw3)[:, None])
        control = self.encode(to_model_range(skeletons_bthw3))
        latents = self.sample_latents(keys_b, image_latent, control, jnp.asarray(contexts_bsk), sampling)
        return to_uint8(self.decode(latents))


# Weights are arguments (not closure constants) so a 5B model is never baked into the executable.
@functools.partial(jax.jit, static_argnums=0)
def vae_encode(graph: nnx.GraphDef, state: nnx.State, video_bthwc: jax.Array) -> jax.Array:
    return vae_lib.encode(graph, state, video_bthwc)


@functools.partial(jax.jit, static_argnums=0)
def vae_decode(graph: nnx.GraphDef, state: nnx.State, latents_bthwc: jax.Array) -> jax.Array:
    return vae_lib.decode(graph, state, latents_bthwc)


def _sample_impl(graph: nnx.GraphDef, state: nnx.State, key: jax.Array, image_latent_b1hwc: jax.Array,
                 control_bthwc: jax.Array, context_bsk: jax.Array, sampling: SamplingConfig) -> jax.Array:
    dit = nnx.merge(graph, state)

    def model_fn(x, t_bf, ctx):
        reps = x.shape[0] // control_bthwc.shape[0]  # CFG stacks cond/uncond on the batch
        return dit(x, t_bf, ctx, jnp.concatenate([control_bthwc] * reps, axis=0))

    if sampling.guidance_scale == 1.0:
        velocity_fn = functools.partial(model_fn, ctx=context_bsk)
    else:
        velocity_fn = samplers.make_cfg_velocity_fn(
            model_fn, context_bsk, jnp.zeros_like(context_bsk), sampling.guidance_scale)
    return samplers.sample(key, velocity_fn, control_bthwc.shape[:4] + (dit.cfg.in_channels,),
                           solver=sampling.solver, num_steps=sampling.num_steps, shift=sampling.shift,
                           first_frame_latent=image_latent_b1hwc)


# Weights are arguments here too; the FP8 variant compiles its GEMMs for cuBLASLt (fp8.compiler_options).
_sample = jax.jit(_sample_impl, static_argnums=(0, 6))
_sample_fp8 = jax.jit(_sample_impl, static_argnums=(0, 6), compiler_options=fp8.FP8_COMPILER_OPTIONS)


def to_model_range(frames_uint8: np.ndarray) -> jax.Array:
    return jnp.asarray(frames_uint8, jnp.float32) / 127.5 - 1.0


def to_uint8(frames: jax.Array) -> np.ndarray:
    return np.asarray(jnp.round((jnp.clip(frames, -1, 1) + 1) * 127.5), np.uint8)
