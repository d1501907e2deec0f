"""Static (calibrated) FP8 activation scales for the VAE convs that our FP8 conv kernel runs.

The FP8 kernel conv (`vae_conv.configure(cfg, "kernel_fp8")`) quantizes each conv input with its
own max|x| by default ("per_call"): one more reduction over the activations per conv, and a convert XLA cannot fuse into
the op that produces them. With one calibrated scale per conv ("static") both go away; on an H200
the streaming decode chunk at 480×832 drops from 47.7–48.1 ms to 43.0 ms, and to 36.0 ms with the
weights quantized once (also done here) and the FP8 bytes moved as words (fold2d, the bf16
default: ≈ 49–50 ms; conv_kernel.md).

    scales = vae_fp8.calibrate(model, vae_fp8.decode_clip, latent_batches)  # any conv_impl; fold2d runs anywhere
    served = vae_fp8.with_static_scales(model, scales)  # the FP8 kernel, static scales
    vae_fp8.save_scales("vae_fp8_scales.safetensors", scales); vae_fp8.load_scales(...)
    served = vae_fp8.load_static(model, "vae_fp8_scales.safetensors")  # kernel_fp8 on Hopper (see serving_conv_impl)

From the command line: `python serve.py calibrate-vae-fp8 --vae DIR --latents SHARDS --out FILE`
(pre-encoded latents of real clips), then `serve.py demo --vae DIR --vae-fp8-scales FILE ...`.

Scales are keyed by the conv's dotted path ("decoder.up_blocks.0.resnets.1.conv1.input_scale"),
shape (1,) float32. Inputs beyond the calibrated range saturate at ±448 · scale when served, so
calibrate on data like what is served (decoded latents of real clips, streamed or whole).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from safetensors.numpy import save_file

from rynn_jax.kernels import conv_kernel as ck
from rynn_jax.kernels import vae_conv
from rynn_jax.models import fp8 as fp8_lib
from rynn_jax.models import vae as V
from rynn_jax.weights import flatten_params, unflatten_params

_log = logging.getLogger(__name__)

SCALES_FORMAT = "rynn_jax.vae_fp8_scales/1"  # safetensors metadata "format" of a VAE scales file


def _dotted(path: tuple) -> str:
    return ".".join(map(str, path))


def decode_clip(model: V.WanVAE, latents: jax.Array) -> jax.Array:
    """Whole-clip decode of normalized latents: a calibration `run` (the kernel convs are the
    decoder's, vae.encoder_config)."""
    return model.decode_frames(latents, None, True, True)[0]


@functools.lru_cache(maxsize=8)
def _scale_paths(cfg: V.WanVAEConfig) -> dict[str, tuple]:
    """Dotted name → path of every input scale a static-scale VAE of this config has: one per conv
    the FP8 kernel takes (vae_conv.KernelConv.attach decides)."""
    static = vae_conv.configure(cfg, "kernel_fp8", fp8_scales="static")
    paths = flatten_params(nnx.to_pure_dict(nnx.state(V.abstract_vae(static))), str_keys=False)
    return {_dotted(p): p for p in sorted(paths, key=_dotted) if p[-1] == "input_scale"}


def kernel_convs(model: V.WanVAE) -> list[tuple[str, nnx.Module]]:
    """(dotted path, module) of every conv that the FP8 kernel conv takes."""
    modules = {_dotted(tuple(path)): m for path, m in nnx.iter_graph(model)}
    return [(_dotted(p[:-1]), modules[_dotted(p[:-1])]) for p in _scale_paths(model.cfg).values()]


class ConvInputAmax(nnx.Variable):
    """Running max |input| of a kernel conv, in `calibrate`'s probe only."""


@dataclasses.dataclass(frozen=True)
class _Observed:
    """`calibrate`'s probe conv: records the max |input| of every conv the FP8 kernel takes, then
    computes it as the model does (its own injected conv, or XLA's when `inner` is None)."""
    inner: vae_conv.KernelConv | None
    impl: str = "observed"

    def attach(self, conv: nnx.Module, kernel_thwio: jax.Array, stride: tuple[int, int, int]) -> None:
        if self.inner is not None:
            self.inner.attach(conv, kernel_thwio, stride)
        taken = vae_conv.KernelConv(impl="kernel_fp8").takes(kernel_thwio.shape, stride)
        conv.input_amax = ConvInputAmax(jnp.full((), -1.0, jnp.float32)) if taken else nnx.data(None)  # < 0: never called

    def __call__(self, conv: nnx.Module, x: jax.Array, *args) -> jax.Array | None:
        if conv.input_amax is not None:
            conv.input_amax[...] = jnp.maximum(conv.input_amax[...], jnp.max(jnp.abs(x.astype(jnp.float32))))
        return None if self.inner is None else self.inner(conv, x, *args)


def calibrate(model: V.WanVAE, run: Callable[[V.WanVAE, Any], Any], batches: Iterable[Any], *,
              margin: float = 1.0, progress: bool = True) -> dict[str, np.ndarray]:
    """Static activation scales, margin · max|input| / 448, for every conv the FP8 kernel takes.

    Runs `run(probe, batch)` (jitted; e.g. `decode_clip`, or a streamed decode) over the batches,
    where `probe` is `model` (same arrays) whose kernel convs record the largest |input| they see.
    `model` may compute its convs any way: a float one (fold2d, on any backend) calibrates on
    unquantized activations. `model` itself is left as it was."""
    kernel = model.cfg.kernel_conv
    if kernel is not None and kernel.fp8_scales == "static":
        raise ValueError("calibrate: the model already has static scales; calibrate its float or per-call version")
    if not margin >= 1.0:
        raise ValueError(f"calibrate: margin must be ≥ 1 (got {margin})")
    names = {name[:-len(".input_scale")]: path[:-1] for name, path in _scale_paths(model.cfg).items()}
    if not names:
        raise ValueError("calibrate: no conv of this VAE fits the FP8 kernel (channels off its tiles)")
    values = flatten_params(nnx.to_pure_dict(nnx.state(model)), str_keys=False)
    values.update({(*path, "input_amax"): jnp.full((), -1.0, jnp.float32) for path in names.values()})
    probe = V.vae_from_params(dataclasses.replace(model.cfg, kernel_conv=_Observed(kernel)), unflatten_params(values))
    n = fp8_lib.run_observers(probe, run, batches, ConvInputAmax, desc="vae fp8 calibration", progress=progress)
    observed = flatten_params(nnx.to_pure_dict(nnx.state(probe, ConvInputAmax)), str_keys=False)
    amax = {name: float(observed[(*path, "input_amax")]) for name, path in names.items()}
    bad = sorted(name for name, a in amax.items() if not (0 <= a < float("inf")))
    if bad:
        raise ValueError(f"calibrate: these convs saw no input or a non-finite one over {n} batches: {bad} "
                         "(does `run` decode, with finite inputs?)")
    zero = sorted(name for name, a in amax.items() if a == 0)
    if zero:
        warnings.warn(f"calibrate: these convs saw only zero inputs, their input_scale is 1: {zero}", stacklevel=2)
    return {f"{name}.input_scale": np.asarray(fp8_lib.amax_scale(jnp.full((1,), a, jnp.float32))
                                              * np.float32(margin), np.float32)
            for name, a in amax.items()}


def with_static_scales(model: V.WanVAE, scales: dict[str, Any], *, conv_impl: str = "kernel_fp8") -> V.WanVAE:
    """The same weights (shared arrays) through the FP8 kernel conv with static scales: these
    scales, each kernel conv's weights also quantized once for the kernel (vae_conv.ConvKernelFp8),
    and `conv_impl` "kernel_fp8" (serving, Hopper GPUs) or "emulate_fp8" (the same numerics by XLA,
    any backend). The model's kernel settings (tiles, prologue) are kept.
    Every kernel conv needs its scale, (1,), finite and > 0; anything else is an error naming the
    entry."""
    if conv_impl not in vae_conv.FP8_IMPLS:
        raise ValueError(f"with_static_scales: conv_impl must be one of {vae_conv.FP8_IMPLS}, got {conv_impl!r}")
    want = _scale_paths(model.cfg)
    values = flatten_params(nnx.to_pure_dict(nnx.state(model)), str_keys=False)
    for name, a in fp8_lib.checked_scales(scales, {name: (1,) for name in want}, "VAE").items():
        path = want[name]
        values[path] = a
        kernel = values[(*path[:-1], "kernel")]  # quantized once here, not on every call
        kernel = kernel[None] if kernel.ndim == 4 else kernel  # Conv2d's (k_h, k_w, C, N)
        values[(*path[:-1], "kernel_fp8")], values[(*path[:-1], "kernel_scale")] = ck.quantize_kernel(kernel)
    settings = model.cfg.kernel_conv or vae_conv.KernelConv()
    cfg = dataclasses.replace(model.cfg, conv_impl="fold2d",
                              kernel_conv=dataclasses.replace(settings, impl=conv_impl, fp8_scales="static"))
    return V.vae_from_params(cfg, unflatten_params(values))


def _hopper() -> bool:
    """The FP8 conv kernel's wgmma/TMA need a GPU of compute capability 9.x."""
    device = jax.devices()[0]
    return device.platform == "gpu" and str(getattr(device, "compute_capability", "")).startswith("9")


def fp8_conv_impl() -> str:
    """The FP8 convs' numbers: "kernel_fp8" on a Hopper GPU, else "emulate_fp8" (computed by XLA;
    slow, to measure or check an FP8 decoder anywhere)."""
    return "kernel_fp8" if _hopper() else "emulate_fp8"


def serving_conv_impl() -> str:
    """What a decoder with static scales is served with: "kernel_fp8" on a Hopper GPU; on another
    GPU the kernel cannot run and its emulation is slower than the float convs, so "fold2d" (XLA's
    convs, the scales unused); on a CPU (tests, checks) "emulate_fp8", the FP8 numbers."""
    if _hopper():
        return "kernel_fp8"
    return "fold2d" if jax.devices()[0].platform == "gpu" else "emulate_fp8"


def load_static(model: V.WanVAE, path: str) -> V.WanVAE:
    """`model` served with the static scales in `path` (`save_scales`; `serve.py calibrate-vae-fp8`),
    through the FP8 kernel where it runs (`serving_conv_impl`); where it does not (a non-Hopper
    GPU), `model` itself, with its XLA convs, said in the log."""
    scales, impl = load_scales(path), serving_conv_impl()
    if impl not in vae_conv.FP8_IMPLS:
        if set(scales) != set(_scale_paths(model.cfg)):
            raise ValueError(f"{path}: scales do not fit this VAE")
        _log.warning("VAE FP8 scales %s unused: the FP8 conv kernel needs a Hopper GPU (compute capability 9.x), "
                     "and emulating it would be slower than the float decoder this serves instead (conv_impl=%s)",
                     path, model.cfg.conv_name)
        return model
    return with_static_scales(model, scales, conv_impl=impl)


def save_scales(path: str, scales: dict[str, np.ndarray], **info: str) -> None:
    """Write `calibrate`'s scales to a safetensors file (a few KB). `info`: extra string metadata."""
    save_file({k: np.asarray(v, np.float32) for k, v in scales.items()}, str(path),
              metadata={"format": SCALES_FORMAT, **info})


def load_scales(path: str) -> dict[str, np.ndarray]:
    """Read a file written by `save_scales`; a missing, truncated or foreign file is a ValueError."""
    return fp8_lib.read_scales(path, SCALES_FORMAT)
