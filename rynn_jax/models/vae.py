"""Wan2.2 "high compression" video VAE (stride 4×16×16, 48 latent channels), in Flax NNX.

Layout is channels-last: video (B, T, H, W, 3) in [-1, 1]; latents (B, T', H/16, W/16, 48) with
T' = 1 + (T-1)/4. The network is causal in time: every 3D conv sees only the current and the two
previous frames (zero before the clip starts), so a clip can be processed all at once or as a stream
of chunks carrying a small cache, with the same result.

How the stream is chunked (as in the reference): the encoder takes video frame 0 alone, then 4
frames per call, and emits one latent frame per call; the decoder takes one latent frame per call
and emits 1 video frame on the first call, 4 after. Frame 0 is special throughout: the temporal
downsamplers pass it through unconvolved, the temporal upsamplers do not double it, and their time
convs never see it. Every layer therefore takes a static `first` flag meaning "frame 0 of the
stream is the first frame of this input"; whole-clip calls use first=True on all frames.

Streaming caches are pytrees of fixed-shape arrays: {"step": int32, "layers": {...}} with, per
causal conv, its last k_t-1 input frames (zeros at the stream start), and 1 frame for each temporal
downsampler. The first call is told apart by `step == 0` under `lax.cond`, so one compiled function
serves every call.

Public, pure functions of (graphdef, params, [cache,] x), to be jitted by the caller:
  encode, decode, init_encode_cache, encode_chunk, init_decode_cache, decode_chunk.
Latents are *normalized* by default, (mu - mean) / std with the 48 fixed statistics, which is what
the DiT consumes; pass normalize=False for the raw posterior mean.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rynn_jax.models import build
from rynn_jax.models.vae_config import (WAN22_LATENTS_MEAN, WAN22_LATENTS_STD, XLA_CONV_IMPLS, ConvImpl,
                                        KernelConvFn, WanVAEConfig)
from rynn_jax.models.vae_layers import (Cache, CausalConv3d, Conv2d, Decoder, Encoder, _conv,
                                        encoder_config)

__all__ = [  # the config and layers are re-exported: callers import them from here
    "WAN22_LATENTS_MEAN", "WAN22_LATENTS_STD", "XLA_CONV_IMPLS", "ConvImpl", "KernelConvFn", "WanVAEConfig",
    "Cache", "CausalConv3d", "Conv2d", "Decoder", "Encoder", "_conv", "encoder_config",
    "WanVAE", "patchify", "unpatchify", "init_vae", "abstract_vae", "vae_from_params", "count_params",
    "encode", "decode", "init_encode_cache", "encode_chunk", "init_decode_cache", "decode_chunk",
]

# --------------------------------------------------------------------------------------------------
# The VAE
# --------------------------------------------------------------------------------------------------


class WanVAE(nnx.Module):
    """Encoder + decoder; parameter names follow diffusers' AutoencoderKLWan (see vae_weights)."""

    def __init__(self, cfg: WanVAEConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.encoder = Encoder(cfg, rngs=rngs)
        self.quant_conv = CausalConv3d(2 * cfg.z_dim, 2 * cfg.z_dim, (1, 1, 1), cfg, rngs=rngs)
        self.post_quant_conv = CausalConv3d(cfg.z_dim, cfg.z_dim, (1, 1, 1), cfg, rngs=rngs)
        self.decoder = Decoder(cfg, rngs=rngs)

    def encode_frames(self, video: jax.Array, cache: Cache | None, first: bool,
                      normalize: bool) -> tuple[jax.Array, Cache]:
        """(B, T, H, W, 3) → latents (B, T', H/16, W/16, z), float32; `first`: see module doc."""
        mu, _, new_cache = self.posterior(video, cache, first)
        if normalize:
            mu = (mu - jnp.asarray(self.cfg.latents_mean)) / jnp.asarray(self.cfg.latents_std)
        return mu, new_cache

    def posterior(self, video: jax.Array, cache: Cache | None, first: bool
                  ) -> tuple[jax.Array, jax.Array, Cache]:
        """(B, T, H, W, 3) → the raw posterior mean and log-variance (B, T', H/16, W/16, z), float32."""
        x = patchify(video.astype(jnp.dtype(self.cfg.dtype)), self.cfg.patch_size)
        x, new_cache = self.encoder(x, cache, first)
        moments = self.quant_conv(x)[0].astype(jnp.float32)
        return moments[..., : self.cfg.z_dim], moments[..., self.cfg.z_dim:], new_cache

    def decode_frames(self, z: jax.Array, cache: Cache | None, first: bool,
                      normalize: bool, clip: bool = True) -> tuple[jax.Array, Cache]:
        """(B, T', h, w, z) → video (B, T, 16h, 16w, 3) in float32, clamped to [-1, 1] (clip=False:
        unclamped, for training losses: a clamped pixel has no gradient to bring it back)."""
        z = z.astype(jnp.float32)
        if normalize:
            z = z * jnp.asarray(self.cfg.latents_std) + jnp.asarray(self.cfg.latents_mean)
        x = self.post_quant_conv(z.astype(jnp.dtype(self.cfg.dtype)))[0]
        x, new_cache = self.decoder(x, cache, first)
        video = unpatchify(x, self.cfg.patch_size).astype(jnp.float32)
        return (jnp.clip(video, -1.0, 1.0) if clip else video), new_cache


def patchify(x: jax.Array, p: int) -> jax.Array:
    """(B,T,H,W,C) → (B,T,H/p,W/p,C·p²); channel index = (c, w-offset, h-offset), c major."""
    if p == 1:
        return x
    b, t, h, w, c = x.shape
    x = x.reshape(b, t, h // p, p, w // p, p, c)
    return x.transpose(0, 1, 2, 4, 6, 5, 3).reshape(b, t, h // p, w // p, c * p * p)


def unpatchify(x: jax.Array, p: int) -> jax.Array:
    """Inverse of `patchify`."""
    if p == 1:
        return x
    b, t, h, w, cpp = x.shape
    x = x.reshape(b, t, h, w, cpp // (p * p), p, p)  # (..., c, w-offset, h-offset)
    return x.transpose(0, 1, 2, 6, 3, 5, 4).reshape(b, t, h * p, w * p, cpp // (p * p))


# --------------------------------------------------------------------------------------------------
# Construction
# --------------------------------------------------------------------------------------------------


def init_vae(cfg: WanVAEConfig, seed: int = 0) -> WanVAE:
    """Randomly initialized model, for tests and training from scratch; real use loads weights."""
    return build.init_model(WanVAE, cfg, seed)


def abstract_vae(cfg: WanVAEConfig) -> WanVAE:
    """The model with ShapeDtypeStruct leaves: shapes and count without allocating anything."""
    return build.abstract_model(WanVAE, cfg)


def vae_from_params(cfg: WanVAEConfig, params: dict) -> WanVAE:
    """A model whose parameters are the given pure dict (e.g. from the converter)."""
    return build.model_from_params(WanVAE, cfg, params)


def count_params(model_or_state: Any) -> int:
    state = nnx.state(model_or_state, nnx.Param) if isinstance(model_or_state, nnx.Module) \
        else model_or_state
    return sum(math.prod(x.shape) for x in jax.tree.leaves(state))


# --------------------------------------------------------------------------------------------------
# Pure functions: whole clip
# --------------------------------------------------------------------------------------------------


def _check_video(shape: tuple[int, ...], cfg: WanVAEConfig) -> None:
    _, t, h, w, c = shape
    if (t - 1) % cfg.temporal_stride:
        raise ValueError(f"video needs 1 + {cfg.temporal_stride}·k frames, got {t}")
    if h % cfg.spatial_stride or w % cfg.spatial_stride or c != cfg.image_channels:
        raise ValueError(f"video (B,T,H,W,C) needs H, W multiples of {cfg.spatial_stride} and "
                         f"C = {cfg.image_channels}, got {shape}")


def encode(graphdef: nnx.GraphDef, params: nnx.State, video_bthwc: jax.Array, *,
           normalize: bool = True) -> jax.Array:
    """Video (B, 1+4k, H, W, 3) in [-1, 1] → latents (B, 1+k, H/16, W/16, z), float32.

    normalize=True (default): (mu - latents_mean) / latents_std, what the DiT consumes.
    """
    model = nnx.merge(graphdef, params)
    _check_video(video_bthwc.shape, model.cfg)
    return model.encode_frames(video_bthwc, None, first=True, normalize=normalize)[0]


def decode(graphdef: nnx.GraphDef, params: nnx.State, latents: jax.Array, *,
           normalize: bool = True) -> jax.Array:
    """Latents (B, 1+k, h, w, z) → video (B, 1+4k, 16h, 16w, 3) in [-1, 1], float32.

    normalize=True (default): the latents are normalized ones (as `encode` returns by default).
    """
    model = nnx.merge(graphdef, params)
    return model.decode_frames(latents, None, first=True, normalize=normalize)[0]


# --------------------------------------------------------------------------------------------------
# Pure functions: streaming
# --------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _abstract_split(cfg: WanVAEConfig) -> tuple[nnx.GraphDef, nnx.State]:
    return nnx.split(abstract_vae(cfg))


def _init_cache(cfg: WanVAEConfig, fn: Callable, x: jax.ShapeDtypeStruct) -> Cache:
    graphdef, abstract = _abstract_split(cfg)
    shapes = jax.eval_shape(lambda p, x: fn(nnx.merge(graphdef, p), x)[1], abstract, x)
    layers = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    return {"step": jnp.zeros((), jnp.int32), "layers": layers}


def init_encode_cache(cfg: WanVAEConfig, batch: int, height: int, width: int,
                      dtype: Any = None) -> Cache:
    """Zero cache for streaming-encoding video of `height`×`width` pixels (multiples of 16)."""
    dtype = jnp.dtype(dtype or cfg.dtype)
    x = jax.ShapeDtypeStruct((batch, 1, height, width, cfg.image_channels), dtype)
    fn = lambda m, v: m.encoder(patchify(v.astype(dtype), cfg.patch_size), None, True)
    return _init_cache(cfg, fn, x)


def encode_chunk(graphdef: nnx.GraphDef, params: nnx.State, cache: Cache, frames_bthwc: jax.Array,
                 *, normalize: bool = True, first: bool | None = None) -> tuple[jax.Array, Cache]:
    """One streaming step: (B, 4, H, W, 3) frames → (B, 1, H/16, W/16, z) latents, new cache.

    The first call (cache step 0) encodes video frame 0 alone and reads only frames[:, -1]
    (pass e.g. frame 0 repeated 4 times); later calls encode the next 4 frames. Concatenating the
    outputs equals `encode` of the clip. `first=None` picks the branch on the device from the
    cache's step counter (lax.cond); a caller that knows it statically passes True/False and
    compiles only that branch.
    """
    model = nnx.merge(graphdef, params)
    stride = model.cfg.temporal_stride
    _check_video(frames_bthwc.shape[:1] + (1,) + frames_bthwc.shape[2:], model.cfg)
    if frames_bthwc.shape[1] != stride:
        raise ValueError(f"encode_chunk takes {stride} frames a call, got {frames_bthwc.shape[1]}")

    def branch(layers: Cache, first: bool) -> tuple[jax.Array, Cache]:
        x = frames_bthwc[:, -1:] if first else frames_bthwc
        # step 0's cache is all zeros: None says so, and the lone frame skips the padding's taps
        return model.encode_frames(x, None if first else layers, first=first, normalize=normalize)

    return _stream_step(branch, cache, first)


def init_decode_cache(cfg: WanVAEConfig, batch: int, height: int, width: int,
                      dtype: Any = None) -> Cache:
    """Zero cache for streaming-decoding to video of `height`×`width` pixels (multiples of 16)."""
    dtype = jnp.dtype(dtype or cfg.dtype)
    s = cfg.spatial_stride
    z = jax.ShapeDtypeStruct((batch, 1, height // s, width // s, cfg.z_dim), dtype)
    return _init_cache(cfg, lambda m, z: m.decoder(z, None, True), z)


def decode_chunk(graphdef: nnx.GraphDef, params: nnx.State, cache: Cache, latent_b1hwc: jax.Array,
                 *, normalize: bool = True, first: bool | None = None) -> tuple[jax.Array, Cache]:
    """One streaming step: (B, 1, h, w, z) latent → (B, 4, 16h, 16w, 3) frames, new cache.

    The first call (cache step 0) decodes video frame 0 only: it is returned at index 3 and
    indices 0..2 are zeros, so concatenating all outputs and dropping the first 3 frames equals
    `decode` of the clip. `first`: as in `encode_chunk`.
    """
    model = nnx.merge(graphdef, params)
    stride = model.cfg.temporal_stride
    if latent_b1hwc.ndim != 5 or latent_b1hwc.shape[1] != 1:
        raise ValueError(f"decode_chunk takes one latent frame (B,1,h,w,z): {latent_b1hwc.shape}")

    def branch(layers: Cache, first: bool) -> tuple[jax.Array, Cache]:
        y, new = model.decode_frames(latent_b1hwc, None if first else layers, first=first,
                                     normalize=normalize)
        if first:
            y = jnp.pad(y, ((0, 0), (stride - 1, 0), (0, 0), (0, 0), (0, 0)))
        return y, new

    return _stream_step(branch, cache, first)


def _stream_step(branch: Callable[[Cache, bool], tuple[jax.Array, Cache]], cache: Cache,
                 first: bool | None) -> tuple[jax.Array, Cache]:
    """Run `branch(layers, first)` on a streaming cache: the first-chunk or later-chunk program,
    picked on the device from the step counter (first=None, lax.cond) or statically; the new
    layer caches keep the old ones' dtypes, and the step counter advances."""
    def run(is_first: bool):
        def go(layers: Cache) -> tuple[jax.Array, Cache]:
            y, new = branch(layers, is_first)
            return y, jax.tree.map(lambda n, o: n.astype(o.dtype), new, layers)
        return go

    if first is None:
        y, layers = jax.lax.cond(cache["step"] == 0, run(True), run(False), cache["layers"])
    else:
        y, layers = run(first)(cache["layers"])
    return y, {"step": cache["step"] + 1, "layers": layers}
