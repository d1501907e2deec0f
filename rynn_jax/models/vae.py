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

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, ClassVar, Literal, Protocol, get_args

import jax
import jax.numpy as jnp
from flax import nnx

from rynn_jax.models import build

# Per-channel statistics of Wan2.2 VAE latents (Wan2.2 `vae2_2.py`, diffusers config `latents_*`).
WAN22_LATENTS_MEAN: tuple[float, ...] = (
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813,
    0.0891, 0.1570, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108,
    -0.2158, 0.2502, -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230, -0.0313,
    -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748, 0.0152, 0.1957, 0.1433, -0.2944,
    0.3573, -0.0548, -0.1681, -0.0667,
)
WAN22_LATENTS_STD: tuple[float, ...] = (
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901,
    0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944,
    0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
)

Cache = dict[str, Any]

# --------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------


ConvImpl = Literal["fold2d", "3d", "sum2d"]
XLA_CONV_IMPLS: tuple[str, ...] = get_args(ConvImpl)


class KernelConvFn(Protocol):
    """A conv injected into the VAE (WanVAEConfig.kernel_conv) for the convs it takes, instead of
    XLA's: the Hopper kernel, rynn_jax/kernels/vae_conv.py. Hashable: it is part of the config."""

    impl: str  # its name, for logs and result files (WanVAEConfig.conv_name)

    def attach(self, conv: nnx.Module, kernel_thwio: jax.Array, stride: tuple[int, int, int]) -> None:
        """At construction: give the conv module whatever state this conv keeps on it."""

    def __call__(self, conv: nnx.Module, x: jax.Array, kernel_thwio: jax.Array, past: jax.Array | None,
                 stride: tuple[int, int, int], pad_hw: tuple[tuple[int, int], tuple[int, int]]) -> jax.Array | None:
        """The conv over past ⧺ x without bias, or None where it does not apply (XLA's then)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class WanVAEConfig:
    base_dim: int = 160  # encoder width at full (patchified) resolution
    decoder_base_dim: int = 256  # decoder width at full (patchified) resolution
    z_dim: int = 48  # latent channels (the encoder emits 2·z_dim: mean and log-variance)
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)  # width multiplier per level; ×2 spatial between
    num_res_blocks: int = 2  # residual blocks per encoder level (decoder levels use one more)
    temporal_downsample: tuple[bool, ...] = (False, True, True)  # per down step: also halve time?
    patch_size: int = 2  # space-to-channel patchify before the encoder (3 → 3·p² channels)
    image_channels: int = 3  # RGB
    latents_mean: tuple[float, ...] = WAN22_LATENTS_MEAN  # per-channel latent mean (normalize)
    latents_std: tuple[float, ...] = WAN22_LATENTS_STD  # per-channel latent std (normalize)
    dtype: str = "float32"  # compute dtype of convs/attention; norms always reduce in float32
    param_dtype: str = "float32"  # storage dtype of parameters
    precision: Literal["default", "high", "highest"] = "default"  # conv precision; highest: no TF32
    # How XLA computes a causal k_t×3×3 conv (same function, different kernels; see _conv):
    # "fold2d" (serving) the k_t input frames stacked on channels, one 2-D conv (bench_vae on an
    # H200: streaming decode 61.2 → 54.1 ms, encode 19.3 → 15.8 ms per chunk; also faster on CPU);
    # for tests and benches: "3d" one 3-D conv; "sum2d" k_t 2-D convs summed in float32 (slowest).
    # 1×1×1 convs are 2-D unless "3d".
    conv_impl: ConvImpl = "fold2d"
    # The injected conv the decoder runs the convs it takes through (the Hopper FP8 kernel; set with
    # rynn_jax.kernels.vae_conv.configure); None: XLA's conv_impl for every conv.
    kernel_conv: KernelConvFn | None = None

    def __post_init__(self):
        if len(self.latents_mean) != self.z_dim or len(self.latents_std) != self.z_dim:
            raise ValueError(f"latents_mean/std need {self.z_dim} values each")
        if len(self.temporal_downsample) != len(self.dim_mult) - 1:
            raise ValueError("temporal_downsample needs one flag per down step (len(dim_mult) - 1)")
        if self.kernel_conv is not None and not callable(self.kernel_conv):
            raise ValueError(f"kernel_conv must be an injected conv (rynn_jax.kernels.vae_conv.KernelConv), "
                             f"got {self.kernel_conv!r}")
        if self.conv_impl not in XLA_CONV_IMPLS:
            raise ValueError(f"conv_impl must be one of {XLA_CONV_IMPLS}, got {self.conv_impl!r} "
                             "(the kernel ones: rynn_jax.kernels.vae_conv.configure)")

    # Fields older versions wrote to config.json, dropped on load when at their old default
    # (checkpoints.load_config): the kernel's FP8 scaling now lives in kernel_conv.
    DROPPED_FIELDS: ClassVar[dict[str, Any]] = {"conv_fp8_scales": "per_call"}

    @property
    def conv_name(self) -> str:
        """What computes the convs: the injected conv's name, else conv_impl."""
        return self.conv_impl if self.kernel_conv is None else self.kernel_conv.impl

    @property
    def temporal_stride(self) -> int:
        return 2 ** sum(self.temporal_downsample)

    @property
    def spatial_stride(self) -> int:
        return self.patch_size * 2 ** (len(self.dim_mult) - 1)

    @property
    def patch_channels(self) -> int:
        return self.image_channels * self.patch_size**2

    @classmethod
    def wan22(cls, **overrides) -> "WanVAEConfig":
        """The released Wan2.2 VAE (TI2V-5B): 704,688,668 parameters."""
        return cls(**overrides)

    @classmethod
    def tiny(cls, **overrides) -> "WanVAEConfig":
        """A ~1.2M-parameter VAE of the same structure (every layer kind), for tests."""
        base = dict(base_dim=8, decoder_base_dim=12, z_dim=4, num_res_blocks=1,
                    latents_mean=(0.1, -0.2, 0.3, -0.05), latents_std=(0.5, 1.5, 0.8, 1.2))
        return cls(**{**base, **overrides})

    @classmethod
    def synthetic(cls, **overrides) -> "WanVAEConfig":
        """The autoencoder trained on the synthetic world (rynn_jax/training/autoencoder.py):
        stride 4×8×8 (128×224 video → 16×28 latents, 48× compression), 16 latent channels,
        4,709,420 parameters (9.4 MB in bfloat16). Widths end on a repeated multiplier as in
        Wan2.2: a level's parameter-free shortcut (`avg_down`) folds its input into its output
        channels, so the last (time- and space-preserving) level cannot widen; (1, 2, 4) fails.
        The latent statistics are placeholders until training measures them."""
        z = overrides.get("z_dim", 16)
        base = dict(base_dim=32, decoder_base_dim=48, z_dim=z, dim_mult=(1, 2, 2), num_res_blocks=1,
                    temporal_downsample=(True, True), latents_mean=(0.0,) * z, latents_std=(1.0,) * z)
        return cls(**{**base, **overrides})


# --------------------------------------------------------------------------------------------------
# Layers
# --------------------------------------------------------------------------------------------------

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
        if h:
            cache = (jnp.zeros((x.shape[0], h, *x.shape[2:]), x.dtype) if cache is None
                     else cache.astype(x.dtype))
            new_cache = x[:, -h:] if t >= h else jnp.concatenate([cache[:, t:], x], axis=1)
        kh, kw = self.kernel.shape[1:3]
        y = _conv(x, self.kernel[...], self.bias[...], self.cfg, pad_hw=((kh // 2, kh // 2), (kw // 2, kw // 2)),
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
        mults = cfg.dim_mult[::-1]
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
        return model.encode_frames(x, layers, first=first, normalize=normalize)

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
        y, new = model.decode_frames(latent_b1hwc, layers, first=first, normalize=normalize)
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
