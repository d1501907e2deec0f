"""Where the GPU time goes: per-kernel breakdowns of the serving hot paths, plus conv-layout variants.

    python bench/profile_ops.py --targets conv dit vae_decode vae_encode --out bench/results/profile_h200.json
    python bench/profile_ops.py --targets conv dit --tiny --out /tmp/p.json          # CPU smoke check

For each target the jitted call is run under `jax.profiler.trace`; the device plane's kernel events
are summed per call and grouped into categories (matmul, conv, attention, copy, elementwise fusion,
other). `busy_ms` is the summed kernel time per call, `wall_ms` the host-timed median: their gap is
launch / synchronisation overhead. `conv` times one causal 3×3×3 VAE conv at the decoder's real
shapes in three formulations (3D conv; time folded into input channels then a 2D conv; a sum of three
2D convs) — the winner is what `WanVAEConfig.conv_impl` should default to on GPU. `stream` profiles
one served streaming chunk (5B bf16 DiT + tiny autoencoder), per block:

    python bench/profile_ops.py --targets stream --clean-pass merged sequential --out bench/results/profile_stream_h200.json

`policy` profiles the policy's control step at SPEC size (random weights; bench_policy's rows), per
backbone layout (`--policy-layouts unrolled scan`) and FP8 variant (`--policy-fp8`):

    python bench/profile_ops.py --targets policy --policy-fp8 static+attention --policy-layouts unrolled scan \
        --out bench/results/profile_policy_h100.json
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import time_ms, write_json  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from rynn_jax.kernels.conv_kernel import PROLOGUE_PRESETS, TILE_PRESETS  # noqa: E402

_CATEGORIES = (  # first match wins, on the lower-cased kernel name
    ("attention", r"flash|fmha|_attn|attention|sdpa"),
    ("conv", r"conv(?!ert)|fprop|dgrad|wgrad|implicit_gemm|cudnn"),
    ("matmul", r"gemm|cublas|cutlass|nvjet|xmma|matmul|dot"),
    ("copy", r"copy|memcpy|memset|dynamic.?slice|dynamic.?update|transpose|concatenate"),
    ("fusion", r"fusion|loop_|input_|reduce|wrapped"),
)


def _category(name: str) -> str:
    low = name.lower()
    for cat, pattern in _CATEGORIES:
        if re.search(pattern, low):
            return cat
    return "other"


def kernel_breakdown(fn, iters: int = 5, top: int = 25) -> dict:
    """Profile `fn()` (already compiled) `iters` times; kernel time per call by category and op."""
    wall = time_ms(lambda: jax.block_until_ready(fn()), 2, max(iters, 5))

    def run():
        for _ in range(iters):
            jax.block_until_ready(fn())

    return dict(wall_ms=statistics.median(wall), **traced_breakdown(run, iters, top))


def gpu_idle(spans: list[tuple[float, float, str]], calls: int) -> tuple[float, dict[str, float]]:
    """GPU time of `calls` back-to-back calls from their kernels' (start_ns, end_ns, op) spans: the
    calls' summed span (first kernel start to last kernel end of each, ns) and the idle inside them
    charged to the kernel that ends each gap (ms per call: launch latency, or waiting on the host).
    The calls − 1 longest gaps are taken to be the host between calls. wall − span / calls is host
    time the GPU never overlaps: dispatch before the first kernel, sync after the last."""
    if not spans:
        return 0.0, {}
    spans = sorted(spans)
    gaps, end = [], spans[0][1]
    for start, stop, op in spans[1:]:
        if start > end:
            gaps.append((start - end, op))
        end = max(end, stop)
    gaps.sort(reverse=True)
    idle: dict[str, float] = collections.Counter()
    for g, op in gaps[calls - 1:]:
        idle[op] += g / 1e6 / calls
    return end - spans[0][0] - sum(g for g, _ in gaps[:calls - 1]), dict(idle)


def host_reads(op_counts: dict[str, int], calls: int) -> float:
    """Device-to-host copies per call, from profiled op names → event counts. Each one (e.g. a
    lax.cond's predicate, which XLA's GPU runtime reads back to pick the branch) makes the host wait
    for the GPU before it can queue the work after it."""
    return sum(n for op, n in op_counts.items() if "MemcpyD2H" in op) / calls


def traced_breakdown(run, calls: int, top: int = 25) -> dict:
    """Run `run()` under the profiler; kernel time per call (of `calls`) by category and op."""
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            run()
        (path,) = glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)
        data = jax.profiler.ProfileData.from_file(path)
        by_cat: dict[str, float] = collections.Counter()
        by_op: dict[str, float] = collections.Counter()
        count: dict[str, int] = collections.Counter()
        gap_by_op: dict[str, float] = collections.Counter()
        span_ns = 0.0
        device_planes = [p for p in data.planes if p.name.startswith("/device:")]
        for plane in device_planes:
            spans = []
            for line in plane.lines:
                if "stream" not in line.name.lower():
                    continue  # GPU planes also carry summary lines ("XLA Ops", "Launch stats")
                for ev in line.events:
                    stats = dict(ev.stats)
                    hlo = str(stats.get("hlo_op", ""))
                    # Inside command buffers hlo_op names the buffer: the kernel name says more.
                    op = ev.name if not hlo or hlo.startswith("command_buffer") else f"{hlo} [{ev.name}]"
                    ms = ev.duration_ns / 1e6 / calls
                    by_cat[_category(ev.name)] += ms
                    by_op[f"{_category(ev.name)}:{op}"] += ms
                    count[f"{_category(ev.name)}:{op}"] += 1
                    spans.append((ev.start_ns, ev.start_ns + ev.duration_ns, f"{_category(ev.name)}:{op}"))
            span, idle = gpu_idle(spans, calls)
            span_ns += span
            gap_by_op.update(idle)
        if not device_planes:  # CPU: thunk events on the host plane
            for plane in data.planes:
                for line in plane.lines:
                    for ev in line.events:
                        stats = dict(ev.stats)
                        if "hlo_op" in stats:
                            op = str(stats["hlo_op"])
                            ms = ev.duration_ns / 1e6 / calls
                            by_cat[_category(op)] += ms
                            by_op[f"{_category(op)}:{op}"] += ms
                            count[f"{_category(op)}:{op}"] += 1
    return dict(busy_ms=sum(by_cat.values()), kernels_per_call=sum(count.values()) / calls,
                host_reads_per_call=host_reads(count, calls),
                gpu_span_ms=round(span_ns / 1e6 / calls, 3), idle_ms=round(sum(gap_by_op.values()), 3),
                idle_before=[dict(op=k, ms=round(v, 3)) for k, v in gap_by_op.most_common(12)],
                by_category={k: round(v, 3) for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1])},
                top_ops=[dict(op=k, ms=round(v, 3), calls=count[k] // calls)
                         for k, v in by_op.most_common(top)])


def _print(name: str, res: dict) -> None:
    print(f"\n== {name}: wall {res['wall_ms']:.2f} ms"
          + (f" (queued back to back: {res['pipelined_ms']:.2f} ms per call)" if "pipelined_ms" in res else "")
          + f", kernels {res['busy_ms']:.2f} ms "
          f"({res['kernels_per_call']:.0f} launches/call, {res['host_reads_per_call']:g} device-to-host copies/call)")
    print("   by category: " + ", ".join(f"{k} {v:.2f}" for k, v in res["by_category"].items()))
    if res.get("idle_before"):
        print(f"   GPU span {res['gpu_span_ms']:.2f} ms (first kernel start to last end), idle inside it "
              f"{res['idle_ms']:.2f} ms; most before: "
              + ", ".join(f"{r['op'][:60]} {r['ms']:.2f}" for r in res["idle_before"][:6]))
    for row in res["top_ops"]:
        print(f"   {row['ms']:8.3f} ms  x{row['calls']:<4d} {row['op'][:110]}")


# --------------------------------------------------------------------------------------------------
# Targets
# --------------------------------------------------------------------------------------------------


def _fp8_conv_rows(x: jax.Array, k: jax.Array, bias: jax.Array, flops: float, iters: int) -> list[dict]:
    """The same causal conv with e4m3 operands and per-tensor scalar scales, in the HLO form XLA's
    cuDNN rewriter turns into an FP8 graph conv on Hopper (`conv(convert(x8)·sx, convert(w8)·sw)`).
    "prequant": operands already FP8 (the conv alone); "quant": the bf16 activation's amax and
    convert timed in too (what a VAE layer would pay). fold2d folds the time taps in FP8."""
    from rynn_jax.models import fp8 as fp8_lib

    wide = jnp.bfloat16
    shape = [x.shape[0], x.shape[1] - 2, *x.shape[2:]]  # output frames, as the bf16 rows

    def quant(a):  # per-tensor: one scalar scale, the only form the cuDNN FP8 conv takes
        s = fp8_lib.amax_scale(jnp.max(jnp.abs(a.astype(jnp.float32))))
        return fp8_lib.to_fp8(a, s), s

    def conv(x8, sx, k8, sk, bias, impl):
        kt, kh, kw, ci, co = k8.shape
        if impl == "fold2d":
            t = x8.shape[1] - kt + 1
            x8 = jnp.concatenate([x8[:, i:i + t] for i in range(kt)], axis=-1)
            x8 = x8.reshape(-1, *x8.shape[2:])
            k8 = k8.transpose(1, 2, 0, 3, 4).reshape(kh, kw, kt * ci, co)
            dims = ("NHWC", "HWIO", "NHWC")
        else:
            dims = ("NTHWC", "THWIO", "NTHWC")
        xw = x8.astype(wide) * sx.astype(wide)
        kw_ = k8.astype(wide) * sk.astype(wide)
        y = jax.lax.conv_general_dilated(xw, kw_, (1,) * (xw.ndim - 2),
                                         ((0, 0), (1, 1), (1, 1)) if impl == "3d" else ((1, 1), (1, 1)),
                                         dimension_numbers=dims)
        return y + bias.astype(wide)

    y_ref = jax.jit(lambda x, k: jax.lax.conv_general_dilated(
        x.astype(jnp.float32), k.astype(jnp.float32), (1, 1, 1), ((0, 0), (1, 1), (1, 1)),
        dimension_numbers=("NTHWC", "THWIO", "NTHWC")))(x, k) + bias.astype(jnp.float32)
    k8, sk = jax.jit(quant)(k)
    x8, sx = jax.jit(quant)(x)
    rows = []
    for impl in ("3d", "fold2d"):
        for mode in ("prequant", "quant"):
            if mode == "prequant":
                f = jax.jit(lambda x8, sx, k8, sk, b, impl=impl: conv(x8, sx, k8, sk, b, impl))
                args = (x8, sx, k8, sk, bias)
            else:
                f = jax.jit(lambda x, k8, sk, b, impl=impl: conv(*quant(x), k8, sk, b, impl))
                args = (x, k8, sk, bias)
            name = f"{impl}_fp8_{mode}"
            try:
                hlo = f.lower(*args).compile().as_text()
            except Exception as exc:  # noqa: BLE001 — e.g. cuDNN has no FP8 engine for this conv
                print(f"conv {shape} {name:20s} failed to compile: {str(exc).splitlines()[0][:160]}")
                rows.append(dict(shape=shape, impl=name, error=str(exc)[:400]))
                continue
            y = f(*args)
            ms = statistics.median(time_ms(lambda: jax.block_until_ready(f(*args)), 3, iters))
            err = float(jnp.linalg.norm(y.reshape(y_ref.shape).astype(jnp.float32) - y_ref)
                        / jnp.linalg.norm(y_ref))
            row = dict(shape=shape, impl=name,
                       ms=ms, tflops=flops / ms / 1e9, rel_l2_vs_f32=err,
                       cudnn_fp8_graph="convForwardGraph" in hlo)
            rows.append(row)
            print(f"conv {row['shape']} {row['impl']:20s} {ms:8.3f} ms  {row['tflops']:7.1f} TFLOP/s"
                  f"  rel-L2 vs f32 {err:.2e}  cuDNN FP8 graph: {row['cudnn_fp8_graph']}", flush=True)
    return rows


def target_conv(tiny: bool, iters: int, fp8: bool = False) -> list[dict]:
    from rynn_jax.kernels import vae_conv
    from rynn_jax.models import vae as V

    shapes = ([(1, 4, 16, 24, 16)] if tiny else
              [(1, 4, 240, 416, 256), (1, 4, 120, 208, 512), (1, 2, 60, 104, 1024), (1, 4, 240, 416, 160)])
    rows = []
    for b, t, h, w, c in shapes:
        key = jax.random.key(0)
        x = jax.random.normal(key, (b, t + 2, h, w, c), jnp.bfloat16)
        k = (jax.random.normal(key, (3, 3, 3, c, c), jnp.float32) * 0.02).astype(jnp.bfloat16)
        bias = jnp.zeros((c,), jnp.bfloat16)
        flops = 2 * 27 * c * c * b * t * h * w
        for impl in vae_conv.conv_impls_for(jax.default_backend()):
            cfg = vae_conv.configure(V.WanVAEConfig.wan22(dtype="bfloat16", param_dtype="bfloat16"), impl)
            f = jax.jit(lambda x, k, bias, cfg=cfg: vae_conv.bare_conv(cfg, x, k, bias))
            f(x, k, bias).block_until_ready()
            ms = statistics.median(time_ms(lambda: jax.block_until_ready(f(x, k, bias)), 3, iters))
            rows.append(dict(shape=[b, t, h, w, c], impl=impl, ms=ms, tflops=flops / ms / 1e9))
            print(f"conv {rows[-1]['shape']} {impl:10s} {ms:8.3f} ms  {rows[-1]['tflops']:7.1f} TFLOP/s", flush=True)
        if fp8:
            rows += _fp8_conv_rows(x, k, bias, flops, iters)
        ref = jax.jit(lambda x, k, bias: vae_conv.bare_conv(V.WanVAEConfig.wan22(dtype="float32", conv_impl="3d"),
                                                            x, k, bias))
        y_ref = ref(x.astype(jnp.float32), k.astype(jnp.float32), bias.astype(jnp.float32))
        for impl in vae_conv.conv_impls_for(jax.default_backend()):
            cfg = vae_conv.configure(V.WanVAEConfig.wan22(dtype="float32"), impl)
            y = jax.jit(lambda x, k, bias, cfg=cfg: vae_conv.bare_conv(cfg, x, k, bias))(
                x.astype(jnp.float32), k.astype(jnp.float32), bias.astype(jnp.float32))
            err = float(jnp.linalg.norm(y - y_ref) / jnp.linalg.norm(y_ref))
            print(f"     {impl:10s} fp32 rel-L2 vs 3d: {err:.2e}")
            next(r for r in rows if r["impl"] == impl and r["shape"] == [b, t, h, w, c])["rel_l2_vs_3d"] = err
    return rows


def target_dit(tiny: bool, iters: int, frames: int, unrolls: list[int], fp8: bool = False) -> dict:
    """Per-kernel breakdown of the DiT forward per scan_unroll; `fp8`: each variant also quantized
    (fp8.quantize_dit, compiled with its XLA options) to split GEMM from quantization time."""
    from flax import nnx

    from rynn_jax.models import fp8 as fp8_lib
    from rynn_jax.models.dit import WanDiT, WanDiTConfig, unrolled

    out = {}
    for unroll in unrolls:
        if tiny:
            cfg = WanDiTConfig.tiny(scan_unroll=unroll)
            h, w = 4, 6
        else:
            cfg = WanDiTConfig.ti2v_5b(dtype="bfloat16", param_dtype="bfloat16", scan_unroll=unroll)
            h, w = 30, 52
        with nnx.use_eager_sharding(False):
            graphdef, _ = nnx.split(nnx.eval_shape(lambda: WanDiT(cfg, rngs=nnx.Rngs(0))))
            state = jax.jit(lambda: nnx.state(WanDiT(cfg, rngs=nnx.Rngs(0))))()
        stacked = graphdef, state
        if cfg.scan_unroll == cfg.num_layers:  # the serving layout: per-layer weights (dit.unrolled)
            graphdef, state = nnx.split(unrolled(nnx.merge(graphdef, state)))
        fwd = jax.jit(lambda s, z, t, ctx: nnx.merge(graphdef, s)(z, t, ctx))
        key = jax.random.key(0)
        z = jax.random.normal(key, (1, frames, h, w, cfg.in_channels), jnp.bfloat16)
        t = jnp.full((1, frames), 700.0)
        ctx = jax.random.normal(key, (1, cfg.text_len, cfg.text_dim), jnp.bfloat16)
        t0 = time.perf_counter()
        ref = fwd(state, z, t, ctx)
        ref.block_until_ready()
        compile_s = time.perf_counter() - t0
        res = kernel_breakdown(lambda: fwd(state, z, t, ctx), iters)
        res["compile_s"] = compile_s
        if "outputs" in out:  # every variant computes the same function
            res["max_abs_diff_vs_first"] = float(jnp.max(jnp.abs(ref - out["outputs"])))
        else:
            out["outputs"] = ref
        name = f"dit {frames * h * w // 4} tokens, scan_unroll={unroll}"
        _print(name, res)
        out[name] = res
        if fp8:
            model_q = fp8_lib.quantize_dit(nnx.merge(*stacked))
            if cfg.scan_unroll == cfg.num_layers:
                model_q = unrolled(model_q)
            opts_q = fp8_lib.compiler_options(model_q.cfg)
            graphdef_q, state_q = nnx.split(model_q)
            del model_q
            t0 = time.perf_counter()
            fwd_q = jax.jit(lambda s, z, t, ctx: nnx.merge(graphdef_q, s)(z, t, ctx)).lower(
                state_q, z, t, ctx).compile(opts_q)
            out_q = fwd_q(state_q, z, t, ctx).block_until_ready()
            compile_q_s = time.perf_counter() - t0
            res_q = kernel_breakdown(lambda: fwd_q(state_q, z, t, ctx), iters)
            res_q["compile_s"] = compile_q_s
            res_q["rel_l2_vs_float"] = float(jnp.linalg.norm((out_q - ref).astype(jnp.float32))
                                            / jnp.linalg.norm(ref.astype(jnp.float32)))
            _print(name + ", fp8", res_q)
            out[name + ", fp8"] = res_q
            del state_q
        state = stacked = None  # free the weights before the next variant (a `del` would upset the lambda above)
    out.pop("outputs")
    return out


def target_vae(tiny: bool, iters: int, which: str, impls: list[str], branches: tuple[bool, ...] = (False,),
               fp8_static: bool = False, prologues: tuple[str | None, ...] = (None,),
               tile_sets: tuple[str | None, ...] = (None,)) -> dict:
    """`fp8_static`: conv_impl kernel_fp8 with calibrated activation scales (kernels/vae_fp8.py,
    calibrated on one random clip through the per-call model) instead of per-call max|x|.
    `prologues`: kernel_fp8 variants of how conv inputs are quantized and laid out
    (conv_kernel.PROLOGUE_PRESETS names; None: KernelConv's default); `tile_sets`: kernel impls'
    tiles (conv_kernel.TILE_PRESETS names; None: SERVING_TILES);
    `branches`: static_branch values per variant (True: the later-chunk program alone, first=False,
    instead of the lax.cond), sharing each variant's model and calibration."""
    import functools

    from flax import nnx

    from rynn_jax.kernels import conv_kernel as ck
    from rynn_jax.kernels import vae_conv, vae_fp8
    from rynn_jax.models import vae as V

    out = {}
    h, w = (64, 96) if tiny else (480, 832)
    runs = [(impl, pro, tiles_name) for impl in impls for pro in (prologues if impl == "kernel_fp8" else (None,))
            for tiles_name in (tile_sets if impl.startswith("kernel") else (None,))]
    scales = {}  # static FP8 scales per impl: the knobs below change no value
    for impl, prologue, tiles_name in runs:
        knobs = {**({"prologue": ck.PROLOGUE_PRESETS[prologue]} if prologue else {}),
                 **({"tiles": ck.TILE_PRESETS[tiles_name]} if tiles_name else {})}  # none: KernelConv's defaults
        cfg = vae_conv.configure((V.WanVAEConfig.tiny if tiny else V.WanVAEConfig.wan22)(
            dtype="bfloat16", param_dtype="bfloat16"), impl, **knobs)
        model = V.init_vae(cfg, 0)
        key = jax.random.key(0)
        static = fp8_static and impl == "kernel_fp8"
        if static:
            z = jax.random.normal(key, (1, 2, h // 16, w // 16, cfg.z_dim), jnp.float32)
            if impl not in scales:
                scales[impl] = vae_fp8.calibrate(model, vae_fp8.decode_clip, [z], progress=False)
            model = vae_fp8.with_static_scales(model, scales[impl])
        graphdef, params = nnx.split(model)
        if which == "decode":
            chunk, init_cache = V.decode_chunk, V.init_decode_cache
            x = jax.random.normal(key, (1, 1, h // 16, w // 16, cfg.z_dim), jnp.float32)
        else:
            chunk, init_cache = V.encode_chunk, V.init_encode_cache
            x = jnp.clip(jax.random.normal(key, (1, 4, h, w, 3), jnp.float32), -1, 1)
        for static_branch in branches:  # False: lax.cond on the step counter; True: the later-chunk program alone
            step = jax.jit(functools.partial(chunk, graphdef, **({"first": False} if static_branch else {})))
            cache = init_cache(cfg, 1, h, w)
            # past the first chunk (the later-chunk program cannot run it: the first-chunk one does)
            warm = step if not static_branch else jax.jit(functools.partial(chunk, graphdef, first=True))
            _, cache = warm(params, cache, x)
            t0 = time.perf_counter()
            jax.block_until_ready(step(params, cache, x))
            res = kernel_breakdown(lambda: step(params, cache, x), iters, top=60)
            res["first_call_s"] = time.perf_counter() - t0

            def chained(n: int = 8):  # the stream's own dependency: each call takes the last one's cache
                c = cache
                for _ in range(n):
                    y, c = step(params, c, x)
                jax.block_until_ready(y)
            # throughput when the host queues calls ahead (as a streaming server does), per call
            res["pipelined_ms"] = statistics.median(time_ms(chained, 1, 3)) / 8
            name = (f"vae {which} chunk {h}x{w}, conv_impl={impl}" + (", static FP8 scales" if static else "")
                    + (f", FP8 prologue {prologue}" if prologue is not None and len(prologues) > 1 else "")
                    + (f", tiles {tiles_name}" if tiles_name is not None and len(tile_sets) > 1 else "")
                    + (", static branch" if static_branch else ""))
            _print(name, res)
            out[name] = res
    return out


def target_stream(tiny: bool, clean_pass: str) -> dict:
    """One streaming chunk as served (bf16, tiny autoencoder on both sides, `StreamingSession`'s
    default steps; 7 blocks of render → encode → causal DiT step → decode, re-anchoring at its
    start) after two warm-up chunks. Host-timed ms per block next to kernel ms per block: the gap is
    launch, host work and synchronisation."""
    import dataclasses

    import numpy as np

    from rynn_jax.models.causal import CausalConfig
    from rynn_jax.models.dit import WanDiTConfig, init_dit
    from rynn_jax.models.tae import TAEConfig, init_tae
    from rynn_jax.render import RenderConfig, default_intrinsics, render_video_unchecked, synthetic_hand_motion
    from rynn_jax.serving.block_step import SERVING_STEPS
    from rynn_jax.serving.session import StreamingSession

    if tiny:
        dit_cfg, tae_cfg, (h, w) = WanDiTConfig.tiny(control="add-plus", in_channels=4, out_channels=4,
                                                     control_channels=4), TAEConfig.tiny(), (64, 64)
    else:
        dit_cfg = WanDiTConfig.ti2v_5b(control="add-plus", dtype="bfloat16", param_dtype="bfloat16")
        tae_cfg, (h, w) = TAEConfig.wan22(dtype="bfloat16"), (480, 832)
    tae = init_tae(tae_cfg, 0)
    ccfg = CausalConfig()
    scfg = dataclasses.replace(SERVING_STEPS, merge_clean_pass=clean_pass == "merged")
    session = StreamingSession(init_dit(dit_cfg, 0), tae, ccfg, scfg)  # the tiny autoencoder both ways
    rcfg = RenderConfig(width=w, height=h)
    k = default_intrinsics(rcfg)
    joints, elbows = (jnp.asarray(a) for a in synthetic_hand_motion(4 * ccfg.frames_per_block, seed=0))
    render = jax.jit(lambda j, e: render_video_unchecked(rcfg, j, e, k, jnp.ones(j.shape[:1] + (2, 22), bool)) * 2 - 1)
    image = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (1, h, w, 3)), jnp.float32)
    session.start(image, jnp.zeros((1, dit_cfg.text_len, dit_cfg.text_dim), jnp.float32), jax.random.key(0))

    def block():  # the same poses every block: the cost does not depend on them
        n = session.frames_needed
        return session.step(render(joints[:n], elbows[:n])[None]).block_until_ready()

    blocks = 21 // ccfg.frames_per_block  # one chunk
    t0 = time.perf_counter()
    for _ in range(2 * blocks):  # chunks 0 and 1 compile every program (step, re-anchor, both render lengths)
        block()
    warm_s = time.perf_counter() - t0
    wall = time_ms(block, 0, blocks)
    res = traced_breakdown(lambda: [block() for _ in range(blocks)], blocks)
    res.update(wall_ms=statistics.mean(wall), wall_ms_per_block=[round(x, 3) for x in wall], warmup_s=warm_s,
               blocks=blocks, clean_pass=clean_pass)
    name = f"stream chunk {h}x{w}, clean pass {clean_pass} (per block)"
    _print(name, res)
    return {name: res}


def target_policy(tiny: bool, iters: int, fp8: str, layouts: list[str]) -> dict:
    """The policy's control step (`LoadedPolicy.predict`: VAE encode, 4D feature pass, head) at SPEC
    size with random weights (tiny: the toy 4D policy), per backbone layout; `fp8`: "none", "static"
    (static activation scales calibrated as bench_policy does) or "static+attention"."""
    import dataclasses

    import numpy as np
    from bench_policy import observation, policy_config, with_calibrated_scales

    from rynn_jax.policy import inference
    from rynn_jax.policy.normalize import ActionNormalizer

    out = {}
    for layout in layouts:
        cfg = policy_config("tiny" if tiny else "full", fp8 != "none", fp8_attention=fp8 == "static+attention")
        cfg = dataclasses.replace(cfg, backbone=dataclasses.replace(cfg.backbone, unrolled=layout == "unrolled"))
        pol = inference.from_params(cfg, None, ActionNormalizer(np.zeros(54, np.float32), np.ones(54, np.float32)))
        if fp8 != "none":
            pol = with_calibrated_scales(pol, cfg)
        rgb, depth, state, goal = observation(cfg, 0)
        key = jax.random.key(0)
        t0 = time.perf_counter()
        chunk = pol.predict(rgb, depth, state, goal, key)
        compile_s = time.perf_counter() - t0
        if not np.isfinite(chunk).all():
            raise SystemExit(f"policy {layout}: non-finite chunk")
        res = kernel_breakdown(lambda: pol.predict(rgb, depth, state, goal, key), iters)
        res["compile_s"] = compile_s
        name = f"policy step {cfg.image_size[0]}x{cfg.image_size[1]}, fp8 {fp8}, backbone {layout}"
        _print(name, res)
        out[name] = res
        pol = None  # free the backbone before the next layout
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--targets", nargs="+", default=["conv", "dit", "vae_decode", "vae_encode"],
                   choices=["conv", "dit", "vae_decode", "vae_encode", "stream", "policy"])
    p.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke check)")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--frames", type=int, default=3, help="DiT latent frames (3 → 1170 tokens)")
    p.add_argument("--unroll", type=int, nargs="+", default=[1, 30], help="DiT scan_unroll variants")
    p.add_argument("--conv-impls", nargs="+", default=None, help="VAE conv_impl variants (default: all)")
    p.add_argument("--static-branch", nargs="?", const="both", choices=["both", "only"], default=None,
                   help="VAE: also time the later-chunk program alone (first=False), next to the lax.cond; "
                        "'only': that program alone")
    p.add_argument("--fp8", action="store_true", help="dit: also profile the FP8 model (fp8.quantize_dit)")
    p.add_argument("--vae-fp8-static", action="store_true",
                   help="vae_*: kernel_fp8 with calibrated static activation scales (kernels/vae_fp8.py)")
    p.add_argument("--fp8-prologue", nargs="+", choices=sorted(PROLOGUE_PRESETS), default=None,
                   help="vae_*: kernel_fp8 variants of conv_kernel.Fp8Prologue (order, packed, barrier)")
    p.add_argument("--conv-tiles", nargs="+", choices=sorted(TILE_PRESETS), default=None,
                   help="vae_*: kernel impls' tile variants (conv_kernel.SERVING_TILES: order, 2-CTA clusters, "
                        "stages, hk = horizontal taps read in the kernel)")
    p.add_argument("--fp8-conv", action="store_true",
                   help="conv: also time FP8 (e4m3, per-tensor scales) 3d/fold2d convs (cuDNN graph conv)")
    p.add_argument("--clean-pass", nargs="+", choices=["merged", "sequential"], default=["merged"],
                   help="stream: profile these clean-pass variants")
    p.add_argument("--policy-fp8", choices=["none", "static", "static+attention"], default="none",
                   help="policy: the backbone's FP8 variant (as bench_policy's rows)")
    p.add_argument("--policy-layouts", nargs="+", choices=["unrolled", "scan"], default=["unrolled"],
                   help="policy: the 4D backbone's layouts to profile (serving layout, stacked layer scan)")
    p.add_argument("--out", default="bench/results/profile.json")
    a = p.parse_args()
    if "policy" in a.targets and a.policy_fp8 != "none":  # cuBLASLt FP8 GEMMs, as bench_policy compiles them
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_triton_gemm=false").strip()

    from rynn_jax.kernels import vae_conv

    impls = a.conv_impls or list(vae_conv.conv_impls_for(jax.default_backend()))
    result: dict = dict(backend=jax.default_backend(), jax=jax.__version__,
                        device=str(jax.devices()[0].device_kind), argv=sys.argv[1:])
    if "conv" in a.targets:
        result["conv"] = target_conv(a.tiny, a.iters, a.fp8_conv)
    if "dit" in a.targets:
        result["dit"] = target_dit(a.tiny, a.iters, a.frames, a.unroll, a.fp8)
    for which in ("decode", "encode"):
        if f"vae_{which}" in a.targets:
            result[f"vae_{which}"] = target_vae(a.tiny, a.iters, which, impls,
                                                branches={None: (False,), "both": (False, True), "only": (True,)}[a.static_branch],
                                                fp8_static=a.vae_fp8_static, prologues=tuple(a.fp8_prologue or (None,)),
                                                tile_sets=tuple(a.conv_tiles or (None,)))
    if "policy" in a.targets:
        result["policy"] = target_policy(a.tiny, a.iters, a.policy_fp8, a.policy_layouts)
    if "stream" in a.targets:
        result["stream"] = {}
        for variant in a.clean_pass:
            result["stream"].update(target_stream(a.tiny, variant))
    write_json(a.out, result)
    print(f"\nwrote {a.out}")


if __name__ == "__main__":
    main()
