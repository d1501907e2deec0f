"""`retarget` CLI: a recorded operator stream → 54-D action trajectory.

    python -m rynn_jax.kinematics.cli retarget STREAM.npz ACTIONS.npz [--hz 16] [--scale 1.5]

Output `.npz`: `t` [T], `actions` [T,54] (radians, layout.ACTION_NAMES order), `action_names`,
`trackers_fresh` [T,5] / `hands_fresh` [T,2] (False = held or missing input),
`ik_pos_err` / `ik_rot_err` [T,2] (metres / radians), `hand_tip_err` [T,2] (metres).
By default the first step calibrates (`tracker.calibrate`: T_base translation, T_ee rotation) so the operator's first pose maps onto the robot's
home pose (`--no-calibrate` keeps the default calibration).
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from rynn_jax.kinematics import fk, layout, mjcf_model, retarget, streams, tracker


def retarget_stream(stream: streams.Stream, hz: float = streams.VIDEO_FPS, scale: float = 1.5,
                    calibrate: bool = True) -> dict[str, np.ndarray]:
    t0, t1 = stream.span
    if not t1 > t0:
        raise ValueError("tracker and hand clocks do not overlap")
    rs = streams.resample(stream, streams.clock(t0, t1, hz))
    emb = mjcf_model.embodiment()
    robot = retarget.robot_arrays(emb)
    state = retarget.initial_state(emb)
    calib = tracker.default_calibration(scale=scale)
    if calibrate:
        first = np.flatnonzero(rs["trackers_fresh"].all(axis=1))
        if len(first) == 0:
            raise ValueError("no time step has all five trackers valid; cannot calibrate "
                             "(pass --no-calibrate to use the default calibration)")
        home_ee = jax.vmap(fk.chain_tip)(robot.arms, state.arm_q_s7)
        poses = tracker.tracker_poses(jnp.asarray(rs["trackers"][first[0]], jnp.float32))
        calib = tracker.calibrate(calib, poses, home_ee)
    _, actions, info = retarget.trajectory_jit(robot, calib, state, jnp.asarray(rs["trackers"], jnp.float32),
                                               jnp.asarray(rs["hands"], jnp.float32))
    actions = np.asarray(actions)
    if not np.all(np.isfinite(actions)):       # guaranteed by construction; fail loudly if not
        raise RuntimeError("non-finite joints in the retargeted actions")
    return {"t": rs["t"], "actions": actions, "action_names": np.asarray(layout.ACTION_NAMES),
            "trackers_fresh": rs["trackers_fresh"], "hands_fresh": rs["hands_fresh"],
            "ik_pos_err": np.asarray(info.ik.pos_err), "ik_rot_err": np.asarray(info.ik.rot_err),
            "hand_tip_err": np.asarray(info.hand_tip_err_s)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rynn_jax.kinematics.cli", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("retarget", help="recorded stream → 54-D actions")
    r.add_argument("stream")
    r.add_argument("out")
    r.add_argument("--hz", type=float, default=streams.VIDEO_FPS, help="output clock (16 = video)")
    r.add_argument("--scale", type=float, default=1.5, help="translation scale s")
    r.add_argument("--no-calibrate", action="store_true")
    r.add_argument("--video", default=None, help="also write an MP4 of the robot replaying the actions "
                   "(needs MUJOCO_GL=osmesa or egl)")
    args = ap.parse_args(argv)
    t = time.perf_counter()
    out = retarget_stream(streams.read(args.stream), args.hz, args.scale, not args.no_calibrate)
    np.savez_compressed(args.out, **out)
    held = 1.0 - out["trackers_fresh"].mean()
    print(f"{len(out['t'])} steps at {args.hz:g} Hz → {args.out} ({time.perf_counter() - t:.1f} s); "
          f"IK pos err median {1e3 * np.median(out['ik_pos_err']):.2f} mm; tracker frames held {100 * held:.1f}%")
    if args.video:
        from rynn_jax.kinematics.replay import render_replay
        from rynn_jax.render.preview import save_video

        save_video(args.video, render_replay(out["actions"]), fps=round(args.hz))
        print(f"replay video → {args.video}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
