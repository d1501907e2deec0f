"""The VAE decoder's big causal 3×3×3 convs: XLA (cuDNN, today's `fold2d` path) vs our Hopper
implicit-GEMM kernel (kernels/conv_kernel.py) in bf16 and FP8, side by side in one process.

    python bench/bench_conv.py --out bench/results/conv_kernel_h200.json
    python bench/bench_conv.py --sweep --shapes 240x416x256      # a few tile configurations
    python bench/bench_conv.py --taps-in-kernel                   # horizontal taps read in the kernel
    python bench/bench_conv.py --smoke                            # CPU: a tiny shape, interpret mode

A first GPU run of a new kernel may hang; run it under `timeout`: the JSON is rewritten before
every variant, and each variant prints a line before it compiles.

Shapes are the 480×832 decoder's later-chunk convs (4 frames + 2 cached), which carry ≈ 85% of its
29.4 TFLOP per chunk. Each variant is checked against XLA's float32 conv of the same rounded
operands (bf16, or FP8 with the same scales); the FP8 rows also report the error against the exact
conv. The FP8 activation scale is static (what a calibrated serving layer would use). Times are
medians of wall time per call including each variant's operand preparation (padding, tap stacking,
quantisation); kernel rows also time the kernel alone on operands prepared ahead
(conv_kernel.prepare / kernel_rows), and XLA's GEMM of the same M × K × N is the library reference
for the kernel's rate. Tile tags: m{tile_m}n{tile_n}s{stages}, c2 = 2-CTA clusters sharing weight
tiles, o1 = overlap, fr = frame-major tile order, e32 = epi_n 32, hk = horizontal taps read in the
kernel (conv_kernel.ConvTiles; `--taps-in-kernel` times just those against the serving tiles).
Needs a Hopper GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import Checks, time_ms, write_json  # noqa: E402

SHAPES = {  # name: (frames, H, W, C_in, C_out) — decoder level, later streaming chunk
    "240x416x256": (4, 240, 416, 256, 256),  # 5 of these per chunk + a 512→256 one
    "120x208x512": (4, 120, 208, 512, 512),  # 5 + a 1024→512 one
    "60x104x1024": (2, 60, 104, 1024, 1024),  # 6
    "smoke": (2, 6, 10, 128, 64),  # --smoke only
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES)[:3])
    p.add_argument("--iters", type=int, default=20)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--sweep", action="store_true", help="also time other tile configurations")
    which.add_argument("--taps-in-kernel", action="store_true",
                       help="time the serving tiles with ConvTiles(taps_in_kernel=True) against stacked taps")
    p.add_argument("--smoke", action="store_true",
                   help="the tiny 'smoke' shape in Mosaic GPU interpret mode, to check this script on a CPU")
    p.add_argument("--out", default="bench/results/conv_kernel.json")
    a = p.parse_args()
    if a.smoke:
        a.shapes, a.iters = ["smoke"], 1
    warm = 0 if a.smoke else 3  # untimed calls before the timed ones (interpret mode is slow)

    import jax
    import jax.numpy as jnp
    import numpy as np

    from rynn_jax.kernels import conv_kernel as ck
    from rynn_jax.models import vae as V
    from rynn_jax.models.fp8 import FP8_MAX

    interpret = None
    if a.smoke:
        from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams
        interpret = InterpretGPUParams()
    elif jax.default_backend() != "gpu":
        raise SystemExit("bench_conv needs a Hopper GPU (or --smoke: interpret mode on a CPU)")
    def tag(t: ck.ConvTiles) -> str:  # m64n256s4 (+ c2: 2-CTA clusters, o1: overlap, fr: frame-major order)
        return (f"m{t.tile_m}n{t.tile_n}s{t.stages}" + ("c2" if t.cluster_m else "") + (f"o{t.overlap}" if t.overlap else "")
                + ("fr" if t.order == "frames" else "") + (f"e{t.epi_n}" if t.epi_n != 64 else "")
                + ("hk" if t.taps_in_kernel else ""))
    sets = [ck.ConvTiles(), ck.SERVING_TILES]
    if a.sweep:
        sets += [ck.ConvTiles(cluster_m=True), ck.ConvTiles(order="frames"), ck.ConvTiles(overlap=1),
                 ck.ConvTiles(stages=3), ck.ConvTiles(stages=3, cluster_m=True, order="frames"),
                 ck.ConvTiles(tile_n=128), ck.ConvTiles(tile_n=128, cluster_m=True, order="frames"),
                 ck.ConvTiles(tile_m=128, tile_n=128, stages=3), ck.ConvTiles(tile_m=128, tile_n=128, stages=3, order="frames"),
                 ck.ConvTiles(cluster_m=True, order="frames", taps_in_kernel=True),
                 ck.ConvTiles(stages=3, cluster_m=True, order="frames", taps_in_kernel=True)]
    if a.taps_in_kernel:  # just the serving tiles with and without the horizontal taps read in the kernel
        sets = [dataclasses.replace(ck.SERVING_TILES, taps_in_kernel=False), dataclasses.replace(ck.SERVING_TILES, taps_in_kernel=True),
                ck.ConvTiles(), ck.ConvTiles(taps_in_kernel=True)]
    if a.smoke:  # interpret mode: small tiles, no clusters (the interpreter has none)
        base = ck.ConvTiles(tile_n=64, stages=2, num_sms=2, order="frames")
        sets = [base] + ([dataclasses.replace(base, taps_in_kernel=True)] if a.taps_in_kernel else [])
    tile_sets = {tag(t): t for t in sets}
    checks, rows = Checks(), []

    def save() -> None:
        write_json(a.out, dict(rows=rows, checks=checks.rows, argv=sys.argv[1:], jax=jax.__version__,
                               device=jax.devices()[0].device_kind))
    for name in a.shapes:
        t, h, w, c, n = SHAPES[name]
        k = jax.random.split(jax.random.key(0), 3)
        x = jax.random.normal(k[0], (1, t, h, w, c), jnp.bfloat16)
        past = jax.random.normal(k[1], (1, 2, h, w, c), jnp.bfloat16)
        kern = (jax.random.normal(k[2], (3, 3, 3, c, n), jnp.float32) / np.sqrt(27 * c)).astype(jnp.bfloat16)
        tflop = 2 * t * h * w * 27 * c * n / 1e12
        sx = float(jnp.max(jnp.abs(jnp.concatenate([past, x], 1).astype(jnp.float32)))) / FP8_MAX
        exact = jax.jit(ck.causal_conv_reference)(x, kern, past)

        # today's serving conv itself (vae._conv, conv_impl="fold2d"), bias zero
        serving = V.WanVAEConfig.wan22(dtype="bfloat16", param_dtype="bfloat16", conv_impl="fold2d")
        fold2d = jax.jit(lambda x, p, w: V._conv(x, w, jnp.zeros((w.shape[-1],), w.dtype), serving,
                                                 pad_hw=((1, 1), (1, 1)), past=p))
        variants = {"xla fold2d bf16": (fold2d, jnp.bfloat16, None, None)}
        for name_t, tiles in tile_sets.items():
            variants[f"kernel bf16 {name_t}"] = (jax.jit(lambda x, p, w, tiles=tiles: ck.causal_conv(
                x, w, p, dtype=jnp.bfloat16, tiles=tiles, interpret=interpret)), jnp.bfloat16, None, tiles)
            variants[f"kernel fp8 {name_t}"] = (jax.jit(lambda x, p, w, tiles=tiles: ck.causal_conv(
                x, w, p, dtype=jnp.float8_e4m3fn, x_scale=sx, tiles=tiles, interpret=interpret)),
                jnp.float8_e4m3fn, sx, tiles)
        base = None
        for label, (fn, dtype, scale, tiles) in variants.items():
            save()  # after every variant: a hang (run under `timeout`) keeps what came before
            print(f"{name} {label}: compiling", flush=True)
            try:
                y = fn(x, past, kern)
                jax.block_until_ready(y)
            except Exception as e:  # noqa: BLE001 — a tile set may not fit shared memory: report, go on
                print(f"{name} {label}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                rows.append(dict(shape=name, variant=label, error=f"{type(e).__name__}: {str(e)[:300]}"))
                continue
            if label.startswith("kernel"):
                rounded = jax.jit(lambda x, p, w, d=dtype, s=scale: ck.causal_conv_reference(
                    x, w, p, dtype=d, x_scale=s))(x, past, kern)
                checks.finite(f"{name} {label}", y)
                # bf16: output rounding only. FP8: also the Hopper FP8 MMA's accumulator, which keeps
                # fewer mantissa bits than f32 (measured 4.9e-3 at K = 27,648); a wrong kernel is O(1) off.
                checks.close(f"{name} {label} vs XLA f32 of the same operands", y, rounded,
                             1e-2 if scale is not None else 5e-3)
                oracle_gap = float(jnp.linalg.norm(rounded - exact) / jnp.linalg.norm(exact))
                print(f"  (that oracle is {oracle_gap:.2e} off the exact conv: the operand rounding)", flush=True)
            ms = statistics.median(time_ms(lambda: jax.block_until_ready(fn(x, past, kern)), warm, a.iters))
            err = float(jnp.linalg.norm(y.astype(jnp.float32) - exact) / jnp.linalg.norm(exact))
            base = ms if base is None else base
            row = dict(shape=name, variant=label, median_ms=ms, tflops=tflop / ms * 1e3, vs_xla=ms / base,
                       rel_err_vs_exact=err)
            if tiles is not None:  # the kernel alone, on operands prepared (padded, stacked, quantized) ahead
                x_rows, wk, plan, _ = ck.prepare(x, kern, past, dtype=dtype, x_scale=scale, tiles=tiles,
                                                 interpret=interpret)
                alone = jax.jit(lambda r, w, plan=plan, tiles=tiles: ck.kernel_rows(r, w, plan, tiles, interpret))
                row["kernel_ms"] = statistics.median(time_ms(lambda: jax.block_until_ready(alone(x_rows, wk)), warm, a.iters))
                row["kernel_tflops"] = tflop / row["kernel_ms"] * 1e3
            rows.append(row)
            print(f"{name:12s} {label:26s} {ms:8.3f} ms {tflop / ms * 1e3:7.0f} TFLOP/s "
                  f"{ms / base:5.2f}x  err {err:.2e}"
                  + (f"  kernel alone {row['kernel_ms']:.3f} ms" if "kernel_ms" in row else ""), flush=True)
        if not a.smoke:  # XLA's (cuBLAS) GEMM of the same M × K × N, M the kernel's pixels incl. pad columns
            m, kk = t * (h + 2) * (-(-(w + 2) // 8) * 8), 27 * c
            lhs = jax.random.normal(k[0], (m, kk), jnp.bfloat16)
            rhs = (jax.random.normal(k[1], (kk, n), jnp.float32) / np.sqrt(kk)).astype(jnp.bfloat16)
            for label, dt in (("xla gemm bf16, same MxKxN", jnp.bfloat16), ("xla gemm fp8, same MxKxN", jnp.float8_e4m3fn)):
                gemm = jax.jit(lambda p, q: jnp.dot(p, q, preferred_element_type=jnp.float32).astype(jnp.bfloat16))
                p8, q8 = lhs.astype(dt), rhs.astype(dt)
                ms = statistics.median(time_ms(lambda: jax.block_until_ready(gemm(p8, q8)), warm, a.iters))
                rows.append(dict(shape=name, variant=label, median_ms=ms, tflops=2 * m * kk * n / ms / 1e9,
                                 vs_xla=ms / base))
                print(f"{name:12s} {label:26s} {ms:8.3f} ms {2 * m * kk * n / ms / 1e9:7.0f} TFLOP/s", flush=True)
    save()

    print(f"\n{'shape':12s} {'variant':28s} {'median ms':>10s} {'TFLOP/s':>8s} {'vs XLA':>7s} {'err vs exact':>13s}"
          f" {'kernel alone ms':>16s} {'TFLOP/s':>8s}")
    for r in rows:
        if "error" in r:
            print(f"{r['shape']:12s} {r['variant']:28s} {'failed':>10s}")
        else:
            err = f"{r['rel_err_vs_exact']:13.2e}" if "rel_err_vs_exact" in r else f"{'':13s}"
            alone = f" {r['kernel_ms']:16.3f} {r['kernel_tflops']:8.0f}" if "kernel_ms" in r else ""
            print(f"{r['shape']:12s} {r['variant']:28s} {r['median_ms']:10.3f} {r['tflops']:8.0f} "
                  f"{r['vs_xla']:7.2f} {err}{alone}")
    checks.exit_if_failed()


if __name__ == "__main__":
    main()
