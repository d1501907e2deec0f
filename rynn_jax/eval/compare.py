"""One table for several evaluations of the same episodes (e.g. teacher against student):

    python -m rynn_jax.eval.compare teacher=outputs/eval/teacher student=outputs/eval/student \
        --out outputs/eval/teacher_vs_student

Each NAME=DIR is the output folder of one `eval.py` run. Only the episodes every run finished, at the
same frame count and resolution, are compared (so a run on a subset compares on that subset). The
baselines (copy-first-frame, shifted truth, autoencoder round trip) do not depend on the model, so
they are taken from the first run that has them, after checking that every other run that has them
scored them the same (else the runs did not see the same truth: an error, not a table).

Writes `compare.md` (rows: each run's model and swapped-control variants, then the baselines; paired
per-episode PSNR differences between the runs; FVD on the common episodes where the runs stored I3D
features), `compare.json` (the same numbers) and `psnr_over_time.png` (every row's mean per-frame
PSNR).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from rynn_jax.eval import fvd
from rynn_jax.eval.report import VARIANT_LABELS, _fmt, file_stem, per_frame_curve
from rynn_jax.eval.score import METRICS

MODEL_VARIANTS = ("model", "model_swapped")
BASELINES = ("autoencoder", "copy_first_frame", "shifted")
BASELINE_TOL_DB = 1e-3  # identical truth and code give identical baseline scores (up to float printing)


def _parse_runs(specs: Sequence[str]) -> dict[str, Path]:
    runs: dict[str, Path] = {}
    for s in specs:
        name, sep, d = s.partition("=")
        if not sep or not name or not d:
            raise ValueError(f"run {s!r}: expected NAME=DIR (e.g. teacher=outputs/eval/teacher)")
        if name in runs:
            raise ValueError(f"run name {name!r} given twice")
        if not (Path(d) / "episodes").is_dir():
            raise ValueError(f"run {name}: {d} has no episodes/ folder (not an eval.py output)")
        runs[name] = Path(d)
    if len(runs) < 2:
        raise ValueError("give at least two runs to compare (NAME=DIR NAME=DIR ...)")
    return runs


def _records(d: Path) -> dict[str, dict]:
    out = {}
    for p in sorted((d / "episodes").glob("*.json")):
        r = json.loads(p.read_text())
        out[r["episode"]] = r
    return out


def common_records(runs: dict[str, Path]) -> tuple[list[str], dict[str, dict[str, dict]]]:
    """The episodes every run finished with the same frame count and size; each run's records."""
    recs = {n: _records(d) for n, d in runs.items()}
    names = sorted(set.intersection(*(set(r) for r in recs.values())))
    names = [e for e in names if len({(r[e]["frames"], r[e]["height"], r[e]["width"]) for r in recs.values()}) == 1]
    if not names:
        raise ValueError("the runs share no episode evaluated at the same frame count and resolution: "
                         + ", ".join(f"{n}: {len(r)} episodes" for n, r in recs.items()))
    return names, recs


def _stats(x: np.ndarray) -> dict:
    x = x[np.isfinite(x)]
    return {"mean": float(x.mean()), "std": float(x.std()), "n": int(x.size)} if x.size else {}


def _video(recs: dict[str, dict], names: list[str], variant: str, metric: str) -> np.ndarray:
    return np.asarray([recs[e]["variants"][variant]["video"].get(metric, np.nan) for e in names], np.float64)


def _baselines(names: list[str], recs: dict[str, dict[str, dict]]) -> dict[str, tuple[str, dict]]:
    """variant → (run it is taken from, that run's records), after checking the runs agree on it."""
    out: dict[str, tuple[str, dict]] = {}
    for v in BASELINES:
        have = [n for n, r in recs.items() if v in r[names[0]]["variants"]]
        if not have:
            continue
        ref = _video(recs[have[0]], names, v, "psnr")
        for n in have[1:]:
            d = np.nanmax(np.abs(_video(recs[n], names, v, "psnr") - ref))
            if d > BASELINE_TOL_DB:
                raise ValueError(f"baseline {v!r} differs by {d:.3g} dB between runs {have[0]} and {n}: "
                                 "they did not score the same ground truth (episodes, frames or resolution)")
        out[v] = (have[0], recs[have[0]])
    return out


def _features(d: Path, names: list[str]) -> dict[str, np.ndarray] | None:
    """I3D features of the common episodes (None if any episode has none)."""
    feats: dict[str, list[np.ndarray]] = {}
    for e in names:
        p = d / "episodes" / f"{file_stem(e)}.npz"
        if not p.exists():
            return None
        with np.load(p) as z:
            for k in z.files:
                feats.setdefault(k, []).append(z[k])
    return {k: np.asarray(v) for k, v in feats.items()} if feats else None


def compare(runs: dict[str, Path]) -> dict:
    names, recs = common_records(runs)
    rows: dict[str, dict] = {}  # row label → metric → stats
    curves: dict[str, np.ndarray] = {}
    fvds: dict[str, float] = {}
    run_feats = {n: _features(d, names) for n, d in runs.items()}  # read once per run
    for n, d in runs.items():
        r = recs[n]
        feats = run_feats[n]
        for v in MODEL_VARIANTS:
            if v not in r[names[0]]["variants"]:
                continue
            label = n if v == "model" else f"{n}, swapped control"
            rows[label] = {m: _stats(_video(r, names, v, m)) for m in METRICS}
            curves[label] = _mean_curve(r, names, v)
            if feats is not None and v in feats and "truth" in feats and len(names) >= 2:
                fvds[label] = fvd.fvd_from_features(feats[v], feats["truth"])
    base = _baselines(names, recs)
    for v, (n, r) in base.items():
        label = VARIANT_LABELS.get(v, v)
        rows[label] = {m: _stats(_video(r, names, v, m)) for m in METRICS}
        curves[label] = _mean_curve(r, names, v)
        feats = run_feats[n]
        if feats is not None and v in feats and "truth" in feats and len(names) >= 2:
            fvds[label] = fvd.fvd_from_features(feats[v], feats["truth"])
    order = list(runs)
    pairs = []
    for i, a in enumerate(order):
        for b in order[i + 1:]:
            diff = _video(recs[a], names, "model", "psnr") - _video(recs[b], names, "model", "psnr")
            pairs.append({"a": a, "b": b, **_stats(diff), "min": float(np.nanmin(diff)), "max": float(np.nanmax(diff)),
                          "a_better": int(np.sum(diff > 0))})
    gains = {n: _stats(_video(recs[n], names, "model", "psnr") - _video(base["copy_first_frame"][1], names,
                                                                         "copy_first_frame", "psnr"))
             for n in order} if "copy_first_frame" in base else {}
    first = recs[order[0]][names[0]]
    return {"runs": {n: str(d) for n, d in runs.items()}, "episodes": names, "n": len(names),
            "frames": first["frames"], "resolution": [first["height"], first["width"]], "rows": rows,
            "model_minus_copy_first_frame_db": gains, "paired_psnr_db": pairs,
            "fvd": {"videos": len(names), "meaningful": len(names) >= fvd.MIN_VIDEOS, "per_row": fvds},
            "_curves": curves}


def _mean_curve(recs: dict[str, dict], names: list[str], variant: str) -> np.ndarray:
    return per_frame_curve([recs[e] for e in names], variant, "psnr")[0]  # frames 1..: 0 is the given reference


def markdown(s: dict) -> str:
    shown = [m for m in METRICS if any(r.get(m) for r in s["rows"].values())]
    head = ["variant"] + [m + (" ↑" if METRICS[m][0] else " ↓") for m in shown] + ["FVD ↓"]
    lines = [f"# {' vs '.join(s['runs'])}", "",
             f"{s['n']} episodes every run finished, {s['frames']} frames at {s['resolution'][0]}×{s['resolution'][1]}; "
             "mean ± std over episodes of the video scores (frames 1..N−1).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, st in s["rows"].items():
        cells = [f"{_fmt(st[m]['mean'], 2 if METRICS[m][1] else 3)} ± {_fmt(st[m]['std'], 2 if METRICS[m][1] else 3)}"
                 if st.get(m) else "–" for m in shown]
        lines.append("| " + " | ".join([label] + cells + [_fmt(s["fvd"]["per_row"].get(label), 1)]) + " |")
    lines += [""]
    for n, g in s["model_minus_copy_first_frame_db"].items():
        lines.append(f"- {n} − copy-first-frame: {_fmt(g['mean'])} ± {_fmt(g['std'])} dB PSNR.")
    for p in s["paired_psnr_db"]:
        lines.append(f"- {p['a']} − {p['b']}, paired per episode: {_fmt(p['mean'])} ± {_fmt(p['std'])} dB PSNR "
                     f"(from {_fmt(p['min'])} to {_fmt(p['max'])}; {p['a']} better in {p['a_better']} of {p['n']}).")
    if s["fvd"]["per_row"] and not s["fvd"]["meaningful"]:
        lines.append(f"- FVD over {s['n']} videos (< {fvd.MIN_VIDEOS}): biased by the sample size; compare rows "
                     "with each other only.")
    lines += ["", "![per-frame PSNR](psnr_over_time.png)", ""]
    return "\n".join(lines)


def plot(out: Path, s: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=90)
    for label, c in s["_curves"].items():
        ax.plot(np.arange(1, len(c) + 1), c, label=label)
    ax.set_xlabel("frame")
    ax.set_ylabel("PSNR (dB)")
    ax.set_title(f"per-frame PSNR, mean over {s['n']} episodes")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "psnr_over_time.png")
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m rynn_jax.eval.compare", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="NAME=DIR", help="eval.py output folders, the first is the reference")
    p.add_argument("--out", required=True, help="folder for compare.md / compare.json / psnr_over_time.png")
    a = p.parse_args(argv)
    try:
        s = compare(_parse_runs(a.runs))
    except ValueError as e:
        p.exit(2, f"error: {e}\n")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    plot(out, s)
    s = {k: v for k, v in s.items() if not k.startswith("_")}
    (out / "compare.json").write_text(json.dumps(s, indent=1))
    (out / "compare.md").write_text(markdown(s))
    print(markdown(s))
    return s


if __name__ == "__main__":
    main()
