"""Aggregate the per-episode records of an evaluation into tables, plots and one readable report.

    metrics.json         per variant and metric: mean, std, median, n; FVD; swap and baseline gaps
    episodes.csv/.parquet one row per (episode, variant) with its video scores
    psnr_over_time.png   mean per-frame PSNR (±1 std) of each variant across episodes
    geometry_over_time.png  RynnWorld-4D: mean per-frame depth AbsRel and flow EPE of each variant
    psnr_per_chunk.png   mean PSNR per chunk of `chunk_frames` frames (long episodes: does it drift?)
    histograms.png       per-episode PSNR / SSIM / LPIPS of each variant
    grid.png             frame strips of the first episodes: skeleton | generated (| swapped) | truth
    report.md            all of the above, linked, readable without running anything
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from rynn_jax.eval import fvd
from rynn_jax.eval.score import METRICS

GRID_EPISODES = 4
# Drift chunks: frames 1..80, 81..160, ... — what the streamed student generates per re-anchored chunk
# of 21 latent frames (81 video frames, whose frame 0 is the anchor, already shown).
CHUNK_FRAMES = 80
VARIANT_LABELS = {
    "model": "model", "model_swapped": "model, swapped control", "copy_first_frame": "copy first frame",
    "shifted": "truth shifted", "autoencoder": "autoencoder round trip (ceiling)",
}


def file_stem(name: str) -> str:
    return name.replace("/", "__")


def load_records(out: Path, names: list[str]) -> list[dict]:
    recs = []
    for n in names:
        p = out / "episodes" / f"{file_stem(n)}.json"
        if p.exists():
            recs.append(json.loads(p.read_text()))
    return recs


def chunk_means(per_frame: list[float], chunk_frames: int) -> list[float]:
    """Mean of frames 1 + k·c .. (k + 1)·c for every whole chunk k (frame 0 is the given reference)."""
    x = np.asarray(per_frame, np.float64)[1:]
    whole = len(x) // chunk_frames
    return x[:whole * chunk_frames].reshape(whole, chunk_frames).mean(axis=1).tolist()


def per_chunk(records: list[dict], chunk_frames: int, metric: str = "psnr") -> dict[str, list[dict]]:
    """Per variant and whole chunk: mean, std and count over the episodes that reach that chunk."""
    out: dict[str, list[dict]] = {}
    for v in records[0]["variants"]:
        rows = [chunk_means(r["variants"][v]["per_frame"][metric], chunk_frames) for r in records]
        out[v] = []
        for k in range(max(len(c) for c in rows)):
            x = np.asarray([c[k] for c in rows if len(c) > k])
            out[v].append({"chunk": k, "frames": [1 + k * chunk_frames, (k + 1) * chunk_frames],
                           "mean": float(x.mean()), "std": float(x.std()), "n": int(x.size)})
    return out


def aggregate(records: list[dict], features: dict[str, list[np.ndarray]], chunk_frames: int = CHUNK_FRAMES) -> dict:
    variants = list(records[0]["variants"])
    summary: dict = {"episodes": len(records), "frames": sorted({r["frames"] for r in records}),
                     "resolution": sorted({(r["height"], r["width"]) for r in records}), "variants": {}}
    for v in variants:
        summary["variants"][v] = {}
        for m in METRICS:
            x = np.asarray([r["variants"][v]["video"].get(m, np.nan) for r in records], np.float64)
            x = x[np.isfinite(x)]
            if x.size:
                summary["variants"][v][m] = {"mean": float(x.mean()), "std": float(x.std()),
                                             "median": float(np.median(x)), "n": int(x.size)}

    def gap(a: str, b: str, m: str) -> float | None:  # mean over episodes of a − b
        d = [r["variants"][a]["video"].get(m, np.nan) - r["variants"][b]["video"].get(m, np.nan) for r in records]
        d = np.asarray(d, np.float64)
        d = d[np.isfinite(d)]
        return float(d.mean()) if d.size else None

    summary["model_minus_copy_first_frame_db"] = {m: gap("model", "copy_first_frame", m) for m in ("psnr", "robot_psnr")}
    if "autoencoder" in variants:
        summary["model_minus_autoencoder_db"] = {m: gap("model", "autoencoder", m) for m in ("psnr", "robot_psnr")}
    if "model_swapped" in variants:
        summary["swap_drop_db"] = {m: gap("model", "model_swapped", m) for m in ("psnr", "robot_psnr")}
    summary["fvd"] = fvd_summary(features)
    summary["chunk_frames"] = chunk_frames
    summary["psnr_per_chunk"] = per_chunk(records, chunk_frames)
    return summary


def fvd_summary(features: dict[str, list[np.ndarray]]) -> dict:
    truth = np.asarray(features.get("truth", []))
    out: dict = {"videos": int(len(truth)), "min_videos_meaningful": fvd.MIN_VIDEOS,
                 "meaningful": bool(len(truth) >= fvd.MIN_VIDEOS), "per_variant": {}}
    if len(truth) < 2:
        out["note"] = "fewer than 2 videos with I3D features: no FVD"
        return out
    for v, f in features.items():
        if v != "truth":
            out["per_variant"][v] = fvd.fvd_from_features(np.asarray(f), truth)
    half = len(truth) // 2
    if half >= 2:  # the same-N floor: two disjoint halves of the ground truth
        out["truth_half_vs_half"] = fvd.fvd_from_features(truth[:half], truth[half:2 * half])
    if not out["meaningful"]:
        out["note"] = (f"{len(truth)} videos < {fvd.MIN_VIDEOS}: dominated by sample-size bias; compare only with "
                       "FVDs of the same N (see truth_half_vs_half)")
    return out


def write_tables(out: Path, records: list[dict]) -> None:
    rows = [{"episode": r["episode"], "variant": v, "frames": r["frames"],
             **{m: r["variants"][v]["video"].get(m, float("nan")) for m in METRICS}}
            for r in records for v in r["variants"]]
    table = pa.Table.from_pylist(rows)
    pa_csv.write_csv(table, out / "episodes.csv")
    pq.write_table(table, out / "episodes.parquet")


def plot_chunks(out: Path, chunks: dict[str, list[dict]], chunk_frames: int) -> None:
    """Mean PSNR (±1 std over episodes) per chunk of each variant: the drift plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.4), dpi=90)
    for v, rows in chunks.items():
        k = np.asarray([r["chunk"] for r in rows])
        mean, std = np.asarray([r["mean"] for r in rows]), np.asarray([r["std"] for r in rows])
        ax.errorbar(k + 1, mean, yerr=std, marker="o", capsize=3, label=VARIANT_LABELS.get(v, v))
    ax.set_xlabel(f"chunk ({chunk_frames} frames = {chunk_frames / 16:g} s at 16 fps)")
    ax.set_ylabel("PSNR (dB)")
    ax.set_title("PSNR per chunk, mean ± std over episodes")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "psnr_per_chunk.png")
    plt.close(fig)


GEOMETRY_CURVES = (("depth_absrel", "depth AbsRel (median-scaled)"), ("flow_epe", "flow end-point error (px)"))


def per_frame_curve(records: list[dict], variant: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std over episodes of `metric` at each frame 1..T−1 (frame 0 is the given reference);
    episodes of different lengths count where they have the frame."""
    curves = [np.asarray(r["variants"][variant]["per_frame"][metric], np.float64) for r in records]
    m = np.full((len(curves), max(len(c) for c in curves)), np.nan)
    for i, c in enumerate(curves):
        m[i, :len(c)] = c
    return np.nanmean(m[:, 1:], 0), np.nanstd(m[:, 1:], 0)


def has_geometry(records: list[dict]) -> bool:
    """Whether every episode's model has per-frame depth and flow scores (a RynnWorld-4D evaluation)."""
    return all(all(k in r["variants"]["model"]["per_frame"] for k, _ in GEOMETRY_CURVES) for r in records)


def plot(out: Path, records: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = list(records[0]["variants"])
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=90)
    for v in variants:
        mean, std = per_frame_curve(records, v, "psnr")
        x = np.arange(1, len(mean) + 1)
        ax.plot(x, mean, label=VARIANT_LABELS.get(v, v))
        ax.fill_between(x, mean - std, mean + std, alpha=0.15)
    ax.set_xlabel("frame")
    ax.set_ylabel("PSNR (dB)")
    ax.set_title(f"per-frame PSNR, mean ± std over {len(records)} episodes")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "psnr_over_time.png")
    plt.close(fig)

    if has_geometry(records):  # depth and flow per frame (means only: their spread dwarfs the gaps)
        fig, axes = plt.subplots(1, len(GEOMETRY_CURVES), figsize=(10, 3.4), dpi=90)
        for ax, (metric, label) in zip(axes, GEOMETRY_CURVES):
            for v in variants:
                if all(metric in r["variants"][v]["per_frame"] for r in records):
                    mean, _ = per_frame_curve(records, v, metric)
                    ax.plot(np.arange(1, len(mean) + 1), mean, label=VARIANT_LABELS.get(v, v))
            ax.set_xlabel("frame")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        fig.suptitle(f"depth and flow per frame, mean over {len(records)} episodes (lower is better)", fontsize=9)
        fig.tight_layout()
        fig.savefig(out / "geometry_over_time.png")
        plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(10, 3.2), dpi=90)
    for ax, m in zip(axes, ("psnr", "ssim", "lpips")):
        vals = {v: [r["variants"][v]["video"][m] for r in records] for v in variants}
        lo = min(min(x) for x in vals.values())
        hi = max(max(x) for x in vals.values())
        bins = np.linspace(lo, hi if hi > lo else lo + 1e-6, 16)
        for v, x in vals.items():
            ax.hist(x, bins=bins, alpha=0.5, label=VARIANT_LABELS.get(v, v))
        ax.set_xlabel(m.upper() + (" (dB)" if m == "psnr" else ""))
        ax.set_ylabel("episodes")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "histograms.png")
    plt.close(fig)

    from rynn_jax.render.preview import read_png

    shown = records[:GRID_EPISODES]
    strips = [read_png(out / "strips" / f"{file_stem(r['episode'])}.png") for r in shown]
    aspect = max(s.shape[0] / s.shape[1] for s in strips)
    fig, axes = plt.subplots(len(shown), 1, figsize=(8, len(shown) * (6.6 * aspect + 0.4)), dpi=72, squeeze=False)
    rows = records[0]["strip_rows"] if "strip_rows" in records[0] else (  # a 4D model's rows, or the skeleton's
        ["skeleton", "generated"] + (["swapped"] if "model_swapped" in variants else []) + ["truth"])
    for ax, r, img in zip(axes[:, 0], shown, strips):
        ax.imshow(img)
        h = img.shape[0] / len(rows)
        ax.set_yticks([(i + 0.5) * h for i in range(len(rows))], rows, fontsize=7)
        ax.set_xticks([])
        ax.set_title(f"{r['episode']}  (PSNR {r['variants']['model']['video']['psnr']:.2f} dB)", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "grid.png")
    plt.close(fig)


def write_report(out: Path, names: list[str], config: dict, chunk_frames: int = CHUNK_FRAMES) -> dict:
    """Aggregate the finished episodes of `names` under `out`; write every table, plot and report.md
    (the drift plot when episodes have ≥ 2 whole chunks of `chunk_frames` frames)."""
    records = load_records(out, names)
    if not records:
        raise ValueError(f"{out}: no evaluated episodes to report")
    features: dict[str, list[np.ndarray]] = {}
    for r in records:
        p = out / "episodes" / f"{file_stem(r['episode'])}.npz"
        if p.exists():
            with np.load(p) as z:
                for k in z.files:
                    features.setdefault(k, []).append(z[k])
    summary = {**aggregate(records, features, chunk_frames), "config": config,
               "missing_episodes": [n for n in names if n not in {r["episode"] for r in records}],
               "geometry_over_time": has_geometry(records)}
    (out / "metrics.json").write_text(json.dumps(summary, indent=1))
    write_tables(out, records)
    plot(out, records)
    if _drifts(summary):
        plot_chunks(out, summary["psnr_per_chunk"], chunk_frames)
    (out / "report.md").write_text(markdown(summary))
    return summary


def _drifts(s: dict) -> bool:
    """Whether there are ≥ 2 whole chunks to compare (a drift table and plot)."""
    return len(s["psnr_per_chunk"].get("model", [])) >= 2


def _fmt(x: float | None, digits: int = 2) -> str:
    return "–" if x is None or not np.isfinite(x) else f"{x:.{digits}f}"


def markdown(s: dict) -> str:
    cfg = s["config"]
    lines = [f"# Evaluation: {cfg['model']}", "",
             f"{s['episodes']} episodes from `{cfg['episodes']}`, {', '.join(map(str, s['frames']))} frames at "
             f"{', '.join(f'{h}×{w}' for h, w in s['resolution'])}; seed {cfg['seed']}; weights: {cfg['weights']}"
             + (f"; {cfg['steps']} sampler steps" if cfg["model"] in ("teacher", "world4d") else "") + ".",
             "Video scores average frames 1..N−1 (frame 0 is the given reference); the table shows the mean "
             "(± std) over episodes. Definitions: `rynn_jax/eval/metrics.py`.", ""]
    lines += summary_lines(s)
    lines += ["", "## Per-frame PSNR", "", "![per-frame PSNR](psnr_over_time.png)", ""]
    if s.get("geometry_over_time"):
        lines += ["## Depth and flow per frame", "", "![depth and flow per frame](geometry_over_time.png)", ""]
    if _drifts(s):
        c = s["chunk_frames"]
        rows = s["psnr_per_chunk"]
        chunks = rows["model"]
        lines += ["## PSNR per chunk (drift)", "",
                  f"Mean PSNR over each whole chunk of {c} frames ({c / 16:g} s), mean ± std over the episodes "
                  "that reach it.", "",
                  "| variant | " + " | ".join(f"frames {r['frames'][0]}–{r['frames'][1]}" for r in chunks) + " |",
                  "|---|" + "---|" * len(chunks)]
        lines += ["| " + VARIANT_LABELS.get(v, v) + " | " + " | ".join(f"{_fmt(r['mean'])} ± {_fmt(r['std'])}"
                                                                         for r in rs) + " |" for v, rs in rows.items()]
        lines += ["", "![PSNR per chunk](psnr_per_chunk.png)", ""]
    lines += ["## Distributions over episodes", "", "![histograms](histograms.png)", "",
              "## Frame strips", "",
              ("Rows: generated | truth | generated depth | true depth | generated flow | true flow"
               if cfg["model"] == "world4d" else
               "Rows: round trip | truth | its depth | true depth | its flow | true flow (episodes without depth "
               "and flow: skeleton | round trip | truth)" if cfg["model"] == "autoencoder" else
               "Rows: skeleton control | generated" + (" | generated with the swapped control" if "swap_drop_db" in s
                                                       else "") + " | ground truth") + "; frames evenly spaced.", "",
              "![frame strips](grid.png)", "",
              "Per-episode scores: [episodes.csv](episodes.csv) (also `episodes.parquet`); "
              "all numbers: [metrics.json](metrics.json); each episode's strip: `strips/`.", ""]
    return "\n".join(lines)


def summary_lines(s: dict) -> list[str]:
    """The results table (markdown) and the findings under it: what `eval.py` prints."""
    shown = [m for m in ("psnr", "ssim", "lpips", "robot_psnr", "depth_absrel", "depth_delta1", "flow_epe",
                         "depth_video_psnr", "flow_video_psnr", "flow_video_aepe")
             if any(m in v for v in s["variants"].values())]
    head = ["variant"] + [m + (" ↑" if METRICS[m][0] else " ↓") for m in shown] + ["FVD ↓"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    fv = s["fvd"]["per_variant"]
    for v, stats in s["variants"].items():
        digits = lambda m: 2 if METRICS[m][1] else 3  # noqa: E731
        cells = [f"{_fmt(stats[m]['mean'], digits(m))} ± {_fmt(stats[m]['std'], digits(m))}" if m in stats else "–"
                 for m in shown]
        lines.append("| " + " | ".join([VARIANT_LABELS.get(v, v)] + cells + [_fmt(fv.get(v), 1)]) + " |")
    gaps = s["model_minus_copy_first_frame_db"]
    lines += ["", f"Model − copy-first-frame: PSNR {_fmt(gaps['psnr'])} dB, robot-region PSNR "
                  f"{_fmt(gaps['robot_psnr'])} dB (mean over episodes)."]
    if "model_minus_autoencoder_db" in s:
        g = s["model_minus_autoencoder_db"]
        lines.append(f"Model − autoencoder round trip (the latent space's ceiling): PSNR {_fmt(g['psnr'])} dB, "
                     f"robot-region PSNR {_fmt(g['robot_psnr'])} dB.")
    if "swap_drop_db" in s:
        d = s["swap_drop_db"]
        lines.append(f"Control swap (same first frame and noise, the next episode's skeleton): PSNR drops by "
                     f"{_fmt(d['psnr'])} dB, robot-region PSNR by {_fmt(d['robot_psnr'])} dB. A model that follows "
                     "its control drops clearly; one that ignores it does not.")
    f = s["fvd"]
    if f["videos"] < 2:
        return lines + ["", "FVD: not computed (--no-fvd, clips under 9 frames, or fewer than 2 videos)."]
    lines += ["", f"FVD (I3D Kinetics-400 logits, 224×224, whole clips): {f['videos']} videos per set"
              + (f"; truth vs truth (two halves of {2 * (f['videos'] // 2)}): {_fmt(f.get('truth_half_vs_half'), 1)}"
                 if "truth_half_vs_half" in f else "") + "."]
    if not f["meaningful"]:
        lines.append(f"**FVD is not meaningful here**: {f['videos']} < {f['min_videos_meaningful']} videos; "
                     "it is dominated by sample-size bias and comparable only with FVDs of the same N.")
    return lines
