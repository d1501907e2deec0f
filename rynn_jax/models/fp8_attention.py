"""FP8 (e4m3) scaled dot-product attention for serving: cuDNN's FP8 flash attention on Hopper,
and an emulation of its arithmetic in float32 that runs anywhere (the tests' oracle side).

`WanDiTConfig.attention = "cudnn_fp8"` routes every unmasked attention of the model here (the
self-attention over a clip's tokens, the text cross-attention); masked or padded attention (the
causal student's cache, `token_multiple` padding) stays on bf16 cuDNN. Forward only: nothing
trains through it.

Scaling (per tensor, from this call's own max |x|, so nothing is calibrated):

    q8 = q · 448/amax(q)   k8, v8 likewise                  e4m3 inputs
    S  = (q8 k8ᵀ) · descale_q · descale_k · 1/√H             float32 inside the kernel
    P̃  = exp(S − running row max) ∈ (0, 1] → P̃ · 448 in e4m3  (scale_s = 448, descale_s = 1/448)
    O  = (P̃ V) / row sum,  |O| ≤ amax(v)  → O · 448/amax(v) in e4m3 (scale_o = v's scale)

so the output is dequantized with v's descale. The kernel's P̃ is the flash algorithm's,
normalised by the running maximum of each row's scores; the emulation normalises by the row's
final maximum, which differs only where a row's maximum grows between key blocks.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

E4M3_MAX = 448.0  # largest finite float8_e4m3fn
_TINY = 1e-12  # amax floor: an all-zero tensor quantizes to zeros with a finite scale


def quantize(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """x in e4m3 with one scale for the whole tensor, and the descale (float32 scalar) that
    maps it back: x ≈ x8 · descale."""
    amax = jnp.maximum(jnp.max(jnp.abs(x.astype(jnp.float32))), _TINY)
    scale = E4M3_MAX / amax
    return (x.astype(jnp.float32) * scale).astype(jnp.float8_e4m3fn), 1.0 / scale


def cudnn_attention(q_blnh: jax.Array, k_bsnh: jax.Array, v_bsnh: jax.Array) -> jax.Array:
    """softmax(q kᵀ/√H) v through cuDNN's FP8 flash attention (GPU, Hopper or later); inputs and
    output in the callers' dtype (B, L, N, H)."""
    from jax._src.cudnn import fused_attention_stablehlo as cudnn  # the only FP8 attention JAX exposes

    if jax.default_backend() != "gpu":
        raise ValueError("attention='cudnn_fp8' needs a GPU with cuDNN FP8 attention (Hopper); "
                         "use 'cudnn' or 'xla' here")
    (q8, dq), (k8, dk), (v8, dv) = quantize(q_blnh), quantize(k_bsnh), quantize(v_bsnh)
    one = lambda x: jnp.asarray(x, jnp.float32).reshape(1, 1, 1, 1)  # noqa: E731
    params = {name: one(1.0) for name in cudnn.fp8_params_keys}  # the backward's entries: unused
    params.update(descale_q=one(dq), descale_k=one(dk), descale_v=one(dv), descale_s=one(1.0 / E4M3_MAX),
                  scale_s=one(E4M3_MAX), scale_o=one(1.0 / dv))
    out8, _, _ = cudnn.dot_product_attention(q8, k8, v8, fp8_params=params, scale=1.0 / math.sqrt(q_blnh.shape[-1]),
                                             qkv_layout="BTNH", use_fp8=True)
    return (out8.astype(jnp.float32) * dv).astype(q_blnh.dtype)


def emulated_attention(q_blnh: jax.Array, k_bsnh: jax.Array, v_bsnh: jax.Array) -> jax.Array:
    """The same arithmetic in float32 on any backend: e4m3 rounding of q, k, v, of P̃ (scaled by
    448) and of the output, everything else exact."""
    f32 = lambda a8, d: a8.astype(jnp.float32) * d  # noqa: E731
    (q8, dq), (k8, dk), (v8, dv) = quantize(q_blnh), quantize(k_bsnh), quantize(v_bsnh)
    s_bnls = jnp.einsum("blnh,bsnh->bnls", f32(q8, dq), f32(k8, dk)) / math.sqrt(q_blnh.shape[-1])
    p_bnls = jnp.exp(s_bnls - jnp.max(s_bnls, axis=-1, keepdims=True))
    p8 = (p_bnls * E4M3_MAX).astype(jnp.float8_e4m3fn).astype(jnp.float32) / E4M3_MAX
    o_blnh = jnp.einsum("bnls,bsnh->blnh", p8, f32(v8, dv)) / jnp.sum(p_bnls, axis=-1).transpose(0, 2, 1)[..., None]
    o8 = (o_blnh / dv).astype(jnp.float8_e4m3fn)
    return (o8.astype(jnp.float32) * dv).astype(q_blnh.dtype)
