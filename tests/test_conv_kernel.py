"""The Hopper implicit-GEMM causal conv (kernels/conv_kernel.py) and its place in the VAE (kernels/vae_conv.py).

On the CPU the kernel runs in Mosaic GPU's interpret mode (simulated warpgroups, TMA and wgmma) and
is held to XLA's float32 conv of the same rounded operands; both dtypes are also lowered for CUDA,
which runs Mosaic's own layout checks (e.g. the 8-row alignment of every TMA offset). The GPU test
times nothing; bench/bench_conv.py does.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rynn_jax.kernels import conv_kernel as ck
from rynn_jax.kernels import vae_conv
from rynn_jax.models.fp8 import FP8_MAX

SMALL = ck.ConvTiles(tile_m=64, tile_n=64, stages=2, epi_n=64, num_sms=2)


def _interpret():
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams
    return InterpretGPUParams()


def _case(b, t, h, w, c, n, kt, seed=0):
    k = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(k[0], (b, t, h, w, c), jnp.float32)
    past = jax.random.normal(k[1], (b, kt - 1, h, w, c), jnp.float32) if kt > 1 else None
    wt = jax.random.normal(k[2], (kt, 3, 3, c, n), jnp.float32) / np.sqrt(kt * 9 * c)
    return x, past, wt


def rel_l2(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("b,t,h,w,c,n,kt,overlap,order", [
    (1, 2, 6, 10, 128, 64, 3, 0, "rows"),  # two M tiles, the streaming case (2 cached frames)
    (2, 1, 9, 14, 64, 128, 3, 1, "rows"),  # batch 2, two N tiles, k_w·C = 192; slots released a step late
    (1, 3, 5, 7, 128, 64, 1, 0, "rows"),  # k_t = 1: a per-frame 2-D 3×3 conv (the upsamplers')
    (2, 2, 5, 9, 64, 128, 3, 0, "frames"),  # frame-major tile order over batch × frames × N tiles
])
def test_bf16_kernel_matches_xla_conv(b, t, h, w, c, n, kt, overlap, order):
    x, past, wt = _case(b, t, h, w, c, n, kt)
    tiles = dataclasses.replace(SMALL, overlap=overlap, order=order)
    y = ck.causal_conv(x, wt, past, dtype=jnp.bfloat16, tiles=tiles, interpret=_interpret())
    assert y.shape == (b, t, h, w, n) and y.dtype == jnp.bfloat16
    rounded = ck.causal_conv_reference(x, wt, past, dtype=jnp.bfloat16)
    # bf16 operands, f32 accumulation, bf16 output: only the output rounding (2^-9 rel.) remains
    assert rel_l2(y, rounded) < 3e-3
    # and a wrong tap order or shift would be far off (neighbouring pixels are uncorrelated here)
    assert rel_l2(y, ck.causal_conv_reference(x, wt[::-1] if kt > 1 else wt[:, ::-1], past)) > 0.5


def test_fp8_kernel_matches_rounded_reference():
    x, past, wt = _case(1, 2, 6, 10, 128, 64, 3)
    sx = float(jnp.max(jnp.abs(jnp.concatenate([past, x], 1)))) / FP8_MAX * 1.25  # a static scale
    y = ck.causal_conv(x, wt, past, dtype=jnp.float8_e4m3fn, x_scale=sx, tiles=SMALL, interpret=_interpret())
    rounded = ck.causal_conv_reference(x, wt, past, dtype=jnp.float8_e4m3fn, x_scale=sx)
    exact = ck.causal_conv_reference(x, wt, past)
    assert rel_l2(y, rounded) < 5e-3  # the kernel adds only bf16 output rounding to FP8 operands
    # FP8 (3 mantissa bits) on both operands: a few percent off the exact conv, not more
    assert 5e-3 < rel_l2(y, exact) < 0.08
    # weights quantized ahead (serving) are the ones quantized per call: the same output, bit for bit
    w_f8, w_scale = ck.quantize_kernel(wt)
    assert w_f8.shape == (64, 3 * 3 * 3 * 128) and w_f8.dtype == jnp.float8_e4m3fn and w_scale.shape == (64,)
    ahead = ck.causal_conv(x, wt, past, dtype=jnp.float8_e4m3fn, x_scale=sx, w_fp8=(w_f8, w_scale), tiles=SMALL,
                           interpret=_interpret())
    np.testing.assert_array_equal(np.asarray(ahead, np.float32), np.asarray(y, np.float32))
    # the tile order moves work between CTAs, not arithmetic: the same bits
    frames = ck.causal_conv(x, wt, past, dtype=jnp.float8_e4m3fn, x_scale=sx, tiles=dataclasses.replace(SMALL, order="frames"),
                            interpret=_interpret())
    np.testing.assert_array_equal(np.asarray(frames, np.float32), np.asarray(y, np.float32))
    with pytest.raises(ValueError, match="w_fp8 must be"):
        ck.causal_conv(x, wt, past, dtype=jnp.float8_e4m3fn, w_fp8=(w_f8[:, :-1], w_scale), tiles=SMALL)
    with pytest.raises(ValueError, match="w_fp8 must be"):
        ck.causal_conv(x, wt, past, dtype=jnp.bfloat16, w_fp8=(w_f8, w_scale), tiles=SMALL)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float8_e4m3fn])
@pytest.mark.parametrize("cluster_m,overlap,order,in_kernel", [(False, 0, "rows", False), (True, 1, "frames", False),
                                                                (True, 0, "frames", True)])
def test_lowers_for_hopper(dtype, cluster_m, overlap, order, in_kernel):
    """Mosaic GPU lowering for CUDA (from a CPU-only machine) with the serving tiles: the TMA
    boxes, shared-memory tiling/swizzle, the K-major FP8 weight layout, the 2-CTA clusters sharing
    weight tiles (which the interpreter cannot run), late slot release, the frame-major tile
    order's offsets and the horizontal taps read in the kernel (TMA at unaligned rows into plain shared
    memory, loaded into registers for a register-lhs wgmma, which the interpreter cannot run either)
    are accepted. Lowering is not correctness: a register load at an unaligned row lowered too and
    read garbage on an H200, hence the GPU test below."""
    x, past, wt = _case(1, 4, 30, 52, 256, 256, 3)
    tiles = ck.ConvTiles(cluster_m=cluster_m, overlap=overlap, order=order, taps_in_kernel=in_kernel,
                         num_sms=132)
    f = jax.jit(lambda x, p, w: ck.causal_conv(x, w, p, dtype=dtype, x_scale=0.01, tiles=tiles))
    text = f.trace(x, past, wt).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text


@pytest.mark.parametrize("dtype,c", [(jnp.bfloat16, 64), (jnp.float8_e4m3fn, 128)])
def test_taps_in_kernel_gives_the_stacked_bits_interpreted(dtype, c):
    """Horizontal taps read in the kernel (each K step's TMA shifted by dw rows, weights in the same
    (dt, dh, dw, c) order) give the stacked kernel's bits. Interpreted, wgmma reads the shifted tile
    from shared memory; the GPU's register load of it is checked by the GPU test below."""
    x, past, wt = _case(1, 2, 6, 10, c, 64, 3)
    run = lambda tiles: ck.causal_conv(x, wt, past, dtype=dtype, x_scale=0.01, tiles=tiles,  # noqa: E731
                                       interpret=_interpret())
    stacked, shifted = run(SMALL), run(dataclasses.replace(SMALL, taps_in_kernel=True))
    np.testing.assert_array_equal(np.asarray(shifted, np.float32), np.asarray(stacked, np.float32))
    # not vacuous: the input really is unstacked (C columns), so a missing shift would show
    x_rows = ck.prepare(x, wt, past, dtype=dtype, tiles=dataclasses.replace(SMALL, taps_in_kernel=True))[0]
    assert x_rows.shape[-1] == c


@pytest.mark.gpu  # JAX_PLATFORMS=cuda python -m pytest -q -m gpu tests/test_conv_kernel.py (conftest defaults to CPU)
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="Hopper GPU only (the register load it checks cannot be interpreted)")
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float8_e4m3fn])
@pytest.mark.parametrize("serving", [False, True])
def test_taps_in_kernel_gives_the_stacked_bits_on_a_gpu(dtype, serving):
    """The horizontal taps read by the kernel (each K step's TMA shifted by dw rows) instead of
    stacked by the prologue: the same products in the same K order, so the same output bits."""
    x, past, wt = _case(1, 4, 30, 52, 256, 256, 3)
    run = lambda tiles: jax.jit(lambda x, p, w: ck.causal_conv(x, w, p, dtype=dtype, x_scale=0.01, tiles=tiles))(  # noqa: E731
        x, past, wt)
    tiles = ck.SERVING_TILES if serving else ck.ConvTiles()
    stacked = run(dataclasses.replace(tiles, taps_in_kernel=False))
    shifted = run(dataclasses.replace(tiles, taps_in_kernel=True))
    np.testing.assert_array_equal(np.asarray(shifted, np.float32), np.asarray(stacked, np.float32))
    assert rel_l2(stacked, ck.causal_conv_reference(x, wt, past, dtype=dtype, x_scale=0.01)) < 1e-2


def test_bad_shapes_are_refused():
    x, past, wt = _case(1, 2, 6, 10, 128, 64, 3)
    with pytest.raises(ValueError, match="past must be"):
        ck.causal_conv(x, wt, None)
    with pytest.raises(ValueError, match="past must be"):
        ck.causal_conv(x, wt, past[:, :1])
    with pytest.raises(ValueError, match="multiple of"):
        ck.causal_conv(x, wt[..., :48], past, tiles=SMALL)  # N = 48 is no multiple of tile_n = 64
    with pytest.raises(ValueError, match="bfloat16 or float8_e4m3fn"):
        ck.causal_conv(x, wt, past, dtype=jnp.float16)
    with pytest.raises(ValueError, match="tiles.order"):
        ck.causal_conv(x, wt, past, tiles=dataclasses.replace(SMALL, order="cols"))


def test_bench_runs_and_checks_on_a_cpu(tmp_path):
    """bench/bench_conv.py end to end on its tiny shape in interpret mode: the script a GPU session
    will run times every variant and records passing checks (so device time is not lost to it)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "conv.json"
    res = subprocess.run([sys.executable, str(root / "bench" / "bench_conv.py"), "--smoke", "--taps-in-kernel",
                          "--out", str(out)],
                         capture_output=True, text=True, cwd=root, timeout=600,
                         env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"})
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json.loads(out.read_text())
    variants = {r["variant"] for r in rows["rows"] if "median_ms" in r}
    assert {"xla fold2d bf16", "kernel bf16 m64n64s2fr", "kernel fp8 m64n64s2fr", "kernel fp8 m64n64s2frhk"} <= variants
    assert all(r["kernel_ms"] > 0 for r in rows["rows"] if r["variant"].startswith("kernel"))
    assert rows["checks"] and all(c["ok"] for c in rows["checks"])


def test_vae_conv_impl_routes_through_the_kernel():
    """The kernel injected into the VAE (vae_conv.configure(cfg, "kernel_bf16")): vae._conv sends the k×3×3 stride-1 convs it can to the
    kernel (streaming with a cache, and 'valid' in time without one), the rest to fold2d. (FP8 in
    the same place: next test — the interpreter cannot run its K-major weight tiles.)"""
    impl = "kernel_bf16"
    from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: F401 — the interpret context below

    from jax._src.pallas.mosaic_gpu.interpret.params import force_gpu_interpret_mode
    from rynn_jax.models import vae as V

    cfg = vae_conv.configure(V.WanVAEConfig.tiny(dtype="bfloat16"), impl)
    ref_cfg = V.WanVAEConfig.tiny(dtype="float32", conv_impl="3d")
    x, past, wt = _case(1, 2, 6, 10, 128, 64, 3)
    bias = jnp.linspace(-1, 1, 64)
    tol = 5e-3
    pad = ((1, 1), (1, 1))
    with force_gpu_interpret_mode():
        streamed = vae_conv.bare_conv(cfg, x.astype(jnp.bfloat16), wt, bias, pad_hw=pad, past=past)
        valid = vae_conv.bare_conv(cfg, jnp.concatenate([past, x], 1).astype(jnp.bfloat16), wt, bias, pad_hw=pad)
    want = vae_conv.bare_conv(ref_cfg, x, wt, bias, pad_hw=pad, past=past)
    if jax.default_backend() != "gpu":  # outside interpret mode a CPU refuses it (Pallas's error)
        with pytest.raises(ValueError, match="interpret mode"):
            vae_conv.bare_conv(cfg, x.astype(jnp.bfloat16), wt, bias, pad_hw=pad, past=past)
        assert impl not in vae_conv.conv_impls_for("cpu") and impl in vae_conv.conv_impls_for("gpu")
    assert streamed.shape == want.shape and rel_l2(streamed, want) < tol
    assert rel_l2(valid, want) < tol
    # channel counts off the kernel's tiles (N = 12) go to fold2d: same result as fold2d, no Mosaic call
    odd = wt[..., :12]
    got = vae_conv.bare_conv(cfg, x.astype(jnp.bfloat16), odd, bias[:12], pad_hw=pad, past=past.astype(jnp.bfloat16))
    fold = vae_conv.bare_conv(V.WanVAEConfig.tiny(dtype="bfloat16"), x.astype(jnp.bfloat16), odd, bias[:12], pad_hw=pad,
                              past=past.astype(jnp.bfloat16))
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(fold, np.float32))


def test_vae_fp8_conv_impl_lowers_to_the_kernel():
    from rynn_jax.models import vae as V

    cfg = vae_conv.configure(V.WanVAEConfig.tiny(dtype="bfloat16"), "kernel_fp8")
    x, past, wt = _case(1, 2, 6, 10, 128, 128, 3)
    f = jax.jit(lambda x, p, w: vae_conv.bare_conv(cfg, x, w, jnp.zeros((w.shape[-1],)), past=p))
    assert "mosaic_gpu" in f.trace(x, past, wt).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" not in f.trace(x, past, wt[..., :12]).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("name", ["pad_first_packed", "quantize_first", "quantize_first_packed",
                                  "quantize_first_packed_fused"])
def test_fp8_prologue_variants_give_the_same_bits(name):
    """The ways of building the FP8 input rows (quantize before or after padding, bytes moved one by
    one or as uint32 words) are layouts of the same values: bit-identical outputs, per-call scale."""
    x, past, wt = _case(1, 2, 6, 10, 128, 64, 3)
    run = lambda prologue: np.asarray(ck.causal_conv(x, wt, past, dtype=jnp.float8_e4m3fn, tiles=SMALL,  # noqa: E731
                                                     prologue=prologue, interpret=_interpret()), np.float32)
    want = run(ck.PROLOGUE_PRESETS["pad_first"])  # the plainest layout is the reference
    np.testing.assert_array_equal(run(ck.PROLOGUE_PRESETS[name]), want)
    with pytest.raises(ValueError, match="Fp8Prologue.order"):
        ck.Fp8Prologue(order="pad_last")


def test_tile_presets_are_what_their_names_say():
    """The benches' --conv-tiles names (conv_kernel.TILE_PRESETS): order, clusters, stages and
    in-kernel taps as named, and each prepares operands for the kernel accordingly."""
    x, past, wt = _case(1, 2, 6, 10, 128, 256, 3)
    assert ck.SERVING_TILES in ck.TILE_PRESETS.values()
    for name, tiles in ck.TILE_PRESETS.items():
        assert tiles.order == name.split("_")[0] and tiles.cluster_m == ("_c2" in name), name
        assert tiles.taps_in_kernel == name.endswith("_hk") and tiles.stages == (3 if "_s3" in name else 4), name
        x_rows, _, plan, _ = ck.prepare(x, wt, past, dtype=jnp.float8_e4m3fn, x_scale=0.01, tiles=tiles)
        assert plan.kw == (3 if tiles.taps_in_kernel else 1) and plan.blocks == (2 if tiles.order == "frames" else 1)
        assert x_rows.shape[-1] == (128 if tiles.taps_in_kernel else 3 * 128), name  # stacked taps: 3·C


def test_kernel_conv_settings_reach_the_kernel(monkeypatch):
    """The kernel's knobs are KernelConv fields, passed down on every call: the tiles (fitted to the
    conv's N) and the FP8 prologue a config names are the ones causal_conv receives."""
    seen = {}

    def fake(x, w, past, **kw):
        seen.update(kw)
        return jnp.zeros((*x.shape[:4], w.shape[-1]), jnp.bfloat16)

    monkeypatch.setattr(ck, "causal_conv", fake)
    from rynn_jax.models import vae as V

    cfg = vae_conv.configure(V.WanVAEConfig.tiny(dtype="bfloat16"), "kernel_fp8", tiles=ck.TILE_PRESETS["rows_c2"],
                             prologue=ck.PROLOGUE_PRESETS["pad_first"])
    x, past, wt = _case(1, 2, 6, 10, 128, 128, 3)
    vae_conv.bare_conv(cfg, x, wt, jnp.zeros((128,)), past=past)
    assert seen["prologue"] == ck.Fp8Prologue(order="pad_first", packed=False, barrier=False)
    assert seen["tiles"] == ck.fitted_tiles(128, ck.TILE_PRESETS["rows_c2"]) and seen["tiles"].tile_n == 128
    assert seen["dtype"] == jnp.float8_e4m3fn
