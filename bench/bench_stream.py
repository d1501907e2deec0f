"""End-to-end streaming FPS: skeleton render → streaming VAE encode → 4-step causal DiT with KV cache
→ clean cache pass → streaming VAE decode, one jitted step per block (random weights).

    python bench/bench_stream.py --chunks 2 --out bench/results/stream_h200.json     # 5B, 480×832, bf16
    python bench/bench_stream.py --tiny --chunks 1 --height 64 --width 64 --out /tmp/s.json  # CPU smoke

Reports time to first frame (start + first block), per-block latency over the chunk, and output
FPS (generated video frames per second of wall time, rendering included). Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tiny", action="store_true", help="tiny DiT + VAE (CPU smoke check)")
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--width", type=int, default=832)
    p.add_argument("--chunks", type=int, default=2, help="81-frame chunks to stream (first includes compile)")
    p.add_argument("--out", default="bench/results/stream.json")
    a = p.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np

    from rynn_jax.models.causal import CausalConfig
    from rynn_jax.models.dit import WanDiTConfig, init_dit
    from rynn_jax.models.vae import WanVAEConfig, init_vae
    from rynn_jax.render import RenderConfig, default_intrinsics, render_video_unchecked, synthetic_hand_motion
    from rynn_jax.teleop.streaming import StepConfig, StreamingSession

    dtype = "float32" if a.tiny else "bfloat16"
    if a.tiny:
        vae_cfg = WanVAEConfig.tiny()
        dit_cfg = WanDiTConfig.tiny(control="add", in_channels=4, out_channels=4, control_channels=4)
    else:
        vae_cfg = WanVAEConfig.wan22(dtype=dtype, param_dtype=dtype)
        dit_cfg = WanDiTConfig.ti2v_5b(control="add", dtype=dtype, param_dtype=dtype)
    session = StreamingSession(init_dit(dit_cfg, 0), init_vae(vae_cfg, 0), CausalConfig(), StepConfig())
    rcfg = RenderConfig(width=a.width, height=a.height)
    k = default_intrinsics(rcfg)
    total = 1 + 80 * a.chunks
    joints, elbows = synthetic_hand_motion(total, seed=0)
    render = jax.jit(lambda j, e: render_video_unchecked(rcfg, j, e, k, jnp.ones(j.shape[:1] + (2, 22), bool)) * 2 - 1)
    image = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (1, a.height, a.width, 3)), jnp.float32)
    ctx = jnp.zeros((1, dit_cfg.text_len, dit_cfg.text_dim), jnp.float32)

    t0 = time.perf_counter()
    session.start(image, ctx, jax.random.key(0))
    used, rows, first_frame_s = 0, [], None
    while used < total:
        n = session.frames_needed
        if used + n > total:
            break
        tb = time.perf_counter()
        skel = render(jnp.asarray(joints[used:used + n]), jnp.asarray(elbows[used:used + n]))[None]
        rgb = session.step(skel)
        rgb.block_until_ready()
        dt = time.perf_counter() - tb
        used += n
        if first_frame_s is None:
            first_frame_s = time.perf_counter() - t0
        rows.append(dict(block=session.blocks, chunk=session.chunks, frames_out=int(rgb.shape[1]), ms=dt * 1e3))
        print(rows[-1], flush=True)
    steady = [r for r in rows if r["chunk"] >= 1] or rows[1:]
    ms_per_frame = sum(r["ms"] for r in steady) / max(1, sum(r["frames_out"] for r in steady))
    result = dict(time_to_first_frame_s=first_frame_s, steady_ms_per_frame=ms_per_frame,
                  steady_fps=1e3 / ms_per_frame, median_block_ms=statistics.median(r["ms"] for r in steady),
                  rows=rows, backend=jax.default_backend(), dtype=dtype, tiny=a.tiny,
                  resolution=[a.height, a.width], argv=sys.argv[1:])
    print(f"\ntime to first frame {first_frame_s:.2f} s (includes compilation)")
    print(f"steady state: {ms_per_frame:.2f} ms per output frame = {1e3 / ms_per_frame:.1f} FPS "
          f"(median block {result['median_block_ms']:.1f} ms)")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
