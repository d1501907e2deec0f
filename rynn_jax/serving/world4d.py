"""RynnWorld-4D synthesis: a first frame (RGB and its depth) and a prompt → RGB, depth in metres and
optical flow in pixels (docs/RYNNWORLD4D.md).

TI2V as the teacher's sampler (serving/bidirectional.py), in three branches at once: each modality's
frame-0 latent is its clean condition at t = 0 — the reference image, the depth of that frame as
the depth video's grey (`data/geometry_video.py`) and the white flow frame, each through the VAE.
One noise ε starts all three branches (the 4D loss's shared noise), and the three latents are
integrated by the teacher's flow-matching solvers (`diffusion.samplers.SOLVERS`) stacked on the
channel axis: every solver update is a per-step scalar combination, so on stacked channels it is
exactly three schedulers running side by side, while the velocity function splits the stack for
the 4D DiT. With the same key the RGB branch starts from the noise the teacher's sampler draws.
The VAE decodes the three latents; `geometry_video` inverts the depth and flow encodings. A model
with a control branch (the synthetic recipe's `control` variant) also reads the operator's skeleton
video, encoded by the same VAE, as the teacher does.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rynn_jax.data import geometry_video as gv
from rynn_jax.diffusion import samplers
from rynn_jax.models.dit4d import Latents, WanDiT4D
from rynn_jax.models.vae import WanVAE
from rynn_jax.serving.bidirectional import SamplingConfig, SplitModels, to_model_range, to_uint8


@dataclasses.dataclass(frozen=True)
class Sample4D:
    """One generated clip of T frames (frame 0 reproduces the given first frame)."""

    rgb: np.ndarray  # (T, H, W, 3) uint8
    depth_video: np.ndarray  # (T, H, W, 3) uint8, the generated grey encoding
    flow_video: np.ndarray  # (T, H, W, 3) uint8, the generated colour-wheel encoding (frame 0 ≈ white)
    depth: np.ndarray  # (T, H, W) float32 metres, decoded from the grey
    flow: np.ndarray  # (T − 1, H, W, 2) float32 pixels, flow i → i + 1 decoded from colour frame i + 1


class World4DModel(SplitModels):
    """The 4D DiT plus the VAE all three modalities share, split once for jitted calls.
    `rgb_decay`: the RGB joint-injection scale the model was trained to (a released checkpoint
    stores it; 1 without the decay)."""

    def __init__(self, dit: WanDiT4D, vae: WanVAE, rgb_decay: float = 1.0):
        super().__init__(dit, vae, name="4D DiT")
        self.rgb_decay = float(rgb_decay)

    def first_latents(self, reference_hw3: np.ndarray, depth_hw: np.ndarray) -> Latents:
        """The frame-0 conditions (1, 1, h, w, C): the reference image, its depth (metres) as the
        grey encoding, the white flow frame; one VAE call."""
        ref = np.asarray(reference_hw3)
        depth = np.asarray(depth_hw)
        if ref.ndim != 3 or ref.shape[-1] != 3 or ref.dtype != np.uint8:
            raise ValueError(f"reference image: expected uint8 (H, W, 3), got {ref.dtype} {ref.shape}")
        if depth.shape != ref.shape[:2]:
            raise ValueError(f"reference depth {depth.shape} does not match the reference image's {ref.shape[:2]}")
        if not np.isfinite(depth).all() or depth.min() < 0:
            raise ValueError("reference depth: expected finite metres ≥ 0 (0 = nothing)")
        frames = np.stack([ref, gv.depth_to_rgb(depth), np.full_like(ref, 255)])
        z = self.encode(to_model_range(frames[:, None]))
        return tuple(z[i:i + 1] for i in range(3))

    @property
    def controlled(self) -> bool:
        """Whether the model reads a skeleton video (a control branch)."""
        return self.dit_cfg.base.control != "none"

    def sample_latents(self, key: jax.Array, first: Latents, context_bsk: jax.Array, num_latent_frames: int,
                       sampling: SamplingConfig, control_bthwc: jax.Array | None = None) -> Latents:
        """The three clips' latents (B, T', h, w, C) from their frame-0 latents (B, 1, h, w, C) (and,
        with a control branch, the skeleton video's latent (B, T', h, w, C))."""
        shapes = {z.shape for z in first}
        if len(shapes) != 1 or first[0].ndim != 5 or first[0].shape[1] != 1:
            raise ValueError(f"frame-0 latents must be three arrays of one shape (B, 1, h, w, C), got {shapes}")
        if num_latent_frames < 2:
            raise ValueError(f"num_latent_frames must be ≥ 2 (frame 0 is given), got {num_latent_frames}")
        if (control_bthwc is None) == self.controlled:
            raise ValueError("this 4D model " + ("reads a skeleton video: pass its latent" if self.controlled
                                                 else "has no control branch: it takes no skeleton video"))
        if control_bthwc is not None and control_bthwc.shape[:2] != (first[0].shape[0], num_latent_frames):
            raise ValueError(f"control latent {control_bthwc.shape} does not cover {num_latent_frames} latent frames")
        return _sample(self._dit_graph, self._dit_state, key, tuple(first), context_bsk, num_latent_frames,
                       sampling, jnp.float32(self.rgb_decay), control_bthwc)

    def generate(self, key: jax.Array, reference_hw3: np.ndarray, depth_hw: np.ndarray, context_sk: np.ndarray,
                 num_frames: int, sampling: SamplingConfig = SamplingConfig(),
                 skeleton_thw3: np.ndarray | None = None) -> Sample4D:
        """`num_frames` (1 + k·VAE temporal stride) of RGB, depth and flow from the reference image
        (H, W, 3) uint8, its depth (H, W) in metres, and the text context (S, D); with a control
        branch, driven by the skeleton video (num_frames, H, W, 3) uint8 (a model without one
        ignores it, so one call serves both)."""
        stride = self.vae_cfg.temporal_stride
        if num_frames < 1 + stride or (num_frames - 1) % stride:
            raise ValueError(f"num_frames must be 1 + {stride}k with k ≥ 1 (the VAE's temporal stride), got {num_frames}")
        control = None
        if skeleton_thw3 is not None and self.controlled:
            if skeleton_thw3.shape != (num_frames,) + np.shape(reference_hw3):
                want = (num_frames,) + np.shape(reference_hw3)
                raise ValueError(f"skeleton video {skeleton_thw3.shape}: expected {want}")
            control = self.encode(to_model_range(np.asarray(skeleton_thw3)[None]))
        first = self.first_latents(reference_hw3, depth_hw)
        z = self.sample_latents(key, first, jnp.asarray(context_sk)[None], 1 + (num_frames - 1) // stride, sampling,
                                control)
        return decoded_sample(*(self.decode(zm)[0] for zm in z))


def decoded_sample(rgb_thw3: jax.Array, depth_thw3: jax.Array, flow_thw3: jax.Array) -> Sample4D:
    """Decoded videos in [−1, 1] → the clip, depth and flow read off their unrounded colours."""
    depth_v, flow_v = (np.asarray(v, np.float32) for v in (depth_thw3, flow_thw3))
    levels = lambda v: (np.clip(v, -1, 1) + 1) * 127.5  # noqa: E731 -- [0, 255]
    return Sample4D(rgb=to_uint8(rgb_thw3), depth_video=to_uint8(depth_v), flow_video=to_uint8(flow_v),
                    depth=gv.rgb_to_depth(levels(depth_v)), flow=gv.rgb_to_flow(levels(flow_v[1:])))


@functools.partial(jax.jit, static_argnums=(0, 5, 6))
def _sample(graph: nnx.GraphDef, state: nnx.State, key: jax.Array, first: Latents, context_bsk: jax.Array,
            num_latent_frames: int, sampling: SamplingConfig, rgb_decay: jax.Array,
            control_bthwc: jax.Array | None) -> Latents:
    dit = nnx.merge(graph, state)
    b, _, h, w, c = first[0].shape

    def model_fn(x, t_bf, ctx):  # (B, T', h, w, 3C) → the three velocities, stacked the same way
        control = None if control_bthwc is None else jnp.concatenate(  # CFG stacks cond/uncond on the batch
            [control_bthwc] * (x.shape[0] // control_bthwc.shape[0]), axis=0)
        return jnp.concatenate(dit(*jnp.split(x, 3, axis=-1), t_bf, ctx, control, rgb_decay=rgb_decay), axis=-1)

    if sampling.guidance_scale == 1.0:
        velocity_fn = functools.partial(model_fn, ctx=context_bsk)
    else:
        velocity_fn = samplers.make_cfg_velocity_fn(model_fn, context_bsk, jnp.zeros_like(context_bsk),
                                                    sampling.guidance_scale)
    eps = samplers.initial_noise(key, (b, num_latent_frames, h, w, c))  # one ε for the three branches
    x = samplers.SOLVERS[sampling.solver](
        velocity_fn, jnp.concatenate([eps] * 3, axis=-1), num_steps=sampling.num_steps, shift=sampling.shift,
        first_frame_latent=jnp.concatenate(first, axis=-1))
    return tuple(jnp.split(x, 3, axis=-1))
