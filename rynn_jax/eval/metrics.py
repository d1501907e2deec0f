"""Per-frame video metrics against ground truth: PSNR, SSIM, robot-region PSNR, depth, flow.

Definitions (every function returns one value per frame; the caller averages over frames 1..T−1,
frame 0 being the reference image the model was given):

* Colour: 8-bit RGB as stored, scaled to [0, 1] (`unit`); no colour-space conversion.
* PSNR: 10·log10(1 / MSE), MSE over all pixels and the 3 channels of a frame; identical frames
  give ∞, capped at `PSNR_CAP_DB`.
* SSIM: Wang et al. 2004 as `dm_pix.ssim`: 11-tap Gaussian window, σ = 1.5, K1 = 0.01, K2 = 0.03,
  data range 1, population (not sample) covariances, the mean of the SSIM map over the 'valid'
  region (a 5-pixel border dropped) and over channels. This is scikit-image's
  `structural_similarity(gaussian_weights=True, sigma=1.5, use_sample_covariance=False,
  data_range=1, channel_axis=-1)`.
* Robot-region PSNR: the MSE is taken over the pixels inside the ground-truth robot mask only
  (segmentation labels 1 = left, 2 = right robot); NaN for a frame where no robot is visible.
* Depth (RynnWorld-4D): per frame, the prediction is scaled by median(true)/median(pred) over the
  valid pixels (true depth > 0); AbsRel = mean |s·pred − true| / true, δ1 = fraction of valid
  pixels with max(s·pred/true, true/(s·pred)) < 1.25.
* Flow: average end-point error, mean over pixels of ‖pred − true‖₂, in pixels (forward flow
  t → t+1; one value per frame pair).
* Colour-space flow AEPE (RynnWorld-4D's AEPE): on the colour-wheel flow videos (frame t = flow
  t − 1 → t, frame 0 white), per frame the mean over all pixels of the L2 distance between the
  two RGB colours in [0, 1] (all 3 channels, no decoding back to vectors, no resize); range
  [0, √3]. Frame 0 (white in both) is left out by the frame average like every other metric.

Inputs are host arrays checked before any device work (`check_*`): a shape, dtype, range or NaN
problem raises one ValueError line naming the input.
"""

from __future__ import annotations

import dm_pix
import jax
import jax.numpy as jnp
import numpy as np

PSNR_CAP_DB = 100.0  # identical frames (MSE 0) score this instead of ∞
ROBOT_LABELS = (1, 2)  # segmentation labels of the left and right robot (docs/sim.md)
DELTA1_THRESHOLD = 1.25


# --- input checks (host side, one line each) ---------------------------------------------------------


def check_video(name: str, video: np.ndarray) -> np.ndarray:
    """An 8-bit RGB video (T, H, W, 3) with T ≥ 1."""
    v = np.asarray(video)
    if v.ndim != 4 or v.shape[-1] != 3 or min(v.shape) < 1:
        raise ValueError(f"{name}: expected a video (T, H, W, 3) with T ≥ 1, got shape {v.shape}")
    if v.dtype != np.uint8:
        raise ValueError(f"{name}: expected 8-bit RGB (uint8), got {v.dtype}")
    return v


def check_pair(pred_name: str, pred: np.ndarray, true_name: str, true: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p, t = check_video(pred_name, pred), check_video(true_name, true)
    if p.shape != t.shape:
        raise ValueError(f"{pred_name} {p.shape} and {true_name} {t.shape} differ in shape")
    return p, t


def check_field(name: str, x: np.ndarray, trailing: tuple[int, ...], like: tuple[int, ...] | None = None) -> np.ndarray:
    """A finite float field (T, H, W, *trailing), e.g. depth (T, H, W) or flow (T, H, W, 2)."""
    x = np.asarray(x)
    if x.ndim != 3 + len(trailing) or x.shape[3:] != trailing or min(x.shape[:3], default=0) < 1:
        raise ValueError(f"{name}: expected shape (T, H, W{''.join(f', {d}' for d in trailing)}), got {x.shape}")
    if not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"{name}: expected floats, got {x.dtype}")
    if not np.isfinite(x).all():
        raise ValueError(f"{name}: {int((~np.isfinite(x)).sum())} non-finite values")
    if like is not None and x.shape != like:
        raise ValueError(f"{name}: shape {x.shape} differs from the ground truth's {like}")
    return x.astype(np.float32)


def robot_mask(labels_thw: np.ndarray) -> np.ndarray:
    """Boolean (T, H, W): pixels of the left or right robot in the segmentation."""
    return np.isin(labels_thw, ROBOT_LABELS)


# --- metrics (jitted; any leading frame axes) ----------------------------------------------------------


def unit(video_uint8: jax.Array) -> jax.Array:
    return jnp.asarray(video_uint8, jnp.float32) / 255.0


@jax.jit
def psnr(pred_thwc: jax.Array, true_thwc: jax.Array) -> jax.Array:
    """Per-frame PSNR (dB) of 8-bit frames."""
    return jnp.minimum(dm_pix.psnr(unit(pred_thwc), unit(true_thwc)), PSNR_CAP_DB)


@jax.jit
def ssim(pred_thwc: jax.Array, true_thwc: jax.Array) -> jax.Array:
    """Per-frame SSIM of 8-bit frames (definition in the module docstring)."""
    return dm_pix.ssim(unit(pred_thwc), unit(true_thwc), max_val=1.0, filter_size=11, filter_sigma=1.5,
                       k1=0.01, k2=0.03)


@jax.jit
def masked_psnr(pred_thwc: jax.Array, true_thwc: jax.Array, mask_thw: jax.Array) -> jax.Array:
    """Per-frame PSNR (dB) over the pixels where `mask` is set; NaN where a frame's mask is empty."""
    sq = jnp.square(unit(pred_thwc) - unit(true_thwc)).mean(-1)
    m = mask_thw.astype(jnp.float32)
    count = m.sum((-2, -1))
    mse = (sq * m).sum((-2, -1)) / jnp.maximum(count, 1.0)
    db = jnp.minimum(-10.0 * jnp.log10(mse), PSNR_CAP_DB)
    return jnp.where(count > 0, db, jnp.nan)


@jax.jit
def depth_errors(pred_thw: jax.Array, true_thw: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-frame (AbsRel, δ1) after per-frame median scaling over the valid pixels (true > 0).
    NaN for a frame without valid pixels."""
    valid = true_thw > 0

    def masked_median(x):  # median over the valid pixels of each frame (invalid ones sorted to the end)
        flat = jnp.where(valid, x, jnp.inf).reshape(x.shape[:-2] + (-1,))
        n = valid.reshape(flat.shape).sum(-1)
        s = jnp.sort(flat, axis=-1)
        lo = jnp.take_along_axis(s, jnp.maximum((n - 1) // 2, 0)[..., None], -1)[..., 0]
        hi = jnp.take_along_axis(s, jnp.maximum(n // 2, 0)[..., None], -1)[..., 0]
        return 0.5 * (lo + hi)

    scale = masked_median(true_thw) / jnp.maximum(masked_median(pred_thw), 1e-12)
    pred = pred_thw * scale[..., None, None]
    safe_true = jnp.where(valid, true_thw, 1.0)
    n = valid.sum((-2, -1))
    absrel = jnp.where(valid, jnp.abs(pred - true_thw) / safe_true, 0.0).sum((-2, -1)) / jnp.maximum(n, 1)
    ratio = jnp.maximum(pred / safe_true, safe_true / jnp.maximum(pred, 1e-12))
    delta1 = jnp.where(valid, ratio < DELTA1_THRESHOLD, False).sum((-2, -1)) / jnp.maximum(n, 1)
    return jnp.where(n > 0, absrel, jnp.nan), jnp.where(n > 0, delta1, jnp.nan)


@jax.jit
def flow_epe(pred_thw2: jax.Array, true_thw2: jax.Array) -> jax.Array:
    """Per-frame-pair average end-point error in pixels."""
    return jnp.linalg.norm(pred_thw2 - true_thw2, axis=-1).mean((-2, -1))


@jax.jit
def colour_aepe(pred_thwc: jax.Array, true_thwc: jax.Array) -> jax.Array:
    """Per-frame AEPE of 8-bit colour-coded flow maps in normalised RGB: mean over pixels of
    ‖pred/255 − true/255‖₂ over the 3 channels (RynnWorld-4D's flow metric; not pixels)."""
    # difference of the 8-bit values first (exact in float32), then /255: identical maps give 0
    # exactly, which unit(pred) − unit(true) does not under jit
    d = jnp.asarray(pred_thwc, jnp.float32) - jnp.asarray(true_thwc, jnp.float32)
    return jnp.sqrt(jnp.square(d).sum(-1)).mean((-2, -1)) / 255.0


def video_mean(per_frame: np.ndarray, skip_first: bool = True) -> float:
    """A video's score: the mean over frames 1.. (all frames when `skip_first` is False, or when
    there is only one), NaN frames (no robot in view, no valid depth) left out."""
    x = np.asarray(per_frame, np.float64)
    x = x[1:] if skip_first and len(x) > 1 else x
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else float("nan")
