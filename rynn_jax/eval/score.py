"""One prediction against its ground truth: every metric per frame, and the video's scores.

Frames 0..n−1 are compared, n the shorter of the two; the video scores average frames 1..n−1
(frame 0 is the reference the model was given) and, for flow, every frame pair. Metrics whose
inputs are missing (no robot mask, no predicted depth or flow) are left out.
"""

from __future__ import annotations

import numpy as np

from rynn_jax.eval import metrics
from rynn_jax.eval.episodes import Generated, Truth
from rynn_jax.eval.lpips import lpips

# name → (higher is better, unit) of every per-episode score, in report order
METRICS = {
    "psnr": (True, "dB"), "ssim": (True, ""), "lpips": (False, ""), "robot_psnr": (True, "dB"),
    "depth_absrel": (False, ""), "depth_delta1": (True, ""), "flow_epe": (False, "px"),
    # RynnWorld-4D: PSNR of the depth (grey) and flow (colour-wheel) videos the model generates, and
    # the paper's flow AEPE: distance of the flow videos' colours in [0, 1] RGB, not pixels
    "depth_video_psnr": (True, "dB"), "flow_video_psnr": (True, "dB"), "flow_video_aepe": (False, ""),
}


def score(pred: Generated, truth: Truth) -> dict[str, list[float]]:
    """Per-frame values of every available metric (lists, NaN where undefined)."""
    n = min(len(pred.frames), len(truth.frames))
    p, t = metrics.check_pair("generated video", pred.frames[:n], "ground truth", truth.frames[:n])
    out = {"psnr": metrics.psnr(p, t), "ssim": metrics.ssim(p, t), "lpips": lpips(p, t)}
    if truth.robot is not None:
        out["robot_psnr"] = metrics.masked_psnr(p, t, truth.robot[:n])
    if pred.depth is not None and truth.depth is not None:
        true_d = metrics.check_field("ground-truth depth", truth.depth[:n], ())
        pred_d = metrics.check_field("predicted depth", pred.depth[:n], (), like=true_d.shape)
        out["depth_absrel"], out["depth_delta1"] = metrics.depth_errors(pred_d, true_d)
    if pred.flow is not None and truth.flow is not None:
        m = min(n - 1, len(truth.flow), len(pred.flow))
        if m > 0:
            true_f = metrics.check_field("ground-truth flow", truth.flow[:m], (2,))
            pred_f = metrics.check_field("predicted flow", pred.flow[:m], (2,), like=true_f.shape)
            out["flow_epe"] = metrics.flow_epe(pred_f, true_f)
    for name in ("depth_video", "flow_video"):
        pv, tv = getattr(pred, name), getattr(truth, name)
        if pv is not None and tv is not None:
            pv, tv = metrics.check_pair(f"generated {name}", pv[:n], f"ground-truth {name}", tv[:n])
            out[f"{name}_psnr"] = metrics.psnr(pv, tv)
            if name == "flow_video":
                out["flow_video_aepe"] = metrics.colour_aepe(pv, tv)
    return {k: np.asarray(v, np.float64).tolist() for k, v in out.items()}


def summarize(per_frame: dict[str, list[float]]) -> dict[str, float]:
    """A video's scores from its per-frame values: frames 1.. (flow: every pair)."""
    return {k: metrics.video_mean(v, skip_first=k != "flow_epe") for k, v in per_frame.items()}
