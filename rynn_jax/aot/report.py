"""The sweep behind `python -m rynn_jax.aot`: every (slice, mesh, program) point compiled, one row
each; the table; and per program and TPU generation the smallest slice with a fitting mesh."""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import re
from collections.abc import Callable, Sequence

import jax

from rynn_jax import sharding
from rynn_jax.aot import analysis, programs, topology


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    batch: int = 0  # global training batch; 0 = one clip per data × fsdp rank
    thw: tuple[int, int, int] = programs.CLIP_THW  # latent clip (frames, h, w)
    sessions: int = 1  # serve: sessions per replica
    serve_mesh: str = "tensor=1"  # serve: one replica's mesh, on the slice's first chips
    hlo_dir: str = ""  # write each point's optimized HLO here


def _programs(cfg, name: str, mesh, plan: Plan) -> list[programs.Program]:
    from rynn_jax.distill.config import DistillConfig

    dp = mesh.shape["data"] * mesh.shape["fsdp"]
    batch = plan.batch or dp
    if batch % dp:
        raise ValueError(f"batch {batch} does not split over data × fsdp = {dp}")
    if name == "train":
        return programs.train(cfg, mesh, batch, plan.thw)
    if name == "distill":
        return programs.distill(cfg, mesh, batch, plan.thw)
    ccfg, scfg = (cfg.causal, cfg.student_steps) if isinstance(cfg, DistillConfig) else _serving_defaults()
    return programs.serve(cfg.model, ccfg, scfg, mesh, cfg.mesh.rules, plan.sessions, plan.thw[1:])


def _serving_defaults():
    from rynn_jax.models.causal import CausalConfig
    from rynn_jax.serving.block_step import StepConfig

    return CausalConfig(), StepConfig()


def _mesh(tpu: topology.Slice, spec: str, cfg, serve: bool):
    mesh_cfg = dataclasses.replace(cfg.mesh, **sharding.parse_mesh_sizes(spec))
    if not serve:
        return topology.make_mesh(tpu, mesh_cfg)
    devices = topology.devices(tpu)
    n = math.prod(s for s in sharding.parse_mesh_sizes(spec).values() if s > 0)
    if n > len(devices):
        raise ValueError(f"serve mesh {spec!r} needs {n} chips, {tpu.name} has {len(devices)}")
    return sharding.make_mesh(mesh_cfg, devices[:n])


def sweep(cfg, slices: Sequence[topology.Slice], meshes: Sequence[str], names: Sequence[str], plan: Plan,
          on_row: Callable[[dict], None] = lambda row: None) -> list[dict]:
    """One row per (slice, mesh, program); a point that cannot be built (mesh does not factor the
    slice, batch does not divide) is a row with status 'skipped' and the reason."""
    rows = []
    for tpu in slices:
        hbm = tpu.spec.hbm_gib * 2**30
        for name in names:
            for spec in ([plan.serve_mesh] if name == "serve" else meshes):
                head = {"topology": tpu.name, "generation": tpu.generation, "slice_chips": tpu.chips,
                        "hbm_gib": tpu.spec.hbm_gib, "mesh_spec": spec}
                try:
                    progs = _programs(cfg, name, _mesh(tpu, spec, cfg, name == "serve"), plan)
                except Exception as exc:  # noqa: BLE001 — a point that cannot be built is a row
                    progs = []
                    status = "skipped" if isinstance(exc, ValueError) else "error"
                    row = {**head, "program": name, "status": status, "reason": f"{type(exc).__name__}: {exc}"[:600]}
                    rows.append(row)
                    on_row(row)
                for p in progs:
                    hlo = os.path.join(plan.hlo_dir, _slug(tpu.name, spec, p.name) + ".hlo.txt") if plan.hlo_dir else ""
                    row = {**head, **analysis.compile_program(p, hbm, hlo)}
                    rows.append(row)
                    on_row(row)
                jax.clear_caches()
                gc.collect()
    return rows


def _slug(*parts: str) -> str:
    return "_".join(re.sub(r"[^\w.=-]+", "-", x) for x in parts)


def smallest_fits(rows: list[dict]) -> list[dict]:
    """Per (program, generation): the fewest chips on which some mesh fits, and there the fitting
    mesh with the least collective traffic per chip per clip of the global batch (meshes with a
    tensor or context axis train fewer clips per step; ties: least memory per chip)."""
    best: dict[tuple[str, str], dict] = {}
    for r in rows:
        if r["status"] != "fits":
            continue
        key = (r["program"], r["generation"])
        clips = r.get("batch", r.get("sessions", 1))
        rank = (r["slice_chips"], traffic(r) / clips, r["memory"]["total"])
        if key not in best or rank < best[key]["rank"]:
            best[key] = {"rank": rank, "row": r}
    return [v["row"] for _, v in sorted(best.items())]


def traffic(row: dict) -> int:
    return sum(c["bytes"] for c in row.get("collectives", {}).values())


def _gib(x) -> str:
    if not isinstance(x, int | float):
        return "–"
    return f"{x / 2**30:.2f} GiB" if x >= 2**28 else f"{x / 2**20:.2f} MiB"


HEADER = ("| topology | program | mesh | batch | status | arguments | outputs | temps | total | HBM GiB "
          "| model TFLOP/chip | all-gather | reduce-scatter | all-reduce | coll.-permute | all-to-all | compile s |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def _coll(row: dict, kinds: Sequence[str]) -> str:
    c = row.get("collectives")
    if c is None:
        return "–"
    runs = sum(c.get(k, {}).get("runs", 0) for k in kinds)
    nbytes = sum(c.get(k, {}).get("bytes", 0) for k in kinds)
    return f"{runs}× {nbytes / 1e9:.3g} GB" if runs else "0"


def format_row(r: dict) -> str:
    mem = r.get("memory", {})
    mesh = ",".join(f"{k}={v}" for k, v in r["mesh"].items() if v > 1) if "mesh" in r else r["mesh_spec"]
    status = r["status"] + (f" ({r['reason']})" if r["status"] != "fits" and "reason" in r else "")
    cells = [r["topology"], r["program"], mesh or "1 chip", str(r.get("batch", r.get("sessions", "–"))), status,
             _gib(mem.get("argument")), _gib(mem.get("output")), _gib(mem.get("temp")), _gib(mem.get("total")),
             f"{r['hbm_gib']:g}", f"{r['model_flops'] / r['chips'] / 1e12:.3g}" if "model_flops" in r else "–",
             _coll(r, ["all-gather"]), _coll(r, ["reduce-scatter"]), _coll(r, ["all-reduce"]),
             _coll(r, ["collective-permute"]), _coll(r, ["all-to-all"]),
             f"{r['compile_s']:.1f}" if "compile_s" in r else "–"]
    return "| " + " | ".join(cells) + " |"
