"""Reference predictions scored by the same code as a model, from the ground truth alone.

* `copy_first_frame`: the reference image held still (what a model that ignores the control and
  never moves scores). Its depth is frame 0's, its flow zero.
* `shifted`: the ground truth delayed by `frames` (default one latent frame = 4 video frames, the
  VAE's temporal stride): the first frames hold frame 0, flow zero while held. A model at this
  level is right up to a small timing error — a temporal-jitter reference.

Each returns the same fields as the truth it is built from (None stays None).
"""

from __future__ import annotations

import numpy as np

from rynn_jax.eval.episodes import Generated, Truth

SHIFT_FRAMES = 4  # one latent frame of the Wan VAE (4× temporal compression)


def copy_first_frame(truth: Truth) -> Generated:
    hold = lambda x: None if x is None else np.repeat(x[:1], len(x), axis=0)  # noqa: E731
    flow = None if truth.flow is None else np.zeros_like(truth.flow)
    return Generated(hold(truth.frames), hold(truth.depth), flow)


def delay(x: np.ndarray, frames: int) -> np.ndarray:
    """x delayed by `frames` along axis 0, frame 0 repeated in front; same length."""
    k = min(frames, len(x))
    return np.concatenate([np.repeat(x[:1], k, axis=0), x[:len(x) - k]])


def shifted(truth: Truth, frames: int = SHIFT_FRAMES) -> Generated:
    if frames < 1:
        raise ValueError(f"the shifted baseline needs a shift of ≥ 1 frame, got {frames}")
    flow = None
    if truth.flow is not None:  # pairs while frame 0 is held move nothing; then the truth's pairs, delayed
        k = min(frames, len(truth.flow))
        flow = np.concatenate([np.zeros_like(truth.flow[:k]), truth.flow[:len(truth.flow) - k]])
    return Generated(delay(truth.frames, frames), None if truth.depth is None else delay(truth.depth, frames), flow)


BASELINES = {"copy_first_frame": copy_first_frame, "shifted": shifted}
