"""Logical axis names → mesh axes: the one rules table of the project.

Parameters and key activations carry *logical* names ("embed", "heads", "act_len", ...). Which mesh
axis each lands on is decided here alone, so a sharding experiment is an edit of this table (or a
config override of it), never of model code. Mesh axes: data (pure data parallel), fsdp (parameter
+ data sharding), tensor (Megatron-style heads/mlp), context (sequence parallel).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
from flax import linen as nn
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES: tuple[str, ...] = ("data", "fsdp", "tensor", "context")

# (logical name, mesh axis or axes or None). First match wins; unknown names are replicated.
LOGICAL_AXIS_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    # activations
    ("act_batch", ("data", "fsdp")),
    ("act_len", "context"),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv_len", None),
    ("act_mlp", "tensor"),
    # parameters
    ("layers", None),
    ("embed", "fsdp"),
    ("heads", "tensor"),  # q/k/v output dim = heads × head_dim, flattened
    ("mlp", "tensor"),
    ("text_embed", None),
    ("time_freq", None),
    ("modulation", None),
    ("patch", None),
    ("in_channels", None),
    ("out_channels", None),
    ("conv_out", None),
    ("lora_rank", None),  # LoRA's inner dimension: small, replicated
    ("vocab", None),  # umT5 token embedding rows (its "embed" columns follow the fsdp rule)
    ("rel_buckets", None),  # umT5 relative-position bias tables: small, replicated
)


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """Sharding constraint by logical names; a no-op outside a mesh + rules context."""
    return nn.with_logical_constraint(x, tuple(names))


Rules = Sequence[tuple[str, str | tuple[str, ...] | None]]


# --------------------------------------------------------------------------------------------------
# Mesh
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshConfig:
    """Sizes of the four mesh axes; exactly one may be -1 (= all remaining devices)."""
    data: int = 1  # pure data parallel (params replicated along it)
    fsdp: int = -1  # data parallel with parameters/optimizer state sharded along it (ZeRO-3)
    tensor: int = 1  # heads / mlp split (Megatron)
    context: int = 1  # sequence (token) split of activations
    # The logical → mesh axis table this run uses (docs/SHARDING.md); a recipe may pass its own.
    rules: tuple[tuple[str, str | tuple[str, ...] | None], ...] = LOGICAL_AXIS_RULES


def mesh_shape(cfg: MeshConfig, num_devices: int) -> tuple[int, ...]:
    sizes = [cfg.data, cfg.fsdp, cfg.tensor, cfg.context]
    if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh sizes must be positive, with at most one -1: {cfg}")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if num_devices % known:
            raise ValueError(f"{num_devices} devices do not divide into {cfg}")
        sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) != num_devices:
        raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices, "
                         f"there are {num_devices}")
    return tuple(sizes)


def parse_mesh_sizes(spec: str) -> dict[str, int]:
    """'fsdp=4,tensor=2' → {data: 1, fsdp: 4, tensor: 2, context: 1} (axes not named are 1; one
    size may be -1 = the remaining devices). A ValueError names the bad item."""
    sizes = dict.fromkeys(MESH_AXES, 1)
    for item in filter(None, spec.split(",")):
        axis, sep, size = item.partition("=")
        if not sep or axis.strip() not in sizes or not size.strip().lstrip("-").isdigit():
            raise ValueError(f"mesh {spec!r}: {item!r} is not axis=size with axis in {MESH_AXES}")
        sizes[axis.strip()] = int(size)
    return sizes


def make_mesh(cfg: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The one mesh of a run: axes (data, fsdp, tensor, context), Auto axis types so the logical
    rules (not explicit-sharding types) decide layouts."""
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(cfg, len(devices))
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices)


def initialize_distributed(enabled: bool) -> None:
    """Multi-host start: one process per host, coordinator found from the environment (TPU pods,
    SLURM, Kubernetes/JobSet). Must run before anything touches a device."""
    if enabled:
        jax.distributed.initialize()
        logging.info("jax.distributed: process %d of %d, %d local / %d global devices",
                     jax.process_index(), jax.process_count(), jax.local_device_count(), jax.device_count())


# --------------------------------------------------------------------------------------------------
# Logical specs → shardings
# --------------------------------------------------------------------------------------------------


def _is_spec(x: Any) -> bool:
    return isinstance(x, PartitionSpec)


def resolve(names: Sequence[str | None], rules: Rules = LOGICAL_AXIS_RULES,
            mesh: Mesh | None = None) -> PartitionSpec:
    """Logical dimension names → a mesh PartitionSpec. Per dimension, the first rule for its name
    whose mesh axes are still free wins (a mesh axis can shard only one dimension: the second
    "embed" of an embed×embed kernel stays whole); unknown names are replicated. With `mesh`,
    axes of size 1 are dropped (same layout; then the spec also fits non-divisible dims)."""
    used: set[str] = set()
    out: list[str | tuple[str, ...] | None] = []
    for name in names:
        chosen: tuple[str, ...] = ()
        for rule_name, target in rules:
            if rule_name != name:
                continue
            axes = (target,) if isinstance(target, str) else tuple(target or ())
            if mesh is not None:
                axes = tuple(a for a in axes if mesh.shape[a] > 1)
            if not used.intersection(axes):
                chosen = axes
                break
        used.update(chosen)
        out.append(chosen[0] if len(chosen) == 1 else (chosen or None))
    return PartitionSpec(*out)


def named_shardings(logical_specs: Any, mesh: Mesh, rules: Rules = LOGICAL_AXIS_RULES) -> Any:
    """Tree of logical PartitionSpecs → tree of NamedShardings on `mesh`."""
    return jax.tree.map(lambda s: NamedSharding(mesh, resolve(tuple(s), rules, mesh)), logical_specs,
                        is_leaf=_is_spec)


@contextlib.contextmanager
def axis_rules(mesh: Mesh, rules: Rules = LOGICAL_AXIS_RULES) -> Iterator[None]:
    """Context for calling (tracing) jitted model code: `constrain` resolves against this mesh and
    table. Enter it around the jitted call, not inside the traced function."""
    with jax.set_mesh(mesh), nn.logical_axis_rules(tuple(rules)):
        yield


# --------------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------------


def unsharded_large_arrays(tree: Any, min_size: int) -> list[str]:
    """Paths of arrays with at least `min_size` elements that are fully replicated although the
    mesh has more than one device — on a 5B model that is a silent memory blow-up."""
    bad = []
    for path, x in jax.tree_util.tree_leaves_with_path(tree):
        if not isinstance(x, jax.Array) or x.size < min_size or len(x.sharding.device_set) < 2:
            continue
        if x.sharding.is_fully_replicated:
            bad.append(f"{jax.tree_util.keystr(path)} {tuple(x.shape)}")
    return bad


def check_sharded(tree: Any, min_size: int) -> None:
    bad = unsharded_large_arrays(tree, min_size)
    if bad:
        raise ValueError(f"{len(bad)} large arrays are replicated on every device (check the logical "
                         f"axis rules and mesh sizes): " + ", ".join(bad[:10]))


def spec_table(logical_specs: Any, shapes: Any, rules: Rules = LOGICAL_AXIS_RULES) -> dict[str, dict]:
    """{path: {shape, logical, mesh}} for every leaf — the golden-file view of a sharding."""
    flat_specs = dict(jax.tree_util.tree_leaves_with_path(logical_specs, is_leaf=_is_spec))
    out = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(shapes):
        spec = flat_specs[path]
        mesh_axes = resolve(tuple(spec), rules)
        out[".".join(str(getattr(k, "key", k)) for k in path)] = {
            "shape": list(np.shape(leaf)),
            "logical": [s for s in spec],
            "mesh": [list(a) if isinstance(a, tuple) else a for a in mesh_axes],
        }
    return out
