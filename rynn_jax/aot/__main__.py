"""Compile a recipe's steps for TPU slices ahead of time, on any machine (libtpu's compiler).

    python -m rynn_jax.aot --config configs/tiny.py --topology v5e:2x4 --mesh fsdp=-1 data=-1
    python -m rynn_jax.aot --config configs/stage1_sft.py --topology v5p:2x2x2 v5e:4x8 --mesh fsdp=-1
    python -m rynn_jax.aot --config configs/distill_5b.py:dmd --topology v5p:4x4x4 --slices 2 --mesh data=2,fsdp=-1

Per (topology, mesh, program) it prints a markdown row — per-chip argument / output / temp memory,
fits or "does not fit" (with the compiler's RESOURCE_EXHAUSTED figure), FLOPs, the collectives
per step by kind, compile time — then, per program and TPU generation, the smallest slice with a
fitting mesh; `--out` gets the rows as JSON. Programs: a training recipe's `train` step, a
distillation recipe's `distill` update(s) and the student's `serve` step (rynn_jax/aot/programs.py).
Needs libtpu: pip install 'jax[tpu]==<this jax>' (its start-up warnings about TPU_* variables are
harmless on a machine without TPUs).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compile-only TPU devices; nothing runs here

from rynn_jax import errors  # noqa: E402


def main(argv: Sequence[str] | None = None) -> list[dict]:
    from rynn_jax.aot import programs, report, topology
    from rynn_jax.distill.config import DistillConfig
    from rynn_jax.training import config as config_lib

    p = errors.ArgumentParser(prog="python -m rynn_jax.aot", description=__doc__)
    p.add_argument("--config", required=True, help="recipe under configs/ (file.py:arg as distill.py takes)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="recipe override (repeatable)")
    p.add_argument("--topology", nargs="+", required=True, help="TPU slices, e.g. v5e:2x4 v5p:4x4x4 v6e:16x16")
    p.add_argument("--slices", type=int, default=1, help="slices joined over DCN (mesh data axis spans them)")
    p.add_argument("--mesh", nargs="+", default=None, help="meshes to try, e.g. fsdp=-1 fsdp=-1,tensor=2 "
                   "(default: the recipe's)")
    p.add_argument("--programs", nargs="+", choices=("train", "distill", "serve"), default=None,
                   help="default: train for a training recipe, distill and serve for a distillation recipe")
    p.add_argument("--batch", type=int, default=0, help="global batch; 0 = one clip per data × fsdp rank")
    p.add_argument("--frames", type=int, default=0, help="latent frames (default 21, or the synthetic shape)")
    p.add_argument("--hw", type=int, nargs=2, default=None, help="latent H W (default 30 52: 480×832 video)")
    p.add_argument("--sessions", type=int, default=1, help="serve: sessions per replica")
    p.add_argument("--serve-mesh", default="tensor=1", help="serve: one replica's mesh (its chips)")
    p.add_argument("--out", default="", help="write the rows as JSON here")
    p.add_argument("--dump-hlo", default="", metavar="DIR", help="write each point's optimized HLO text here")
    a = p.parse_args(argv)

    path, _, arg = a.config.partition(":")
    recipe = config_lib.run_recipe(path, (config_lib.TrainConfig, DistillConfig), arg)
    cfg = config_lib.apply_overrides(recipe, a.set)
    try:
        slices = [topology.parse(t, a.slices) for t in a.topology]
    except ValueError as exc:
        raise errors.UsageError(str(exc)) from None
    if reason := topology.available():
        raise errors.UsageError(f"--topology: {reason}")
    meshes = a.mesh or [",".join(f"{k}={getattr(cfg.mesh, k)}" for k in ("data", "fsdp", "tensor", "context"))]
    for spec in [*meshes, a.serve_mesh]:
        try:
            from rynn_jax.sharding import parse_mesh_sizes
            parse_mesh_sizes(spec)
        except ValueError as exc:
            raise errors.UsageError(f"--mesh: {exc}") from None
    distill = isinstance(cfg, DistillConfig)
    names = a.programs or (["distill", "serve"] if distill else ["train"])
    if "distill" in names and not distill or "train" in names and distill:
        raise errors.UsageError(f"--programs {' '.join(names)}: {path} is a "
                                f"{'distillation' if distill else 'training'} recipe")
    t, h, w = cfg.data.synthetic_shape if cfg.data.kind == "synthetic" else programs.CLIP_THW
    h, w = a.hw or (h, w)
    plan = report.Plan(batch=a.batch, thw=(a.frames or t, h, w), sessions=a.sessions, serve_mesh=a.serve_mesh,
                       hlo_dir=a.dump_hlo)
    if a.dump_hlo:
        os.makedirs(a.dump_hlo, exist_ok=True)

    print(f"{a.config}: latent clip {plan.thw}, {'one clip per data×fsdp rank' if not a.batch else f'batch {a.batch}'}"
          f"; GiB = 2^30 bytes per chip, GB = 1e9; collectives: executions × result bytes per step\n")
    print(report.HEADER, flush=True)
    done: list[dict] = []

    def on_row(row: dict) -> None:  # printed and saved as it comes: a killed sweep keeps its rows
        done.append(row)
        print(report.format_row(row), flush=True)
        if a.out:
            os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
            with open(a.out, "w") as f:
                json.dump({"argv": list(sys.argv[1:] if argv is None else argv), "rows": done}, f, indent=1)

    rows = report.sweep(cfg, slices, meshes, names, plan, on_row=on_row)
    print("\nSmallest slice that fits, and its least-traffic mesh:")
    for r in report.smallest_fits(rows):
        print(report.format_row(r))
    if a.out:
        print(f"→ {a.out}")
    return rows


if __name__ == "__main__":
    sys.exit(errors.run(main))
