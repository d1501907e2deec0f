"""`retarget` CLI: a recorded operator stream → 54-D action trajectory.

    python -m rynn_jax.kinematics.cli retarget STREAM.npz ACTIONS.npz [--hz 16] [--scale 1.5]
    python -m rynn_jax.kinematics.cli retarget data/sample/operator_stream.npz out/actions.npz --video out/replay.mp4

Output `.npz`: `t` [T], `actions` [T,54] (radians, layout.ACTION_NAMES order), `action_names`,
`trackers_fresh` [T,5] / `hands_fresh` [T,2] (False = held or missing input),
`ik_pos_err` / `ik_rot_err` [T,2] (metres / radians), `hand_tip_err` [T,2] (metres).
By default the first step calibrates (`tracker.calibrate`: T_base translation, T_ee rotation) so the operator's first pose maps onto the robot's
home pose (`--no-calibrate` keeps the default calibration). Lost or implausible input frames are
held (and counted in a warning); a stream with more than half its frames lost is refused
(`streams.check`). Outputs are written atomically; their folders are created.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
from tqdm import tqdm

from rynn_jax import errors
from rynn_jax.atomic import atomic_file
from rynn_jax.kinematics import streams
from rynn_jax.kinematics.retarget import retarget_stream


def main(argv: list[str] | None = None) -> int:
    ap = errors.ArgumentParser(prog="python -m rynn_jax.kinematics.cli", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=errors.ArgumentParser)
    r = sub.add_parser("retarget", help="recorded stream → 54-D actions", description=__doc__,
                       formatter_class=errors.HelpFormatter)
    r.add_argument("stream", help=f"operator stream (.npz, {streams.FORMAT})")
    r.add_argument("out", help="actions file to write (.npz; its folder is created)")
    r.add_argument("--hz", type=float, default=streams.VIDEO_FPS, help="output clock (16 = video)")
    r.add_argument("--scale", type=float, default=1.5, help="translation scale s")
    r.add_argument("--no-calibrate", action="store_true", help="keep the default calibration")
    r.add_argument("--video", default=None, help="also write an MP4 of the robot replaying the actions "
                   "(MuJoCo offscreen: MUJOCO_GL=osmesa unless set)")
    args = ap.parse_args(argv)
    # Everything cheap first: flags, the stream file and its validity, the output folders.
    if not args.hz > 0 or not args.scale > 0:
        raise errors.UsageError(f"--hz {args.hz:g} / --scale {args.scale:g}: must be > 0")
    if not args.out.endswith(".npz"):
        raise errors.UsageError(f"{args.out}: the actions file must end in .npz")
    stream = streams.read(args.stream)
    for flag, path in (("out", args.out), ("--video", args.video)):
        if path:
            errors.writable_dir(os.path.dirname(os.path.abspath(path)), flag)
    if args.video:
        os.environ.setdefault("MUJOCO_GL", "osmesa")  # headless, as the sim and the demo (before mujoco loads)
    t = time.perf_counter()
    with tqdm(total=2 + bool(args.video), desc="retarget", unit="stage") as bar:
        bar.set_postfix_str("IK (compiling)")
        out = retarget_stream(stream, args.hz, args.scale, not args.no_calibrate, where=args.stream)
        bar.update()
        bar.set_postfix_str("write")
        with atomic_file(args.out) as tmp:
            np.savez_compressed(tmp, **out)
        bar.update()
        if args.video:
            from rynn_jax.kinematics.replay import render_replay
            from rynn_jax.render.preview import save_video

            bar.set_postfix_str("replay video")
            with atomic_file(args.video) as tmp:
                save_video(tmp, render_replay(out["actions"]), fps=round(args.hz))
            bar.update()
    held = 1.0 - out["trackers_fresh"].mean()
    print(f"{len(out['t'])} steps at {args.hz:g} Hz → {args.out} ({time.perf_counter() - t:.1f} s); "
          f"IK pos err median {1e3 * np.median(out['ik_pos_err']):.2f} mm; tracker frames held {100 * held:.1f}%")
    if args.video:
        print(f"replay video → {args.video}")
    return 0


if __name__ == "__main__":
    sys.exit(errors.run(main))
