"""FP8 (e4m3) quantization and the FP8 linear layer the DiT's blocks use (`WanDiTConfig(fp8=True)`).

Per-output-channel weight scales, activation scales per token (at every call) or static (one
calibrated scale per layer); models/fp8.py builds and calibrates FP8 models out of these, and the
VAE's FP8 conv kernel (rynn_jax/kernels/) quantizes with the same functions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

FP8 = jnp.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn


def amax_scale(amax: jax.Array) -> jax.Array:
    """amax / 448, with all-zero rows/channels given scale 1 (their FP8 values are 0 anyway).

    Written as a multiply by float32(1/448), which is what XLA turns a division by the constant
    into anyway; spelled out, the scale is the same float32 number on every backend and in numpy."""
    amax = amax.astype(jnp.float32)
    return jnp.where(amax > 0, amax * jnp.float32(1.0 / FP8_MAX), jnp.float32(1.0))


def to_fp8(x: jax.Array, scale: jax.Array) -> jax.Array:
    # x/scale is within ±448 up to rounding; the clip makes that exact (e4m3fn has no inf, and an
    # out-of-range convert would give NaN).
    return jnp.clip(x.astype(jnp.float32) / scale, -FP8_MAX, FP8_MAX).astype(FP8)


def quantize_weight(w_io: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-output-channel symmetric quantization of a (..., in, out) kernel to float8_e4m3fn.

    Returns (w_f8 (..., in, out), scale (..., out) float32) with w ≈ w_f8 · scale[..., None, :].
    Leading axes (the stacked 'layers' axis) are handled independently."""
    scale_o = amax_scale(jnp.max(jnp.abs(w_io.astype(jnp.float32)), axis=-2))
    return to_fp8(w_io, scale_o[..., None, :]), scale_o


def fp8_matmul(x_bli: jax.Array, w_f8_oi: jax.Array, w_scale_o: jax.Array, out_dtype,
               x_scale: jax.Array | None = None) -> jax.Array:
    """x @ wᵀ for an FP8 kernel stored (out, in), w ≈ w_f8 · w_scale, with x quantized per token
    (row) on the fly, or with the given one-element `x_scale` (static scaling: |x| beyond 448·x_scale
    saturates). The (out, in) layout puts the contracted axis minor-most in both operands,
    the only FP8 layout cuBLASLt takes on Hopper ("TN"); an (in, out) kernel would make XLA
    transpose every weight on every call.

    The GEMM is a plain `dot_general` of the two float8_e4m3fn operands accumulating into
    `out_dtype` (bf16 or f32): XLA's GPU GEMM rewriter maps that onto a cuBLASLt FP8 GEMM. cuBLASLt
    (on Hopper) only takes per-tensor scalar scales, not per-row/per-column vectors, so the scales
    are applied afterwards as one elementwise multiply by their outer product (row scale × column
    scale), which XLA fuses into the GEMM's consumer. That is exact algebra:
        (x_f8 · s_x[:, None]) @ (w_f8 · s_w[None, :]) = (x_f8 @ w_f8) · (s_x[:, None] · s_w[None, :]).
    """
    out_dtype = jnp.dtype(out_dtype)
    if x_scale is None:
        x_scale = amax_scale(jnp.max(jnp.abs(x_bli.astype(jnp.float32)), axis=-1, keepdims=True))  # (..., 1)
    else:
        x_scale = x_scale.astype(jnp.float32)
    x_f8 = to_fp8(x_bli, x_scale)
    y = jax.lax.dot_general(x_f8, w_f8_oi, (((x_f8.ndim - 1,), (1,)), ((), ())),
                            preferred_element_type=out_dtype)
    return (y.astype(jnp.float32) * (x_scale * w_scale_o.astype(jnp.float32))).astype(out_dtype)


class Fp8InputAmax(nnx.Variable):
    """Running max |input| of an Fp8Linear, present only while `calibrate` observes the model."""


class Fp8Linear(nnx.Module):
    """Drop-in for `layers.linear`'s nnx.Linear with an FP8 kernel: `kernel` (out, in) float8_e4m3fn,
    `kernel_scale` (out,) float32 per output channel, `bias` (out,) in param_dtype; output in dtype.
    With `static_input_scale`, also `input_scale` (1,) float32, the activation scale (`calibrate`;
    shaped (1,), not (), so the stacked-layer axis gets its logical name like every other param).

    Initialised by quantizing a Xavier-uniform kernel drawn with the same key nnx.Linear would use,
    so a fresh fp8 model is the quantization of the fresh float model with the same seed."""

    def __init__(self, d_in: int, d_out: int, names: tuple[str | None, str | None], *,
                 dtype, param_dtype, rngs: nnx.Rngs, static_input_scale: bool = False):
        self.dtype = jnp.dtype(dtype)
        kernel = nnx.initializers.xavier_uniform()(rngs.params(), (d_in, d_out), jnp.dtype(param_dtype))
        kernel_f8, scale = quantize_weight(kernel)
        bias = nnx.initializers.zeros_init()(rngs.params(), (d_out,), jnp.dtype(param_dtype))
        named = lambda value, axes: nnx.with_partitioning(lambda *_: value, axes)(None)
        self.kernel = nnx.Param(named(kernel_f8.T, (names[1], names[0])))  # (out, in): see fp8_matmul
        self.kernel_scale = nnx.Param(named(scale, (names[1],)))
        self.bias = nnx.Param(named(bias, (names[1],)))
        # 1 until calibrated: a placeholder, not a usable scale (`calibrate` replaces it).
        self.input_scale = (nnx.Param(named(jnp.ones((1,), jnp.float32), (None,))) if static_input_scale
                            else nnx.data(None))
        self.input_amax: Fp8InputAmax | None = nnx.data(None)  # set by `calibrate` only

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.input_amax is not None:  # calibrating
            self.input_amax[...] = jnp.maximum(self.input_amax[...], jnp.max(jnp.abs(x.astype(jnp.float32))))
        x_scale = None if self.input_scale is None else self.input_scale[...]
        y = fp8_matmul(x, self.kernel[...], self.kernel_scale[...], self.dtype, x_scale)
        return y + self.bias[...].astype(self.dtype)
