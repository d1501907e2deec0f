"""Forward latency of the Wan2.2-TI2V-5B DiT (random weights, bf16), ours vs diffusers, one machine.

    python bench/bench_dit.py --frames 1 3 21 --out bench/results/dit.json

Runs the JAX model for each latent-frame count (480×832 video → 30×52 latent → 390 tokens/frame,
text context 512) with cuDNN and XLA attention, the layer scan rolled (training) and unrolled (serving); then, if torch+diffusers are importable and
`--torch` is not 'off', diffusers' `WanTransformer3DModel` in a subprocess (eager and, with
`--torch compile`, torch.compile). Prints a table of medians and writes JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _time(fn, warmup: int, iters: int) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def bench_jax(frames: list[int], iters: int, layers: int | None, unrolls: list[int],
              attentions: list[str]) -> list[dict]:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from rynn_jax.models.dit import WanDiT, WanDiTConfig

    rows = []
    gpu = jax.default_backend() == "gpu"
    variants = [(att, u) for att in attentions if gpu or att == "xla" for u in unrolls]
    for attention, unroll in variants:
        overrides = dict(dtype="bfloat16", param_dtype="bfloat16", attention=attention)
        if layers:
            overrides["num_layers"] = layers
        cfg = WanDiTConfig.ti2v_5b(**overrides)
        cfg = dataclasses.replace(cfg, scan_unroll=min(unroll, cfg.num_layers))
        with nnx.use_eager_sharding(False):
            graphdef, _ = nnx.split(nnx.eval_shape(lambda: WanDiT(cfg, rngs=nnx.Rngs(0))))

            @jax.jit
            def init():
                return nnx.state(WanDiT(cfg, rngs=nnx.Rngs(0)))

            state = init()

        @jax.jit
        def fwd(state, z, t, ctx):
            return nnx.merge(graphdef, state)(z, t, ctx)

        for f in frames:
            key = jax.random.key(f)
            z = jax.random.normal(key, (1, f, 30, 52, 48), jnp.bfloat16)
            t = jnp.concatenate([jnp.zeros((1, 1)), jnp.full((1, f - 1), 700.0)], axis=1)
            ctx = jax.random.normal(key, (1, 512, 4096), jnp.bfloat16)
            t0 = time.perf_counter()
            fwd(state, z, t, ctx).block_until_ready()
            compile_s = time.perf_counter() - t0
            times = _time(lambda: fwd(state, z, t, ctx).block_until_ready(), 3, iters)
            name = f"jax ({attention} attn{', unrolled' if cfg.scan_unroll > 1 else ''})"
            rows.append(dict(impl=name, frames=f, tokens=f * 390,
                             median_ms=statistics.median(times), min_ms=min(times), compile_s=compile_s))
            print(rows[-1], flush=True)
        del state
    return rows


def bench_torch(frames: list[int], iters: int, layers: int | None, compile_: bool) -> list[dict]:
    import torch
    from diffusers import WanTransformer3DModel

    kw = dict(patch_size=(1, 2, 2), num_attention_heads=24, attention_head_dim=128, in_channels=48,
              out_channels=48, text_dim=4096, freq_dim=256, ffn_dim=14336, num_layers=layers or 30,
              cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6)
    model = WanTransformer3DModel(**kw).to("cuda", torch.bfloat16).eval()
    runs = [("diffusers eager", model)]
    if compile_:
        runs.append(("diffusers torch.compile", torch.compile(model)))
    rows = []
    for name, m in runs:
        for f in frames:
            z = torch.randn(1, 48, f, 30, 52, device="cuda", dtype=torch.bfloat16)
            t = torch.cat([torch.zeros(1, 390), torch.full((1, 390 * (f - 1)), 700.0)], 1).cuda()
            ctx = torch.randn(1, 512, 4096, device="cuda", dtype=torch.bfloat16)

            def step():
                with torch.no_grad():
                    m(z, t, ctx, return_dict=False)
                torch.cuda.synchronize()

            times = _time(step, 3, iters)
            rows.append(dict(impl=name, frames=f, tokens=f * 390, median_ms=statistics.median(times),
                             min_ms=min(times)))
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--frames", type=int, nargs="+", default=[1, 3, 21])
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--layers", type=int, default=None, help="fewer layers for a quick CPU smoke run")
    p.add_argument("--unroll", type=int, nargs="+", default=[1, 30],
                   help="WanDiTConfig.scan_unroll variants (30 = the serving path, dit.unrolled)")
    p.add_argument("--attention", nargs="+", default=["cudnn", "xla"], choices=["cudnn", "xla"])
    p.add_argument("--torch", choices=["off", "eager", "compile"], default="eager")
    p.add_argument("--only-torch", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default="bench/results/dit.json")
    a = p.parse_args()
    if a.only_torch:
        print("JSON" + json.dumps(bench_torch(a.frames, a.iters, a.layers, a.torch == "compile")))
        return
    rows = []
    if a.torch != "off":
        # Separate process: torch and JAX would otherwise fight over GPU memory.
        cmd = [sys.executable, __file__, "--only-torch", "--torch", a.torch, "--iters", str(a.iters),
               "--frames", *map(str, a.frames)] + (["--layers", str(a.layers)] if a.layers else [])
        res = subprocess.run(cmd, capture_output=True, text=True)
        lines = [ln for ln in res.stdout.splitlines() if ln.startswith("JSON")]
        if lines:
            rows += json.loads(lines[-1][4:])
        else:
            print("torch reference skipped:", res.stderr.strip().splitlines()[-1:] or "no output")
    rows += bench_jax(a.frames, a.iters, a.layers, a.unroll, a.attention)
    print(f"\n{'impl':28s} {'frames':>6s} {'tokens':>6s} {'median ms':>10s} {'min ms':>8s}")
    for r in rows:
        print(f"{r['impl']:28s} {r['frames']:6d} {r['tokens']:6d} {r['median_ms']:10.2f} {r['min_ms']:8.2f}")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(dict(rows=rows, argv=sys.argv[1:]), f, indent=1)


if __name__ == "__main__":
    main()
