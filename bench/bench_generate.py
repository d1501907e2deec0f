"""Training-data throughput of `serve.py generate`: operator streams → robot episodes per hour,
with the host work (IK, skeleton render, MP4 encoding, parquet) one step after the other
(`--sequential`) and pipelined on threads beside the world model (the default), in one process.

    python bench/bench_generate.py --batch 4 --streams 12 --out bench/results/generate_h200.json  # 5B, 480×832
    python bench/bench_generate.py --tiny --height 96 --width 160 --frames 13 --streams 4 --out /tmp/g.json  # CPU smoke

Random weights: the 5B control student (bf16, layers unrolled) in `serve.py generate`'s session
(2-frame blocks, 4-frame rolling cache), the exact Wan2.2 VAE encoding and the tiny autoencoder
decoding (`--decoder vae`: the exact VAE both ways). Synthetic operator streams and reference
views, written as `serve.py generate` reads them. Per batch size: one untimed run on `batch`
streams (compiles and loads every program), then the sequential and the pipelined run over all
`--streams`, each into its own directory. Reports seconds, episodes per hour, generated frames per
second and the main thread's waits (`waited_seconds`: preparing, the world model, writing).
Checks: every episode written by both runs, the two runs' episodes identical (actions and decoded
video: per-episode noise keys), videos not blank. Random weights make noise-like frames, which
encode slower than a trained model's video: the write times are an upper bound.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import Checks, write_json  # noqa: E402


def write_streams(root: Path, n: int, frames: int, height: int, width: int) -> None:
    """`n` synthetic operator stream directories in the layout `serve.py generate` reads."""
    from rynn_jax.kinematics import streams
    from rynn_jax.render.preview import save_png
    from rynn_jax.teleop.camera_hands import synthetic_stream
    from rynn_jax.teleop.demo import reference_scene
    from rynn_jax.teleop.inputs import IMAGE_FILE, STREAM_FILE

    for i in range(n):
        d = root / f"op{i:03d}"
        d.mkdir(parents=True)
        streams.write(d / STREAM_FILE, synthetic_stream(frames + 8, seed=i))
        save_png(d / IMAGE_FILE, reference_scene(height, width, seed=i))


def compare_runs(a: Path, b: Path, names: list[str], checks: Checks) -> None:
    """The same episodes in both output roots: actions equal, decoded videos equal, not blank."""
    import imageio.v3 as iio
    import numpy as np
    import pyarrow.parquet as pq

    from rynn_jax.data import robot as robot_data

    worst_video, worst_action, blank = 0.0, 0.0, 0
    for name in names:
        acts = [np.asarray(pq.read_table(r / name / robot_data.TIMESERIES_FILE)[robot_data.ACTION_COLUMN].to_pylist())
                for r in (a, b)]
        worst_action = max(worst_action, float(np.abs(acts[0] - acts[1]).max()))
        vids = [np.asarray(iio.imread(r / name / robot_data.VIDEO_FILE), np.float32) for r in (a, b)]
        if vids[0].shape != vids[1].shape:
            worst_video = float("inf")
            continue
        worst_video = max(worst_video, float(np.abs(vids[0] - vids[1]).max()))
        blank += int(vids[0].std() == 0)  # one flat colour
    for what, value, tol in (("actions, sequential vs pipelined: max abs", worst_action, 0.0),
                             ("decoded video, sequential vs pipelined: max abs (8-bit)", worst_video, 2.0),
                             ("blank videos", blank, 0)):
        ok = value <= tol
        checks.rows.append(dict(check=f"{what} ≤ {tol:g}", value=value, ok=ok))
        print(f"check {what}: {value:g} (≤ {tol:g}) {'ok' if ok else 'FAILED'}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, nargs="+", default=[4])
    p.add_argument("--streams", type=int, default=12, help="operator streams (episodes) per timed run")
    p.add_argument("--frames", type=int, default=81, help="frames per episode")
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--width", type=int, default=832)
    p.add_argument("--decoder", choices=["tae", "vae"], default="tae")
    p.add_argument("--tiny", action="store_true", help="tiny float32 models (CPU smoke)")
    p.add_argument("--workdir", default=None, help="where streams and episodes go (default: a temp dir, removed)")
    p.add_argument("--out", default="bench/results/generate.json")
    a = p.parse_args()

    import jax

    from rynn_jax.models.dit import WanDiTConfig, init_dit
    from rynn_jax.models.tae import TAEConfig, init_tae
    from rynn_jax.models.vae import WanVAEConfig, init_vae
    from rynn_jax.serving.assemble import serving_session
    from rynn_jax.teleop import generate as gen

    dtype = "float32" if a.tiny else "bfloat16"
    if a.tiny:
        dit_cfg = WanDiTConfig.tiny(control="add-plus", in_channels=4, out_channels=4, control_channels=4)
        vae_cfg, tae_cfg = WanVAEConfig.tiny(), TAEConfig.tiny(dtype=dtype)
    else:
        dit_cfg = WanDiTConfig.ti2v_5b(control="add-plus", dtype=dtype, param_dtype=dtype)
        vae_cfg, tae_cfg = WanVAEConfig.wan22(dtype=dtype, param_dtype=dtype), TAEConfig.wan22(dtype=dtype)
    t = time.perf_counter()
    dit, vae = init_dit(dit_cfg, 0), init_vae(vae_cfg, 0)
    decoder = init_tae(tae_cfg, 0) if a.decoder == "tae" else None
    print(f"models built in {time.perf_counter() - t:.1f} s ({jax.default_backend()})", flush=True)

    work = Path(a.workdir or tempfile.mkdtemp(prefix="bench_generate_"))
    root = work / "streams"
    if root.exists():
        shutil.rmtree(root)
    write_streams(root, a.streams, a.frames, a.height, a.width)
    names = sorted(d.name for d in root.iterdir())
    checks, results = Checks(), []

    def save() -> None:
        write_json(a.out, dict(results=results, checks=checks.rows, backend=jax.default_backend(), dtype=dtype,
                               tiny=a.tiny, decoder=a.decoder, resolution=[a.height, a.width], frames=a.frames,
                               cpu_count=os.cpu_count(), argv=sys.argv[1:]))

    for b in a.batch:
        session = serving_session(dit, vae, decoder=decoder, unroll_layers=not a.tiny)
        runs = {}
        for run in ("warm-up", "sequential", "pipelined"):
            out = work / f"b{b}_{run}"
            if out.exists():
                shutil.rmtree(out)
            src = root
            if run == "warm-up":  # `batch` streams: compiles (in generate, at its first batch) and loads
                src = work / "warm_streams"
                if src.exists():
                    shutil.rmtree(src)
                src.mkdir()
                for name in names[:b]:
                    shutil.copytree(root / name, src / name)
            s = gen.generate(src, out, batch=b, num_frames=a.frames, height=a.height, width=a.width,
                             pipeline=run != "sequential", session=session)
            frames = sum(s["written"].values())
            runs[run] = s
            row = dict(batch=b, run=run, episodes=len(s["written"]), frames=frames, seconds=s["seconds"],
                       episodes_per_hour=round(3600 * len(s["written"]) / s["seconds"], 1),
                       frames_per_s=round(frames / s["seconds"], 2), waited_seconds=s["waited_seconds"],
                       failed=s["failed"])
            results.append(row)
            print(row, flush=True)
            ok = not s["failed"] and len(s["written"]) == (b if run == "warm-up" else len(names))
            checks.rows.append(dict(check=f"B={b} {run}: every episode written", ok=ok))
        compare_runs(work / f"b{b}_sequential", work / f"b{b}_pipelined", names, checks)
        seq, pipe = runs["sequential"]["seconds"], runs["pipelined"]["seconds"]
        print(f"B={b}: pipelined {pipe:.1f} s vs sequential {seq:.1f} s = {seq / pipe:.2f}× episodes per hour",
              flush=True)
        save()  # after every batch size: a run cut short keeps what it measured

    print("\n| B | run | episodes | s | episodes/h | frames/s | waited: prepare / world model / write (s) |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        w = r["waited_seconds"]
        print(f"| {r['batch']} | {r['run']} | {r['episodes']} | {r['seconds']:.1f} | {r['episodes_per_hour']:.0f} | "
              f"{r['frames_per_s']:.1f} | {w['prepare']:.1f} / {w['world_model']:.1f} / {w['write']:.1f} |")
    if a.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    checks.exit_if_failed()


if __name__ == "__main__":
    main()
