"""Forward latency of the Wan2.2-TI2V-5B DiT (random weights, bf16), ours vs diffusers, one machine.

    python bench/bench_dit.py --frames 1 3 21 --out bench/results/dit.json

Runs the JAX model for each latent-frame count (480×832 video → 30×52 latent → 390 tokens/frame,
text context 512) with cuDNN and XLA attention, the layer scan rolled (training) and unrolled (serving); then, if torch+diffusers are importable and
`--torch` is not 'off', diffusers' `WanTransformer3DModel` in a subprocess (eager and, with
`--torch compile`, torch.compile). Prints a table of medians and writes JSON.

`--fp8` also times, for each JAX configuration, the same weights quantized for the FP8 serving path
(`rynn_jax.models.fp8.quantize_dit`: block linears as float8_e4m3fn GEMMs), checks its output
against the bf16 one, counts the GEMM kinds in its compiled HLO (`hlo_gemms` in the row: on an
H100/H200 the block linears should show up as `__cublas$lt$matmul$f8`). The compiled HLO of every
variant goes next to the JSON (`<out>.<bf16|fp8>.<attention>.u<unroll>.m<token multiple>.<layout>.hlo.txt`).
`--fp8 --fp8-static` also times the FP8 model with calibrated static activation scales
(`fp8.calibrate`; row "…, fp8 static)"), held to the bf16 output like the per-token one.
`--token-multiple 1 16` also times the model with its tokens padded (WanDiTConfig.token_multiple).
`--compiler-options '{"xla_gpu_triton_gemm_any": true}'` also times the bf16 program built with those
XLA options. `--round-robin` times the JAX variants in turn after compiling them all (A/B within
one process; the diffusers peer still runs first, in its own process).
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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import Checks, time_ms, write_json  # noqa: E402

# --layouts of a fully unrolled model → dit.unrolled's fusions (None: the stacked arrays, sliced)
LAYOUTS = {"per_layer": dict(fuse_self_qkv=True, fuse_text_kv=True),  # the serving layout
           "per_layer_text_split": dict(fuse_self_qkv=True, fuse_text_kv=False),
           "per_layer_split": dict(fuse_self_qkv=False, fuse_text_kv=False),
           "stacked": None}
LAYOUT_NAMES = {"per_layer_text_split": ", text k/v per layer", "per_layer_split": ", q/k/v + text k/v unfused"}


def check_slice(checks, attention: str, unroll: int) -> None:
    """The timed configuration (bf16, `attention`, `unroll`) against the float32 XLA-attention path
    (the one tests/test_dit.py holds to diffusers) on a slice: 2 layers at full width, 1 latent frame."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from rynn_jax.models.dit import WanDiTConfig, init_dit

    outs = []
    for dtype, att, u in (("float32", "xla", 1), ("bfloat16", attention, min(unroll, 2))):
        cfg = WanDiTConfig.ti2v_5b(dtype=dtype, param_dtype="float32", attention=att, num_layers=2, scan_unroll=u)
        model = init_dit(cfg, 1)  # same seed and param dtype: identical weights in both runs
        key = jax.random.key(1)
        z = jax.random.normal(key, (1, 1, 30, 52, 48), jnp.float32)
        ctx = jax.random.normal(key, (1, 512, 4096), jnp.float32)
        graphdef, state = nnx.split(model)
        run = jax.jit(lambda s, z, c: nnx.merge(graphdef, s)(z, jnp.full((1, 1), 700.0), c))
        outs.append(jax.device_get(run(state, z, ctx)))
    checks.close(f"2-layer slice, bf16 {attention} unroll {unroll} vs float32 xla", outs[1], outs[0], 3e-2)


def _hlo_gemms(hlo_text: str) -> dict:
    """GEMM kinds in a compiled GPU HLO module (all zero on CPU, which has no such custom calls)."""
    return dict(cublas_fp8=hlo_text.count('custom_call_target="__cublas$lt$matmul$f8"'),
                cublas_lt=hlo_text.count('custom_call_target="__cublas$lt$matmul"'),
                cublas=hlo_text.count('custom_call_target="__cublas$gemm"'),
                triton=hlo_text.count('"kind":"__triton_gemm"'))


def _write_hlo(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)


class Timing:
    """Times each compiled variant right away or, with `round_robin`, all of them in turn at the end
    (one call of each, then the next round), so that clock drift over the run — ±4% between
    processes on the H200 — falls on every variant alike. Round-robin keeps every variant's weights
    alive until the end."""

    def __init__(self, iters: int, round_robin: bool = False):
        self.iters, self.round_robin = iters, round_robin
        self.pending: list[tuple[object, list[float]]] = []

    def time(self, call) -> list[float]:
        if not self.round_robin:
            return time_ms(call, 3, self.iters)
        times: list[float] = []
        self.pending.append((call, times))
        return times  # filled in by finish()

    def finish(self, rows: list[dict]) -> None:
        if not self.pending:
            return
        for _ in range(3):  # warm-up round
            for call, _ in self.pending:
                call()
        for _ in range(self.iters):
            for call, times in self.pending:
                t0 = time.perf_counter()
                call()
                times.append((time.perf_counter() - t0) * 1e3)
        for row in rows:
            if "times_ms" not in row:
                _summarise(row, row.pop("_times"))


def _compile_and_time(fn, args: tuple, options: dict | None, timing: Timing):
    """Compile `fn` for `args` with XLA `options`, run once, time it: (output, times ms, compile s, HLO)."""
    t0 = time.perf_counter()
    compiled = fn.lower(*args).compile(options)
    out = compiled(*args).block_until_ready()
    compile_s = time.perf_counter() - t0
    times = timing.time(lambda: compiled(*args).block_until_ready())
    return out, times, compile_s, compiled.as_text() or ""


def _row(name: str, frames: int, times: list[float], compile_s: float, **extra) -> dict:
    row = dict(impl=name, frames=frames, tokens=frames * 390, compile_s=compile_s, **extra)
    if times:
        _summarise(row, times)
    else:  # timed later (Timing.round_robin)
        row["_times"] = times
    return row


def _summarise(row: dict, times: list[float]) -> None:
    row.update(median_ms=statistics.median(times), min_ms=min(times))
    print({k: v for k, v in row.items() if k != "hlo_gemms"}, flush=True)
    row["times_ms"] = [round(t, 3) for t in times]  # every timed call: the spread behind the median


def _option_rows(option_sets, fn, args: tuple, base_options: dict | None, base_name: str, base_out,
                 frames: int, timing: Timing, checks) -> list[dict]:
    """The same program rebuilt with each extra XLA option set (on top of its own options), each
    checked against the default build's output."""
    rows = []
    for opts in option_sets:
        out, times, compile_s, hlo = _compile_and_time(fn, args, {**(base_options or {}), **opts}, timing)
        name = f"{base_name[:-1]}, {json.dumps(opts, sort_keys=True)})"
        if checks is not None:
            checks.close(f"{name} vs default options, {frames} frames", out, base_out, 2e-2)
        rows.append(_row(name, frames, times, compile_s, compiler_options=opts, hlo_gemms=_hlo_gemms(hlo)))
    return rows


def bench_jax(frames: list[int], iters: int, layers: int | None, unrolls: list[int],
              attentions: list[str], checks=None, fp8: bool = False, hlo_prefix: str | None = None,
              token_multiples: tuple[int, ...] = (1,), layouts: tuple[str, ...] = ("per_layer",),
              option_sets: tuple[dict, ...] = (), fp8_static: bool = False, round_robin: bool = False) -> list[dict]:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from rynn_jax.models.dit import WanDiT, WanDiTConfig, unrolled
    from rynn_jax.models.fp8 import calibrate, compiler_options, quantize_dit
    from rynn_jax.teleop.calibrate_fp8 import calibration_timesteps

    rows, first_out = [], {}
    timing = Timing(iters, round_robin)
    gpu = jax.default_backend() == "gpu"
    variants = [(att, u, m, lay) for att in attentions if gpu or att == "xla" for u in unrolls
                for m in token_multiples for lay in (layouts if u >= (layers or WanDiTConfig.ti2v_5b().num_layers)
                                                     else ("stacked",))]
    for attention, unroll, multiple, layout in variants:
        overrides = dict(dtype="bfloat16", param_dtype="bfloat16", attention=attention, token_multiple=multiple)
        if layers:
            overrides["num_layers"] = layers
        cfg = WanDiTConfig.ti2v_5b(**overrides)
        cfg = dataclasses.replace(cfg, scan_unroll=min(unroll, cfg.num_layers))
        variant_tag = f"{attention}.u{cfg.scan_unroll}.m{multiple}.{layout}"
        with nnx.use_eager_sharding(False):
            graphdef, _ = nnx.split(nnx.eval_shape(lambda: WanDiT(cfg, rngs=nnx.Rngs(0))))

            @jax.jit
            def init():
                return nnx.state(WanDiT(cfg, rngs=nnx.Rngs(0)))

            state = init()

        if fp8:  # the same weights, block linears quantized to FP8 (serving path)
            model_q = quantize_dit(nnx.merge(graphdef, state))
            if fp8_static:  # calibrated activation scales: random inputs at the student's timesteps + 0
                model_s = calibrate(model_q, lambda m, b: m(*b), _calibration_batches(frames[0], calibration_timesteps()))
                if layout != "stacked":
                    model_s = unrolled(model_s, **LAYOUTS[layout])
                graphdef_s, state_s = nnx.split(model_s)
                del model_s
                fwd_s = jax.jit(lambda s, z, t, ctx: nnx.merge(graphdef_s, s)(z, t, ctx))
            if layout != "stacked":
                model_q = unrolled(model_q, **LAYOUTS[layout])
            opts_q = compiler_options(model_q.cfg)
            graphdef_q, state_q = nnx.split(model_q)
            del model_q
            fwd_q = jax.jit(lambda s, z, t, ctx: nnx.merge(graphdef_q, s)(z, t, ctx))
        if layout != "stacked":  # the serving layout: per-layer weights (dit.unrolled)
            graphdef, state = nnx.split(unrolled(nnx.merge(graphdef, state), **LAYOUTS[layout]))

        @jax.jit
        def fwd(state, z, t, ctx):
            return nnx.merge(graphdef, state)(z, t, ctx)

        for f in frames:
            key = jax.random.key(f)
            z = jax.random.normal(key, (1, f, 30, 52, 48), jnp.bfloat16)
            t = jnp.concatenate([jnp.zeros((1, 1)), jnp.full((1, f - 1), 700.0)], axis=1)
            ctx = jax.random.normal(key, (1, 512, 4096), jnp.bfloat16)
            out, times, compile_s, hlo = _compile_and_time(fwd, (state, z, t, ctx), None, timing)
            if hlo_prefix and f == frames[0]:
                _write_hlo(f"{hlo_prefix}.bf16.{variant_tag}.hlo.txt", hlo)
            name = (f"jax ({attention} attn{', unrolled' if cfg.scan_unroll > 1 else ''}"
                    f"{', stacked weights' if cfg.scan_unroll > 1 and layout == 'stacked' else ''}"
                    f"{LAYOUT_NAMES.get(layout, '')}"
                    f"{f', tokens padded to ×{multiple}' if multiple > 1 else ''})")
            if checks is not None:  # same seed, same params: every variant must agree with the first
                checks.finite(f"{name}, {f} frames", out)
                if f in first_out:
                    checks.close(f"{name} vs {first_out[f][0]}, {f} frames", out, first_out[f][1], 2e-2)
                else:
                    first_out[f] = (name, jax.device_get(out))
            rows.append(_row(name, f, times, compile_s))
            rows += _option_rows(option_sets, fwd, (state, z, t, ctx), None, name, out, f, timing, checks)
            if fp8:
                name_q = f"{name[:-1]}, fp8)"
                out_q, times, compile_s, hlo = _compile_and_time(fwd_q, (state_q, z, t, ctx), opts_q, timing)
                if hlo_prefix and f == frames[0]:
                    _write_hlo(f"{hlo_prefix}.fp8.{variant_tag}.hlo.txt", hlo)
                if checks is not None:
                    checks.finite(f"{name_q}, {f} frames", out_q)
                    checks.close(f"{name_q} vs bf16, {f} frames", out_q, out, 1e-1)
                rows.append(_row(name_q, f, times, compile_s, hlo_gemms=_hlo_gemms(hlo)))
                rows += _option_rows(option_sets, fwd_q, (state_q, z, t, ctx), opts_q, name_q, out_q, f, timing,
                                     checks)
            if fp8 and fp8_static:
                name_s = f"{name[:-1]}, fp8 static)"
                out_s, times, compile_s, hlo = _compile_and_time(fwd_s, (state_s, z, t, ctx), opts_q, timing)
                if checks is not None:
                    checks.finite(f"{name_s}, {f} frames", out_s)
                    checks.close(f"{name_s} vs bf16, {f} frames", out_s, out, 1e-1)
                rows.append(_row(name_s, f, times, compile_s, hlo_gemms=_hlo_gemms(hlo)))
        del state
        if fp8:
            del state_q
        if fp8 and fp8_static:
            del state_s
    timing.finish(rows)
    return rows


def _calibration_batches(frames: int, timesteps: tuple[float, ...]) -> list[tuple]:
    """Random 5B-shaped (z, t, ctx) batches, one per timestep (frame 0 clean, as in the timed calls)."""
    import jax
    import jax.numpy as jnp

    out = []
    for i, ts in enumerate(timesteps):
        key_z, key_c = jax.random.split(jax.random.key(100 + i))
        z = jax.random.normal(key_z, (1, frames, 30, 52, 48), jnp.bfloat16)
        t = jnp.concatenate([jnp.zeros((1, 1)), jnp.full((1, frames - 1), ts)], axis=1)
        out.append((z, t, jax.random.normal(key_c, (1, 512, 4096), jnp.bfloat16)))
    return out


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

            times = time_ms(step, 3, iters)
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
    p.add_argument("--fp8", action="store_true",
                   help="also time each JAX configuration with FP8 block linears (fp8.quantize_dit)")
    p.add_argument("--fp8-static", action="store_true",
                   help="with --fp8: also time the FP8 model with calibrated static activation scales "
                        "(fp8.calibrate on random inputs at 5 timesteps; calibration not timed)")
    p.add_argument("--token-multiple", type=int, nargs="+", default=[1],
                   help="WanDiTConfig.token_multiple variants (16: 1170 tokens run as 1184)")
    p.add_argument("--layouts", nargs="+", default=["per_layer"], choices=list(LAYOUTS),
                   help="weights of a fully unrolled model: per-layer arrays with fused self-attention q/k/v "
                        "and all layers' text k/v as one linear (dit.unrolled, serving); the same with the "
                        "text k/v per layer; with neither fused; or the stacked (layers, …) arrays sliced "
                        "statically")
    p.add_argument("--compiler-options", type=json.loads, nargs="*", default=[],
                   help='extra XLA compiler-option sets (JSON dicts, e.g. \'{"xla_gpu_triton_gemm_any": true}\'), '
                        "each timed on the same bf16 program beside the default build")
    p.add_argument("--round-robin", action="store_true",
                   help="time the JAX variants in turn, call by call, after all are compiled (so clock drift "
                        "over the run hits all alike; keeps every variant's weights in memory)")
    p.add_argument("--only-torch", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default="bench/results/dit.json")
    a = p.parse_args()
    if a.fp8_static and not a.fp8:
        p.error("--fp8-static needs --fp8")
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
    checks = Checks()
    rows += bench_jax(a.frames, a.iters, a.layers, a.unroll, a.attention, checks,
                      fp8=a.fp8, hlo_prefix=os.path.splitext(a.out)[0], token_multiples=tuple(a.token_multiple),
                      layouts=tuple(a.layouts), option_sets=tuple(a.compiler_options), fp8_static=a.fp8_static,
                      round_robin=a.round_robin)
    import jax

    for attention in a.attention if jax.default_backend() == "gpu" else ["xla"]:
        check_slice(checks, attention, max(a.unroll))
    print(f"\n{'impl':56s} {'frames':>6s} {'tokens':>6s} {'median ms':>10s} {'min ms':>8s}")
    for r in rows:
        print(f"{r['impl']:56s} {r['frames']:6d} {r['tokens']:6d} {r['median_ms']:10.2f} {r['min_ms']:8.2f}")
    write_json(a.out, dict(rows=rows, checks=checks.rows, argv=sys.argv[1:]))
    checks.exit_if_failed()


if __name__ == "__main__":
    main()
