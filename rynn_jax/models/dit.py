"""Wan2.2 TI2V video diffusion transformer (the 5B DiT), in Flax NNX.

Layout is channels-last throughout: latents are (B, T, H, W, C). Tokens are the (t, h, w) patches in
row-major order. Timesteps are given per latent *frame* (B, T) — TI2V puts frame 0 (the clean image
latent) at t=0 — and every modulation tensor is computed per frame and broadcast over that frame's
tokens, which is what the reference's per-token timesteps amount to at 1/390 of the memory.

Numerics follow the reference where it matters for parity: layer norms, modulation, the time
embedding and the residual stream stay in float32; matmuls and attention run in `cfg.dtype`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rynn_jax.models import build, rope
from rynn_jax.models.control import MODES as CONTROL_MODES
from rynn_jax.models.control import ControlBranch
from rynn_jax.models.fp8 import Fp8Linear
from rynn_jax.models.layers import layer_norm, linear, param, patchify_embed, rms_norm
from rynn_jax.sharding import constrain

# --------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class WanDiTConfig:
    dim: int = 3072  # model width (heads × head_dim)
    num_layers: int = 30  # transformer blocks, run with scan
    num_heads: int = 24  # attention heads; head_dim = dim // num_heads
    ffn_dim: int = 14336  # GELU-tanh FFN hidden width
    freq_dim: int = 256  # sinusoidal timestep embedding width
    in_channels: int = 48  # VAE latent channels in
    out_channels: int = 48  # velocity channels out
    text_dim: int = 4096  # umT5-XXL hidden size
    text_len: int = 512  # text context is trimmed/zero-padded to this many slots
    patch_size: tuple[int, int, int] = (1, 2, 2)  # (t, h, w) patch of the latent per token
    eps: float = 1e-6  # layer/RMS norm epsilon
    rope_theta: float = 10000.0
    rope_max_len: int = 1024  # positions available per RoPE axis
    dtype: str = "float32"  # compute dtype of matmuls/attention ("bfloat16" for speed)
    param_dtype: str = "float32"  # storage dtype of parameters
    attention: Literal["auto", "xla", "cudnn"] = "auto"  # auto: cuDNN flash on GPU in bf16/fp16
    # Activation checkpointing per block: "full" saves nothing, "save_dots" the linear layers'
    # outputs, "save_dots_attn" those and the cuDNN attention outputs (_REMAT_POLICIES).
    remat: Literal["none", "full", "save_dots", "save_dots_attn"] = "none"
    # Blocks per iteration of the layer scan. num_layers unrolls it fully: no device loop, and XLA
    # sees each layer's weights as a static slice (an inference knob; compiles num_layers blocks).
    scan_unroll: int = 1
    # The plain forward pads the token sequence at its tail to a multiple of this (pads are masked
    # out of self-attention keys and dropped before the head, so outputs are unchanged). On H200,
    # cuBLAS falls back to slow sm80 kernels for weight-gradient GEMMs that contract over a token
    # count that is not a multiple of 8, e.g. 8190 = 21 × 390 (bench/results: 5B step 0.90 → 0.8x s).
    token_multiple: int = 1
    # Action control (RynnWorld-Teleop, see models/control.py); "none" is the plain Wan2.2 model.
    # The released code's modes: "add" (no alignment), "add-plus" (aligned), "concat" (the ablation).
    control: Literal["none", "add", "add-plus", "concat"] = "none"
    control_channels: int = 48  # channels of the skeleton video's VAE latent
    control_gate_init: float = 0.1  # α at initialisation
    control_stats_momentum: float = 0.01  # momentum of the running statistics (add-plus)
    # μ_z, σ_z without ground truth (add-plus): "running" = the running clean-video-latent statistics
    # recorded in training (the control's own when none were); "prior" = the fixed prior below.
    control_video_stats: Literal["running", "prior"] = "running"
    control_prior_mean: float = 0.0  # μ_z of the fixed prior (control_video_stats="prior")
    control_prior_std: float = 0.8  # σ_z likewise
    # Serving: block linears as FP8 e4m3 GEMMs with per-channel weight scales (fp8.quantize_dit)
    # and activation scales per token at every call, or "static": one calibrated scale per linear
    # (fp8.calibrate; no max reduction per call, the quantization fuses into the producer).
    fp8: bool = False
    fp8_activations: Literal["per_token", "static"] = "per_token"

    def __post_init__(self) -> None:
        if self.control not in CONTROL_MODES:
            raise ValueError(f"control must be one of {CONTROL_MODES} (add: no alignment, add-plus: aligned), "
                             f"got {self.control!r}")
        if self.control_video_stats not in ("running", "prior"):
            raise ValueError(f"control_video_stats must be 'running' or 'prior', got {self.control_video_stats!r}")
        if self.token_multiple < 1:
            raise ValueError(f"token_multiple must be ≥ 1, got {self.token_multiple}")
        if self.fp8_activations not in ("per_token", "static"):
            raise ValueError(f"fp8_activations must be 'per_token' or 'static', got {self.fp8_activations!r}")
        if self.fp8_activations == "static" and not self.fp8:
            raise ValueError("fp8_activations='static' needs fp8=True")

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def patch_dim_out(self) -> int:
        return math.prod(self.patch_size) * self.out_channels

    @classmethod
    def ti2v_5b(cls, **overrides) -> "WanDiTConfig":
        """Wan2.2-TI2V-5B (the defaults)."""
        return cls(**overrides)

    @classmethod
    def tiny(cls, **overrides) -> "WanDiTConfig":
        """A few-thousand-parameter model for tests and the CPU demo."""
        base = dict(dim=48, num_layers=2, num_heads=4, ffn_dim=96, freq_dim=32,
                    in_channels=8, out_channels=8, control_channels=8, text_dim=24, text_len=16)
        return cls(**{**base, **overrides})


# --------------------------------------------------------------------------------------------------
# Small pieces
# --------------------------------------------------------------------------------------------------


def timestep_sinusoid(t: jax.Array, dim: int) -> jax.Array:
    """[cos | sin] embedding of (fractional) timesteps, float32: (...,) → (..., dim).

    The frequency table is a host constant, correctly rounded to float32: arguments reach ~1000 rad,
    so a 1-ulp difference in a frequency (XLA's exp vs libm's) would move them by ~3e-5."""
    half = dim // 2
    exponent = np.float32(-math.log(10000.0)) * np.arange(half, dtype=np.float32) / np.float32(half)
    freqs = np.exp(exponent.astype(np.float64)).astype(np.float32)
    arg = t.astype(jnp.float32)[..., None] * jnp.asarray(freqs)
    return jnp.concatenate([jnp.cos(arg), jnp.sin(arg)], axis=-1)


def attention_impl(cfg: WanDiTConfig, dtype: jnp.dtype) -> str | None:
    """What `jax.nn.dot_product_attention` runs: cuDNN flash on a GPU backend in bf16/fp16 under
    "auto", else XLA (also for TPU compiles from a CPU host: the backend here is CPU)."""
    if cfg.attention != "auto":
        return cfg.attention
    if jax.default_backend() == "gpu" and dtype in (jnp.bfloat16, jnp.float16):
        return "cudnn"
    return "xla"


def modulate(x_bfsd: jax.Array, shift_bfd: jax.Array, scale_bfd: jax.Array) -> jax.Array:
    """x·(1+scale)+shift with per-frame (B, F, D) modulation broadcast over the frame's S tokens."""
    return x_bfsd * (1.0 + scale_bfd[:, :, None]) + shift_bfd[:, :, None]


def pad_tokens(x_bld: jax.Array, rope_cs: tuple[jax.Array, jax.Array], multiple: int
               ) -> tuple[jax.Array, tuple[jax.Array, jax.Array], int]:
    """Tail-pad tokens (B, L, D) and their RoPE cos/sin (L, H/2) to a multiple of `multiple`
    (WanDiTConfig.token_multiple): zero tokens with the identity rotation. Returns (x, rope, pad)."""
    pad = -x_bld.shape[1] % multiple
    if pad:
        cos, sin = rope_cs
        x_bld = jnp.pad(x_bld, ((0, 0), (0, pad), (0, 0)))
        rope_cs = jnp.pad(cos, ((0, pad), (0, 0)), constant_values=1.0), jnp.pad(sin, ((0, pad), (0, 0)))
    return x_bld, rope_cs, pad


def frames_to_tokens(a_bfd: jax.Array, tokens_per_frame: int, pad: int) -> jax.Array:
    """Per-frame values (B, F, D) repeated over each frame's tokens, then `pad` zero rows: (B, F·S + pad, D).
    A broadcast XLA fuses into its consumer, not a materialised array."""
    b, f, d = a_bfd.shape
    a_bld = jnp.broadcast_to(a_bfd[:, :, None], (b, f, tokens_per_frame, d)).reshape(b, f * tokens_per_frame, d)
    return jnp.pad(a_bld, ((0, 0), (0, pad), (0, 0)))


# --------------------------------------------------------------------------------------------------
# Attention and block
# --------------------------------------------------------------------------------------------------


def attention(cfg: WanDiTConfig, q_blnh: jax.Array, k_bsnh: jax.Array, v_bsnh: jax.Array, *,
              mask_bnls: jax.Array | None = None, kv_len_b: jax.Array | None = None) -> jax.Array:
    """Scaled dot-product attention of head-split q, k, v (cuDNN flash where `attention_impl`
    picks it), heads merged: (B, L, D)."""
    q_blnh = constrain(q_blnh, ("act_batch", "act_len", "act_heads", None))
    # K/V pinned too: left to propagation they can pick up the FSDP-sharded weights' layout,
    # which cuDNN attention's partitioner rejects (seen on 2 H200s with fsdp=2).
    k_bsnh, v_bsnh = (constrain(a, ("act_batch", "act_kv_len", "act_heads", None)) for a in (k_bsnh, v_bsnh))
    out_blnh = jax.nn.dot_product_attention(
        q_blnh, k_bsnh, v_bsnh, mask=mask_bnls, key_value_seq_lengths=kv_len_b,
        implementation=attention_impl(cfg, q_blnh.dtype))
    return out_blnh.reshape(*out_blnh.shape[:2], cfg.dim)


class WanAttention(nnx.Module):
    """Multi-head attention with RMSNorm on q and k across all heads (before the head split)."""

    def __init__(self, cfg: WanDiTConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d = cfg.dim
        self.q = linear(cfg, d, d, ("embed", "heads"), rngs, fp8=cfg.fp8)
        self.k = linear(cfg, d, d, ("embed", "heads"), rngs, fp8=cfg.fp8)
        self.v = linear(cfg, d, d, ("embed", "heads"), rngs, fp8=cfg.fp8)
        self.o = linear(cfg, d, d, ("heads", "embed"), rngs, fp8=cfg.fp8)
        self.norm_q = param(rngs, nnx.initializers.ones_init(), (d,), cfg.param_dtype, ("heads",))
        self.norm_k = param(rngs, nnx.initializers.ones_init(), (d,), cfg.param_dtype, ("heads",))
        # Serving layout only (`fuse_qkv`): q, k, v as one (D, 3D) linear, and q/k/v set to None.
        self.qkv: nnx.Linear | Fp8Linear | None = nnx.data(None)

    # Pieces, so the causal student can cache K/V and attend over a cache with the same weights.

    def query(self, x_bld: jax.Array, rope_cs: tuple[jax.Array, jax.Array] | None = None) -> jax.Array:
        """Normed, head-split (and rotated) queries (B, L, N, H)."""
        return self._query_heads(self.q(x_bld.astype(jnp.dtype(self.cfg.dtype))), rope_cs)

    def key_value(self, kv_bsd: jax.Array, rope_cs: tuple[jax.Array, jax.Array] | None = None
                  ) -> tuple[jax.Array, jax.Array]:
        """Normed keys (rotated when rope_cs is given) and values, each (B, S, N, H)."""
        if self.k is None:
            raise ValueError("this attention's k/v projections were fused out of the block (dit.unrolled's "
                             "fuse_cross_kv / fuse_qkv): use WanDiT.text_kv or self_qkv")
        kv_bsd = kv_bsd.astype(jnp.dtype(self.cfg.dtype))
        return self._key_value_heads(self.k(kv_bsd), self.v(kv_bsd), rope_cs)

    def self_qkv(self, x_bld: jax.Array, q_rope: tuple[jax.Array, jax.Array] | None,
                 k_rope: tuple[jax.Array, jax.Array] | None) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Self-attention queries, keys, values (B, L, N, H) of one input; one GEMM when the
        projections are fused (the serving layout, `fuse_qkv`)."""
        x_bld = x_bld.astype(jnp.dtype(self.cfg.dtype))
        if self.qkv is None:
            q, k, v = self.q(x_bld), self.k(x_bld), self.v(x_bld)
        else:
            q, k, v = jnp.split(self.qkv(x_bld), 3, axis=-1)
        return self._query_heads(q, q_rope), *self._key_value_heads(k, v, k_rope)

    def _heads(self, a_bld: jax.Array) -> jax.Array:
        return a_bld.reshape(*a_bld.shape[:2], self.cfg.num_heads, self.cfg.head_dim)

    def _query_heads(self, q_bld: jax.Array, rope_cs: tuple[jax.Array, jax.Array] | None) -> jax.Array:
        q_blnh = self._heads(rms_norm(q_bld, self.norm_q[...], self.cfg.eps))
        return q_blnh if rope_cs is None else rope.apply_rope(q_blnh, *rope_cs)

    def _key_value_heads(self, k_bsd: jax.Array, v_bsd: jax.Array, rope_cs: tuple[jax.Array, jax.Array] | None
                         ) -> tuple[jax.Array, jax.Array]:
        k_bsnh = self._heads(rms_norm(k_bsd, self.norm_k[...], self.cfg.eps))
        return (k_bsnh if rope_cs is None else rope.apply_rope(k_bsnh, *rope_cs)), self._heads(v_bsd)

    def attend(self, q_blnh: jax.Array, k_bsnh: jax.Array, v_bsnh: jax.Array, *,
               mask_bnls: jax.Array | None = None, kv_len_b: jax.Array | None = None) -> jax.Array:
        """Attention + output projection. `kv_len_b` masks keys past a per-sample length (a padding
        mask, which cuDNN supports natively); `mask_bnls` is a general boolean mask."""
        return self.o(self.attention(q_blnh, k_bsnh, v_bsnh, mask_bnls=mask_bnls, kv_len_b=kv_len_b))

    def attention(self, q_blnh: jax.Array, k_bsnh: jax.Array, v_bsnh: jax.Array, *,
                  mask_bnls: jax.Array | None = None, kv_len_b: jax.Array | None = None) -> jax.Array:
        """`attend` without the output projection: heads merged, (B, L, D)."""
        return attention(self.cfg, q_blnh, k_bsnh, v_bsnh, mask_bnls=mask_bnls, kv_len_b=kv_len_b)

    def __call__(self, x_bld: jax.Array, ctx_bsd: jax.Array | None = None,
                 rope_cs: tuple[jax.Array, jax.Array] | None = None, kv_len_b: jax.Array | None = None
                 ) -> jax.Array:
        if ctx_bsd is None:
            q_blnh, k_bsnh, v_bsnh = self.self_qkv(x_bld, rope_cs, rope_cs)
        else:
            q_blnh, (k_bsnh, v_bsnh) = self.query(x_bld, rope_cs), self.key_value(ctx_bsd, rope_cs)
        return self.attend(q_blnh, k_bsnh, v_bsnh, kv_len_b=kv_len_b)


class WanBlock(nnx.Module):
    """x += SA(mod(LN x))·g;  x += CA(LN_affine x, ctx);  x += FFN(mod(LN x))·g."""

    def __init__(self, cfg: WanDiTConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d = cfg.dim
        self.self_attn = WanAttention(cfg, rngs=rngs)
        self.cross_attn = WanAttention(cfg, rngs=rngs)
        # The cross-attention LayerNorm is the only affine one in the block.
        self.norm_cross_scale = param(rngs, nnx.initializers.ones_init(), (d,), cfg.param_dtype, ("embed",))
        self.norm_cross_bias = param(rngs, nnx.initializers.zeros_init(), (d,), cfg.param_dtype, ("embed",))
        self.ffn_up = linear(cfg, d, cfg.ffn_dim, ("embed", "mlp"), rngs, fp8=cfg.fp8)
        self.ffn_down = linear(cfg, cfg.ffn_dim, d, ("mlp", "embed"), rngs, fp8=cfg.fp8)
        # Learned offsets added to the time projection: shift/scale/gate for attention, then FFN.
        self.modulation = param(rngs, nnx.initializers.normal(d ** -0.5), (6, d), cfg.param_dtype,
                                 ("modulation", "embed"))

    def __call__(self, x_bld: jax.Array, ctx_bsd: jax.Array | None, tproj_bf6d: jax.Array,
                 rope_cs: tuple[jax.Array, jax.Array], num_frames: int, pad: int = 0,
                 cross_kv: tuple[jax.Array, jax.Array] | None = None) -> jax.Array:
        """`pad` tail tokens (see WanDiTConfig.token_multiple) are kept out of every real token's
        self-attention. `cross_kv`: this layer's precomputed text K/V (then `ctx_bsd` is unused)."""
        kv_len_b = None if pad == 0 else jnp.full((x_bld.shape[0],), x_bld.shape[1] - pad, jnp.int32)
        return self.forward(x_bld, ctx_bsd, tproj_bf6d, num_frames, pad=pad, cross_kv=cross_kv,
                            self_attention=lambda attn, h: (attn(h, rope_cs=rope_cs, kv_len_b=kv_len_b), None))[0]

    def forward(self, x_bld: jax.Array, ctx_bsd: jax.Array | None, tproj_bf6d: jax.Array, num_frames: int,
                *, self_attention: Callable[[WanAttention, jax.Array], tuple[jax.Array, Any]],
                cross_kv: tuple[jax.Array, jax.Array] | None = None, pad: int = 0) -> tuple[jax.Array, Any]:
        """The block with a pluggable self-attention `(attn, h_bld) -> (out_bld, aux)` (the causal
        student attends over its KV cache and returns the new K/V as aux) and optionally
        precomputed text K/V. The last `pad` tokens belong to no frame (they get zero modulation).
        Returns (x, aux)."""
        x_bld, aux = self.self_attention_residual(x_bld, tproj_bf6d, num_frames, self_attention, pad)
        return self.text_ffn_residual(x_bld, ctx_bsd, tproj_bf6d, num_frames, cross_kv, pad), aux

    def _frame_ops(self, x_bld: jax.Array, tproj_bf6d: jax.Array, num_frames: int, pad: int):
        """The six modulation terms (B, F, D) and the per-frame `modulated(h, shift, scale)`,
        `gated(h, gate)` for tokens shaped like x."""
        b, l, d = x_bld.shape
        mod = self.modulation[...].astype(jnp.float32)[None, None] + tproj_bf6d  # (B, F, 6, D)
        if pad == 0:  # per-frame modulation as a reshape of the tokens into frames
            as_frames = lambda a: a.reshape(b, num_frames, l // num_frames, d)  # noqa: E731
            modulated = lambda h, shift, scale: modulate(as_frames(h), shift, scale).reshape(b, l, d)  # noqa: E731
            gated = lambda h, gate: (as_frames(h) * gate[:, :, None]).reshape(b, l, d)  # noqa: E731
        else:  # the frame reshape would cut across the pads: broadcast the (B, F, D) terms instead
            per_token = lambda a: frames_to_tokens(a, (l - pad) // num_frames, pad)  # noqa: E731
            modulated = lambda h, shift, scale: h * (1.0 + per_token(scale)) + per_token(shift)  # noqa: E731
            gated = lambda h, gate: h * per_token(gate)  # noqa: E731
        return jnp.moveaxis(mod, 2, 0), modulated, gated

    def self_attention_residual(self, x_bld: jax.Array, tproj_bf6d: jax.Array, num_frames: int,
                                self_attention: Callable[[WanAttention, jax.Array], tuple[jax.Array, Any]],
                                pad: int = 0) -> tuple[jax.Array, Any]:
        """x + SA(mod(LN x))·g: the first third of the block (RynnWorld-4D puts its joint
        attention between this and `text_ffn_residual`)."""
        (shift_a, scale_a, gate_a, *_), modulated, gated = self._frame_ops(x_bld, tproj_bf6d, num_frames, pad)
        h = modulated(layer_norm(x_bld, self.cfg.eps), shift_a, scale_a)
        h, aux = self_attention(self.self_attn, h)
        return x_bld + gated(h.astype(jnp.float32), gate_a), aux

    def text_ffn_residual(self, x_bld: jax.Array, ctx_bsd: jax.Array | None, tproj_bf6d: jax.Array,
                          num_frames: int, cross_kv: tuple[jax.Array, jax.Array] | None = None,
                          pad: int = 0) -> jax.Array:
        """x += CA(LN_affine x, ctx);  x += FFN(mod(LN x))·g: the rest of the block."""
        cfg = self.cfg
        (*_, shift_f, scale_f, gate_f), modulated, gated = self._frame_ops(x_bld, tproj_bf6d, num_frames, pad)
        h = layer_norm(x_bld, cfg.eps) * self.norm_cross_scale[...].astype(jnp.float32) \
            + self.norm_cross_bias[...].astype(jnp.float32)
        if cross_kv is None:
            h = self.cross_attn(h, ctx_bsd)
        else:
            h = self.cross_attn.attend(self.cross_attn.query(h), *cross_kv)
        x_bld = x_bld + h.astype(jnp.float32)

        h = modulated(layer_norm(x_bld, cfg.eps), shift_f, scale_f)
        h = self.ffn_up(h.astype(jnp.dtype(cfg.dtype)))
        h = constrain(h, ("act_batch", "act_len", "act_mlp"))
        h = self.ffn_down(jax.nn.gelu(h, approximate=True))
        x_bld = x_bld + gated(h.astype(jnp.float32), gate_f)
        return constrain(x_bld, ("act_batch", "act_len", "act_embed"))


# Primitives of JAX's cuDNN flash attention forward (jax.nn.dot_product_attention(implementation="cudnn")):
# their outputs — the attention output and the softmax statistics — are what its backward needs.
ATTENTION_FWD_PRIMITIVES = ("dot_product_attention_fwd_wrapper", "dot_product_attention_fwd")


def save_dots_and_attention(prim, *avals, **params) -> bool:
    """Remat policy: the linear layers' outputs (as "save_dots") plus the fused attention kernel's
    outputs, so the backward pass does not run the attention forward again (on one H200 the
    recomputed self-attention forwards cost ~45 ms of a 0.9 s 5B step). Costs the attention output
    and statistics per block: ~100 MB per block at 8190 tokens, bf16."""
    if prim.name in ATTENTION_FWD_PRIMITIVES:
        return True
    return jax.checkpoint_policies.dots_with_no_batch_dims_saveable(prim, *avals, **params)


_REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "save_dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "save_dots_attn": save_dots_and_attention,
}


# --------------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------------


def patch_embed_params(cfg: WanDiTConfig, rngs: nnx.Rngs) -> tuple[nnx.Param, nnx.Param]:
    """The patch-embedding Conv3d as a (pt, ph, pw, C_in, D) kernel and its bias."""
    pt, ph, pw = cfg.patch_size
    kernel = param(rngs, nnx.initializers.xavier_uniform(in_axis=(0, 1, 2, 3), out_axis=4),
                   (pt, ph, pw, cfg.in_channels, cfg.dim), cfg.param_dtype,
                   ("patch", "patch", "patch", "in_channels", "embed"))
    return kernel, param(rngs, nnx.initializers.zeros_init(), (cfg.dim,), cfg.param_dtype, ("embed",))


M = TypeVar("M", bound=nnx.Module)


def stacked(make: Callable[[nnx.Rngs], M], n: int, rngs: nnx.Rngs) -> M:
    """`n` modules made by `make(rngs)`, their variables stacked on a leading "layers" axis (what
    `WanDiT.scan_blocks` runs over), each layer from its own split of `rngs`."""
    @nnx.split_rngs(splits=n)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
    def make_all(rngs: nnx.Rngs) -> M:
        return make(rngs)

    return make_all(rngs)


class WanDiT(nnx.Module):
    """Velocity prediction v(z_t, t, text) for latents (B, T, H, W, C_in) → (B, T, H, W, C_out)."""

    def __init__(self, cfg: WanDiTConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d = cfg.dim
        self.patch_embed, self.patch_embed_bias = patch_embed_params(cfg, rngs)
        self.text_embed_1 = linear(cfg, cfg.text_dim, d, ("text_embed", "embed"), rngs)
        self.text_embed_2 = linear(cfg, d, d, ("embed", "embed"), rngs)
        self.time_embed_1 = linear(cfg, cfg.freq_dim, d, ("time_freq", "embed"), rngs)
        self.time_embed_2 = linear(cfg, d, d, ("embed", "embed"), rngs)
        self.time_proj = linear(cfg, d, 6 * d, ("embed", "mlp"), rngs)

        self.blocks = stacked(lambda r: WanBlock(cfg, rngs=r), cfg.num_layers, rngs)
        self.head_modulation = param(rngs, nnx.initializers.normal(d ** -0.5), (2, d), cfg.param_dtype,
                                      ("modulation", "embed"))
        self.head = linear(cfg, d, cfg.patch_dim_out, ("embed", "out_channels"), rngs)
        self.control = ControlBranch(cfg, rngs=rngs) if cfg.control != "none" else None
        # Serving layout only (`fuse_cross_kv`): every block's cross-attention k, v as one
        # (D, layers·2·D) linear over the text context, and the blocks' own k/v set to None.
        self.fused_text_kv: nnx.Linear | Fp8Linear | None = nnx.data(None)

    # -- pieces that later modules (control branch, causal student) reuse -------------------------

    def embed_patches(self, z_bthwc: jax.Array) -> jax.Array:
        """(B, T, H, W, C) latents → (B, L, D) tokens, L = T/pt · H/ph · W/pw in (t, h, w) order."""
        token_grid(z_bthwc.shape, self.cfg)
        return patchify_embed(z_bthwc, self.patch_embed[...], self.patch_embed_bias[...],
                              self.cfg.patch_size, jnp.dtype(self.cfg.dtype))

    def embed_text(self, ctx_bsk: jax.Array) -> jax.Array:
        return self.text_embed_2(jax.nn.gelu(self.text_embed_1(ctx_bsk), approximate=True))

    def embed_time(self, t_bf: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Per-frame time embedding (B, F, D) and block modulation input (B, F, 6, D), float32."""
        cfg = self.cfg
        f32 = lambda lin, a: a @ lin.kernel[...].astype(jnp.float32) + lin.bias[...].astype(jnp.float32)  # noqa: E731
        e = timestep_sinusoid(t_bf, cfg.freq_dim)
        temb = f32(self.time_embed_2, jax.nn.silu(f32(self.time_embed_1, e)))
        tproj = f32(self.time_proj, jax.nn.silu(temb))
        return temb, tproj.reshape(*tproj.shape[:-1], 6, cfg.dim)

    def text_kv(self, ctx_bsd: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Cross-attention K/V of every layer for an embedded text context (B, S, D): two
        (layers, B, S, N, H) arrays. One GEMM when they are fused (`fuse_cross_kv`)."""
        if self.fused_text_kv is None:
            return self.scan_blocks(lambda block, x, _: (x, block.cross_attn.key_value(ctx_bsd)), jnp.zeros(()))[1]
        b, s, d = ctx_bsd.shape
        kv_bsl2d = self.fused_text_kv(ctx_bsd.astype(jnp.dtype(self.cfg.dtype))).reshape(b, s, -1, 2, d)
        kv = [block.cross_attn._key_value_heads(kv_bsl2d[:, :, i, 0], kv_bsl2d[:, :, i, 1], None)
              for i, block in enumerate(self.blocks)]
        return jnp.stack([k for k, _ in kv]), jnp.stack([v for _, v in kv])

    def run_blocks(self, x_bld: jax.Array, ctx_bsd: jax.Array, tproj_bf6d: jax.Array,
                   rope_cs: tuple[jax.Array, jax.Array], num_frames: int, pad: int = 0) -> jax.Array:
        """All blocks (scan_blocks: one `lax.scan` over stacked layers, a loop over `unrolled` ones)."""
        if self.fused_text_kv is not None:  # the serving layout: all layers' text K/V in one GEMM first
            return self.scan_blocks(
                lambda block, x, kv: (block(x, None, tproj_bf6d, rope_cs, num_frames, pad, cross_kv=kv), None),
                x_bld, self.text_kv(ctx_bsd))[0]
        return self.scan_blocks(
            lambda block, x, _: (block(x, ctx_bsd, tproj_bf6d, rope_cs, num_frames, pad), None), x_bld)[0]

    def scan_blocks(self, layer_fn: Callable[[WanBlock, jax.Array, Any], tuple[jax.Array, Any]],
                    x_bld: jax.Array, layer_xs: Any = None, num_layers: int | None = None) -> tuple[jax.Array, Any]:
        """`layer_fn(block, x, xs_l) -> (x, ys_l)` over the first `num_layers` layers (default all)
        with per-layer inputs `layer_xs` (leading layer axis) → (x, stacked ys). The carry `x` may
        be any pytree of arrays.

        Stacked blocks (training, checkpoints): plain `lax.scan` over the split block state, not
        `nnx.scan`: the model may itself be used inside a caller's scan (the sampler's step loop, the
        causal rollout), where NNX transforms refuse modules created at an outer trace level.
        Per-layer blocks (`unrolled`, serving): a Python loop, one layer after another."""
        cfg = self.cfg

        def body(x: jax.Array, inputs, graphdef) -> tuple[jax.Array, Any]:
            layer_state, xs_l = inputs
            return layer_fn(nnx.merge(graphdef, layer_state), x, xs_l)

        if cfg.remat != "none":
            body = jax.checkpoint(body, policy=_REMAT_POLICIES[cfg.remat], static_argnums=(2,))
        if isinstance(self.blocks, nnx.List):
            ys = []
            for i, block in enumerate(self.blocks[:num_layers]):
                graphdef, layer_state = nnx.split(block)
                x_bld, y = body(x_bld, (layer_state, jax.tree.map(lambda a: a[i], layer_xs)), graphdef)
                ys.append(y)
            return x_bld, jax.tree.map(lambda *a: jnp.stack(a), *ys)
        graphdef, state = nnx.split(self.blocks)
        if num_layers is not None and num_layers != cfg.num_layers:
            state = jax.tree.map(lambda a: a[:num_layers], state)
        return jax.lax.scan(lambda x, inputs: body(x, inputs, graphdef), x_bld, (state, layer_xs),
                            unroll=cfg.scan_unroll)

    def project_out(self, x_bld: jax.Array, temb_bfd: jax.Array, grid_thw: tuple[int, int, int],
                    head: nnx.Linear | None = None) -> jax.Array:
        """Modulated final norm and the output linear (`head`, default this model's), unpatchified."""
        cfg = self.cfg
        head = self.head if head is None else head
        b, l, d = x_bld.shape
        f = grid_thw[0]
        mod = self.head_modulation[...].astype(jnp.float32)[None, None] + temb_bfd[:, :, None]
        shift, scale = mod[:, :, 0], mod[:, :, 1]
        h = modulate(layer_norm(x_bld, cfg.eps).reshape(b, f, l // f, d), shift, scale).reshape(b, l, d)
        out = head(h.astype(jnp.dtype(cfg.dtype)))
        return unpatchify(out.astype(jnp.float32), grid_thw, cfg)

    def __call__(self, z_bthwc: jax.Array, t_bf: jax.Array, ctx_bsk: jax.Array,
                 control_bthwc: jax.Array | None = None, *, gt_latent_bthwc: jax.Array | None = None,
                 train: bool = False, null_control: bool = False) -> jax.Array:
        """Velocity for latents z (B, T, H, W, C), per-frame timesteps t (B, T) in [0, 1000],
        and text context (B, S, text_dim) (S = cfg.text_len for official weights). Returns float32.

        With a control branch, `control_bthwc` is the skeleton video's latent (same T, H, W as z);
        `gt_latent_bthwc` (the clean video latent; required in training with add-plus) supplies
        μ_z, σ_z; `train=True` updates the running stats. `null_control=True` is the null condition:
        the branch is skipped (no control latent needed) and the output is the base model's."""
        cfg = self.cfg
        grid = token_grid(z_bthwc.shape, cfg)
        if t_bf.shape != (z_bthwc.shape[0], grid[0]):
            raise ValueError(f"timesteps must be per latent frame, shape {(z_bthwc.shape[0], grid[0])}; "
                             f"got {t_bf.shape}")
        x_bld = self.embed_patches(z_bthwc).astype(jnp.float32)
        if self.control is not None and not null_control:
            if control_bthwc is None:
                raise ValueError("this model has a control branch: pass the control latent (or null_control=True)")
            if control_bthwc.shape[:4] != z_bthwc.shape[:4]:
                raise ValueError(f"control latent {control_bthwc.shape} does not align with {z_bthwc.shape}")
            x_bld = x_bld + self.control(control_bthwc, gt_latent_bthwc, train)
        elif self.control is None and control_bthwc is not None:
            raise ValueError("a control latent was given but cfg.control is 'none'")
        ctx_bsd = self.embed_text(ctx_bsk)
        temb, tproj = self.embed_time(t_bf)
        rope_cs = rope.rope_cos_sin(grid, cfg.head_dim, cfg.rope_theta, max_len=cfg.rope_max_len)
        l = x_bld.shape[1]
        x_bld, rope_cs, pad = pad_tokens(x_bld, rope_cs, cfg.token_multiple)  # pads: masked as keys
        x_bld = self.run_blocks(x_bld, ctx_bsd, tproj, rope_cs, grid[0], pad)
        return self.project_out(x_bld[:, :l], temb, grid)


def token_grid(shape_bthwc: tuple[int, ...], cfg: WanDiTConfig) -> tuple[int, int, int]:
    _, t, h, w, c = shape_bthwc
    pt, ph, pw = cfg.patch_size
    if c != cfg.in_channels:
        raise ValueError(f"latent has {c} channels, model expects {cfg.in_channels}")
    if t % pt or h % ph or w % pw:
        raise ValueError(f"latent (T, H, W) = {(t, h, w)} is not divisible by patch size {cfg.patch_size}")
    return t // pt, h // ph, w // pw


def unpatchify(x_blp: jax.Array, grid_thw: tuple[int, int, int], cfg: WanDiTConfig) -> jax.Array:
    """(B, L, pt·ph·pw·C) → (B, T, H, W, C); each token's outputs are patch-major, channel-minor."""
    b = x_blp.shape[0]
    f, h, w = grid_thw
    pt, ph, pw = cfg.patch_size
    x = x_blp.reshape(b, f, h, w, pt, ph, pw, cfg.out_channels)
    return x.transpose(0, 1, 4, 2, 5, 3, 6, 7).reshape(b, f * pt, h * ph, w * pw, cfg.out_channels)


def init_dit(cfg: WanDiTConfig, seed: int = 0) -> WanDiT:
    return build.init_model(WanDiT, cfg, seed)


def abstract_dit(cfg: WanDiTConfig) -> WanDiT:
    """The model with ShapeDtypeStruct leaves: shapes and count without allocating anything."""
    return build.abstract_model(WanDiT, cfg)


def unrolled(model: WanDiT, *, fuse_self_qkv: bool = True, fuse_text_kv: bool = True) -> WanDiT:
    """The serving layout: the layer scan fully unrolled and every block a module of its own
    (`blocks` an nnx.List of per-layer weights instead of (num_layers, …) stacked arrays), for
    serving, where nothing is differentiated. Copies the block weights out of the stacked arrays
    once (drop the stacked model to free them); the other parameters are shared.

    Why (H200, docs/PERFORMANCE.md): the scanned 5B forward at 1170 tokens spent 7.5 of its 28.5 ms
    copying each layer's weights out of the stacked arrays; unrolling the scan made the slices
    static, but XLA still copies a static slice that feeds a cuBLAS call (the bf16 FFN
    up-projection, every FP8 GEMM's weight). Per-layer arrays need no slicing: bf16 forward 25.2 →
    24.4 ms, causal block step −13%, compile 68 → 16 s. `fuse_self_qkv`: see `fuse_qkv`;
    `fuse_text_kv`: see `fuse_cross_kv`."""
    if isinstance(model.blocks, nnx.List):  # already unrolled
        return model
    cfg = dataclasses.replace(model.cfg, scan_unroll=model.cfg.num_layers)
    graphdef, _ = nnx.split(abstract_dit(cfg))
    out = nnx.merge(graphdef, nnx.state(model))
    stacked = nnx.to_pure_dict(nnx.state(model.blocks))
    slice_layer = jax.jit(lambda tree, i: jax.tree.map(lambda a: a[i], tree))
    layers = []
    for i in range(cfg.num_layers):
        block_graphdef, block_state = nnx.split(build.abstract_model(WanBlock, cfg))
        nnx.replace_by_pure_dict(block_state, slice_layer(stacked, i))
        block = nnx.merge(block_graphdef, block_state)
        if fuse_self_qkv:
            fuse_qkv(block.self_attn)
        layers.append(block)
    out.blocks = nnx.List(layers)
    if fuse_text_kv:
        fuse_cross_kv(out)
    return out


def fuse_qkv(attn: WanAttention) -> None:
    """In place: replaces a self-attention's q, k, v linears by one (D, 3D) linear (`attn.qkv`;
    FP8 kernels stay quantized per output channel, so their scales just concatenate). Serving
    only: checkpoints and training keep the three (diffusers' layout).

    Why: XLA's GPU dot merger joins the three GEMMs that read the same input anyway, but with
    per-layer weights it then concatenates the three weights on every call (40 concatenations per
    FP8 forward, ≈ 2 × 57 MB per bf16 block); a pre-concatenated kernel makes it one plain GEMM."""
    parts = [attn.q, attn.k, attn.v]
    if attn.qkv is not None or not _plain_linears(parts):
        return  # already fused, or adapted (LoRA): left as three linears
    attn.qkv = _concatenated_linear(attn.cfg, parts)
    attn.q = attn.k = attn.v = None


def fuse_cross_kv(model: WanDiT) -> None:
    """In place, on the serving layout (`unrolled`): every block's cross-attention k and v
    linears become one (D, layers·2·D) linear (`model.fused_text_kv`, layer-major, k before v), so
    `WanDiT.text_kv` computes all layers' text K/V in one GEMM.

    Why: all 60 projections read the same text context, so XLA's dot merger joins groups of them
    and, with per-layer weights, concatenates those weights on every call (15 merges per bf16
    forward); one GEMM measured −2.0 ms of a 26 ms 1170-token forward (H200, docs/PERFORMANCE.md).
    A single-device layout, like `fuse_qkv`'s: on a tensor-parallel mesh its column split would fall
    between layers, not heads."""
    if not isinstance(model.blocks, nnx.List):
        raise ValueError("fuse_cross_kv: expects the per-layer serving layout (dit.unrolled)")
    parts = [p for block in model.blocks for p in (block.cross_attn.k, block.cross_attn.v)]
    if model.fused_text_kv is not None or not _plain_linears(parts):
        return  # already fused, or adapted (LoRA)
    model.fused_text_kv = _concatenated_linear(model.cfg, parts)
    for block in model.blocks:
        block.cross_attn.k = block.cross_attn.v = None


def _plain_linears(parts: list) -> bool:
    return all(type(p) in (nnx.Linear, Fp8Linear) for p in parts)


def _concatenated_linear(cfg: WanDiTConfig, parts: list) -> nnx.Linear | Fp8Linear:
    """One linear computing the (D → D) `parts` side by side: kernels, biases and FP8 per-channel
    scales concatenate on the output axis; a static FP8 input scale (one per linear, all reading
    the same input) becomes their max, which clips none of them."""
    with nnx.use_eager_sharding(False):
        fused = nnx.eval_shape(lambda: linear(cfg, cfg.dim, len(parts) * cfg.dim, ("embed", "heads"),
                                              nnx.Rngs(0), fp8=isinstance(parts[0], Fp8Linear)))
    graphdef, state = nnx.split(fused)
    values = nnx.to_pure_dict(state)
    for name, shape in values.items():
        arrays = [getattr(p, name)[...] for p in parts]
        if shape.shape == arrays[0].shape:  # FP8 static input_scale
            values[name] = jnp.max(jnp.stack(arrays), axis=0)
            continue
        axis = next(i for i, (n, m) in enumerate(zip(shape.shape, arrays[0].shape)) if n != m)
        values[name] = jnp.concatenate(arrays, axis=axis)
    nnx.replace_by_pure_dict(state, values)
    return nnx.merge(graphdef, state)


def dit_from_params(cfg: WanDiTConfig, params: dict) -> WanDiT:
    """A model whose parameters are the given pure dict (e.g. from the converter or a checkpoint)."""
    return build.model_from_params(WanDiT, cfg, params)
