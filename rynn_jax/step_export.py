"""Compiled executables of the causal step: AOT compile for fixed shapes, and `jax.export` files
that a server loads and runs without the model's Python code — one artifact lowered for CPU, CUDA
and TPU (`PORTABLE_PLATFORMS`), so the same files serve on any of them.

An export directory holds
    step.jaxexport   the serialized StableHLO of step(param_leaves, state, control, rng_key_data)
    start.jaxexport  start(param_leaves, ref_latent, ctx) -> state (text K/V, empty cache)
    params.npz       the parameter leaves in the order the executables take them
    meta.json        shapes/dtypes of the inputs, for checks and for building inputs
Parameters enter as a flat list and the state is a plain dict of arrays, so the only pytrees in the
calling convention are lists and dicts (no NNX classes are needed to load or call). The batch of B
sessions is part of the shapes: one executable serves B sessions in lock step.

`load` imports nothing from the model; a server needs jax, numpy and these files.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# --------------------------------------------------------------------------------------------------
# AOT compile
# --------------------------------------------------------------------------------------------------


def compile_aot(fn: Callable, *args: Any, in_shardings: Any = None, out_shardings: Any = None,
                donate_argnums: Sequence[int] = (), name: str = "step", verbose: bool = True,
                compiler_options: dict | None = None) -> jax.stages.Compiled:
    """`jit(fn).lower(*args).compile(compiler_options)` for the given (abstract or concrete)
    arguments; prints the compiled memory analysis. Shardings as in `jax.jit` (None: let the
    compiler choose); `compiler_options`: XLA options (e.g. `fp8.compiler_options(cfg)`)."""
    kw = {}
    if in_shardings is not None:
        kw["in_shardings"] = in_shardings
    if out_shardings is not None:
        kw["out_shardings"] = out_shardings
    compiled = jax.jit(fn, donate_argnums=tuple(donate_argnums), **kw).lower(*args).compile(compiler_options)
    if verbose:
        print(format_memory(compiled, name))
    return compiled


def format_memory(compiled: jax.stages.Compiled, name: str) -> str:
    stats = compiled.memory_analysis()
    if stats is None:
        return f"[{name}] memory analysis not available on this backend"
    fields = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
              "temp_size_in_bytes", "generated_code_size_in_bytes")
    parts = [f"{f.replace('_size_in_bytes', '')} {getattr(stats, f, 0) / 2**20:.1f} MiB" for f in fields]
    return f"[{name}] " + ", ".join(parts)


# --------------------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------------------


def _flat(fn_with_params: Callable, params: Any) -> tuple[Callable, list[jax.Array]]:
    """fn(params, *rest) → fn(param_leaves: list, *rest) with the parameter treedef closed over."""
    leaves, treedef = jax.tree.flatten(params)

    def flat_fn(param_leaves: list, *rest):
        return fn_with_params(jax.tree.unflatten(treedef, param_leaves), *rest)

    return flat_fn, leaves


def _spec(x: Any) -> dict:
    return {"shape": list(x.shape), "dtype": str(x.dtype)}


PORTABLE_PLATFORMS = ("cpu", "cuda", "tpu")  # one serialized artifact for all three


@dataclasses.dataclass(frozen=True)
class CausalStepSignature:
    """The exported calling convention of the causal student, for `batch` sessions at `latent_hw`:
    `start(param_leaves, ref, ctx) -> state`, `step(param_leaves, state, control, rng) -> (x, state)`;
    the inputs as ShapeDtypeStructs (`leaves` may be arrays or ShapeDtypeStructs), and each leaf's
    logical PartitionSpec (for a sharded compile, rynn_jax.aot)."""
    start: Callable
    step: Callable
    leaves: list
    leaf_specs: list[jax.ShapeDtypeStruct]
    leaf_logical: list
    ref: jax.ShapeDtypeStruct
    ctx: jax.ShapeDtypeStruct
    control: jax.ShapeDtypeStruct
    rng: jax.ShapeDtypeStruct
    state: Any  # the state's ShapeDtypeStructs (what start returns)


def causal_step_signature(model, ccfg, scfg, *, batch: int, latent_hw: tuple[int, int],
                          unroll_layers: bool = True) -> CausalStepSignature:
    """start/step of the causal student as `export_causal_step` writes them (layers unrolled unless
    `unroll_layers=False`, see `dit.unrolled`); `model` may be abstract (`nnx.eval_shape`)."""
    from flax import nnx
    from jax.sharding import PartitionSpec

    from rynn_jax.models.dit import unrolled
    from rynn_jax.serving.block_step import make_start, make_step

    if scfg.merge_clean_pass:  # its steps take the previous block as extra inputs: not this calling convention
        raise ValueError("export_causal_step exports the sequential step; StepConfig.merge_clean_pass is "
                         "StreamingSession-only")
    cfg = model.cfg
    graphdef, params = nnx.split(unrolled(model) if unroll_layers else model)
    start, leaves = _flat(make_start(graphdef, ccfg), params)
    step, _ = _flat(make_step(graphdef, ccfg, scfg), params)
    logical = jax.tree.leaves(nnx.get_partition_spec(params), is_leaf=lambda x: isinstance(x, PartitionSpec))
    leaf_specs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
    ref = jax.ShapeDtypeStruct((batch, 1, *latent_hw, cfg.in_channels), jnp.float32)
    ctx = jax.ShapeDtypeStruct((batch, cfg.text_len, cfg.text_dim), jnp.float32)
    c_channels = cfg.control_channels if cfg.control != "none" else cfg.in_channels
    control = jax.ShapeDtypeStruct((batch, ccfg.frames_per_block, *latent_hw, c_channels), jnp.float32)
    rng = jax.ShapeDtypeStruct((2,), jnp.uint32)  # raw threefry key data
    state = jax.eval_shape(start, leaf_specs, ref, ctx)
    return CausalStepSignature(start, step, leaves, leaf_specs, logical, ref, ctx, control, rng, state)


def export_causal_step(model, ccfg, scfg, out_dir: str | pathlib.Path, *, batch: int,
                       latent_hw: tuple[int, int], platforms: Sequence[str] | None = PORTABLE_PLATFORMS,
                       state_shardings: Any = None, unroll_layers: bool = True) -> pathlib.Path:
    """Export start + step of the causal student for `batch` sessions at `latent_hw` (h, w), lowered
    for every platform in `platforms` (default CPU, CUDA and TPU in one artifact; None: this
    machine's backend only). XLA attention only: cuDNN's lowers for CUDA alone."""
    from rynn_jax.models.dit import attention_impl

    platforms = None if platforms is None else tuple(platforms)
    impl = attention_impl(model.cfg, jnp.dtype(model.cfg.dtype))
    if platforms not in (None, ("cuda",)) and impl in ("cudnn", "cudnn_fp8"):
        raise ValueError(f"export for {platforms}: the model's attention resolves to cuDNN, which lowers for "
                         "CUDA only; set model.attention='xla' (or platforms=('cuda',))")
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sig = causal_step_signature(model, ccfg, scfg, batch=batch, latent_hw=latent_hw, unroll_layers=unroll_layers)
    kw = {} if platforms is None else {"platforms": platforms}
    step_jit = jax.jit(sig.step, donate_argnums=1,
                       **({} if state_shardings is None else {"in_shardings": (None, state_shardings, None, None)}))
    exp_step = jax.export.export(step_jit, **kw)(sig.leaf_specs, sig.state, sig.control, sig.rng)
    exp_start = jax.export.export(jax.jit(sig.start), **kw)(sig.leaf_specs, sig.ref, sig.ctx)
    (out / "step.jaxexport").write_bytes(exp_step.serialize())
    (out / "start.jaxexport").write_bytes(exp_start.serialize())
    _save_leaves(out / "params.npz", sig.leaves)
    meta = {"batch": batch, "latent_hw": list(latent_hw), "frames_per_block": ccfg.frames_per_block,
            "window_frames": ccfg.window_frames, "policy": ccfg.policy, "num_steps": scfg.num_steps,
            "solver": scfg.solver, "shift": scfg.shift, "num_params": len(sig.leaves),
            "platforms": list(exp_step.platforms),
            "inputs": {"ref_latent": _spec(sig.ref), "ctx": _spec(sig.ctx), "control": _spec(sig.control),
                       "rng": _spec(sig.rng)}}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return out


def _save_leaves(path: pathlib.Path, leaves: list) -> None:
    # bfloat16 has no numpy dtype code: store raw bits and the dtype name.
    arrays, dtypes = {}, []
    for i, x in enumerate(leaves):
        a = np.asarray(x)
        dtypes.append(str(a.dtype))
        arrays[f"p{i:05d}"] = a.view(np.uint16) if a.dtype == jnp.bfloat16 else a
    np.savez(path, dtypes=np.array(dtypes), **arrays)


def _load_leaves(path: pathlib.Path) -> list[jax.Array]:
    with np.load(path) as f:
        dtypes = list(f["dtypes"])
        return [jnp.asarray(f[f"p{i:05d}"].view(jnp.bfloat16) if d == "bfloat16" else f[f"p{i:05d}"])
                for i, d in enumerate(dtypes)]


# --------------------------------------------------------------------------------------------------
# Load (server side: no model code)
# --------------------------------------------------------------------------------------------------


class LoadedStep:
    """A loaded export: `start(ref_latent, ctx) -> state`, `step(state, control, rng_key_data) ->
    (latents, state)`, both running the deserialized executables with the stored parameters."""

    def __init__(self, export_dir: str | pathlib.Path):
        d = pathlib.Path(export_dir)
        self.meta = json.loads((d / "meta.json").read_text())
        self._step = jax.export.deserialize(bytearray((d / "step.jaxexport").read_bytes()))
        self._start = jax.export.deserialize(bytearray((d / "start.jaxexport").read_bytes()))
        self.params = _load_leaves(d / "params.npz")
        self._call_step = jax.jit(self._step.call, donate_argnums=1)
        self._call_start = jax.jit(self._start.call)

    def start(self, ref_latent: Any, ctx: Any) -> dict:
        return self._call_start(self.params, jnp.asarray(ref_latent), jnp.asarray(ctx))

    def step(self, state: dict, control: Any, rng_key_data: Any) -> tuple[jax.Array, dict]:
        want = self.meta["inputs"]["control"]
        if list(np.shape(control)) != want["shape"]:
            raise ValueError(f"control block must have shape {want['shape']}, got {list(np.shape(control))}")
        return self._call_step(self.params, state, jnp.asarray(control), jnp.asarray(rng_key_data, jnp.uint32))


def load(export_dir: str | pathlib.Path) -> LoadedStep:
    return LoadedStep(export_dir)
