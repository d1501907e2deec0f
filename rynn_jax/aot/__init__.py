"""Ahead-of-time compilation of the real training, distillation and serving steps for TPU slices,
on a machine without a TPU (libtpu's compiler, `jax.experimental.topologies`).

    python -m rynn_jax.aot --config configs/tiny.py --topology v5e:2x4 --mesh fsdp=-1 data=-1

topology.py  TPU slice names → compile-only devices and meshes (multislice over DCN)
programs.py  the steps train.py / distill.py / the server run, with their real shardings, as
             abstract (shape + sharding) arguments
analysis.py  compile one program: per-chip memory, fits or not, FLOPs, collectives, compile time
"""


def main(argv=None):
    """The command line (`python -m rynn_jax.aot`, rynn_jax/aot/__main__.py)."""
    from rynn_jax.aot.__main__ import main as cli

    return cli(argv)
