"""Per-block latency of the causal student's step (few-step denoise + clean cache-writing pass).

    python bench/bench_causal.py --out bench/results/causal_h200.json          # 5B, 480×832, bf16
    python bench/bench_causal.py --tiny --layers 1 --out /tmp/causal_cpu.json  # CPU smoke check
    python bench/bench_causal.py --fp8 --chunks 2 --rolling-blocks 4           # FP8 block linears

Full Wan2.2-TI2V-5B config (random weights, bf16, cuDNN attention on GPU) at 480×832 → 30×52 latent
→ 390 tokens per latent frame, 3 latent frames (12 video frames) per block, text context 512. One
chunk = 7 blocks (21 latent frames) against the 21-frame cache; the table gives each block's
position in the chunk (the cache fills up), then a rolling-cache steady state. Also times a single
model pass against a full cache, and the clean cache pass + the next block's first pass separately
and merged into one forward (StepConfig.merge_clean_pass). Prints the AOT memory analysis, a table
and JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import Checks, write_json  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=None, help="fewer layers (smoke runs)")
    p.add_argument("--tiny", action="store_true", help="tiny model and latent grid (CPU smoke check)")
    p.add_argument("--batch", type=int, default=1, help="sessions batched in one step")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--solver", choices=["x0_euler", "unipc"], default="x0_euler")
    p.add_argument("--frames-per-block", type=int, default=3)
    p.add_argument("--window", type=int, default=20, help="cached latent frames after the sink")
    p.add_argument("--attention", choices=["auto", "cudnn", "xla"], default="auto")
    p.add_argument("--no-unroll", action="store_true", help="keep the layer scan rolled (the serving "
                   "path unrolls it, see dit.unrolled)")
    p.add_argument("--chunks", type=int, default=3, help="timed chunks (the first one is warm-up)")
    p.add_argument("--rolling-blocks", type=int, default=10)
    p.add_argument("--fp8", action="store_true", help="FP8 block linears (fp8.quantize_dit of the same weights)")
    p.add_argument("--token-multiple", type=int, default=1,
                   help="WanDiTConfig.token_multiple (16: a 1170-token block runs as 1184)")
    p.add_argument("--unfused-qkv", action="store_true",
                   help="serve self-attention q/k/v as three linears (before dit.fuse_qkv), for comparison")
    p.add_argument("--out", default="bench/results/causal.json")
    a = p.parse_args()

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from rynn_jax import step_export
    from rynn_jax.models import causal, fp8
    from rynn_jax.models.dit import WanDiT, WanDiTConfig, unrolled
    from rynn_jax.serving.block_step import StepConfig, anchor_state, make_start, make_step
    from rynn_jax.serving.cached_passes import forward_block_after_clean

    overrides = dict(attention=a.attention, token_multiple=a.token_multiple)
    if a.layers:
        overrides["num_layers"] = a.layers
    if a.tiny:
        cfg = WanDiTConfig.tiny(control="add-plus", **overrides)
        hw, text_len = (4, 6), cfg.text_len
    else:
        cfg = WanDiTConfig.ti2v_5b(control="add-plus", dtype="bfloat16", param_dtype="bfloat16", **overrides)
        hw, text_len = (30, 52), 512
    tokens = (hw[0] // 2) * (hw[1] // 2)
    fpb, b = a.frames_per_block, a.batch
    scfg = StepConfig(num_steps=a.steps, solver=a.solver)

    with nnx.use_eager_sharding(False):
        graphdef, _ = nnx.split(nnx.eval_shape(lambda: WanDiT(cfg, rngs=nnx.Rngs(0))))
        params = jax.jit(lambda: nnx.state(WanDiT(cfg, rngs=nnx.Rngs(0))))()
    if a.fp8:
        model_q = fp8.quantize_dit(nnx.merge(graphdef, params))
        cfg = model_q.cfg
        graphdef, params = nnx.split(model_q)
        del model_q
    if not a.no_unroll:  # the serving layout (dit.unrolled: per-layer weights, no layer scan)
        graphdef, params = nnx.split(unrolled(nnx.merge(graphdef, params), fuse_self_qkv=not a.unfused_qkv))
    opts = fp8.compiler_options(cfg)
    key = jax.random.key(0)
    ref = jax.random.normal(key, (b, 1, *hw, cfg.in_channels), jnp.float32)
    ctx = jax.random.normal(key, (b, text_len, cfg.text_dim), jnp.float32)
    control = jax.random.normal(key, (b, fpb, *hw, cfg.control_channels), jnp.float32)
    rng = jax.random.key_data(key)
    print(f"backend {jax.default_backend()}, {jax.devices()[0].device_kind}; layers {cfg.num_layers}, "
          f"dim {cfg.dim}, {tokens} tokens/frame, {fpb} frames/block, batch {b}, {a.steps} steps ({a.solver}), "
          f"dtype {cfg.dtype}{', FP8 block linears' if cfg.fp8 else ''}", flush=True)

    rows, results, checks = [], {}, Checks()
    for policy in ("full", "rolling"):
        ccfg = causal.CausalConfig(frames_per_block=fpb, window_frames=a.window, policy=policy)
        start = jax.jit(make_start(graphdef, ccfg), compiler_options=opts)
        state = start(params, ref, ctx)
        t0 = time.perf_counter()
        step = step_export.compile_aot(make_step(graphdef, ccfg, scfg), params, state, control, rng,
                                  donate_argnums=(1,), name=f"step/{policy}", compiler_options=opts)
        results[f"compile_s/{policy}"] = time.perf_counter() - t0
        anchor = jax.jit(anchor_state, donate_argnums=0)

        last = {}

        def run_block(state, step=step):
            t0 = time.perf_counter()
            x, state = step(params, state, control, rng)
            x.block_until_ready()
            last["x"] = x
            return (time.perf_counter() - t0) * 1e3, state

        if policy == "full":
            per_block: dict[int, list[float]] = {}
            blocks = ccfg.cache_frames // fpb
            for c in range(a.chunks):
                state = anchor(state, ref)
                for i in range(blocks):
                    ms, state = run_block(state)
                    if c > 0:
                        per_block.setdefault(i, []).append(ms)
            for i, ts in per_block.items():
                rows.append(dict(policy=policy, block=i, cached_frames=min(i * fpb, ccfg.cache_frames),
                                 median_ms=statistics.median(ts), min_ms=min(ts)))
        else:
            for _ in range(ccfg.cache_frames // fpb + 2):  # fill and wrap the ring first
                _, state = run_block(state)
            ts = []
            for _ in range(a.rolling_blocks):
                ms, state = run_block(state)
                ts.append(ms)
            rows.append(dict(policy=policy, block="steady", cached_frames=ccfg.cache_frames,
                             median_ms=statistics.median(ts), min_ms=min(ts)))
        checks.finite(f"{policy} cache: last block's latents", last["x"])
        del state

    # One model pass of a block against a full cache (what each of the steps + 1 costs).
    ccfg = causal.CausalConfig(frames_per_block=fpb, window_frames=a.window)
    state = jax.jit(make_start(graphdef, ccfg), compiler_options=opts)(params, ref, ctx)
    cache = {**state["cache"], "frames": jnp.int32(ccfg.cache_frames - fpb)}
    z = jax.random.normal(key, (b, fpb, *hw, cfg.in_channels), jnp.float32)
    t_bf = jnp.full((b, fpb), 937.0)
    one_pass = jax.jit(lambda p, cache: causal.forward_block(nnx.merge(graphdef, p), cache, ccfg, z, t_bf, control,
                                                             write=False)[0], compiler_options=opts)

    def median_ms(fn, *args, iters: int = 10) -> float:
        jax.block_until_ready(fn(*args))  # compile
        ts = []
        for _ in range(iters):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts)

    results["one_pass_full_cache_ms"] = median_ms(one_pass, params, cache)

    # The merged clean pass (StepConfig.merge_clean_pass): block n's clean pass + block n+1's first
    # denoising pass as one forward, against the two passes it replaces, at the last block of a chunk.
    cache_n = {**state["cache"], "frames": jnp.int32(ccfg.cache_frames - 2 * fpb)}
    clean = jax.random.normal(jax.random.fold_in(key, 1), z.shape, jnp.float32)
    zeros = jnp.zeros((b, fpb), jnp.float32)
    model_fn = lambda p: nnx.merge(graphdef, p)  # noqa: E731
    clean_pass = jax.jit(lambda p, c: causal.forward_block(model_fn(p), c, ccfg, clean, zeros, control, write=True)[1],
                         compiler_options=opts)
    merged_pass = jax.jit(lambda p, c: forward_block_after_clean(model_fn(p), c, ccfg, clean, control, z, t_bf,
                                                                        control), compiler_options=opts)
    written = clean_pass(params, cache_n)
    v_seq = one_pass(params, written)
    v_merged, _ = merged_pass(params, cache_n)
    checks.close("merged clean pass vs clean pass then step", v_merged, v_seq, 2e-2)
    for name, fn, arg in (("clean_pass_ms", clean_pass, cache_n), ("next_pass_ms", one_pass, written),
                          ("merged_pass_ms", merged_pass, cache_n)):
        results[name] = median_ms(fn, params, arg)

    video_frames = 4 * fpb
    print(f"\n{'policy':8s} {'block':>6s} {'cached':>6s} {'median ms':>10s} {'min ms':>8s} {'ms/video frame':>15s} {'fps':>6s}")
    for r in rows:
        r["ms_per_video_frame"] = r["median_ms"] / video_frames / b
        r["fps"] = 1e3 / r["ms_per_video_frame"]
        print(f"{r['policy']:8s} {str(r['block']):>6s} {r['cached_frames']:6d} {r['median_ms']:10.2f} "
              f"{r['min_ms']:8.2f} {r['ms_per_video_frame']:15.2f} {r['fps']:6.1f}")
    print(f"one model pass (block of {fpb} vs full cache): {results['one_pass_full_cache_ms']:.2f} ms; "
          f"compile {results['compile_s/full']:.1f} s")
    print(f"clean pass {results['clean_pass_ms']:.2f} + next block's pass {results['next_pass_ms']:.2f} ms "
          f"= {results['clean_pass_ms'] + results['next_pass_ms']:.2f} ms, merged into one forward "
          f"{results['merged_pass_ms']:.2f} ms (StepConfig.merge_clean_pass)")
    out = dict(rows=rows, **results, checks=checks.rows, argv=sys.argv[1:], backend=jax.default_backend(),
               device=jax.devices()[0].device_kind, layers=cfg.num_layers, tokens_per_frame=tokens,
               frames_per_block=fpb, batch=b, steps=a.steps, solver=a.solver, dtype=cfg.dtype, fp8=cfg.fp8, token_multiple=cfg.token_multiple)
    print("JSON " + json.dumps(out))
    write_json(a.out, out)
    checks.exit_if_failed()


if __name__ == "__main__":
    main()
