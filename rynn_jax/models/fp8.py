"""FP8 (e4m3) serving path for the DiT's transformer-block linear layers.

Opt in with `WanDiTConfig(fp8=True)`; build such a model from a trained (bf16/f32) one with
`quantize_dit`. Weights are stored as float8_e4m3fn with one float32 scale per output channel.
Activations are quantized on the fly, with one of two scalings (`WanDiTConfig.fp8_activations`):
"per_token" (quantize_dit's default) takes each token's max |x| at every call; "static" uses one
calibrated scale per linear layer (`calibrate`), which saves the max reduction and lets XLA fuse
the quantization into the op that produces the activation. The matmul itself runs on the two FP8
operands (`fp8_matmul`), the form XLA's GPU GEMM rewriter can hand to cuBLASLt's FP8 GEMM on Hopper.
Only the serving forward is meant to use this: nothing here is differentiable in a useful way.
The quantization primitives and the FP8 linear layer itself live in models/fp8_linear.py.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file
from tqdm import tqdm

from rynn_jax.models import build
from rynn_jax.models.dit import WanDiT, WanDiTConfig, unrolled
from rynn_jax.models.fp8_linear import (FP8, FP8_MAX, Fp8InputAmax, Fp8Linear, amax_scale, fp8_matmul, quantize_weight,
                                        to_fp8)
from rynn_jax.weights import flatten_params, unflatten_params

M = TypeVar("M")  # WanDiT or WanDiT4D

__all__ = [  # the FP8 primitives are re-exported: callers import them from here
    "FP8", "FP8_MAX", "Fp8InputAmax", "Fp8Linear", "amax_scale", "fp8_matmul", "quantize_weight", "to_fp8",
    "FP8_COMPILER_OPTIONS", "compiler_options", "quantize_dit", "run_observers", "calibrate", "SCALES_FORMAT",
    "static_scales", "with_static_scales", "checked_scales", "save_scales", "load_scales", "read_scales",
]

# XLA options for compiling an FP8 model on GPU (`lowered.compile(FP8_COMPILER_OPTIONS)`, or
# XLA_FLAGS=--xla_gpu_enable_triton_gemm=false for a whole process). With Triton GEMM fusions on,
# XLA autotunes a Triton FP8 kernel for every linear layer separately: the unrolled 5B forward took
# over 4 minutes to compile on an H200 (2 layers: 31 s) to run within 2% of cuBLASLt's FP8 GEMMs
# (2 layers: 1.99 ms Triton, 2.03 ms cuBLASLt, which compiled in 4.8 s).
FP8_COMPILER_OPTIONS = {"xla_gpu_enable_triton_gemm": False}


def compiler_options(cfg: WanDiTConfig) -> dict | None:
    """XLA options for a program that runs a DiT with this config: FP8_COMPILER_OPTIONS for an FP8
    model on GPU, else None (XLA's defaults)."""
    return FP8_COMPILER_OPTIONS if cfg.fp8 and jax.default_backend() == "gpu" else None


def _is_4d(model: Any) -> bool:
    from rynn_jax.models.dit4d import WanDiT4D  # dit4d imports the FP8 layer: not at module level

    return isinstance(model, WanDiT4D)


def _base(model: Any) -> tuple[WanDiTConfig, nnx.Module]:
    """The DiT config whose FP8 settings apply and its stacked blocks: a WanDiT's own, or for a
    WanDiT4D its RGB branch's (the depth and flow branches share that config)."""
    return (model.cfg.base, model.base.blocks) if _is_4d(model) else (model.cfg, model.blocks)


def _with_base(model: Any, **fields: Any) -> Any:
    """The model's config with these fields of its DiT config (a WanDiT4D's: its `base`) replaced."""
    base = dataclasses.replace(_base(model)[0], **fields)
    return dataclasses.replace(model.cfg, base=base) if _is_4d(model) else base


def with_fp8_attention(model: M) -> M:
    """The same model (a WanDiT or WanDiT4D, any FP8 linear state; weights shared, not copied)
    with attention="cudnn_fp8": its unmasked attention as cuDNN's FP8 flash attention
    (models/fp8_attention.py; a Hopper GPU)."""
    graphdef, _ = nnx.split(build.abstract_model(type(model), _with_base(model, attention="cudnn_fp8")))
    return nnx.merge(graphdef, nnx.state(model))


def quantize_dit(model: M) -> M:
    """The FP8 serving model for a float model (a WanDiT, or a WanDiT4D: its three branches' block
    linears; the joint attention stays in the model's dtype): same config with fp8=True, every
    Fp8Linear's kernel and kernel_scale from quantizing the source kernel (all stacked layers at
    once), every other variable the source's array unchanged (shared, so bit-exact)."""
    if _base(model)[0].fp8:
        raise ValueError("quantize_dit: the model is already fp8 (cfg.fp8=True)")
    cfg = _with_base(model, fp8=True, fp8_activations="per_token")
    graphdef, target = nnx.split(build.abstract_model(type(model), cfg))  # eager sharding off inside
    want = flatten_params(nnx.to_pure_dict(target), str_keys=False)
    src = flatten_params(nnx.to_pure_dict(nnx.state(model)), str_keys=False)
    dotted = lambda path: ".".join(map(str, path))
    quantize = jax.jit(quantize_weight)

    values, used = {}, set()
    for path in want:
        if path in values:
            continue
        if path[-1] in ("kernel", "kernel_scale") and path[:-1] + ("kernel_scale",) in want:  # Fp8Linear
            kernel_path = path[:-1] + ("kernel",)
            if kernel_path not in src:
                raise ValueError(f"quantize_dit: the fp8 model's parameter {dotted(path)!r} has no source "
                                 f"in the model (it is quantized from {dotted(kernel_path)!r})")
            w8_io, values[path[:-1] + ("kernel_scale",)] = quantize(src[kernel_path])
            values[kernel_path] = jnp.swapaxes(w8_io, -1, -2)  # stored (…, out, in), see fp8_matmul
            used.add(kernel_path)
        elif path in src:
            values[path] = src[path]
            used.add(path)
        else:
            raise ValueError(f"quantize_dit: the fp8 model's parameter {dotted(path)!r} has no source "
                             "in the model")
    for path, spec in want.items():
        got = values[path]
        if got.shape != spec.shape or got.dtype != spec.dtype:
            raise ValueError(f"quantize_dit: {dotted(path)!r} comes out {got.dtype}{list(got.shape)}, "
                             f"the fp8 model wants {spec.dtype}{list(spec.shape)}")
    unused = sorted(dotted(p) for p in set(src) - used)
    if unused:  # e.g. unmerged LoRA factors, which quantizing would silently drop
        raise ValueError(f"quantize_dit: source variables with no place in the fp8 model: {unused}")
    nnx.replace_by_pure_dict(target, unflatten_params(values))
    return nnx.merge(graphdef, target)


def run_observers(probe: nnx.Module, run: Callable[[Any, Any], Any], batches: Iterable[Any],
                  observer: type[nnx.Variable], *, desc: str, progress: bool = True,
                  compiler_options: dict | None = None) -> int:
    """Run `run(probe, batch)`, jitted, over the batches, keeping the updates of `probe`'s `observer`
    variables (a calibration's running maxima); returns the batch count (none is an error)."""
    graphdef = nnx.graphdef(probe)

    @functools.partial(jax.jit, compiler_options=compiler_options)
    def step(state, batch):
        m = nnx.merge(graphdef, state)
        run(m, batch)
        return nnx.state(m, observer)

    n = 0
    for batch in tqdm(batches, desc=desc, unit="batch", disable=not progress):
        nnx.update(probe, step(nnx.state(probe), batch))
        n += 1
    if n == 0:
        raise ValueError("calibrate: no calibration batches")
    return n


def calibrate(model: M, run: Callable[[M, Any], Any], batches: Iterable[Any], *,
              margin: float = 1.0, progress: bool = True, layers: int | None = None) -> M:
    """Static activation scales for an FP8 model (`quantize_dit`'s output, stacked layers): runs
    `run(model, batch)` (jitted; any forward — plain, causal, several timesteps) over the
    calibration batches while every Fp8Linear records the largest |input| it sees, and returns the
    same weights with cfg.fp8_activations="static" and input_scale = margin · amax / 448 per layer and linear.

    Inputs larger than the calibrated range saturate at ±448 · input_scale at serving time, so
    calibrate on inputs like those served (every denoising timestep and the t = 0 cache pass);
    margin > 1 leaves headroom at the cost of resolution near zero. Serve the result through
    `dit.unrolled` as usual (StreamingSession does). A WanDiT4D (the policy's backbone) works the
    same way. `layers`: only the first `layers` blocks must be reached (a features pass that stops
    there); later blocks keep scale 1 and must not be run with these scales."""
    cfg, blocks = _base(model)
    if not cfg.fp8 or cfg.fp8_activations != "per_token":
        raise ValueError("calibrate: expects an FP8 model with per-token activation scales (quantize_dit's "
                         f"output); got fp8={cfg.fp8}, fp8_activations={cfg.fp8_activations!r}")
    if isinstance(blocks, nnx.List):
        raise ValueError("calibrate: pass the stacked-layer model (quantize_dit's output), not dit.unrolled's")
    if cfg.remat != "none":
        raise ValueError(f"calibrate: needs remat='none' (got {cfg.remat!r}); the observers cannot record "
                         "through a rematerialised layer")
    if not margin >= 1.0:
        raise ValueError(f"calibrate: margin must be ≥ 1 (got {margin})")
    layers = cfg.num_layers if layers is None else layers
    if not 1 <= layers <= cfg.num_layers:
        raise ValueError(f"calibrate: layers must be in 1..{cfg.num_layers} (got {layers})")
    if _is_4d(model):
        return _calibrate_4d(model, run, batches, margin=margin, progress=progress, layers=layers)
    # One module per layer (unrolled's Python loop), so each layer's observer is updated in place;
    # a lax.scan over stacked layers would drop the updates. Projections stay unfused to keep the paths.
    probe = unrolled(model, fuse_self_qkv=False, fuse_text_kv=False)
    linears = [(tuple(path), m) for path, m in nnx.iter_graph(probe) if isinstance(m, Fp8Linear)]
    if not linears or any(path[0] != "blocks" for path, _ in linears):  # all FP8 layers live in blocks
        raise ValueError(f"calibrate: unexpected FP8 layers {[p for p, _ in linears if p[0] != 'blocks']}")
    for _, lin in linears:
        lin.input_amax = Fp8InputAmax(jnp.full((), -1.0, jnp.float32))  # < 0: never called
    n = run_observers(probe, run, batches, Fp8InputAmax, desc="fp8 calibration", progress=progress,
                      compiler_options=compiler_options(cfg))
    # Back to the stacked layout: ('blocks', i, *rest) → 'blocks.<rest>.input_scale', row i.
    amax: dict[str, np.ndarray] = {}
    for path, lin in linears:
        name = ".".join(map(str, (path[0], *path[2:], "input_scale")))
        amax.setdefault(name, np.full(cfg.num_layers, -1.0, np.float32))[path[1]] = float(lin.input_amax[...])
    return with_static_scales(model, _checked_scales(amax, layers, n, margin))


def _checked_scales(amax: dict[str, np.ndarray], layers: int, n: int, margin: float) -> dict[str, np.ndarray]:
    """Static scales (layers, 1) = margin · amax / 448 from each stacked linear's per-layer input
    maxima (name → (num_layers,), < 0 where never called); blocks from `layers` on keep scale 1.
    A block before `layers` that saw no input or a non-finite one is an error naming it; one that
    saw only zeros (e.g. K/V of an all-zero text context) a warning, and its scale is 1."""
    amax = {name: np.where(np.arange(a.shape[0]) < layers, a, 0.0).astype(np.float32) for name, a in amax.items()}

    def where(test) -> list[str]:
        found = sorted(f"{name.removesuffix('.input_scale')}[layer {i}]" for name, a in amax.items()
                       for i in np.flatnonzero(test(a)))
        return found[:8] + ([f"… {len(found)} in all"] if len(found) > 8 else [])

    bad = where(lambda a: ~((a >= 0) & np.isfinite(a)))
    if bad:
        raise ValueError(f"calibrate: these FP8 layers saw no input or a non-finite one over {n} batches: {bad} "
                         "(does `run` call every block, with finite inputs?)")
    zero = where(lambda a: (a == 0) & (np.arange(a.shape[0]) < layers))
    if zero:
        warnings.warn(f"calibrate: these FP8 layers saw only zero inputs, their input_scale is 1: {zero}", stacklevel=3)
    return {name: np.asarray(amax_scale(jnp.asarray(a)[:, None]) * jnp.float32(margin)) for name, a in amax.items()}


def _calibrate_4d(model: M, run: Callable[[M, Any], Any], batches: Iterable[Any], *, margin: float,
                  progress: bool, layers: int) -> M:
    """`calibrate` for a WanDiT4D: its three branches' stacked block linears observe their inputs
    inside the layer scan (each (layers,) maximum; `WanDiT4D.hidden` returns them out of the scan)
    on a copy of the module graph, so `model` itself is left as it was."""
    cfg, _ = _base(model)
    probe = nnx.merge(*nnx.split(model))  # a new graph over the same arrays
    linears = [(tuple(path), m) for path, m in nnx.iter_graph(probe) if isinstance(m, Fp8Linear)]
    odd = [p for p, _ in linears if p[0] not in ("base", "depth", "flow") or p[1] != "blocks"]
    if not linears or odd:  # all FP8 layers live in the branches' blocks
        raise ValueError(f"calibrate: unexpected FP8 layers {odd}")
    for _, lin in linears:
        lin.input_amax = Fp8InputAmax(jnp.full((cfg.num_layers,), -1.0, jnp.float32))  # < 0: never called
    n = run_observers(probe, run, batches, Fp8InputAmax, desc="fp8 calibration", progress=progress,
                      compiler_options=compiler_options(cfg))
    amax = {".".join(map(str, path + ("input_scale",))): np.asarray(lin.input_amax[...]) for path, lin in linears}
    return with_static_scales(model, _checked_scales(amax, layers, n, margin))


SCALES_FORMAT = "rynn_jax.fp8_static_scales/1"  # safetensors metadata "format" of a scales file


def static_scales(model: M) -> dict[str, np.ndarray]:
    """A static-scale model's activation scales by dotted name ('blocks.ffn_up.input_scale', each
    (layers, 1) float32; a WanDiT4D's under 'base.', 'depth.', 'flow.'): what `save_scales` writes
    and `with_static_scales` takes."""
    cfg, blocks = _base(model)
    if cfg.fp8_activations != "static" or isinstance(blocks, nnx.List):
        raise ValueError("static_scales: expects a stacked-layer model with static activation scales (calibrate's output)")
    flat = flatten_params(nnx.to_pure_dict(nnx.state(model)))
    return {".".join(p): np.asarray(v) for p, v in flat.items() if p[-1] == "input_scale"}


def with_static_scales(model: M, scales: dict[str, Any]) -> M:
    """The per-token FP8 model (`quantize_dit`'s output, stacked layers; a WanDiT or WanDiT4D) with
    the given activation scales: same weights, fp8_activations="static". Every FP8 linear needs its
    scale, with the model's (layers, 1) shape, finite and > 0; anything else is an error that names
    the entry."""
    cfg, blocks = _base(model)
    if not cfg.fp8 or cfg.fp8_activations != "per_token" or isinstance(blocks, nnx.List):
        raise ValueError("with_static_scales: expects quantize_dit's output (stacked layers, per-token activation "
                         f"scales); got fp8={cfg.fp8}, fp8_activations={cfg.fp8_activations!r}")
    graphdef, target = nnx.split(build.abstract_model(type(model), _with_base(model, fp8_activations="static")))
    want = {".".join(p): tuple(v.shape) for p, v in flatten_params(nnx.to_pure_dict(target)).items()
            if p[-1] == "input_scale"}
    values = flatten_params(nnx.to_pure_dict(nnx.state(model)), str_keys=False)
    for name, a in checked_scales(scales, want, "model").items():
        values[tuple(name.split("."))] = a
    nnx.replace_by_pure_dict(target, unflatten_params(values))
    return nnx.merge(graphdef, target)


def checked_scales(scales: dict[str, Any], want: dict[str, tuple[int, ...]], what: str) -> dict[str, jax.Array]:
    """`scales` as float32 arrays, checked against `want` (name → shape): none missing or extra,
    each of its shape, finite and > 0; anything else is a ValueError naming the entry."""
    missing, extra = sorted(set(want) - set(scales)), sorted(set(scales) - set(want))
    if missing or extra:
        raise ValueError(f"with_static_scales: scales do not fit this {what}: missing {missing}, unexpected {extra}")
    checked = {}
    for name, shape in want.items():
        a = np.asarray(scales[name])
        if a.shape != shape:
            raise ValueError(f"with_static_scales: {name!r} has shape {a.shape}, this {what} needs {shape}")
        if not (np.isfinite(a).all() and (a > 0).all()):
            raise ValueError(f"with_static_scales: {name!r} has non-finite or non-positive values")
        checked[name] = jnp.asarray(a, jnp.float32)
    return checked


def save_scales(path: str | os.PathLike[str], model: WanDiT, **info: str) -> None:
    """Write a static-scale model's activation scales to a safetensors file (a few KB; the weights
    stay in their own checkpoint and are quantized at load). `info`: extra string metadata."""
    save_file(static_scales(model), os.fspath(path), metadata={"format": SCALES_FORMAT, **info})


def load_scales(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Read a file written by `save_scales`; a missing, truncated or foreign file is a ValueError
    naming it."""
    return read_scales(path, SCALES_FORMAT)


def read_scales(path: str | os.PathLike[str], expected_format: str) -> dict[str, np.ndarray]:
    """The tensors of a safetensors scales file whose metadata "format" is `expected_format`; a
    missing, truncated or foreign file is a ValueError naming it."""
    path = os.fspath(path)
    try:
        with safe_open(path, framework="numpy") as f:
            fmt = (f.metadata() or {}).get("format")
            if fmt != expected_format:
                raise ValueError(f"{path}: not an FP8 scales file (format {fmt!r}, expected {expected_format!r})")
            return {k: f.get_tensor(k) for k in f.keys()}
    except ValueError:
        raise
    except Exception as e:  # safetensors raises its own error types for truncated/garbled files
        raise ValueError(f"{path}: cannot read FP8 scales ({type(e).__name__}: {e})") from e
