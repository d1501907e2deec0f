"""The Wan2.2 VAE's layers, channels-last: causal convs (their streaming caches and the `first` flag
are described in models/vae.py), RMS norms, per-frame attention, resamplers, the parameter-free
shortcuts, residual blocks, and the encoder and decoder that models/vae.py assembles."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from rynn_jax.models.vae_config import WanVAEConfig

Cache = dict[str, Any]

_CONV_DIMS = ("NTHWC", "THWIO", "NTHWC")
# torch's default conv init, U(±1/√fan_in); uniform also compiles far faster than truncated normal.
_KERNEL_INIT = nnx.initializers.variance_scaling(1 / 3, "fan_in", "uniform")


def _param(rngs: nnx.Rngs, init: Callable, shape: tuple[int, ...], cfg: WanVAEConfig,
           names: tuple[str | None, ...]) -> nnx.Param:
    return nnx.Param(nnx.with_partitioning(init, names)(rngs.params(), shape,
                                                        jnp.dtype(cfg.param_dtype)))


def _time_views(past: jax.Array | None, x: jax.Array, kt: int) -> list[jax.Array]:
    """The kt time-shifted windows of past ⧺ x that a 'valid' kt-tap conv reads (window i = frames
    i … i+t−1, t = P+T−kt+1), cut from past and x directly: past ⧺ x itself is never materialised
    (it would be one more full copy of the activations per conv; the windows fuse into one copy)."""
    p = 0 if past is None else past.shape[1]
    t = p + x.shape[1] - kt + 1
    views = []
    for i in range(kt):
        parts = []
        if i < p:
            parts.append(past[:, i:min(i + t, p)])
        if i + t > p:
            parts.append(x[:, max(i - p, 0):i + t - p])
        views.append(parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1))
    return views


def _conv(x: jax.Array, kernel_thwio: jax.Array, bias: jax.Array, cfg: WanVAEConfig,
          stride: tuple[int, int, int] = (1, 1, 1),
          pad_hw: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0)),
          past: jax.Array | None = None, module: nnx.Module | None = None) -> jax.Array:
    """3D conv over past ⧺ x (`past`: earlier frames, e.g. a causal cache), time unpadded ('valid'),
    space padded by `pad_hw`. `module`: the conv module calling, for cfg.kernel_conv (injected).

    The 2-D formulations exist because GPU conv libraries are tuned for 2-D NHWC convs: frames go
    into the batch axis, and the time taps either into input channels (fold2d) or a sum (sum2d)."""
    precision = None if cfg.precision == "default" else cfg.precision
    kernel = kernel_thwio.astype(x.dtype)
    kt, kh, kw, c_in, c_out = kernel.shape
    if cfg.conv_impl == "3d" or stride[0] != 1:
        if past is not None:
            x = jnp.concatenate([past.astype(x.dtype), x], axis=1)
        y = jax.lax.conv_general_dilated(
            x, kernel, window_strides=stride, padding=((0, 0), *pad_hw),
            dimension_numbers=_CONV_DIMS, precision=precision)
        return y + bias.astype(x.dtype)
    past = None if past is None else past.astype(x.dtype)
    if cfg.kernel_conv is not None and module is not None:
        y = cfg.kernel_conv(module, x, kernel_thwio, past, stride, pad_hw)
        if y is not None:
            return y + bias.astype(y.dtype)
    views = _time_views(past, x, kt)
    b, t = x.shape[0], views[0].shape[1]

    def conv2d(x_bthwc: jax.Array, kernel_hwio: jax.Array, out_dtype: Any = None) -> jax.Array:
        y = jax.lax.conv_general_dilated(
            x_bthwc.reshape(b * t, *x_bthwc.shape[2:]), kernel_hwio, window_strides=stride[1:],
            padding=pad_hw, dimension_numbers=("NHWC", "HWIO", "NHWC"), precision=precision,
            preferred_element_type=out_dtype)
        return y.reshape(b, t, *y.shape[1:])

    if kt == 1:
        y = conv2d(views[0], kernel[0])
    elif cfg.conv_impl == "fold2d":  # channel index (tap, c): tap-major, as the kernel reshape
        y = conv2d(jnp.concatenate(views, axis=-1), kernel.transpose(1, 2, 0, 3, 4).reshape(kh, kw, kt * c_in, c_out))
    else:
        y = sum(conv2d(v, kernel[i], jnp.float32) for i, v in enumerate(views)).astype(x.dtype)
    return y + bias.astype(x.dtype)


def encoder_config(cfg: WanVAEConfig) -> WanVAEConfig:
    """The config the encoder's layers run with: no injected conv. Measured on an H200, the FP8
    kernel makes the streaming encode slower (14.8 → 25.4 ms per chunk, per-call FP8): its
    160/320-channel convs do not fit the kernel and its 640-channel ones are small."""
    return cfg if cfg.kernel_conv is None else dataclasses.replace(cfg, kernel_conv=None)


class CausalConv3d(nnx.Module):
    """Conv3d padded 2·(k//2) frames in the past only; when streaming the past is the cache."""

    def __init__(self, c_in: int, c_out: int, kernel: tuple[int, int, int], cfg: WanVAEConfig, *,
                 rngs: nnx.Rngs):
        self.cfg = cfg
        self.kernel = _param(rngs, _KERNEL_INIT, (*kernel, c_in, c_out), cfg,
                             (None, None, None, None, "conv_out"))
        self.bias = _param(rngs, nnx.initializers.zeros_init(), (c_out,), cfg, ("conv_out",))
        self.history = kernel[0] - 1  # frames of past input each output frame looks at
        if cfg.kernel_conv is not None:
            cfg.kernel_conv.attach(self, self.kernel[...], (1, 1, 1))

    def __call__(self, x: jax.Array, cache: jax.Array | None = None) -> tuple[jax.Array, Any]:
        """x (B,T,H,W,C); cache (B,k_t-1,H,W,C) = the previous input frames, None = zeros."""
        new_cache = None
        h, t = self.history, x.shape[1]
        # a lone frame after the zero padding (an image: the policy's observation, a reference frame):
        # the padding's taps add exact zeros, so only the last tap runs (a third of the work)
        lone = h and cache is None and t == 1 and self.cfg.kernel_conv is None
        if h:
            cache = (jnp.zeros((x.shape[0], h, *x.shape[2:]), x.dtype) if cache is None
                     else cache.astype(x.dtype))
            new_cache = x[:, -h:] if t >= h else jnp.concatenate([cache[:, t:], x], axis=1)
        kh, kw = self.kernel.shape[1:3]
        pad_hw = ((kh // 2, kh // 2), (kw // 2, kw // 2))
        if lone:
            return _conv(x, self.kernel[...][h:], self.bias[...], self.cfg, pad_hw=pad_hw), new_cache
        y = _conv(x, self.kernel[...], self.bias[...], self.cfg, pad_hw=pad_hw,
                  past=cache if h else None, module=self)
        return y, new_cache


class RMSNorm(nnx.Module):
    """x / ‖x‖₂ over channels · √C · gamma (the reference's F.normalize form), in float32."""

    def __init__(self, dim: int, cfg: WanVAEConfig, *, rngs: nnx.Rngs):
        self.gamma = _param(rngs, nnx.initializers.ones_init(), (dim,), cfg, (None,))

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        sq = jnp.sum(jnp.square(xf), axis=-1, keepdims=True)
        y = xf * jax.lax.rsqrt(jnp.maximum(sq, 1e-24)) * (x.shape[-1] ** 0.5)
        return (y * self.gamma[...].astype(jnp.float32)).astype(x.dtype)


class ResidualBlock(nnx.Module):
    def __init__(self, c_in: int, c_out: int, cfg: WanVAEConfig, *, rngs: nnx.Rngs):
        self.norm1 = RMSNorm(c_in, cfg, rngs=rngs)
        self.conv1 = CausalConv3d(c_in, c_out, (3, 3, 3), cfg, rngs=rngs)
        self.norm2 = RMSNorm(c_out, cfg, rngs=rngs)
        self.conv2 = CausalConv3d(c_out, c_out, (3, 3, 3), cfg, rngs=rngs)
        self.conv_shortcut = (CausalConv3d(c_in, c_out, (1, 1, 1), cfg, rngs=rngs)
                              if c_in != c_out else None)

    def __call__(self, x: jax.Array, cache: Cache | None) -> tuple[jax.Array, Cache]:
        h = x if self.conv_shortcut is None else self.conv_shortcut(x)[0]
        y, c1 = self.conv1(jax.nn.silu(self.norm1(x)), _get(cache, "conv1"))
        y, c2 = self.conv2(jax.nn.silu(self.norm2(y)), _get(cache, "conv2"))
        return y + h, {"conv1": c1, "conv2": c2}


class AttentionBlock(nnx.Module):
    """Single-head self-attention over the pixels of each frame separately."""

    def __init__(self, dim: int, cfg: WanVAEConfig, *, rngs: nnx.Rngs):
        self.norm = RMSNorm(dim, cfg, rngs=rngs)
        init = _KERNEL_INIT
        self.to_qkv = _Dense(dim, 3 * dim, cfg, init, rngs=rngs)
        self.proj = _Dense(dim, dim, cfg, init, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, h, w, c = x.shape
        qkv = self.to_qkv(self.norm(x)).reshape(b * t, h * w, 3, c)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        logits = jnp.einsum("nqc,nkc->nqk", q, k).astype(jnp.float32) * (c ** -0.5)
        probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
        out = jnp.einsum("nqk,nkc->nqc", probs, v).reshape(b, t, h, w, c)
        return x + self.proj(out)


class _Dense(nnx.Module):
    """A 1×1 conv on channels-last input (kernel (in, out))."""

    def __init__(self, c_in: int, c_out: int, cfg: WanVAEConfig, init: Callable, *,
                 rngs: nnx.Rngs):
        self.kernel = _param(rngs, init, (c_in, c_out), cfg, (None, "conv_out"))
        self.bias = _param(rngs, nnx.initializers.zeros_init(), (c_out,), cfg, ("conv_out",))

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.kernel[...].astype(x.dtype) + self.bias[...].astype(x.dtype)


class Conv2d(nnx.Module):
    """A per-frame 3×3 conv (kernel (kh, kw, in, out)); `stride` 2 pads right/bottom only."""

    def __init__(self, c_in: int, c_out: int, cfg: WanVAEConfig, stride: int, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.stride = stride
        self.kernel = _param(rngs, _KERNEL_INIT, (3, 3, c_in, c_out), cfg,
                             (None, None, None, "conv_out"))
        self.bias = _param(rngs, nnx.initializers.zeros_init(), (c_out,), cfg, ("conv_out",))
        if cfg.kernel_conv is not None:
            cfg.kernel_conv.attach(self, self.kernel[...][None], (1, stride, stride))

    def __call__(self, x: jax.Array) -> jax.Array:
        pad = ((0, 1), (0, 1)) if self.stride == 2 else ((1, 1), (1, 1))
        return _conv(x, self.kernel[...][None], self.bias[...], self.cfg,
                     stride=(1, self.stride, self.stride), pad_hw=pad, module=self)


class Resample(nnx.Module):
    """Spatial ×2 up/down per frame, plus (the "3d" modes) a temporal ×2 with its own time conv."""

    def __init__(self, dim: int, mode: Literal["down2d", "down3d", "up2d", "up3d"],
                 cfg: WanVAEConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.mode = mode
        self.resample = Conv2d(dim, dim, cfg, stride=2 if mode.startswith("down") else 1, rngs=rngs)
        # down3d: stride 2 over (previous, current pair), no padding; up3d: each frame → 2 frames
        # from a causal window of 3. Both are applied by hand below, not by CausalConv3d.__call__.
        time_out = {"down3d": dim, "up3d": 2 * dim}.get(mode)
        self.time_conv = (CausalConv3d(dim, time_out, (3, 1, 1), cfg, rngs=rngs)
                          if time_out else None)

    def __call__(self, x: jax.Array, cache: Cache | None, first: bool) -> tuple[jax.Array, Cache]:
        new_cache: Cache = {}
        if self.mode == "up3d":
            x, new_cache["time_conv"] = self._time_up(x, _get(cache, "time_conv"), first)
        if self.mode.startswith("up"):
            x = jnp.repeat(jnp.repeat(x, 2, axis=2), 2, axis=3)  # nearest ×2
        x = self.resample(x)
        if self.mode == "down3d":
            x, new_cache["time_conv"] = self._time_down(x, _get(cache, "time_conv"), first)
        return x, new_cache

    def _time_up(self, x: jax.Array, cache: jax.Array | None, first: bool):
        """Frame 0 passes through once; every later frame becomes 2 from a conv over frames ≥ 1."""
        conv = self.time_conv
        if first:
            head, x = x[:, :1], x[:, 1:]
            if x.shape[1] == 0:
                return head, jnp.zeros((head.shape[0], 2, *head.shape[2:]), head.dtype)
            cache = None
        y, new_cache = conv(x, cache)
        b, t, h, w, c2 = y.shape
        y = y.reshape(b, t, h, w, 2, c2 // 2).transpose(0, 1, 4, 2, 3, 5)  # channel half = frame
        y = y.reshape(b, 2 * t, h, w, c2 // 2)
        if first:
            y = jnp.concatenate([head, y], axis=1)
        return y, new_cache

    def _time_down(self, x: jax.Array, cache: jax.Array | None, first: bool):
        """Frame 0 passes through; then one output per pair (2j-1, 2j), looking back at 2j-2."""
        conv = self.time_conv
        kernel, bias = conv.kernel[...], conv.bias[...]
        new_cache = x[:, -1:]
        if first:
            head = x[:, :1]
            if x.shape[1] == 1:
                return head, new_cache
            y = _conv(x, kernel, bias, self.cfg, stride=(2, 1, 1))
            return jnp.concatenate([head, y], axis=1), new_cache
        x = jnp.concatenate([cache.astype(x.dtype), x], axis=1)
        return _conv(x, kernel, bias, self.cfg, stride=(2, 1, 1)), new_cache


def avg_down(x: jax.Array, c_out: int, factor_t: int, factor_s: int) -> jax.Array:
    """Parameter-free shortcut: fold a (t, s, s) block into channels, then average channel groups.

    Time is front-padded with zeros to a multiple of factor_t (frame 0 pairs with a zero frame).
    """
    pad_t = (-x.shape[1]) % factor_t
    x = jnp.pad(x, ((0, 0), (pad_t, 0), (0, 0), (0, 0), (0, 0)))
    b, t, h, w, c = x.shape
    x = x.reshape(b, t // factor_t, factor_t, h // factor_s, factor_s, w // factor_s, factor_s, c)
    x = x.transpose(0, 1, 3, 5, 7, 2, 4, 6)  # folded channel index = (c, t, h, w), c major
    x = x.reshape(b, t // factor_t, h // factor_s, w // factor_s, c_out, -1)
    return x.mean(axis=-1)


def dup_up(x: jax.Array, c_out: int, factor_t: int, factor_s: int, first: bool) -> jax.Array:
    """Parameter-free shortcut: repeat channels, unfold them into a (t, s, s) block; at the stream
    start drop the first factor_t-1 frames (frame 0 is not doubled)."""
    b, t, h, w, c = x.shape
    factor = factor_t * factor_s * factor_s
    x = jnp.repeat(x, c_out * factor // c, axis=-1)
    x = x.reshape(b, t, h, w, c_out, factor_t, factor_s, factor_s)
    x = x.transpose(0, 1, 5, 2, 6, 3, 7, 4)
    x = x.reshape(b, t * factor_t, h * factor_s, w * factor_s, c_out)
    return x[:, factor_t - 1:] if first else x


class DownBlock(nnx.Module):
    def __init__(self, c_in: int, c_out: int, temporal: bool, spatial: bool, cfg: WanVAEConfig, *,
                 rngs: nnx.Rngs):
        self.c_out = c_out
        self.factor_t = 2 if temporal else 1
        self.factor_s = 2 if spatial else 1
        self.resnets = nnx.List([ResidualBlock(c_in if i == 0 else c_out, c_out, cfg, rngs=rngs)
                                 for i in range(cfg.num_res_blocks)])
        self.downsampler = (Resample(c_out, "down3d" if temporal else "down2d", cfg, rngs=rngs)
                            if spatial else None)

    def __call__(self, x: jax.Array, cache: Cache | None, first: bool) -> tuple[jax.Array, Cache]:
        shortcut = avg_down(x, self.c_out, self.factor_t, self.factor_s)
        new_cache: Cache = {"resnets": []}
        for i, resnet in enumerate(self.resnets):
            x, c = resnet(x, _get(cache, "resnets", i))
            new_cache["resnets"].append(c)
        if self.downsampler is not None:
            x, new_cache["downsampler"] = self.downsampler(x, _get(cache, "downsampler"), first)
        return x + shortcut, new_cache


class UpBlock(nnx.Module):
    def __init__(self, c_in: int, c_out: int, temporal: bool, spatial: bool, cfg: WanVAEConfig, *,
                 rngs: nnx.Rngs):
        self.c_out = c_out
        self.factor_t = 2 if temporal else 1
        self.spatial = spatial
        self.resnets = nnx.List([ResidualBlock(c_in if i == 0 else c_out, c_out, cfg, rngs=rngs)
                                 for i in range(cfg.num_res_blocks + 1)])
        self.upsampler = (Resample(c_out, "up3d" if temporal else "up2d", cfg, rngs=rngs)
                          if spatial else None)

    def __call__(self, x: jax.Array, cache: Cache | None, first: bool) -> tuple[jax.Array, Cache]:
        x_in = x
        new_cache: Cache = {"resnets": []}
        for i, resnet in enumerate(self.resnets):
            x, c = resnet(x, _get(cache, "resnets", i))
            new_cache["resnets"].append(c)
        if self.upsampler is not None:
            x, new_cache["upsampler"] = self.upsampler(x, _get(cache, "upsampler"), first)
            x = x + dup_up(x_in, self.c_out, self.factor_t, 2, first)
        return x, new_cache


class MidBlock(nnx.Module):
    def __init__(self, dim: int, cfg: WanVAEConfig, *, rngs: nnx.Rngs):
        self.resnets = nnx.List([ResidualBlock(dim, dim, cfg, rngs=rngs) for _ in range(2)])
        self.attentions = nnx.List([AttentionBlock(dim, cfg, rngs=rngs)])

    def __call__(self, x: jax.Array, cache: Cache | None) -> tuple[jax.Array, Cache]:
        x, c0 = self.resnets[0](x, _get(cache, "resnets", 0))
        x = self.attentions[0](x)
        x, c1 = self.resnets[1](x, _get(cache, "resnets", 1))
        return x, {"resnets": [c0, c1]}


class Encoder(nnx.Module):
    def __init__(self, cfg: WanVAEConfig, *, rngs: nnx.Rngs):
        cfg = encoder_config(cfg)
        dims = [cfg.base_dim * m for m in (1, *cfg.dim_mult)]
        n = len(cfg.dim_mult)
        self.conv_in = CausalConv3d(cfg.patch_channels, dims[0], (3, 3, 3), cfg, rngs=rngs)
        self.down_blocks = nnx.List([
            DownBlock(dims[i], dims[i + 1], temporal=i < n - 1 and cfg.temporal_downsample[i],
                      spatial=i < n - 1, cfg=cfg, rngs=rngs)
            for i in range(n)])
        self.mid_block = MidBlock(dims[-1], cfg, rngs=rngs)
        self.norm_out = RMSNorm(dims[-1], cfg, rngs=rngs)
        self.conv_out = CausalConv3d(dims[-1], 2 * cfg.z_dim, (3, 3, 3), cfg, rngs=rngs)

    def __call__(self, x: jax.Array, cache: Cache | None, first: bool) -> tuple[jax.Array, Cache]:
        new_cache: Cache = {"down_blocks": []}
        x, new_cache["conv_in"] = self.conv_in(x, _get(cache, "conv_in"))
        for i, block in enumerate(self.down_blocks):
            x, c = block(x, _get(cache, "down_blocks", i), first)
            new_cache["down_blocks"].append(c)
        x, new_cache["mid_block"] = self.mid_block(x, _get(cache, "mid_block"))
        x = jax.nn.silu(self.norm_out(x))
        x, new_cache["conv_out"] = self.conv_out(x, _get(cache, "conv_out"))
        return x, new_cache


class Decoder(nnx.Module):
    def __init__(self, cfg: WanVAEConfig, *, rngs: nnx.Rngs):
        mults = (cfg.decoder_dim_mult or cfg.dim_mult)[::-1]
        dims = [cfg.decoder_base_dim * m for m in (mults[0], *mults)]
        temporal_up = cfg.temporal_downsample[::-1]
        n = len(cfg.dim_mult)
        self.conv_in = CausalConv3d(cfg.z_dim, dims[0], (3, 3, 3), cfg, rngs=rngs)
        self.mid_block = MidBlock(dims[0], cfg, rngs=rngs)
        self.up_blocks = nnx.List([
            UpBlock(dims[i], dims[i + 1], temporal=i < n - 1 and temporal_up[i], spatial=i < n - 1,
                    cfg=cfg, rngs=rngs)
            for i in range(n)])
        self.norm_out = RMSNorm(dims[-1], cfg, rngs=rngs)
        self.conv_out = CausalConv3d(dims[-1], cfg.patch_channels, (3, 3, 3), cfg, rngs=rngs)

    def __call__(self, x: jax.Array, cache: Cache | None, first: bool) -> tuple[jax.Array, Cache]:
        new_cache: Cache = {"up_blocks": []}
        x, new_cache["conv_in"] = self.conv_in(x, _get(cache, "conv_in"))
        x, new_cache["mid_block"] = self.mid_block(x, _get(cache, "mid_block"))
        for i, block in enumerate(self.up_blocks):
            x, c = block(x, _get(cache, "up_blocks", i), first)
            new_cache["up_blocks"].append(c)
        x = jax.nn.silu(self.norm_out(x))
        x, new_cache["conv_out"] = self.conv_out(x, _get(cache, "conv_out"))
        return x, new_cache


def _get(cache: Cache | None, *path: str | int) -> Any:
    for key in path:
        if cache is None:
            return None
        cache = cache[key]
    return cache
