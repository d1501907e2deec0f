"""Throughput of the depth-aware skeleton renderer on the current JAX backend.

    python bench/bench_render.py --batch 16 --out bench/results/render_cpu.json

Renders a batch of synthetic two-hand frames (`synthetic_hand_motion`) at 480×832 with the
jitted, vmapped renderer (`render_video_unchecked` + uint8 conversion), for each batch size, and
reports the median wall time per batch and frames/s (compile time separately), plus the host
CPU time per frame (process time: on a shared, oversubscribed CPU it is steadier than wall
time). Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def bench(batches: list[int], iters: int, width: int, height: int) -> list[dict]:
    import jax
    import jax.numpy as jnp

    from rynn_jax.render.rasterize import (RenderConfig, default_intrinsics,
                                           render_video_unchecked, to_uint8)
    from rynn_jax.render.synthetic import synthetic_hand_motion

    cfg = RenderConfig(width=width, height=height)
    K = jnp.asarray(default_intrinsics(cfg))
    fn = jax.jit(lambda j, e, v: to_uint8(render_video_unchecked(cfg, j, e, K, v)))
    rows = []
    for b in batches:
        joints, elbows = synthetic_hand_motion(b, seed=0, fps=cfg.fps)
        joints, elbows = jnp.asarray(joints), jnp.asarray(elbows)
        valid = jnp.ones((b, 2, 22), jnp.bool_)
        t0 = time.perf_counter()
        fn(joints, elbows, valid).block_until_ready()
        compile_s = time.perf_counter() - t0
        times, cpu = [], []
        for _ in range(iters):
            t0, c0 = time.perf_counter(), time.process_time()
            fn(joints, elbows, valid).block_until_ready()
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        med = statistics.median(times)
        rows.append(dict(backend=jax.default_backend(), device=str(jax.devices()[0].device_kind),
                         batch=b, height=height, width=width, median_ms=med * 1e3,
                         min_ms=min(times) * 1e3, fps=b / med, compile_s=compile_s,
                         cpu_ms_per_frame=statistics.median(cpu) * 1e3 / b))
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batch", type=int, nargs="+", default=[16], help="frames per call")
    p.add_argument("--iters", type=int, default=5, help="timed calls per batch size")
    p.add_argument("--width", type=int, default=832)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--out", default=None, help="JSON output path")
    args = p.parse_args()
    import jax

    rows = bench(args.batch, args.iters, args.width, args.height)
    print(f"\n{'backend':8} {'device':24} {'batch':>5} {'ms/batch':>10} {'frames/s':>10} "
          f"{'compile s':>9} {'cpu ms/frame':>12}")
    for r in rows:
        print(f"{r['backend']:8} {r['device'][:24]:24} {r['batch']:5d} {r['median_ms']:10.2f} "
              f"{r['fps']:10.1f} {r['compile_s']:9.2f} {r['cpu_ms_per_frame']:12.1f}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        meta = dict(jax=jax.__version__, host=platform.node(), cpu_count=os.cpu_count(),
                    iters=args.iters)
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
