"""One teleop control step: trackers + hand skeletons → 54-D action, and its scan over time.

    trackers [5, 7] ─ tracker.arm_targets ─▶ ik.solve (both arms, warm start)  ─┐
    hand keypoints [2, 21, 3] ─ hand_retarget.retarget (both hands) ─▶ EMA ─────┴▶ action [54]

Bad input never yields NaN joints: an invalid tracker or hand frame (non-finite, degenerate
quaternion) is replaced by the last valid one (hold-last-valid); with no valid frame yet, the
IK / retargeter reject the target and hold the previous joints. `info` reports what was held.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rynn_jax import errors
from rynn_jax.kinematics import fk, hand_retarget, ik, layout, mjcf_model, streams, tracker
from rynn_jax.kinematics.mjcf_model import Chain, Embodiment

Array = jnp.ndarray


# Teleop targets come from a human whose scaled reach exceeds the robot's: keep the elbow bent by
# ≥ 0.3 rad (gives up ≤ 7 mm of reach) instead of driving the arm into its straight-elbow singularity.
TELEOP_ELBOW_BEND = 0.3


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetargetConfig:
    ik: ik.IKConfig = ik.IKConfig(min_elbow_bend=TELEOP_ELBOW_BEND)
    hand: hand_retarget.HandRetargetConfig = hand_retarget.HandRetargetConfig()
    use_elbow_prior: bool = True    # feed the upper-arm trackers to the IK null-space prior


def realtime_config() -> RetargetConfig:
    """Latency-oriented settings for a tracker-rate loop (100–120 Hz, warm-started every step):
    both solvers stop as soon as they converge (while_loop), and per step the arm IK takes at
    most 10 iterations and stops chasing the elbow posture once its null-space step is below
    1e-2 rad, the hand at most 3 Gauss-Newton iterations; what is left is finished over the
    next steps (the input moves < 1 cm per step). Forward-mode AD only; use the default
    (fixed-iteration) config for gradients and for offline (16 fps) retargeting."""
    return RetargetConfig(ik=ik.IKConfig(early_exit=True, n_iters=10, tol_null=1e-2,
                                         min_elbow_bend=TELEOP_ELBOW_BEND),
                          hand=hand_retarget.HandRetargetConfig(early_exit=True, n_iters=3))


class Robot(NamedTuple):
    """The arrays of an `Embodiment` the step needs (a pytree: pass it as a jit argument)."""
    arms: Chain      # [2, 7]
    fingers: Chain   # [2, 5, 4]


class RetargetState(NamedTuple):
    arm_q_s7: Array          # last IK solutions (warm start)
    hand_q_s20: Array        # last raw hand solutions (warm start)
    hand_filt_s20: Array     # EMA-filtered hand joints (what is emitted)
    trackers_n7: Array       # last valid tracker poses (hold-last-valid buffer)
    hands_s213: Array        # last valid hand keypoints


class StepInfo(NamedTuple):
    tracker_valid_n: Array
    hand_valid_s: Array
    ik: ik.IKResult
    hand_tip_err_s: Array


def robot_arrays(emb: Embodiment, dtype=jnp.float32) -> Robot:
    cast = lambda a: jnp.asarray(a, dtype)
    return Robot(jax.tree.map(cast, emb.arms), jax.tree.map(cast, emb.fingers))


def initial_state(emb: Embodiment, dtype=jnp.float32) -> RetargetState:
    q = jnp.asarray(emb.home_q, dtype)
    arm, hand = layout.unpack_action(q)
    return RetargetState(arm, hand, hand, jnp.full((5, 7), jnp.nan, dtype),
                         jnp.full((2, 21, 3), jnp.nan, dtype))


def calibrated(robot: Robot, state: RetargetState, trackers_n7: Array, scale: float = 1.5) -> tracker.Calibration:
    """The default calibration (translation scale `scale`) fitted so that the operator's pose
    `trackers_n7` (all five valid) maps onto the robot's end effectors at `state` (`tracker.calibrate`)."""
    home_ee = jax.vmap(fk.chain_tip)(robot.arms, state.arm_q_s7)
    poses = tracker.tracker_poses(jnp.asarray(trackers_n7, jnp.float32))
    return tracker.calibrate(tracker.default_calibration(scale=scale), poses, home_ee)


def step(robot: Robot, calib: tracker.Calibration, state: RetargetState, trackers_n7: Array,
         hands_s213: Array, cfg: RetargetConfig = RetargetConfig()) -> tuple[RetargetState, Array, StepInfo]:
    """One control step. Returns (new state, action [54], info)."""
    t_ok = tracker.tracker_valid(trackers_n7)
    trackers_n7 = jnp.where(t_ok[:, None], trackers_n7, state.trackers_n7)
    h_ok = jnp.all(jnp.isfinite(hands_s213), axis=(-1, -2))
    hands_s213 = jnp.where(h_ok[:, None, None], hands_s213, state.hands_s213)

    t_target, elbow = tracker.arm_targets(calib, tracker.tracker_poses(trackers_n7))
    if not cfg.use_elbow_prior:
        elbow = jnp.full_like(elbow, jnp.nan)
    res = ik.solve_arms(robot.arms, t_target, state.arm_q_s7, elbow, cfg.ik)
    hand = jax.vmap(lambda f, h, q: hand_retarget.retarget(f, h, q, cfg.hand))(
        robot.fingers, hands_s213, state.hand_q_s20)
    # The filter starts from the first valid solve, not from the open home hand (which would
    # make the first frames glide from open to the operator's grip).
    first = ~jnp.all(jnp.isfinite(state.hands_s213), axis=(-1, -2)) & h_ok
    filt = jnp.where(first[:, None], hand.q_20,
                     hand_retarget.ema(state.hand_filt_s20, hand.q_20, cfg.hand.ema_alpha))
    new = RetargetState(res.q_n, hand.q_20, filt, trackers_n7, hands_s213)
    return new, layout.pack_action(res.q_n, filt), StepInfo(t_ok, h_ok, res, hand.tip_err)


def trajectory(robot: Robot, calib: tracker.Calibration, state: RetargetState, trackers_tn7: Array,
               hands_ts213: Array, cfg: RetargetConfig = RetargetConfig()) -> tuple[RetargetState, Array, StepInfo]:
    """`step` scanned over time: [T,5,7] trackers, [T,2,21,3] hands → actions [T,54].
    vmap it over sessions; differentiable w.r.t. trackers and calibration (fori-loop IK)."""
    def body(s, x):
        s, a, info = step(robot, calib, s, x[0], x[1], cfg)
        return s, (a, info)
    state, (actions, info) = jax.lax.scan(body, state, (trackers_tn7, hands_ts213))
    return state, actions, info


# One compiled program per (shapes, cfg), shared by every caller: robot, calibration and state are
# arguments, so retargeting a new stream never recompiles.
trajectory_jit = jax.jit(trajectory, static_argnames="cfg")


def retarget_stream(stream: streams.Stream, hz: float = streams.VIDEO_FPS, scale: float = 1.5,
                    calibrate: bool = True, where: str = "stream",
                    cfg: RetargetConfig = RetargetConfig()) -> dict[str, np.ndarray]:
    """A recorded operator stream → its 54-D action trajectory on the `hz` clock (calibrated on the
    first step with all five trackers valid unless `calibrate` is False). `where` names the stream in
    errors and warnings (its file); `cfg`: the solvers' settings."""
    t0, t1 = stream.span
    if not t1 > t0:
        raise errors.InputError(f"{where}: tracker and hand clocks do not overlap")
    rs = streams.resample(stream, streams.clock(t0, t1, hz))
    streams.check(stream, where, rs)
    emb = mjcf_model.embodiment()
    robot = robot_arrays(emb)
    state = initial_state(emb)
    calib = tracker.default_calibration(scale=scale)
    if calibrate:
        first = np.flatnonzero(rs["trackers_fresh"].all(axis=1))
        if len(first) == 0:
            raise errors.InputError(f"{where}: no time step has all five trackers valid; cannot calibrate",
                                    fix="pass --no-calibrate to use the default calibration")
        calib = calibrated(robot, state, rs["trackers"][first[0]], scale)
    _, actions, info = trajectory_jit(robot, calib, state, jnp.asarray(rs["trackers"], jnp.float32),
                                               jnp.asarray(rs["hands"], jnp.float32), cfg)
    actions = np.asarray(actions)
    if not np.all(np.isfinite(actions)):       # guaranteed by construction; fail loudly if not
        raise RuntimeError("non-finite joints in the retargeted actions")
    return {"t": rs["t"], "actions": actions, "action_names": np.asarray(layout.ACTION_NAMES),
            "trackers_fresh": rs["trackers_fresh"], "hands_fresh": rs["hands_fresh"],
            "ik_pos_err": np.asarray(info.ik.pos_err), "ik_rot_err": np.asarray(info.ik.rot_err),
            "hand_tip_err": np.asarray(info.hand_tip_err_s)}
