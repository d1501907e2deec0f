"""Benchmark the teleop kinematics: single-step latency and batched throughput.

    python bench/bench_ik.py [--batch 1024] [--steps 300] [--repeats 3] [--json bench_ik.json]

Rows:
  step_realtime   one control step, both arms (early-exit DLS IK) + both hands (early-exit
                  Gauss-Newton) + tracker chain + EMA, on a moving operator trajectory (100 Hz)
  step_fixed      the same with fixed iteration counts (the differentiable / offline configuration)
  arms_realtime   both-arm IK alone (early exit, with the elbow prior), same trajectory
  hands_realtime  both-hand retargeting alone (early exit)
  arms_batched    vmap of the fixed-iteration both-arm IK over `--batch` problems → solves/s
  hands_batched   vmap of both-hand retargeting over `--batch` problems → solves/s
Latency = wall time of one jitted call incl. dispatch and block_until_ready, after warm-up, over
`--repeats` passes of the trajectory (median / p90 / p99). Each step's inputs arrive as host
(numpy) arrays, as from a tracker driver; indexing a device array per step instead would add a
dispatched slice per input (≈0.1 ms each on a loaded CPU) that is not part of the solve.
CPU runs use synchronous dispatch (`jax_cpu_enable_async_dispatch=False`, the setting for a
real-time loop that waits for every result; `--async-dispatch` keeps JAX's default, which hands
each call to another thread and costs more, and much more in the tail, on a busy machine).
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


def _time_sequence(fn, state, xs: tuple[np.ndarray, ...], repeats: int = 1) -> np.ndarray:
    """Per-step wall times [s] of `state = fn(state, *x_t)` over the host arrays `xs` (one step
    of warm-up first), `repeats` passes from the same initial state."""
    jax.block_until_ready(fn(state, *[x[0] for x in xs]))
    times = []
    for _ in range(repeats):
        s = state
        for i in range(len(xs[0])):
            args = [x[i] for x in xs]
            t0 = time.perf_counter()
            s = jax.block_until_ready(fn(s, *args))
            times.append(time.perf_counter() - t0)
    return np.asarray(times)


def _latency_row(times_s: np.ndarray) -> dict:
    ms = 1e3 * times_s
    return {"median_ms": float(np.median(ms)), "p90_ms": float(np.percentile(ms, 90)),
            "p99_ms": float(np.percentile(ms, 99)), "n": len(ms)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3, help="passes over the trajectory per latency row")
    ap.add_argument("--async-dispatch", action="store_true", help="keep JAX's asynchronous CPU dispatch")
    ap.add_argument("--json", default="bench_ik.json")
    args = ap.parse_args()
    if not args.async_dispatch:
        jax.config.update("jax_cpu_enable_async_dispatch", False)
    emb = mjcf_model.embodiment()
    robot = retarget.robot_arrays(emb)
    calib, trk, kp, state0 = _operator_trajectory(emb, robot, args.steps)
    trk_np, kp_np = np.asarray(trk), np.asarray(kp)
    rows: dict[str, dict] = {}

    for name, cfg in [("step_realtime", retarget.realtime_config()), ("step_fixed", retarget.RetargetConfig())]:
        f = jax.jit(lambda s, a, b, cfg=cfg: retarget.step(robot, calib, s, a, b, cfg)[0])
        rows[name] = _latency_row(_time_sequence(f, state0, (trk_np, kp_np), args.repeats))

    rt = retarget.realtime_config()
    t_target, elbow = jax.vmap(lambda x: tracker.arm_targets(calib, tracker.tracker_poses(x)))(trk)
    arms = jax.jit(lambda q, t, e: ik.solve_arms(robot.arms, t, q, e, rt.ik).q_n)
    rows["arms_realtime"] = _latency_row(_time_sequence(arms, state0.arm_q_s7, (np.asarray(t_target), np.asarray(elbow)),
                                                        args.repeats))
    hands = jax.jit(lambda q, k: jax.vmap(lambda f, h, qq: hand_retarget.retarget(f, h, qq, rt.hand).q_20)(robot.fingers, k, q))
    rows["hands_realtime"] = _latency_row(_time_sequence(hands, state0.hand_q_s20, (kp_np,), args.repeats))

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
            "machine": platform.machine(), "cpus": jax.local_device_count(),
            "dispatch": "async" if args.async_dispatch else "sync"}
    print(f"device: {meta['backend']} ({meta['device']}), jax {meta['jax']}, {meta['dispatch']} dispatch")
    print(f"{'row':16s} {'median ms':>10s} {'p90 ms':>8s} {'p99 ms':>8s} {'throughput':>18s}")
    for k, v in rows.items():
        thr = next((f"{v[x]:,.0f} {x[:-6]}/s" for x in v if x.endswith("_per_s")), "")
        print(f"{k:16s} {v.get('median_ms', v.get('ms_per_batch', 0)):10.3f} {v.get('p90_ms', float('nan')):8.3f} "
              f"{v.get('p99_ms', float('nan')):8.3f} {thr:>18s}")
    with open(args.json, "w") as fh:
        json.dump({"meta": meta, "rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
