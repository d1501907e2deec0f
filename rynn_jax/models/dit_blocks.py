"""The DiT's transformer block and its pieces: timestep embedding, per-frame modulation, token
padding, attention (cuDNN flash or XLA), the self/cross-attention module, the block itself, and
the named remat policies `WanDiT.scan_blocks` applies to it (models/dit.py)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rynn_jax.models import fp8_attention
from rynn_jax.models import rope
from rynn_jax.models.dit_config import WanDiTConfig
from rynn_jax.models.fp8_linear import Fp8Linear
from rynn_jax.models.layers import layer_norm, linear, param, rms_norm
from rynn_jax.sharding import constrain

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
    impl = attention_impl(cfg, q_blnh.dtype)
    if impl == "cudnn_fp8" and mask_bnls is None and kv_len_b is None:
        out_blnh = fp8_attention.cudnn_attention(q_blnh, k_bsnh, v_bsnh)
    else:
        out_blnh = jax.nn.dot_product_attention(
            q_blnh, k_bsnh, v_bsnh, mask=mask_bnls, key_value_seq_lengths=kv_len_b,
            implementation="cudnn" if impl == "cudnn_fp8" else impl)
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
