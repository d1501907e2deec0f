"""TPU slices as compile-only devices: `v5e:2x4`, `v5p:4x4x4`, `v6e:16x16` (× `slices` over DCN).

libtpu describes a slice it is not running on (`jax.experimental.topologies.get_topology_desc`);
the devices it returns carry their physical coordinates, so `jax.make_mesh` lays the mesh axes
along the torus as it would on the pod. The per-generation constants are the ones MaxText's
`accelerator_to_spec_map.py` uses (topology prefix, chip config, 2×2 chips per host, wrap-around
links on full-size dimensions); HBM per chip is the datasheet figure, for display only — whether a
program fits is the TPU compiler's verdict, not ours.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
from jax.experimental import mesh_utils, topologies
from jax.sharding import AxisType, Mesh

from rynn_jax import sharding


@dataclasses.dataclass(frozen=True)
class Generation:
    libtpu_name: str  # topology prefix libtpu knows ("v5" is v5p)
    chip_config: str  # "megacore": the chip's two TensorCores are one device
    dims: int  # 2-D (v5e, v6e) or 3-D (v5p) torus
    hbm_gib: float  # per chip, datasheet


GENERATIONS: dict[str, Generation] = {
    "v5e": Generation("v5e", "default", 2, 16.0),
    "v6e": Generation("v6e", "default", 2, 32.0),
    "v5p": Generation("v5", "megacore", 3, 95.0),
}


@dataclasses.dataclass(frozen=True)
class Slice:
    """`slices` identical TPU slices of `generation` with chip grid `shape`."""
    generation: str
    shape: tuple[int, ...]
    slices: int = 1

    @property
    def name(self) -> str:
        base = f"{self.generation}:{'x'.join(map(str, self.shape))}"
        return base if self.slices == 1 else f"{base}×{self.slices}"

    @property
    def chips(self) -> int:
        return math.prod(self.shape) * self.slices

    @property
    def spec(self) -> Generation:
        return GENERATIONS[self.generation]


def parse(text: str, slices: int = 1) -> Slice:
    """'v5e:2x4' → Slice; a clear error naming the flag for anything else."""
    gen, sep, grid = text.partition(":")
    if not sep or gen not in GENERATIONS:
        raise ValueError(f"--topology {text!r}: want GENERATION:AxB[xC] with GENERATION in {sorted(GENERATIONS)}")
    try:
        shape = tuple(int(s) for s in grid.split("x"))
    except ValueError:
        raise ValueError(f"--topology {text!r}: chip grid {grid!r} is not AxB[xC]") from None
    want = GENERATIONS[gen].dims
    if len(shape) != want or min(shape) < 1:
        raise ValueError(f"--topology {text!r}: {gen} slices are {want}-D chip grids, e.g. "
                         f"{'v5p:4x4x4' if want == 3 else gen + ':2x4'}")
    if slices < 1:
        raise ValueError(f"--slices {slices}: must be ≥ 1")
    return Slice(gen, shape, slices)


def _wrap(s: Slice) -> tuple[bool, bool, bool]:
    """Wrap-around (torus) links: v5e/v6e on 16-chip dimensions; v5p on full 4×4×4+ cubes."""
    if s.spec.dims == 2:
        return (s.shape[0] == 16, s.shape[1] == 16, False)
    return (min(s.shape) >= 4,) * 3


def devices(s: Slice) -> list:
    """The slice's compile-only TPU devices (libtpu must be installed; `available()` says)."""
    grid = tuple(s.shape) + (1,) * (3 - len(s.shape))
    per_host = tuple(min(2, d) for d in grid[:2]) + (1,)
    topo = topologies.get_topology_desc(
        platform="tpu", topology_name=f"{s.spec.libtpu_name}:{'x'.join(map(str, s.shape))}",
        chip_config_name=s.spec.chip_config, chips_per_host_bounds=per_host, num_slices=s.slices,
        wrap=_wrap(s))
    return list(topo.devices)


def make_mesh(s: Slice, mesh_cfg: sharding.MeshConfig) -> Mesh:
    """The run's (data, fsdp, tensor, context) mesh on the slice. With several slices the `data`
    axis spans them (DCN: gradient all-reduce only, once per step); every other axis stays inside
    a slice, on its ICI links. A mesh axis that does not factor the torus axes (tensor=2 on a 4×4
    slice) splits a physical axis, as `allow_split_physical_axes` permits: its ring is not a torus
    ring, which the compiled collectives then reflect."""
    devs = devices(s)
    shape = sharding.mesh_shape(mesh_cfg, len(devs))
    if s.slices == 1:
        try:
            return sharding.make_mesh(mesh_cfg, devs)
        except NotImplementedError:  # a mesh axis that is no product of whole torus axes (2 on 4×4)
            grid = mesh_utils.create_device_mesh(shape, devs, allow_split_physical_axes=True)
            return Mesh(grid, sharding.MESH_AXES, axis_types=(AxisType.Auto,) * len(shape))
    data = shape[0]
    if data % s.slices:
        raise ValueError(f"--slices {s.slices}: mesh data={data} must be a multiple of the slice count "
                         "(data is the axis across slices)")
    ici = (data // s.slices, *shape[1:])
    dcn = (s.slices,) + (1,) * (len(shape) - 1)
    grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devs)
    return Mesh(np.asarray(grid), sharding.MESH_AXES, axis_types=(AxisType.Auto,) * len(shape))


def available() -> str:
    """'' when libtpu can describe a slice here, else the reason (for a test skip or a CLI error)."""
    try:
        devices(Slice("v5e", (1, 1)))
    except Exception as exc:  # noqa: BLE001 — any failure means: no TPU compiler on this machine
        return (f"libtpu is not usable ({type(exc).__name__}: {str(exc)[:200]}); install it with "
                f"pip install 'jax[tpu]=={jax.__version__}'")
    return ""
