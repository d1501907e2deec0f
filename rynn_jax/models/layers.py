"""Parameter helpers and small numerics shared by the DiT and its branches."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from rynn_jax.models.fp8_linear import Fp8Linear


def linear(cfg, d_in: int, d_out: int, names: tuple[str | None, str | None],
           rngs: nnx.Rngs, *, fp8: bool = False, zero: bool = False) -> nnx.Linear | Fp8Linear:
    """nnx.Linear in cfg.dtype/cfg.param_dtype with logical axis names on kernel and bias (kernel
    Xavier-uniform, or zero with `zero`: a new path that starts as a no-op); with
    `fp8`, an `fp8.Fp8Linear` (float8_e4m3fn kernel + per-channel scale, + a static input scale
    when cfg.fp8_activations is "static") with the same names."""
    if fp8:
        return Fp8Linear(d_in, d_out, names, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs,
                         static_input_scale=cfg.fp8_activations == "static")
    return nnx.Linear(
        d_in, d_out,
        dtype=jnp.dtype(cfg.dtype), param_dtype=jnp.dtype(cfg.param_dtype),
        kernel_init=nnx.with_partitioning(
            nnx.initializers.zeros_init() if zero else nnx.initializers.xavier_uniform(), names),
        bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), (names[1],)),
        rngs=rngs,
    )


def param(rngs: nnx.Rngs, init: Callable, shape: tuple[int, ...], dtype: str,
          names: tuple[str | None, ...]) -> nnx.Param:
    """A parameter carrying logical axis names (no mesh needed at creation)."""
    return nnx.Param(nnx.with_partitioning(init, names)(rngs.params(), shape, jnp.dtype(dtype)))


def layer_norm(x: jax.Array, eps: float) -> jax.Array:
    """Affine-free LayerNorm over the last axis, in float32."""
    x = x.astype(jnp.float32)
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """RMSNorm over the last axis (all heads together), in float32, returned in x's dtype."""
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.square(xf).mean(-1, keepdims=True) + eps)
    return (y * scale.astype(jnp.float32)).astype(x.dtype)


def patchify_embed(z_bthwc: jax.Array, kernel_pqrcd: jax.Array, bias_d: jax.Array,
                   patch_size: tuple[int, int, int], dtype: jnp.dtype) -> jax.Array:
    """Non-overlapping Conv3d (kernel = stride = patch) as one matmul over flattened patches:
    (B, T, H, W, C) → (B, L, D) with tokens in (t, h, w) row-major order."""
    b, t, h, w, c = z_bthwc.shape
    pt, ph, pw = patch_size
    f, hh, ww = t // pt, h // ph, w // pw
    z = z_bthwc.astype(dtype).reshape(b, f, pt, hh, ph, ww, pw, c)
    x = jnp.einsum("bfphqwrc,pqrcd->bfhwd", z, kernel_pqrcd.astype(dtype))
    return (x + bias_d.astype(dtype)).reshape(b, f * hh * ww, -1)
