"""Evaluation speed: the metrics of `python eval.py` on N videos of T frames (default 100 × 81 at
480×832, the paper's protocol size), per stage, on the default device.

    python bench/bench_eval.py --out bench/results/eval_h200.json                         # H200
    python bench/bench_eval.py --videos 4 --frames 17 --height 64 --width 96 --out /tmp/e.json   # CPU smoke

Stages, each timed over all videos after one untimed warm-up video (compiles): PSNR + SSIM +
robot-region PSNR (`rynn_jax.eval.metrics`, one jitted call per video and metric), LPIPS
(`rynn_jax.eval.lpips`, `--lpips-batch` frames per call), I3D features (`rynn_jax.eval.fvd`,
`--i3d-batch` clips per call, frames resized to 224×224 on the device), and the Fréchet distance.
Frame data: a few synthetic smooth videos (moving gradients and boxes) and noisy copies, cycled,
made on the host once (the bench times the metrics, not the data). Per-video time includes the
host → device copy of both 8-bit videos, as in `eval.py`.

Checks: PSNR of one video against a float64 NumPy reference, LPIPS(x, x) = 0, I3D features finite,
FVD(X, X) = 0 and FVD(X, noisy X) > 0.

`--stages frames,lpips` / `--stages fvd` run a part (e.g. where the I3D and LPIPS checkpoints, 51 and
10 MB, cannot travel together); the JSON says which ran.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import Checks, write_json  # noqa: E402

DISTINCT = 4  # distinct synthetic (truth, prediction) pairs, cycled over the N videos


def synthetic_pair(seed: int, t: int, h: int, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(truth, prediction, robot mask): a moving gradient with boxes; the prediction is shifted and noisy."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    truth = np.empty((t, h, w, 3), np.uint8)
    mask = np.zeros((t, h, w), bool)
    colours = rng.uniform(40, 220, (3, 3))
    for k in range(t):
        img = np.stack([120 + 80 * np.sin((x + 3 * k) / (0.1 * w) + c) * np.cos(y / (0.15 * h)) for c in range(3)], -1)
        for j in range(3):
            cx, cy = (0.2 + 0.3 * j) * w + 2 * k * (j - 1), (0.4 + 0.2 * np.sin(k / 5 + j)) * h
            box = (np.abs(x - cx) < 0.08 * w) & (np.abs(y - cy) < 0.1 * h)
            img[box] = colours[j]
            mask[k] |= box if j < 2 else False
        truth[k] = np.clip(img, 0, 255)
    pred = np.clip(np.roll(truth, 2, axis=2) + rng.normal(0, 8, truth.shape), 0, 255).astype(np.uint8)
    return truth, pred, mask


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--videos", type=int, default=100)
    p.add_argument("--frames", type=int, default=81)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--width", type=int, default=832)
    p.add_argument("--lpips-batch", type=int, default=81, help="frames per LPIPS call")
    p.add_argument("--i3d-batch", type=int, default=8, help="clips per I3D call")
    p.add_argument("--stages", default="frames,lpips,fvd",
                   help="comma-separated: frames (PSNR/SSIM/robot PSNR), lpips, fvd (I3D + Fréchet distance)")
    p.add_argument("--out", default="bench/results/eval.json")
    a = p.parse_args()
    stages = set(a.stages.split(","))
    if not stages or not stages <= {"frames", "lpips", "fvd"}:
        p.error(f"--stages: a comma-separated subset of frames,lpips,fvd, got {a.stages!r}")

    import jax

    from rynn_jax.eval import fvd, lpips, metrics

    pairs = [synthetic_pair(s, a.frames, a.height, a.width) for s in range(min(DISTINCT, a.videos))]
    order = [pairs[i % len(pairs)] for i in range(a.videos)]
    checks = Checks()
    rows = []

    def stage(name: str, fn, per_video: bool = True) -> object:
        fn(0)  # warm-up: compiles
        t0 = time.perf_counter()
        out = [fn(i) for i in range(a.videos)] if per_video else fn(None)
        sec = time.perf_counter() - t0
        rows.append({"stage": name, "seconds": sec, "videos_per_second": a.videos / sec})
        print(f"{name:<28} {sec:8.2f} s   {a.videos / sec:8.2f} videos/s", flush=True)
        return out

    def frame_metrics(i: int) -> float:
        truth, pred, mask = order[i]
        outs = (metrics.psnr(pred, truth), metrics.ssim(pred, truth), metrics.masked_psnr(pred, truth, mask))
        return [np.asarray(o) for o in outs]  # read back (blocks)

    truth, pred, _ = order[0]
    if "frames" in stages:
        fm = stage("psnr + ssim + robot psnr", frame_metrics)
        d = (pred.astype(np.float64) - truth) / 255.0
        checks.close("psnr vs float64 numpy", fm[0][0], -10 * np.log10(np.mean(d * d, axis=(1, 2, 3))), 1e-5)
    if "lpips" in stages:
        lp = stage("lpips (alexnet)", lambda i: lpips.lpips(order[i][1], order[i][0], batch=a.lpips_batch))
        checks.finite("lpips", np.stack(lp))
        self_lp = lpips.lpips(truth, truth, batch=a.lpips_batch)
        rows_ok = float(np.abs(self_lp).max()) < 1e-5
        checks.rows.append(dict(check="lpips(x, x) = 0", value=float(np.abs(self_lp).max()), ok=rows_ok))

    def i3d(_):  # `--i3d-batch` clips per call; a last, smaller group is padded inside i3d_features
        groups = [range(s, min(s + a.i3d_batch, a.videos)) for s in range(0, a.videos, a.i3d_batch)]
        return np.concatenate([fvd.i3d_features(np.stack([order[i][0] for i in g]), batch=a.i3d_batch) for g in groups])

    if "fvd" in stages:
        feats_true = stage("i3d features (truth)", i3d, per_video=False)
        checks.finite("i3d features", feats_true)
        noisy = np.stack([p[1] for p in pairs])
        feats_noisy = fvd.i3d_features(noisy, batch=a.i3d_batch) if len(noisy) >= 2 else None
        t0 = time.perf_counter()
        same = fvd.fvd_from_features(feats_true, feats_true)
        rows.append({"stage": "frechet distance (400-d)", "seconds": time.perf_counter() - t0})
        checks.rows.append(dict(check="FVD(X, X) = 0", value=same, ok=abs(same) < 1e-6))
        if feats_noisy is not None:
            base = np.stack([p[0] for p in pairs])
            diff = fvd.fvd_from_features(fvd.i3d_features(base, batch=a.i3d_batch), feats_noisy)
            checks.rows.append(dict(check="FVD(X, noisy X) > 0", value=diff, ok=diff > 0))
    total = sum(r["seconds"] for r in rows)
    print(f"{'total':<28} {total:8.2f} s   {a.videos / total:8.2f} videos/s  "
          f"({a.videos} videos × {a.frames} frames at {a.height}×{a.width}, {jax.default_backend()})")
    write_json(a.out, {"videos": a.videos, "frames": a.frames, "height": a.height, "width": a.width,
                       "lpips_batch": a.lpips_batch, "i3d_batch": a.i3d_batch, "device": str(jax.devices()[0]),
                       "stages_run": sorted(stages),
                       "stages": rows, "total_seconds": total, "checks": checks.rows})
    checks.exit_if_failed()


if __name__ == "__main__":
    main()
