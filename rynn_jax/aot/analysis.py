"""Compile one program for its TPU mesh and read what the compiler says about it.

Per chip: argument / output / temp bytes (`compiled.memory_analysis()`); whether it fits — the TPU
compiler refuses a program whose temporaries do not fit with RESOURCE_EXHAUSTED (we keep its
figure), and we also call "does not fit" a compiled program whose arguments + outputs − aliased +
temps (+ anything else resident) exceed the chip's HBM; FLOPs (XLA's `cost_analysis()`, which
counts a loop body once: model FLOPs come from programs.py where there is a closed form); and the
collectives in the optimized HLO by kind: how many instructions, and how many times and bytes they
run per step (a collective inside a `while` body — the scan over the DiT blocks, a windowed
collective matmul — counts once per trip of the loop).
"""

from __future__ import annotations

import collections
import math
import re
import time

from rynn_jax import sharding
from rynn_jax.aot.programs import Program, bytes_per_chip

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2,
                "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8, "c64": 8}
_COMP = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")  # unindented header: "%name (params) -> out {"
_INSTR = re.compile(r"^\s*(?:ROOT )?%?[\w.\-]+ = (.+?) ([a-z][\w\-]*)\((.*)$")
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\dm\d(?:fn)?)?)\[([\d,]*)\]")
_CALLS = re.compile(r"\b(?:body|to_apply|calls|branch_computations|true_computation|false_computation)="
                    r"(\{[^}]*\}|%?[\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_COND = re.compile(r"\bcondition=%?([\w.\-]+)")
_CONST = re.compile(r"^\s*%?([\w.\-]+) = [su](?:32|64)\[\]\S* constant\((\d+)\)")


def _trip_count(rest: str, comps: dict) -> int:
    """XLA's known_trip_count when printed, else the bound N of the condition's `i < N` (scans and
    fori_loops count from 0); 1 when neither is there."""
    if t := _TRIP.search(rest):
        return int(t.group(1))
    cond = _COND.search(rest)
    lines = comps.get(cond.group(1), []) if cond else []
    consts = dict(m.groups() for line in lines if (m := _CONST.match(line)))
    for line in lines:
        if line.lstrip().startswith("ROOT") and "direction=LT" in line:
            for name, value in consts.items():
                if f"%{name})" in line or f"%{name}," in line:
                    return int(value)
    return 1


def _shape_bytes(shape_text: str) -> int:
    return sum(_DTYPE_BYTES.get(dt, 4) * math.prod(int(d) for d in dims.split(",") if d)
               for dt, dims in _ARRAY.findall(shape_text))


def collectives(hlo_text: str) -> dict[str, dict[str, int]]:
    """{kind: {"ops": instructions in the HLO, "runs": executions per step, "bytes": result bytes
    per step}}. Async pairs count once, at the -start (whose result tuple is operand, result and
    sync flags: its bytes are the result's)."""
    comps: dict[str, list[tuple[str, str, str]]] = {}
    raw: dict[str, list[str]] = {}
    entry, current = None, None
    for line in hlo_text.splitlines():
        m = _COMP.match(line)
        if m and not line.startswith("HloModule"):
            current = m.group(1)
            comps[current], raw[current] = [], []
            entry = current if line.startswith("ENTRY") else entry
            continue
        m = _INSTR.match(line)
        if m and current is not None:
            comps[current].append(m.groups())
            raw[current].append(line)
    runs: dict[str, int] = collections.defaultdict(int)

    def visit(name: str, times: int, depth: int = 0) -> None:
        if name not in comps or depth > 64:
            return
        runs[name] += times
        for _, op, rest in comps[name]:
            trip = _trip_count(rest, raw) if op == "while" else 1
            for group in _CALLS.findall(rest):
                for callee in group.strip("{}").split(","):
                    visit(callee.strip().lstrip("%"), times * trip, depth + 1)

    if entry is not None:
        visit(entry, 1)
    out: dict[str, dict[str, int]] = {}
    for name, instrs in comps.items():
        for shape, op, _ in instrs:
            kind = op.removesuffix("-start")
            if kind not in COLLECTIVES or op.endswith("-done"):
                continue
            arrays = _ARRAY.findall(shape)
            if op.endswith("-start") and len(arrays) >= 2:  # (operand, result, [u32 sync flags]) → result
                arrays = arrays[1:2]
            nbytes = sum(_shape_bytes("{}[{}]".format(*a)) for a in arrays)
            row = out.setdefault(kind, {"ops": 0, "runs": 0, "bytes": 0})
            row["ops"] += 1
            row["runs"] += runs.get(name, 0)
            row["bytes"] += nbytes * runs.get(name, 0)
    return out


def _oom_figure(text: str) -> str:
    """The sentence of a RESOURCE_EXHAUSTED message that carries the numbers."""
    for line in text.splitlines():
        if "RESOURCE_EXHAUSTED" in line or "exceeds" in line or "Used" in line:
            return " ".join(line.split())[:300]
    return " ".join(text.split())[:300]


def compile_program(p: Program, hbm_bytes: float, hlo_path: str = "") -> dict:
    """A row: status 'fits', 'does not fit' (compiler's RESOURCE_EXHAUSTED, or arguments + temps +
    `resident_bytes` over `hbm_bytes`) or 'error', with the compiler's figures; `hlo_path`: write
    the optimized HLO there."""
    row: dict = {"program": p.name, "mesh": dict(p.mesh.shape), "chips": p.mesh.size, **p.info,
                 "argument_bytes_computed": bytes_per_chip(p.args), "resident_bytes": p.resident_bytes}
    t0 = time.perf_counter()
    try:
        with sharding.axis_rules(p.mesh, p.rules):
            lowered = p.fn.lower(*p.args)
        row["lower_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        compiled = lowered.compile()
    except Exception as exc:  # noqa: BLE001 — a point that fails is a row, not a crash of the table
        text = f"{type(exc).__name__}: {exc}"
        oom = "RESOURCE_EXHAUSTED" in text or "Ran out of memory" in text
        row.update(status="does not fit" if oom else "error", reason=_oom_figure(text) if oom else text[:600],
                   compile_s=time.perf_counter() - t0)
        return row
    row["compile_s"] = time.perf_counter() - t0
    ma = compiled.memory_analysis()
    mem = {k: int(getattr(ma, f"{k}_size_in_bytes")) for k in ("argument", "output", "alias", "temp",
                                                             "generated_code")}
    mem["total"] = mem["argument"] + mem["output"] - mem["alias"] + mem["temp"] + p.resident_bytes
    row["memory"] = mem
    cost = compiled.cost_analysis() or {}
    cost = cost[0] if isinstance(cost, list) else cost
    row["xla_flops"] = float(cost.get("flops", 0.0))  # XLA's cost analysis: each loop body counted once
    hlo = compiled.as_text()
    row["collectives"] = collectives(hlo)
    if hlo_path:
        with open(hlo_path, "w") as f:
            f.write(hlo)
    over = mem["total"] > hbm_bytes
    row["status"] = "does not fit" if over else "fits"
    if over:
        row["reason"] = (f"compiled, but arguments + outputs + temps{' + resident' if p.resident_bytes else ''} = "
                         f"{mem['total'] / 2**30:.2f} GiB per chip > {hbm_bytes / 2**30:.0f} GiB HBM")
    return row
