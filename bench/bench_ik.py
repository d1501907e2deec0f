"""Benchmark the teleop kinematics: single-step latency and batched throughput.

    python bench/bench_ik.py [--batch 1024] [--steps 300] [--json bench_ik.json]

Rows:
  step_realtime   one control step, both arms (early-exit DLS IK) + both hands (early-exit
                  Gauss-Newton) + tracker chain + EMA, on a moving operator trajectory
  step_fixed      the same with fixed iteration counts (the differentiable configuration)
  arms_realtime   both-arm IK alone (early exit), same trajectory
  hands_realtime  both-hand retargeting alone (early exit)
  arms_batched    vmap of the fixed-iteration both-arm IK over `--batch` problems → solves/s
  hands_batched   vmap of both-hand retargeting over `--batch` problems → solves/s
Latency = median wall time of a jitted call incl. dispatch (block_until_ready), after warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rynn_jax.kinematics import fk, hand_retarget, ik, mjcf_model, retarget, se3, tracker


def _operator_trajectory(emb, robot, steps: int):
    """Smooth robot-space motion (0.5 Hz, ±0.3 rad per arm joint at 100 Hz) mapped back
    through the tracker chain, plus hand keypoints from the hand's own FK."""
    t = np.arange(steps) / 100.0
    state = retarget.initial_state(emb)
    rng = np.random.default_rng(0)
    q = np.asarray(state.arm_q_s7)[None] + 0.3 * np.sin(np.pi * t)[:, None, None] * rng.uniform(-1, 1, (1, 2, 7))
    q = np.clip(q, emb.arms.lower_n, emb.arms.upper_n)
    frames = jax.vmap(lambda qq: jax.vmap(fk.chain_fk)(robot.arms, qq))(jnp.asarray(q, jnp.float32))
    calib = tracker.default_calibration()
    trk = jax.vmap(lambda a, b: tracker.trackers_from_targets(calib, a, b))(frames.tip_44, frames.anchor_n3[:, :, 3])
    hq = np.asarray(state.hand_q_s20)[None] + 0.4 * (1 + np.sin(np.pi * t))[:, None, None]
    hq = np.clip(hq, emb.fingers.lower_n.reshape(2, 20), emb.fingers.upper_n.reshape(2, 20))
    kp = jax.vmap(lambda qq: jax.vmap(lambda f, x: hand_retarget.robot_keypoints(f, x)[0])(robot.fingers, qq))(
        jnp.asarray(hq, jnp.float32))
    return calib, se3.pos_quat_from_pose(trk), kp, state


def _time_sequence(fn, state, xs) -> np.ndarray:
    times = []
    for i in range(len(xs[0])):
        t0 = time.perf_counter()
        state = jax.block_until_ready(fn(state, *[x[i] for x in xs]))
        times.append(time.perf_counter() - t0)
    return np.asarray(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--json", default="bench_ik.json")
    args = ap.parse_args()
    emb = mjcf_model.embodiment()
    robot = retarget.robot_arrays(emb)
    calib, trk, kp, state0 = _operator_trajectory(emb, robot, args.steps)
    rows: dict[str, dict] = {}

    for name, cfg in [("step_realtime", retarget.realtime_config()), ("step_fixed", retarget.RetargetConfig())]:
        f = jax.jit(lambda s, a, b, cfg=cfg: retarget.step(robot, calib, s, a, b, cfg)[0])
        _time_sequence(f, state0, (trk[:5], kp[:5]))                       # compile + warm-up
        ts = _time_sequence(f, state0, (trk, kp))[5:]
        rows[name] = {"median_ms": 1e3 * np.median(ts), "p90_ms": 1e3 * np.percentile(ts, 90)}

    rt = retarget.realtime_config()
    t_target = jax.vmap(lambda x: tracker.arm_targets(calib, tracker.tracker_poses(x))[0])(trk)
    arms = jax.jit(lambda q, t: ik.solve_arms(robot.arms, t, q, None, rt.ik).q_n)
    _time_sequence(arms, state0.arm_q_s7, (t_target[:5],))
    ts = _time_sequence(arms, state0.arm_q_s7, (t_target,))[5:]
    rows["arms_realtime"] = {"median_ms": 1e3 * np.median(ts), "p90_ms": 1e3 * np.percentile(ts, 90)}
    hands = jax.jit(lambda q, k: jax.vmap(lambda f, h, qq: hand_retarget.retarget(f, h, qq, rt.hand).q_20)(robot.fingers, k, q))
    _time_sequence(hands, state0.hand_q_s20, (kp[:5],))
    ts = _time_sequence(hands, state0.hand_q_s20, (kp,))[5:]
    rows["hands_realtime"] = {"median_ms": 1e3 * np.median(ts), "p90_ms": 1e3 * np.percentile(ts, 90)}

    b = args.batch
    idx = np.arange(b) % args.steps
    tb, qb = t_target[idx], jnp.broadcast_to(state0.arm_q_s7, (b, 2, 7))
    arms_b = jax.jit(jax.vmap(lambda t, q: ik.solve_arms(robot.arms, t, q).q_n))
    jax.block_until_ready(arms_b(tb, qb))
    t0 = time.perf_counter()
    reps = 3
    for _ in range(reps):
        jax.block_until_ready(arms_b(tb, qb))
    dt = (time.perf_counter() - t0) / reps
    rows["arms_batched"] = {"batch": b, "ms_per_batch": 1e3 * dt, "arm_pairs_per_s": b / dt}
    kb, hb = kp[idx], jnp.broadcast_to(state0.hand_q_s20, (b, 2, 20))
    hands_b = jax.jit(jax.vmap(lambda k, q: jax.vmap(hand_retarget.retarget)(robot.fingers, k, q).q_20))
    jax.block_until_ready(hands_b(kb, hb))
    t0 = time.perf_counter()
    for _ in range(reps):
        jax.block_until_ready(hands_b(kb, hb))
    dt = (time.perf_counter() - t0) / reps
    rows["hands_batched"] = {"batch": b, "ms_per_batch": 1e3 * dt, "hand_pairs_per_s": b / dt}

    device = jax.devices()[0]
    meta = {"backend": device.platform, "device": str(device.device_kind), "jax": jax.__version__,
            "machine": platform.machine(), "cpus": jax.local_device_count()}
    print(f"device: {meta['backend']} ({meta['device']}), jax {meta['jax']}")
    print(f"{'row':16s} {'median ms':>10s} {'p90 ms':>8s} {'throughput':>18s}")
    for k, v in rows.items():
        thr = next((f"{v[x]:,.0f} {x[:-6]}/s" for x in v if x.endswith("_per_s")), "")
        print(f"{k:16s} {v.get('median_ms', v.get('ms_per_batch', 0)):10.3f} {v.get('p90_ms', float('nan')):8.3f} {thr:>18s}")
    with open(args.json, "w") as fh:
        json.dump({"meta": meta, "rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
