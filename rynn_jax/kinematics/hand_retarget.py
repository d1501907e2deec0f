"""MediaPipe-21 hand keypoints → 20 WUJI hand joints (vector / DexPilot-style retargeting).

Keypoints come in the operator's wrist frame (metres, MediaPipe order: 0 wrist; thumb 1-4;
index 5-8; middle 9-12; ring 13-16; little 17-20). The robot counterparts on the WUJI hand
(palm frame) are: 0 = palm origin, and for finger f (1 = thumb … 5 = little)
    kp 4f-3 = link2 origin, 4f-2 = link3 origin, 4f-1 = link4 origin, 4f = fingertip,
the pairing the public wuji-retargeting vector configs use for kp 2-4 / 6-8 / ….

Objective (weighted least squares, solved by damped Gauss-Newton under joint limits):
  * vector terms: palm→kp for kp ∈ {4f-2, 4f-1, 4f} match `hand_scale` × the human vectors;
  * pinch terms (DexPilot): thumb-tip→fingertip vectors, weight boosted smoothly when the
    human's thumb–finger distance drops below `pinch_distance`, so pinches close on the robot;
  * a small pull toward the previous solution (warm start → temporal consistency).
Jacobians are analytic (geometric, per finger) so one solve is a handful of tiny matmuls.
An EMA low-pass (`ema`) smooths the joint stream afterwards.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rynn_jax.kinematics import fk
from rynn_jax.kinematics.mjcf_model import Chain

Array = jnp.ndarray

VECTOR_KPS = tuple(4 * f + k for f in range(5) for k in (2, 3, 4))   # 2,3,4, 6,7,8, ...
THUMB_TIP = 4
FINGER_TIPS = (8, 12, 16, 20)


@dataclasses.dataclass(frozen=True, kw_only=True)
class HandRetargetConfig:
    n_iters: int = 10             # Gauss-Newton iterations (static)
    hand_scale: float = 1.0       # robot / operator hand size
    tip_weight: float = 1.0       # weight of palm→fingertip vectors
    joint_weight: float = 0.5     # weight of palm→link3 / link4 vectors
    pinch_weight: float = 4.0     # extra weight on a thumb→fingertip vector while pinching
    pinch_distance: float = 0.03  # operator thumb–finger distance where pinching starts [m]
    reg_weight: float = 1e-6      # pull toward the warm start [m²/rad²] (keep ≪ residual²)
    damping: float = 2e-3         # Levenberg damping [m²/rad²] added to the normal equations: no
                                  # bias at convergence, but directions the keypoints barely
                                  # constrain (finger joint 3 vs 4) keep the previous frame's value
                                  # instead of flipping (16 fps sample: max jump 0.53 → 0.21 rad)
    early_exit: bool = False      # True: while_loop stopping at ‖Δq‖∞ < step_tol (latency)
    step_tol: float = 1e-4        # [rad]
    ema_alpha: float = 0.5        # EMA filter: q_f ← α q + (1 − α) q_f


class HandResult(NamedTuple):
    q_20: Array
    tip_err: Array      # mean palm-frame fingertip distance to the scaled targets [m]
    valid: Array        # keypoints were finite


def robot_keypoints(fingers: Chain, q_20: Array) -> tuple[Array, Array]:
    """21 robot keypoints in the palm frame and their Jacobian d kp / d q: ([21,3], [21,3,20])."""
    q_f4 = q_20.reshape(5, 4)
    frames = jax.vmap(fk.chain_fk)(fingers, q_f4)                              # per finger
    pts_f43 = jnp.concatenate([frames.anchor_n3[:, 1:], frames.tip_44[:, None, :3, 3]], axis=1)
    # Point k of a finger (link2, link3, link4, tip) moves with joints 0..k of that finger.
    lever = pts_f43[:, :, None, :] - frames.anchor_n3[:, None, :, :]             # [5,4(pt),4(j),3]
    jac = jnp.cross(frames.axis_n3[:, None, :, :], lever)
    # numpy masks become literals; jnp.tril/eye would be kernels run on every call.
    jac = jac * jnp.asarray(np.tril(np.ones((4, 4))), q_20.dtype)[None, :, :, None]
    kp = jnp.concatenate([jnp.zeros((1, 3), q_20.dtype), pts_f43.reshape(20, 3)], axis=0)
    # Block-diagonal over fingers: [5,4(pt),4(j),3] → [20, 3, 20] (a broadcast, not a matmul).
    eye_f = jnp.asarray(np.eye(5), q_20.dtype)
    jac_full = (jnp.swapaxes(jac, 2, 3)[:, :, :, None, :] * eye_f[:, None, None, :, None]).reshape(20, 3, 20)
    jac_full = jnp.concatenate([jnp.zeros((1, 3, 20), q_20.dtype), jac_full], axis=0)
    return kp, jac_full


def _targets(human_213: Array, cfg: HandRetargetConfig) -> tuple[Array, Array, Array]:
    """Residual selector D [M,21], targets [M,3] and weights [M] from the human keypoints."""
    dt = human_213.dtype
    h = (human_213 - human_213[:1]) * cfg.hand_scale          # wrist at the origin, rescaled
    n_vec = len(VECTOR_KPS)
    d = np.zeros((n_vec + len(FINGER_TIPS), 21))
    for i, k in enumerate(VECTOR_KPS):
        d[i, k] = 1.0                                          # palm origin is 0: kp − kp0 = kp
    for i, k in enumerate(FINGER_TIPS):
        d[n_vec + i, k], d[n_vec + i, THUMB_TIP] = 1.0, -1.0
    d = jnp.asarray(d, dt)
    target = d @ h
    w_vec = jnp.asarray([cfg.tip_weight if k % 4 == 0 else cfg.joint_weight for k in VECTOR_KPS], dt)
    pinch_gap = jnp.linalg.norm(target[n_vec:], axis=-1) / cfg.hand_scale
    # Smooth switch (5 mm wide) so the objective, and the solution, stay differentiable.
    w_pinch = cfg.pinch_weight * jax.nn.sigmoid((cfg.pinch_distance - pinch_gap) / 0.005)
    return d, target, jnp.concatenate([w_vec, w_pinch])


def retarget(fingers: Chain, human_213: Array, q_init_20: Array,
             cfg: HandRetargetConfig = HandRetargetConfig()) -> HandResult:
    """One hand. `fingers` is a [5]-stacked Chain (palm → fingertip). Warm-start from the
    previous solution. Non-finite keypoints hold the warm start (valid=False)."""
    dt = q_init_20.dtype
    lower, upper = fingers.lower_n.reshape(20).astype(dt), fingers.upper_n.reshape(20).astype(dt)
    q0 = jnp.clip(jnp.where(jnp.isfinite(q_init_20), q_init_20, 0.0), lower, upper)
    valid = jnp.all(jnp.isfinite(human_213))
    human = jnp.where(valid, human_213, 0.0)
    d, target, w = _targets(human, cfg)
    sw = jnp.sqrt(w)[:, None, None]

    # Trip k evaluates the keypoints at q_k, then takes a Gauss-Newton step unless stopped, so
    # the keypoints of the returned q are the last ones evaluated (no FK after the loop).
    def trip(q, k):
        kp, jkp = robot_keypoints(fingers, q)
        r = sw[..., 0] * (jnp.einsum("mk,kc->mc", d, kp) - target)          # [M,3]
        jr = sw * jnp.einsum("mk,kcj->mcj", d, jkp)                          # [M,3,20]
        jr, r = jr.reshape(-1, 20), r.reshape(-1)
        h = jr.T @ jr + (cfg.reg_weight + cfg.damping) * jnp.asarray(np.eye(20), dt)
        g = jr.T @ r + cfg.reg_weight * (q - q0)
        # Cholesky (h is SPD): unlike LU it needs no pivot-permutation loop, which cost more
        # than the factorisation on CPU. A failed factorisation (NaN) keeps q, never NaN joints.
        dq = jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(h, lower=True), g)
        q_next = jnp.where(jnp.all(jnp.isfinite(dq)), jnp.clip(q - dq, lower, upper), q)
        stop = (k >= cfg.n_iters) | ~valid
        if cfg.early_exit:
            stop = stop | (jnp.max(jnp.abs(q_next - q)) < cfg.step_tol)
        return jnp.where(stop, q, q_next), kp, stop

    init = (q0, jnp.zeros((21, 3), dt), jnp.zeros((), bool), jnp.zeros((), jnp.int32))
    if cfg.early_exit:
        # Real-time path: stop once the Gauss-Newton step is below `step_tol` (that last tiny
        # step is not taken; no reverse AD).
        def body(c):
            q, kp, stop = trip(c[0], c[3])
            return q, kp, stop, c[3] + 1

        q, kp, _, _ = jax.lax.while_loop(lambda c: ~c[2], body, init)
    else:
        q, kp, _, _ = jax.lax.fori_loop(0, cfg.n_iters + 1, lambda k, c: (*trip(c[0], k), c[3]), init)
    tips = jnp.asarray((THUMB_TIP,) + FINGER_TIPS)
    tip_err = jnp.mean(jnp.linalg.norm(kp[tips] - (human - human[:1])[tips] * cfg.hand_scale, axis=-1))
    return HandResult(jnp.where(valid, q, q0), tip_err, valid)


def ema(q_filtered: Array, q_new: Array, alpha: float) -> Array:
    """Exponential moving average low-pass: α q_new + (1 − α) q_filtered."""
    return alpha * q_new + (1.0 - alpha) * q_filtered
