"""The Hopper conv kernel (conv_kernel.py) plugged into the VAE: the conv models/vae.py is given
as `WanVAEConfig.kernel_conv`, and the FP8 state it keeps on each conv it takes.

    cfg = vae_conv.configure(WanVAEConfig.wan22(dtype="bfloat16"), "kernel_fp8")

The VAE's conv modules call the injected conv at construction (`attach`: slots for a static FP8
input scale and the weights quantized once) and on every call; it returns None for the convs it
does not take (strides, 1×1 convs, channels off the kernel's tiles, fewer than k_t frames), which
run XLA's conv_impl (fold2d). Only the decoder is given it (`vae.encoder_config`).

conv_impl names (`configure`; `conv_impls_for` lists those a backend runs):
  "fold2d"       XLA's convs, k_t frames stacked on channels: the serving default everywhere;
  "kernel_fp8"   the FP8 kernel: served on Hopper GPUs with static scales (vae_fp8.load_static);
for tests and benches only:
  "3d", "sum2d"  other XLA formulations (slower);
  "kernel_bf16"  the kernel in bf16 (slower than fold2d);
  "emulate_fp8"  the FP8 kernel's rounding and scales, computed by XLA in float32 (any backend,
                 slow): fidelity studies (bench/fidelity_vae_fp8.py) and CPU tests.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, get_args

import jax
import jax.numpy as jnp
from flax import nnx

from rynn_jax.kernels import conv_kernel as ck
from rynn_jax.models import vae as V

KernelImpl = Literal["kernel_bf16", "kernel_fp8", "emulate_fp8"]
KERNEL_IMPLS: tuple[str, ...] = get_args(KernelImpl)
FP8_IMPLS = ("kernel_fp8", "emulate_fp8")
CONV_IMPLS: tuple[str, ...] = (*V.XLA_CONV_IMPLS, *KERNEL_IMPLS)
Fp8Scales = Literal["per_call", "static"]


class ConvInputScale(nnx.Variable):
    """The calibrated FP8 activation scale, (1,) float32, of a conv the FP8 kernel runs
    (fp8_scales="static"; vae_fp8.py). Not an nnx.Param: checkpoints and converted weights stay
    the float model's; the scales are a small file of their own."""


class ConvKernelFp8(nnx.Variable):
    """A static-scale kernel conv's weights as the FP8 kernel reads them, quantized once
    (vae_fp8.with_static_scales; conv_kernel.quantize_kernel): `kernel_fp8` (N, K) float8_e4m3fn
    and `kernel_scale` (N,) float32. Derived from the kernel parameter, so not an nnx.Param;
    quantizing per call cost ≈ 1.5 ms per 480×832 decode chunk on the H200."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class KernelConv:
    """Which of the VAE's convs the kernel runs, and how (frozen: part of WanVAEConfig)."""
    impl: KernelImpl = "kernel_fp8"
    # FP8 activation scales: "per_call" max|x| of each conv input (an extra reduction and an
    # unfused convert per conv), or "static": one calibrated scale per conv (vae_fp8.py). H200,
    # decode chunk at 480×832: fold2d ≈ 49–50 ms; per_call 47.7, static 36.0 (conv_kernel.md).
    fp8_scales: Fp8Scales = "per_call"
    tiles: ck.ConvTiles = ck.SERVING_TILES  # cut to each conv's N by conv_kernel.fitted_tiles
    prologue: ck.Fp8Prologue = ck.Fp8Prologue()  # how FP8 input rows are laid out (same bits)

    def __post_init__(self):
        if self.impl not in KERNEL_IMPLS:
            raise ValueError(f"KernelConv.impl must be one of {KERNEL_IMPLS}, got {self.impl!r}")
        if self.fp8_scales not in get_args(Fp8Scales):
            raise ValueError(f"fp8_scales must be one of {get_args(Fp8Scales)}, got {self.fp8_scales!r}")
        if self.fp8_scales == "static" and self.impl not in FP8_IMPLS:
            raise ValueError(f'fp8_scales="static" needs impl in {FP8_IMPLS}, got {self.impl!r}')

    def takes(self, kernel_shape: tuple[int, ...], stride: tuple[int, int, int]) -> bool:
        """Whether a conv with this (k_t, k_h, k_w, C, N) kernel (same padding) runs here: stride
        1, k_h > 1, channels that fit the kernel's tiles."""
        dtype = jnp.float8_e4m3fn if self.impl in FP8_IMPLS else jnp.bfloat16
        return stride == (1, 1, 1) and kernel_shape[1] > 1 and ck.supports(kernel_shape, dtype)

    def attach(self, conv: nnx.Module, kernel_thwio: jax.Array, stride: tuple[int, int, int]) -> None:
        """Give a conv module its FP8 slots: with static scales, for a conv taken here, its input
        scale (1 until calibrated) and the kernel quantized from `kernel_thwio`; else None. Weights
        loaded later must be requantized: vae_fp8.with_static_scales does."""
        static = self.fp8_scales == "static" and self.takes(kernel_thwio.shape, stride)
        conv.input_scale = ConvInputScale(jnp.ones((1,), jnp.float32)) if static else nnx.data(None)
        w_f8, w_scale = ck.quantize_kernel(kernel_thwio) if static else (None, None)
        conv.kernel_fp8 = ConvKernelFp8(w_f8) if static else nnx.data(None)
        conv.kernel_scale = ConvKernelFp8(w_scale) if static else nnx.data(None)

    def __call__(self, conv: nnx.Module, x: jax.Array, kernel_thwio: jax.Array, past: jax.Array | None,
                 stride: tuple[int, int, int], pad_hw: tuple[tuple[int, int], tuple[int, int]]) -> jax.Array | None:
        """The conv over past ⧺ x ('valid' in time, no bias) through the kernel, bf16; None where
        the kernel does not apply."""
        kt, kh, kw, _, c_out = kernel_thwio.shape
        frames = x.shape[1] + (0 if past is None else past.shape[1])
        if (not self.takes(kernel_thwio.shape, stride) or pad_hw != ((kh // 2, kh // 2), (kw // 2, kw // 2))
                or frames < kt):
            return None
        if past is None or past.shape[1] != kt - 1:  # 'valid' in time over past ⧺ x: split it as the kernel wants
            xx = x if past is None else jnp.concatenate([past, x], axis=1)
            past, x = (xx[:, :kt - 1] if kt > 1 else None), xx[:, kt - 1:]
        x_scale = None if conv.input_scale is None else conv.input_scale[...][0]
        if self.impl == "emulate_fp8":  # the kernel's operands and bf16 output; f32 math by XLA
            return ck.causal_conv_reference(x, kernel_thwio, past, dtype=jnp.float8_e4m3fn,
                                            x_scale=x_scale).astype(jnp.bfloat16)
        fp8 = self.impl == "kernel_fp8"
        w_fp8 = (conv.kernel_fp8[...], conv.kernel_scale[...]) if fp8 and conv.kernel_fp8 is not None else None
        return ck.causal_conv(x, kernel_thwio, past, dtype=jnp.float8_e4m3fn if fp8 else jnp.bfloat16,
                              x_scale=x_scale, w_fp8=w_fp8, tiles=ck.fitted_tiles(c_out, self.tiles),
                              prologue=self.prologue)


def configure(cfg: V.WanVAEConfig, conv_impl: str, **kernel: Any) -> V.WanVAEConfig:
    """`cfg` with its convs computed by `conv_impl` (a name of CONV_IMPLS, module docstring): an
    XLA formulation, or the kernel (KernelConv(impl=conv_impl, **kernel)) with fold2d for the
    convs it does not take."""
    if conv_impl not in CONV_IMPLS:
        raise ValueError(f"conv_impl must be one of {CONV_IMPLS}, got {conv_impl!r}")
    if conv_impl in V.XLA_CONV_IMPLS:
        if kernel:
            raise ValueError(f"conv_impl {conv_impl!r} runs XLA's convs: kernel settings {sorted(kernel)} do not apply")
        return dataclasses.replace(cfg, conv_impl=conv_impl, kernel_conv=None)
    return dataclasses.replace(cfg, conv_impl="fold2d", kernel_conv=KernelConv(impl=conv_impl, **kernel))


def bare_conv(cfg: V.WanVAEConfig, x: jax.Array, kernel_thwio: jax.Array, bias: jax.Array, *,
              past: jax.Array | None = None, pad_hw: tuple[tuple[int, int], tuple[int, int]] = ((1, 1), (1, 1))
              ) -> jax.Array:
    """One stride-1 conv over past ⧺ x as a VAE conv module with `cfg` computes it, on a kernel given
    here (benches and tests; per-call FP8 scales)."""
    conv = nnx.Module()  # stands in for the conv module: holds the injected conv's slots
    if cfg.kernel_conv is not None:
        cfg.kernel_conv.attach(conv, kernel_thwio, (1, 1, 1))
    return V._conv(x, kernel_thwio, bias, cfg, pad_hw=pad_hw, past=past, module=conv)


def conv_impls_for(backend: str) -> tuple[str, ...]:
    """The conv_impl names that run at speed on `backend` (jax.default_backend()): the kernel ones on
    a GPU only; emulate_fp8, an oracle for fidelity studies and tests, is left out."""
    return tuple(i for i in CONV_IMPLS if i != "emulate_fp8" and (backend == "gpu" or i not in KERNEL_IMPLS))
