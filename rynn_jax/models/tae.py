"""Tiny autoencoder for the Wan2.2 latent space (TAEHV family, weights `taew2_2`), in Flax NNX.

An 11.4M-parameter stand-in for the exact Wan2.2 VAE (models/vae.py, ~705M) with the same latent
space and time/space strides (4 × 16 × 16, 48 channels), for real-time decoding: per frame it is a
few 2-D convs at low resolution instead of a stack of 3-D convs at full resolution.

Layout is channels-last like vae.py: video (B, T, H, W, 3) in [-1, 1]; latents (B, T', H/16, W/16,
48) float32, by default in the DiT's normalized space (what vae.encode_chunk(normalize=True)
gives); normalize=False maps to/from the Wan VAE's raw posterior mean with the Wan2.2 statistics.

What the reference fixes (madebyollin/taehv: `taehv.py`, README, examples/TAEW2.2_T2I_Demo; the
encoder's time alignment from the training example TAEHV_Training_Example.ipynb in
madebyollin/seraena):
  * `taew2_2` = 48 latent channels and a 2×2 pixel (un)shuffle around the network (torch's channel
    order: c major, then row offset, then column offset). Every conv is a per-frame 2-D conv, 3×3
    with padding 1 unless said otherwise; activations are ReLU.
  * Encoder (torch `encoder.<i>`): 0 conv 12→64 (+bias), 1 ReLU; then 3 stages k at i = 2+5k:
    TPool(64, stride) [1×1 conv, no bias, over `stride` consecutive frames stacked on channels,
    earliest first], conv stride 2 (no bias), 3 MemBlocks(64); strides (2, 2, 1); 17 conv 64→48
    (+bias), no activation.
  * Decoder (`decoder.<i>`): 0 Clamp = 3·tanh(x/3) on the latents, 1 conv 48→256 (+bias), 2 ReLU;
    then 3 stages k at i = 3+6k with widths 256, 128, 64: 3 MemBlocks, nearest ×2 upsample,
    TGrow(c, stride) [1×1 conv, no bias, c → stride·c, split into `stride` frames, earliest
    first], conv c → next width (no bias; 128, 64, 64); time strides (1, 2, 2) (the stride-1
    TGrow is still a learned 1×1); 21 ReLU, 22 conv 64→12 (+bias); pixel shuffle; clamp [0, 1].
  * MemBlock(c): relu(f(concat[x, past]) + x), f = conv 2c→c, ReLU, conv, ReLU, conv (params
    `conv.0`, `conv.2`, `conv.4`, each weight + bias; no skip params since in = out width). `past`
    is the block's input at the previous frame, zeros at the first frame: the only memory.
  * Checkpoint = a plain state dict with exactly those keys (torch OIHW conv weights). A TGrow
    weight with more output channels than the model's (a time-upscaling checkpoint loaded into a
    config without it) is cut to its last-timestep rows.
  * Whole clip: encode_video pads the end with copies of the last frame to a multiple of 4
    (T → ceil(T/4) latents); decode_video returns 4·T' frames minus the first 3 (1 + 4(T'-1)).
  * Latents are exactly what the diffusion model uses: no mean/std (README; the Wan2.2-TI2V-5B
    demo wraps it with latents_mean 0, latents_std 1). Images are in [0, 1].
  * Time alignment: the decoder matches the Wan VAE (latent 0 → frame 0, latent j → frames
    4j-3 … 4j). The encoder was trained (training example, Wan2.1) to map frames 4j … 4j+3 to Wan
    latent j, i.e. it looks 3 frames further ahead than the Wan encoder.

Beyond the released layout (config fields, defaults = taew2_2): `blocks_per_stage` MemBlocks per
stage, and `decoder_only` (no encoder; the decoder of another autoencoder's latent space, trained by
rynn_jax/training/decoder.py, `TAEConfig.synthetic`), whose stages may keep the resolution
(`decoder_space_upscale` False: the reference's flag) for a smaller spatial stride.

Streaming contract (same signatures and first call as vae.py, so a session can swap codecs):
  * encode_chunk: the first call (cache step 0) reads only frames[:, -1] and encodes it as that
    frame held for 4 frames, which is exactly the reference's encoding of a still image; later
    calls encode their 4 frames. The whole-clip equivalent is `encode(..., time_pad="front")`
    (frame 0 repeated 3 more times in front). Difference from the reference's own video
    alignment: after the first latent, latent j comes from frames 4j-3 … 4j, 3 frames earlier than
    the reference's encode_video (`time_pad="end"`) would read, so encoded motion lags by up to 3
    frames. Only an encoder with lookahead (one latent of latency) could stream the latter.
  * decode_chunk: every call emits 4 frames; on the first call frames 0..2 are the reference's
    start-up frames (trimmed by `decode`) and are returned as zeros, as vae.decode_chunk does.
  * Beyond vae.py's contract, a call may also take k chunks at once (4k frames / k latents): the
    same result as k calls, in one parallel pass (serving.codecs.StreamingCodec.whole_blocks uses it).
  * The cache is {"step": int32, "layers": [encoder|decoder stage][block] → (B, 1, h, w, C)}, the
    last input frame of every MemBlock. Within a call all frames run in parallel (each block sees
    concat(memory, x[:-1]) as its past). The first call ignores the cache's contents; `first=None`
    picks first/later from the step counter with selects (one program for every call), True/False
    compile one case only.

Public, pure functions of (graphdef, params, [cache,] x), to be jitted by the caller:
  encode, decode, init_encode_cache, encode_chunk, init_decode_cache, decode_chunk.
Official weights: models/tae_weights.py (tae_from_state_dict, load_tae).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from rynn_jax.models import build
from rynn_jax.models.vae_config import WAN22_LATENTS_MEAN, WAN22_LATENTS_STD

Cache = dict[str, Any]
Memory = list[list[jax.Array]]  # [stage][block] → (B, 1, h, w, C): the block's last input frame

BLOCKS_PER_STAGE = 3  # MemBlocks per encoder / decoder stage in every released TAEHV checkpoint

# --------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class TAEConfig:
    z_dim: int = 48  # z: the Wan2.2 VAE's latent channels
    patch_size: int = 2  # pixel unshuffle before the encoder / shuffle after the decoder
    image_channels: int = 3  # RGB
    encoder_width: int = 64  # channels of every encoder layer after the input conv
    encoder_time_downscale: tuple[bool, ...] = (True, True, False)  # per stage: TPool stride 2?
    # Input width of each decoder stage, then the width before the output conv.
    decoder_widths: tuple[int, ...] = (256, 128, 64, 64)
    decoder_time_upscale: tuple[bool, ...] = (False, True, True)  # per stage: TGrow stride 2?
    decoder_space_upscale: tuple[bool, ...] = (True, True, True)  # per stage: nearest ×2?
    blocks_per_stage: int = BLOCKS_PER_STAGE  # MemBlocks per encoder / decoder stage
    # A decoder alone (no encoder parameters): trained for another autoencoder's latent space
    # (rynn_jax/training/decoder.py); its spatial stride may then differ from the encoder layout's.
    decoder_only: bool = False
    # Per-channel statistics of the Wan2.2 VAE's raw latents; used only with normalize=False
    # (the network itself works in the normalized space).
    latents_mean: tuple[float, ...] = WAN22_LATENTS_MEAN
    latents_std: tuple[float, ...] = WAN22_LATENTS_STD
    dtype: Literal["bfloat16", "float32"] = "bfloat16"  # parameters and compute; outputs float32
    precision: Literal["default", "high", "highest"] = "default"  # conv precision; highest: no TF32

    def __post_init__(self):
        n = len(self.encoder_time_downscale)
        if len(self.decoder_time_upscale) != n or len(self.decoder_space_upscale) != n:
            raise ValueError("encoder_time_downscale, decoder_time_upscale and "
                             "decoder_space_upscale need one flag per stage each")
        if len(self.decoder_widths) != n + 1:
            raise ValueError(f"decoder_widths needs {n + 1} values (one per stage, then the head)")
        z = self.z_dim
        if len(self.latents_mean) != z or len(self.latents_std) != z:
            raise ValueError(f"latents_mean/std need {z} values each")
        if self.dtype not in ("bfloat16", "float32"):
            raise ValueError(f"dtype must be 'bfloat16' or 'float32', got {self.dtype!r}")
        if self.blocks_per_stage < 1:
            raise ValueError(f"blocks_per_stage must be ≥ 1, got {self.blocks_per_stage}")
        if not self.decoder_only and not all(self.decoder_space_upscale):
            raise ValueError("with an encoder every decoder stage upscales space (the encoder halves it in "
                             "every stage); a decoder of another stride is decoder_only")

    @property
    def num_stages(self) -> int:
        return len(self.encoder_time_downscale)

    @property
    def temporal_stride(self) -> int:
        """Video frames per latent frame on the encoder side."""
        return 2 ** sum(self.encoder_time_downscale)

    @property
    def decoder_temporal_stride(self) -> int:
        """Video frames per latent frame out of the decoder (4; 1 with time upscaling off)."""
        return 2 ** sum(self.decoder_time_upscale)

    @property
    def spatial_stride(self) -> int:
        """Pixels per latent along H and W (the decoder's upscaling; the encoder's when it has one)."""
        return self.patch_size * 2 ** sum(self.decoder_space_upscale)

    @property
    def patch_channels(self) -> int:
        return self.image_channels * self.patch_size**2

    @classmethod
    def wan22(cls, **overrides) -> TAEConfig:
        """The released `taew2_2` weights' shapes."""
        return cls(**overrides)

    @classmethod
    def tiny(cls, **overrides) -> TAEConfig:
        """The same structure (every layer kind, same strides) with a few channels, for tests."""
        base = {"z_dim": 4, "encoder_width": 8, "decoder_widths": (16, 12, 8, 8),
                "latents_mean": (0.1, -0.2, 0.3, -0.05), "latents_std": (0.5, 1.5, 0.8, 1.2)}
        return cls(**{**base, **overrides})

    @classmethod
    def synthetic(cls, **overrides) -> TAEConfig:
        """The real-time decoder of the synthetic world's autoencoder (WanVAEConfig.synthetic, 32
        channels, stride 4×8×8; rynn_jax/training/decoder.py trains it): decoder only, the first
        stage at the latents' resolution (no space upscale), then two ×2 stages and the 2×2 pixel
        shuffle = stride 8; 1,718,092 parameters. Widths sized for ≲ 100 ms per 3-latent block at 128×224
        on 2 CPU cores (measured 78–105 ms on shared cores, docs/PERFORMANCE.md). latents_mean/std:
        the autoencoder's, set by the trainer."""
        z = overrides.get("z_dim", 32)
        base = {"z_dim": z, "decoder_only": True, "decoder_widths": (128, 64, 32, 32),
                "decoder_space_upscale": (False, True, True), "blocks_per_stage": 2,
                "latents_mean": (0.0,) * z, "latents_std": (1.0,) * z}
        return cls(**{**base, **overrides})


# --------------------------------------------------------------------------------------------------
# Layers (all take and return (B, T, h, w, C); frames are folded into the conv batch)
# --------------------------------------------------------------------------------------------------

# torch's default conv init, U(±1/√fan_in); only for tests and training from scratch.
_KERNEL_INIT = nnx.initializers.variance_scaling(1 / 3, "fan_in", "uniform")


class Conv(nnx.Module):
    """torch Conv2d applied to every frame: k×k, padding k//2 on all sides, stride 1 or 2.

    The padding is explicit: XLA's "SAME" puts a stride-2 conv's padding on the bottom/right only."""

    def __init__(self, c_in: int, c_out: int, cfg: TAEConfig, *, kernel_size: int = 3,
                 stride: int = 1, bias: bool = True, rngs: nnx.Rngs):
        dtype = jnp.dtype(cfg.dtype)
        self.stride = stride
        self.precision = None if cfg.precision == "default" else cfg.precision
        self.kernel = nnx.Param(_KERNEL_INIT(rngs.params(), (kernel_size, kernel_size, c_in, c_out),
                                             dtype))
        self.bias = nnx.Param(jnp.zeros((c_out,), dtype)) if bias else None

    def __call__(self, x_bthwc: jax.Array) -> jax.Array:
        b, t = x_bthwc.shape[:2]
        kernel = self.kernel[...].astype(x_bthwc.dtype)
        pad = kernel.shape[0] // 2
        y = jax.lax.conv_general_dilated(
            x_bthwc.reshape(b * t, *x_bthwc.shape[2:]), kernel, (self.stride, self.stride),
            ((pad, pad), (pad, pad)), dimension_numbers=("NHWC", "HWIO", "NHWC"),
            precision=self.precision)
        if self.bias is not None:
            y = y + self.bias[...].astype(y.dtype)
        return y.reshape(b, t, *y.shape[1:])


class MemBlock(nnx.Module):
    """Residual block whose first conv also sees the block's input at the previous frame."""

    def __init__(self, c: int, cfg: TAEConfig, *, rngs: nnx.Rngs):
        self.conv0 = Conv(2 * c, c, cfg, rngs=rngs)
        self.conv1 = Conv(c, c, cfg, rngs=rngs)
        self.conv2 = Conv(c, c, cfg, rngs=rngs)

    def __call__(self, x_bthwc: jax.Array, memory_b1hwc: jax.Array | None
                 ) -> tuple[jax.Array, jax.Array]:
        """memory: the input frame before x[:, 0] (None: zeros, the clip start). Returns the output
        and the new memory, x[:, -1]."""
        head = (jnp.zeros_like(x_bthwc[:, :1]) if memory_b1hwc is None
                else memory_b1hwc.astype(x_bthwc.dtype))
        past = jnp.concatenate([head, x_bthwc[:, :-1]], axis=1)
        h = jax.nn.relu(self.conv0(jnp.concatenate([x_bthwc, past], axis=-1)))
        h = self.conv2(jax.nn.relu(self.conv1(h)))
        return jax.nn.relu(h + x_bthwc), x_bthwc[:, -1:]


class TimePool(nnx.Module):
    """`stride` consecutive frames → 1: stacked on channels (earliest first), then a 1×1 conv."""

    def __init__(self, c: int, stride: int, cfg: TAEConfig, *, rngs: nnx.Rngs):
        self.stride = stride
        self.conv = Conv(stride * c, c, cfg, kernel_size=1, bias=False, rngs=rngs)

    def __call__(self, x_bthwc: jax.Array) -> jax.Array:
        b, t, h, w, c = x_bthwc.shape
        s = self.stride
        x = x_bthwc.reshape(b, t // s, s, h, w, c).transpose(0, 1, 3, 4, 2, 5)
        return self.conv(x.reshape(b, t // s, h, w, s * c))


class TimeGrow(nnx.Module):
    """1 frame → `stride`: a 1×1 conv to stride·c channels, split frame-major (earliest first)."""

    def __init__(self, c: int, stride: int, cfg: TAEConfig, *, rngs: nnx.Rngs):
        self.stride = stride
        self.conv = Conv(c, stride * c, cfg, kernel_size=1, bias=False, rngs=rngs)

    def __call__(self, x_bthwc: jax.Array) -> jax.Array:
        b, t, h, w, c = x_bthwc.shape
        s = self.stride
        y = self.conv(x_bthwc).reshape(b, t, h, w, s, c).transpose(0, 1, 4, 2, 3, 5)
        return y.reshape(b, t * s, h, w, c)


def _run_blocks(blocks: nnx.List, x: jax.Array, memory: list[jax.Array] | None
                ) -> tuple[jax.Array, list[jax.Array]]:
    new_memory = []
    for i, block in enumerate(blocks):
        x, m = block(x, None if memory is None else memory[i])
        new_memory.append(m)
    return x, new_memory


class EncoderStage(nnx.Module):
    def __init__(self, c: int, time_stride: int, cfg: TAEConfig, *, rngs: nnx.Rngs):
        self.pool = TimePool(c, time_stride, cfg, rngs=rngs)
        self.down = Conv(c, c, cfg, stride=2, bias=False, rngs=rngs)
        self.blocks = nnx.List([MemBlock(c, cfg, rngs=rngs) for _ in range(cfg.blocks_per_stage)])

    def __call__(self, x: jax.Array, memory: list[jax.Array] | None):
        return _run_blocks(self.blocks, self.down(self.pool(x)), memory)


class DecoderStage(nnx.Module):
    def __init__(self, c_in: int, c_out: int, time_stride: int, space_up: bool, cfg: TAEConfig, *,
                 rngs: nnx.Rngs):
        self.space_up = space_up
        self.blocks = nnx.List([MemBlock(c_in, cfg, rngs=rngs) for _ in range(cfg.blocks_per_stage)])
        self.grow = TimeGrow(c_in, time_stride, cfg, rngs=rngs)
        self.proj = Conv(c_in, c_out, cfg, bias=False, rngs=rngs)

    def __call__(self, x: jax.Array, memory: list[jax.Array] | None):
        x, new_memory = _run_blocks(self.blocks, x, memory)
        # The reference upsamples, then grows time; a per-pixel 1×1 conv commutes exactly with a
        # nearest upsample, so grow first, on 4× fewer pixels.
        x = self.grow(x)
        if self.space_up:
            x = jnp.repeat(jnp.repeat(x, 2, axis=2), 2, axis=3)
        return self.proj(x), new_memory


class Encoder(nnx.Module):
    def __init__(self, cfg: TAEConfig, *, rngs: nnx.Rngs):
        w = cfg.encoder_width
        self.conv_in = Conv(cfg.patch_channels, w, cfg, rngs=rngs)
        self.stages = nnx.List([EncoderStage(w, 2 if down else 1, cfg, rngs=rngs)
                                for down in cfg.encoder_time_downscale])
        self.conv_out = Conv(w, cfg.z_dim, cfg, rngs=rngs)

    def __call__(self, x_bthwc: jax.Array, memory: Memory | None) -> tuple[jax.Array, Memory]:
        """Patchified frames in [0, 1], T a multiple of the time stride → latents, new memory."""
        x = jax.nn.relu(self.conv_in(x_bthwc))
        new_memory = []
        for i, stage in enumerate(self.stages):
            x, m = stage(x, None if memory is None else memory[i])
            new_memory.append(m)
        return self.conv_out(x), new_memory


class Decoder(nnx.Module):
    def __init__(self, cfg: TAEConfig, *, rngs: nnx.Rngs):
        widths = cfg.decoder_widths
        self.conv_in = Conv(cfg.z_dim, widths[0], cfg, rngs=rngs)
        self.stages = nnx.List([
            DecoderStage(widths[i], widths[i + 1], 2 if up_t else 1, up_s, cfg, rngs=rngs)
            for i, (up_t, up_s) in enumerate(zip(cfg.decoder_time_upscale,
                                                 cfg.decoder_space_upscale))])
        self.conv_out = Conv(widths[-1], cfg.patch_channels, cfg, rngs=rngs)

    def __call__(self, z_bthwz: jax.Array, memory: Memory | None) -> tuple[jax.Array, Memory]:
        """Normalized latents → patchified frames (≈ [0, 1], unclamped), new memory."""
        x = 3.0 * jnp.tanh(z_bthwz / 3.0)  # the reference's soft clamp to ±3
        x = jax.nn.relu(self.conv_in(x))
        new_memory = []
        for i, stage in enumerate(self.stages):
            x, m = stage(x, None if memory is None else memory[i])
            new_memory.append(m)
        return self.conv_out(jax.nn.relu(x)), new_memory


def pixel_unshuffle(x_bthwc: jax.Array, p: int) -> jax.Array:
    """(B,T,H,W,C) → (B,T,H/p,W/p,C·p²), channel index (c, row offset, column offset) as torch's
    F.pixel_unshuffle (vae.patchify orders the offsets the other way round)."""
    if p == 1:
        return x_bthwc
    b, t, h, w, c = x_bthwc.shape
    x = x_bthwc.reshape(b, t, h // p, p, w // p, p, c).transpose(0, 1, 2, 4, 6, 3, 5)
    return x.reshape(b, t, h // p, w // p, c * p * p)


def pixel_shuffle(x_bthwc: jax.Array, p: int) -> jax.Array:
    """Inverse of `pixel_unshuffle`."""
    if p == 1:
        return x_bthwc
    b, t, h, w, cpp = x_bthwc.shape
    x = x_bthwc.reshape(b, t, h, w, cpp // (p * p), p, p).transpose(0, 1, 2, 5, 3, 6, 4)
    return x.reshape(b, t, h * p, w * p, cpp // (p * p))


# --------------------------------------------------------------------------------------------------
# The autoencoder
# --------------------------------------------------------------------------------------------------


class TinyAutoencoder(nnx.Module):
    """Encoder + decoder; `checkpoint_key` names each parameter in the official state dict."""

    def __init__(self, cfg: TAEConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.encoder = None if cfg.decoder_only else Encoder(cfg, rngs=rngs)
        self.decoder = Decoder(cfg, rngs=rngs)

    def encode_frames(self, video_bthwc: jax.Array, memory: Memory | None, normalize: bool
                      ) -> tuple[jax.Array, Memory]:
        """Video in [-1, 1], T a multiple of the time stride → latents (float32), new memory."""
        cfg = self.cfg
        if self.encoder is None:
            raise ValueError("this tiny autoencoder is a decoder alone (decoder_only): it cannot encode")
        x = ((video_bthwc.astype(jnp.float32) + 1.0) * 0.5).astype(jnp.dtype(cfg.dtype))
        z, new_memory = self.encoder(pixel_unshuffle(x, cfg.patch_size), memory)
        z = z.astype(jnp.float32)
        if not normalize:  # back to the Wan VAE's raw posterior mean
            z = z * jnp.asarray(cfg.latents_std) + jnp.asarray(cfg.latents_mean)
        return z, new_memory

    def decode_frames(self, z_bthwz: jax.Array, memory: Memory | None, normalize: bool, clip: bool = True
                      ) -> tuple[jax.Array, Memory]:
        """Latents → all decoded frames (decoder_temporal_stride per latent, nothing trimmed), in
        [-1, 1] float32, and the new memory. clip=False: unclamped, for training losses (a clamped
        pixel has no gradient to bring it back)."""
        cfg = self.cfg
        z = z_bthwz.astype(jnp.float32)
        if not normalize:  # raw Wan VAE latents → the normalized ones the network reads
            z = (z - jnp.asarray(cfg.latents_mean)) / jnp.asarray(cfg.latents_std)
        x, new_memory = self.decoder(z.astype(jnp.dtype(cfg.dtype)), memory)
        frames01 = pixel_shuffle(x, cfg.patch_size).astype(jnp.float32)
        frames01 = jnp.clip(frames01, 0.0, 1.0) if clip else frames01
        return frames01 * 2.0 - 1.0, new_memory


def init_tae(cfg: TAEConfig, seed: int = 0) -> TinyAutoencoder:
    """Randomly initialized model, for tests and training from scratch; real use loads weights."""
    return build.init_model(TinyAutoencoder, cfg, seed)


def abstract_tae(cfg: TAEConfig) -> TinyAutoencoder:
    """The model with ShapeDtypeStruct leaves: shapes and count without allocating anything."""
    return build.abstract_model(TinyAutoencoder, cfg)


def tae_from_params(cfg: TAEConfig, params: dict) -> TinyAutoencoder:
    """A model whose parameters are the given pure dict."""
    return build.model_from_params(TinyAutoencoder, cfg, params)


# --------------------------------------------------------------------------------------------------
# Pure functions: whole clip
# --------------------------------------------------------------------------------------------------

TimePad = Literal["front", "end"]


def _check_frames(shape: tuple[int, ...], cfg: TAEConfig, what: str) -> None:
    if len(shape) != 5:
        raise ValueError(f"{what} must be (B, T, H, W, {cfg.image_channels}), got {shape}")
    _, _, h, w, c = shape
    s = cfg.spatial_stride
    if h % s or w % s or c != cfg.image_channels:
        raise ValueError(f"{what} (B,T,H,W,C) needs H, W multiples of {s} and "
                         f"C = {cfg.image_channels}, got {shape}")


def _check_latents(shape: tuple[int, ...], cfg: TAEConfig, what: str) -> None:
    if len(shape) != 5 or shape[-1] != cfg.z_dim:
        raise ValueError(f"{what} must be (B, T', h, w, {cfg.z_dim}), got {shape}")


def encode(graphdef: nnx.GraphDef, params: nnx.State, video_bthwc: jax.Array, *,
           normalize: bool = True, time_pad: TimePad = "front") -> jax.Array:
    """Video (B, T, H, W, 3) in [-1, 1] → latents (B, T', H/16, W/16, z), float32.

    time_pad="front" (default, what `encode_chunk` streams): T = 1 + 4k, frame 0 repeated 3 more
    times in front, T' = 1 + k. time_pad="end": the reference's encode_video, any T, the last frame
    repeated at the end to a multiple of 4, T' = ceil(T/4) (see the module docstring for the
    3-frame difference in alignment). normalize=True: latents in the DiT's normalized space (what
    the network produces); False: the Wan VAE's raw posterior-mean space.
    """
    model = nnx.merge(graphdef, params)
    cfg = model.cfg
    _check_frames(video_bthwc.shape, cfg, "video")
    s, t = cfg.temporal_stride, video_bthwc.shape[1]
    if time_pad == "front":
        if (t - 1) % s:
            raise ValueError(f"video needs 1 + {s}·k frames (time_pad='front'), got {t}")
        x = jnp.concatenate([jnp.repeat(video_bthwc[:, :1], s - 1, axis=1), video_bthwc], axis=1)
    elif time_pad == "end":
        if t < 1:
            raise ValueError("video has no frames")
        x = jnp.concatenate([video_bthwc, jnp.repeat(video_bthwc[:, -1:], -t % s, axis=1)], axis=1)
    else:
        raise ValueError(f"time_pad must be 'front' or 'end', got {time_pad!r}")
    return model.encode_frames(x, None, normalize)[0]


def decode(graphdef: nnx.GraphDef, params: nnx.State, latents_bthwz: jax.Array, *,
           normalize: bool = True) -> jax.Array:
    """Latents (B, T', h, w, z) → video (B, 1 + 4(T'-1), 16h, 16w, 3) in [-1, 1], float32.

    The decoder emits 4 frames per latent; the first 3 are start-up frames and are dropped, which
    aligns latent 0 with frame 0 as in the Wan VAE. normalize: as in `encode`.
    """
    model = nnx.merge(graphdef, params)
    _check_latents(latents_bthwz.shape, model.cfg, "latents")
    frames, _ = model.decode_frames(latents_bthwz, None, normalize)
    return frames[:, model.cfg.decoder_temporal_stride - 1:]


# --------------------------------------------------------------------------------------------------
# Pure functions: streaming
# --------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _abstract_split(cfg: TAEConfig) -> tuple[nnx.GraphDef, nnx.State]:
    return nnx.split(abstract_tae(cfg))


def _zero_cache(cfg: TAEConfig, fn: Callable, x: jax.ShapeDtypeStruct, dtype: Any) -> Cache:
    """A step-0 cache: zeros shaped like the memory `fn(model, x)` returns."""
    graphdef, abstract = _abstract_split(cfg)
    shapes = jax.eval_shape(lambda p, x: fn(nnx.merge(graphdef, p), x), abstract, x)
    layers = jax.tree.map(lambda s: jnp.zeros(s.shape, dtype), shapes)
    return {"step": jnp.zeros((), jnp.int32), "layers": layers}


def _memory(cache: Cache, is_first: bool | jax.Array) -> Memory | None:
    """The memory a call reads: none on the first call (whatever the cache holds), else the cache."""
    if isinstance(is_first, bool):
        return None if is_first else cache["layers"]
    return jax.tree.map(lambda m: jnp.where(is_first, jnp.zeros_like(m), m), cache["layers"])


def _advance(cache: Cache, new_memory: Memory) -> Cache:
    layers = jax.tree.map(lambda n, o: n.astype(o.dtype), new_memory, cache["layers"])
    return {"step": cache["step"] + 1, "layers": layers}


def init_encode_cache(cfg: TAEConfig, batch: int, height: int, width: int,
                      dtype: Any = None) -> Cache:
    """Zero cache for streaming-encoding video of `height`×`width` pixels (multiples of 16)."""
    dtype = jnp.dtype(dtype or cfg.dtype)
    _check_frames((batch, 1, height, width, cfg.image_channels), cfg, "video")
    x = jax.ShapeDtypeStruct((batch, cfg.temporal_stride, height, width, cfg.image_channels),
                             jnp.float32)
    return _zero_cache(cfg, lambda m, v: m.encode_frames(v, None, True)[1], x, dtype)


def encode_chunk(graphdef: nnx.GraphDef, params: nnx.State, cache: Cache, frames_bthwc: jax.Array,
                 *, normalize: bool = True, first: bool | None = None) -> tuple[jax.Array, Cache]:
    """One streaming step: (B, 4k, H, W, 3) frames → (B, k, H/16, W/16, z) latents, new cache.

    The usual call is one chunk of 4 frames (k = 1, the Wan VAE's contract); k > 1 chunks in one
    call give the same latents as k calls (every layer sees one frame of memory, so the chunks run
    in parallel over time). The first call (cache step 0) reads only frames[:, 3] of its first
    chunk (video frame 0; pass e.g. frame 0 repeated 4 times), then 4 frames per latent.
    Concatenating the outputs equals `encode` of the clip (time_pad="front"). `first=None` picks
    the case on the device from the cache's step counter; a caller that knows it statically passes
    True/False.
    """
    model = nnx.merge(graphdef, params)
    cfg = model.cfg
    s = cfg.temporal_stride
    _check_frames(frames_bthwc.shape, cfg, "frames")
    if frames_bthwc.shape[1] == 0 or frames_bthwc.shape[1] % s:
        raise ValueError(f"encode_chunk takes a positive multiple of {s} frames a call, got {frames_bthwc.shape[1]}")
    is_first = cache["step"] == 0 if first is None else bool(first)
    # first call: a still first chunk, frame 0 held, as the reference pads the clip's start
    held = jnp.concatenate([jnp.repeat(frames_bthwc[:, s - 1:s], s, axis=1), frames_bthwc[:, s:]], axis=1)
    if isinstance(is_first, bool):
        x = held if is_first else frames_bthwc
    else:
        x = jnp.where(is_first, held, frames_bthwc)
    z, new_memory = model.encode_frames(x, _memory(cache, is_first), normalize)
    return z, _advance(cache, new_memory)


def init_decode_cache(cfg: TAEConfig, batch: int, height: int, width: int,
                      dtype: Any = None) -> Cache:
    """Zero cache for streaming-decoding latents of video `height`×`width` (multiples of 16)."""
    dtype = jnp.dtype(dtype or cfg.dtype)
    _check_frames((batch, 1, height, width, cfg.image_channels), cfg, "video")
    s = cfg.spatial_stride
    z = jax.ShapeDtypeStruct((batch, 1, height // s, width // s, cfg.z_dim), jnp.float32)
    return _zero_cache(cfg, lambda m, z: m.decode_frames(z, None, True)[1], z, dtype)


def decode_chunk(graphdef: nnx.GraphDef, params: nnx.State, cache: Cache, latent_b1hwz: jax.Array,
                 *, normalize: bool = True, first: bool | None = None) -> tuple[jax.Array, Cache]:
    """One streaming step: (B, k, h, w, z) latents → (B, 4k, 16h, 16w, 3) frames, new cache.

    The usual call is one latent (k = 1, the Wan VAE's contract); k > 1 latents in one call give
    the same frames as k calls (see `encode_chunk`). The first call (cache step 0) returns video
    frame 0 at index 3 and zeros at 0..2 (where the decoder emits its start-up frames), so
    concatenating all outputs and dropping the first 3 frames equals `decode` of the clip.
    `first`: as in `encode_chunk`.
    """
    model = nnx.merge(graphdef, params)
    cfg = model.cfg
    _check_latents(latent_b1hwz.shape, cfg, "decode_chunk's latents")
    if latent_b1hwz.shape[1] == 0:
        raise ValueError(f"decode_chunk needs at least one latent frame (B,k,h,w,z): {latent_b1hwz.shape}")
    is_first = cache["step"] == 0 if first is None else bool(first)
    y, new_memory = model.decode_frames(latent_b1hwz, _memory(cache, is_first), normalize)
    startup = (jnp.arange(y.shape[1]) < cfg.decoder_temporal_stride - 1)[:, None, None, None]
    if isinstance(is_first, bool):
        y = jnp.where(startup, 0.0, y) if is_first else y
    else:
        y = jnp.where(is_first & startup, 0.0, y)
    return y, _advance(cache, new_memory)
