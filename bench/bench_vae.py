"""Wan2.2 VAE latency at 480×832 (random weights), ours vs diffusers, one machine.

    python bench/bench_vae.py --latent-frames 21 --out bench/results/vae.json

`--codec vae tae` also times the tiny autoencoder of the same latent space (models/tae.py); with
`--synthetic`, the synthetic autoencoder's tiny decoder (TAEConfig.synthetic, decoder only: no
encode rows):

    python bench/bench_vae.py --synthetic --codec vae tae --height 128 --width 224 --latent-frames 7 \
        --torch off --no-whole --out bench/results/vae_tiny_decoder_synthetic_cpu.json

Times, for the full 2.2 VAE: streaming decode (one latent frame → 4 video frames per call, cache
carried; the real-time path — per call with the host waiting on each, and per call with 8 calls
queued back to back as a streaming server dispatches them; each also with the later-chunk program
alone, without the first-chunk lax.cond, as the session runs it), streaming encode (4 frames per call),
and whole-clip encode/decode.
With torch+diffusers importable (and `--torch` not 'off'), diffusers' `AutoencoderKLWan` decode and
encode run in a subprocess for the side-by-side ratio. Prints a table of medians, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import Checks, decode_streamed, time_ms, write_json  # noqa: E402

from rynn_jax.kernels.conv_kernel import TILE_PRESETS  # noqa: E402


def check_streaming(checks: Checks, V, graphdef, params, cfg, z, video, height: int, width: int,
                    fp8_convs: bool = False) -> None:
    """The timed streaming programs against the whole-clip ones on a slice (2 latent frames ↔ 5
    video frames): same weights, same dtype; outputs finite. bf16 tolerance: the two programs
    accumulate in different orders (a wrong program is off by O(1))."""
    import functools

    import jax
    import jax.numpy as jnp

    # FP8 convs: with per-call scales the streamed and whole-clip programs scale each conv's
    # activations by their own max|x| (different frames), so they differ by FP8 noise (≈ 0.1 rel.);
    # with static scales too, less: FP8's coarse grid amplifies the programs' different float
    # rounding from layer to layer (bench/fidelity_vae_fp8.py). A wrong program is O(1) off.
    tol = 0.25 if fp8_convs else 1e-4 if cfg.dtype == "float32" else 5e-2
    streamed = decode_streamed(V, graphdef, params, z[:, :2], height, width)
    whole = jax.jit(functools.partial(V.decode, graphdef))(params, z[:, :2])
    checks.finite("stream decode", streamed)
    checks.close(f"{V.__name__}: stream decode vs whole-clip decode (2 latents)", streamed, whole, tol)
    if getattr(cfg, "decoder_only", False):
        return

    enc = jax.jit(functools.partial(V.encode_chunk, graphdef))
    ecache = V.init_encode_cache(cfg, 1, height, width)
    z0, ecache = enc(params, ecache, jnp.repeat(video[:, :1], 4, axis=1))
    z1, _ = enc(params, ecache, video[:, 1:5])
    streamed_z = jnp.concatenate([z0, z1], axis=1)
    whole_z = jax.jit(functools.partial(V.encode, graphdef))(params, video[:, :5])
    checks.finite("stream encode", streamed_z)
    checks.close(f"{V.__name__}: stream encode vs whole-clip encode (5 frames)", streamed_z, whole_z, tol)


def _time_streaming(V, graphdef, params, cfg, z, video, height: int, width: int, iters: int, impl: str,
                    k: int, checks: Checks | None) -> list[dict]:
    """Median time of a later streaming call (past the first) with k latents ↔ 4k frames per call.
    k > 1: the last timed outputs must be finite (k = 1 is held to the whole clip, `check_streaming`)."""
    import functools

    import jax
    import jax.numpy as jnp

    latent_frames = z.shape[1]
    dec_step = jax.jit(functools.partial(V.decode_chunk, graphdef), donate_argnums=1)
    # what a streaming server runs past a chunk's first call: the later-chunk program alone (no
    # lax.cond, whose predicate the host reads back on a GPU before it can queue the rest)
    dec_later = jax.jit(functools.partial(V.decode_chunk, graphdef, first=False), donate_argnums=1)
    cache = V.init_decode_cache(cfg, 1, height, width)
    y, cache = dec_step(params, cache, z[:, :k])  # first call (compiles both branches)
    y.block_until_ready()
    state = {"cache": cache, "i": 1}

    def dispatch_decode(step):  # the next later chunk (cycling over the clip), not waited for
        i = 1 + (state["i"] - 1) % ((latent_frames - 1) // k) * k
        state["out"], state["cache"] = step(params, state["cache"], z[:, i:i + k])
        state["i"] += 1

    def one_decode(step):
        dispatch_decode(step)
        state["out"].block_until_ready()

    def queued_decode(step, n: int = 8):  # calls queued back to back, as a streaming server dispatches them
        for _ in range(n):
            dispatch_decode(step)
        state["out"].block_until_ready()

    t_dec, t_queued = {}, {}
    for name, step in (("", dec_step), (", later-chunk program", dec_later)):
        t_dec[name] = time_ms(lambda: one_decode(step), 2, iters)
        t_queued[name] = [t / 8 for t in time_ms(lambda: queued_decode(step), 1, max(3, iters // 4))]

    enc_step = jax.jit(functools.partial(V.encode_chunk, graphdef), donate_argnums=1)
    estate = {}
    if not getattr(cfg, "decoder_only", False):
        ecache = V.init_encode_cache(cfg, 1, height, width)
        zz, estate["cache"] = enc_step(params, ecache, jnp.repeat(video[:, :1], 4 * k, axis=1))
        zz.block_until_ready()

    def one_encode():
        estate["out"], estate["cache"] = enc_step(params, estate["cache"], video[:, 1:1 + 4 * k])
        estate["out"].block_until_ready()

    if k > 1 and checks is not None:
        checks.finite(f"{impl}: stream decode, {k} per call", state["out"])
    many = lambda n, what: f"{n} {what}" + ("s" if n > 1 else "")  # noqa: E731
    op = f"stream decode ({many(k, 'latent')} → {4 * k} frames)"
    rows = [dict(impl=impl, op=op + name + queued, latents_per_call=k, median_ms=statistics.median(t[name]),
                 per_frame_ms=statistics.median(t[name]) / (4 * k))
            for name in t_dec for queued, t in (("", t_dec), (", 8 calls queued", t_queued))]
    if getattr(cfg, "decoder_only", False):  # a tiny decoder alone: nothing to encode with
        return rows
    t_enc = time_ms(one_encode, 2, iters)
    if k > 1 and checks is not None:
        checks.finite(f"{impl}: stream encode, {k} per call", estate["out"])
    return rows + [dict(impl=impl, op=f"stream encode ({4 * k} frames → {many(k, 'latent')})", latents_per_call=k,
                        median_ms=statistics.median(t_enc), per_frame_ms=statistics.median(t_enc) / (4 * k))]


def vae_config(dtype: str, tiny: bool, synthetic: bool):
    """The benched VAE: the synthetic world's autoencoder (configs/synthetic.py), the tiny test one, or
    the released Wan2.2 VAE's layout; random weights stored in `dtype`."""
    from rynn_jax.models import vae

    if synthetic:
        from configs import synthetic as syn

        return vae.WanVAEConfig.synthetic(z_dim=syn.LATENT_CHANNELS, dtype=dtype, param_dtype=dtype)
    return (vae.WanVAEConfig.tiny if tiny else vae.WanVAEConfig.wan22)(dtype=dtype, param_dtype=dtype)


def bench_jax(latent_frames: int, height: int, width: int, dtype: str, iters: int, whole: bool,
              tiny: bool = False, checks: Checks | None = None, codec: str = "vae",
              conv_impl: str = "fold2d", fp8_static: bool = False, conv_tiles: str | None = None,
              synthetic: bool = False) -> list[dict]:
    """`codec`: "vae" (the exact Wan2.2 VAE, models/vae.py) or "tae" (the tiny autoencoder of the
    same latent space, models/tae.py); both modules have the same streaming functions. `conv_impl`:
    the VAE's conv_impl (kernels/vae_conv.py; same weights for every choice: same seed). `fp8_static`:
    kernel_fp8 with static activation scales calibrated on the timed clip (kernels/vae_fp8.py).
    `conv_tiles`: a conv_kernel.TILE_PRESETS name for the kernel conv_impls (None: SERVING_TILES).
    `synthetic`: the synthetic world's autoencoder config (configs/synthetic.py) instead of Wan2.2's."""
    import functools

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from rynn_jax.kernels import vae_conv
    from rynn_jax.models import tae, vae

    if codec == "tae":
        V, impl = tae, "jax tae"
        cfg = (tae.TAEConfig.synthetic if synthetic else tae.TAEConfig.tiny if tiny else tae.TAEConfig.wan22)(dtype=dtype)
        model = tae.init_tae(cfg, 0)
    else:
        V, impl = vae, "jax" if conv_impl == "fold2d" else f"jax {conv_impl}"
        cfg = vae_config(dtype, tiny, synthetic)
        tiles = {} if conv_tiles is None or conv_impl in vae.XLA_CONV_IMPLS else {"tiles": TILE_PRESETS[conv_tiles]}
        cfg = vae_conv.configure(cfg, conv_impl, **tiles)
        model = vae.init_vae(cfg, 0)
    frames = 1 + 4 * (latent_frames - 1)
    key = jax.random.key(0)
    s = cfg.spatial_stride
    z = jax.random.normal(key, (1, latent_frames, height // s, width // s, cfg.z_dim), jnp.float32)
    video = jnp.clip(jax.random.normal(key, (1, frames, height, width, 3), jnp.float32), -1, 1)
    if codec == "vae" and conv_impl == "kernel_fp8" and fp8_static:
        from rynn_jax.kernels import vae_fp8

        model = vae_fp8.with_static_scales(model, vae_fp8.calibrate(model, vae_fp8.decode_clip, [z[:, :2]]))
        cfg, impl = model.cfg, f"{impl} static"
    graphdef, params = nnx.split(model)
    rows = []

    # The tiny autoencoder also streams k chunks per call (one block of the causal student: 3).
    for k in (1, 3) if codec == "tae" and latent_frames > 3 else (1,):
        rows += _time_streaming(V, graphdef, params, cfg, z, video, height, width, iters, impl, k, checks)
        if k == 1 and checks is not None:
            check_streaming(checks, V, graphdef, params, cfg, z, video, height, width,
                            fp8_convs=conv_impl == "kernel_fp8")
    ops = (("decode", V.decode, z),) + (() if getattr(cfg, "decoder_only", False) else (("encode", V.encode, video),))
    for op, fn, x in ops if whole else ():
        f = jax.jit(functools.partial(fn, graphdef))
        try:  # one pass over all frames is memory-heavy at 81 frames; report, don't abort
            t = time_ms(lambda: f(params, x).block_until_ready(), 1, 3)
        except Exception as e:  # noqa: BLE001 — XLA raises several error types for OOM
            print(f"whole-clip {op} failed: {type(e).__name__}: {str(e)[:200]}")
            continue
        rows.append(dict(impl=impl, op=f"whole-clip {op} ({frames} frames)", median_ms=statistics.median(t),
                         per_frame_ms=statistics.median(t) / frames))
    for r in rows:
        print(r, flush=True)
    return rows


def bench_torch(latent_frames: int, height: int, width: int) -> list[dict]:
    import torch
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan(base_dim=160, decoder_base_dim=256, z_dim=48, dim_mult=[1, 2, 4, 4],
                           num_res_blocks=2, temperal_downsample=[False, True, True], is_residual=True,
                           in_channels=12, out_channels=12, patch_size=2, scale_factor_spatial=16,
                           scale_factor_temporal=4).to("cuda", torch.bfloat16).eval()
    frames = 1 + 4 * (latent_frames - 1)
    z = torch.randn(1, 48, latent_frames, height // 16, width // 16, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, 3, frames, height, width, device="cuda", dtype=torch.bfloat16).clamp(-1, 1)
    rows = []
    with torch.no_grad():
        for op, fn, n in ((f"whole-clip decode ({frames} frames)", lambda: vae.decode(z), frames),
                          (f"whole-clip encode ({frames} frames)", lambda: vae.encode(x), frames)):
            def run():
                fn()
                torch.cuda.synchronize()
            t = time_ms(run, 1, 3)
            rows.append(dict(impl="diffusers", op=op, median_ms=statistics.median(t),
                             per_frame_ms=statistics.median(t) / n))
    return rows


def bench_image_encode(batch: int, height: int, width: int, dtype: str, iters: int, tiny: bool, synthetic: bool,
                       checks: Checks) -> list[dict]:
    """Encoding images (one frame each: the policy's observation, a session's reference frame) two
    ways in one run: `encode` of the lone frame, whose causal convs skip the zero padding's taps, and
    the frame through an explicit zero cache, which runs every tap. Same latents; XLA's FLOP counts
    must show the lone frame doing less (else both rows would time one program)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from rynn_jax.models import vae

    cfg = vae_config(dtype, tiny, synthetic)
    graphdef, params = nnx.split(vae.init_vae(cfg, 0))
    images = jnp.clip(jax.random.normal(jax.random.key(0), (batch, 1, height, width, 3), jnp.float32), -1, 1)
    cache = vae.init_encode_cache(cfg, batch, height, width)
    lone = jax.jit(lambda p, x: vae.encode(graphdef, p, x))
    # a zero cache passed in runs every tap (the streaming first chunk now takes the lone path too)
    every_tap = jax.jit(lambda p, c, x: nnx.merge(graphdef, p).encode_frames(x, c["layers"], True, True)[0])
    a, b = np.asarray(lone(params, images), np.float32), np.asarray(every_tap(params, cache, images), np.float32)
    err = float(np.linalg.norm(a - b) / np.linalg.norm(b))
    checks.rows.append(dict(check=f"image encode: lone frame = every tap (rel L2 {err:.1e})", ok=err <= 2e-2))
    flops = [(c[0] if isinstance(c, list) else c)["flops"] for c in (
        lone.lower(params, images).compile().cost_analysis(),
        every_tap.lower(params, cache, images).compile().cost_analysis())]
    checks.rows.append(dict(check=f"image encode: lone frame FLOPs {flops[0]:.3g} < every tap's {flops[1]:.3g}",
                            ok=flops[0] < flops[1]))
    checks.finite("image encode", a)
    rows = []
    for op, fn in ((f"encode {batch} images, every tap (zero cache)", lambda: every_tap(params, cache, images)),
                   (f"encode {batch} images, lone frame", lambda: lone(params, images))):
        t = time_ms(lambda: jax.block_until_ready(fn()), 1, iters)
        rows.append(dict(impl="jax", op=op, median_ms=statistics.median(t), per_frame_ms=statistics.median(t) / batch,
                         times_ms=t, height=height, width=width))
    rows[1]["speedup_vs_every_tap"] = rows[0]["median_ms"] / rows[1]["median_ms"]
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--latent-frames", type=int, default=21)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--width", type=int, default=832)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--no-whole", action="store_true", help="skip whole-clip encode/decode")
    p.add_argument("--torch", choices=["off", "on"], default="on")
    p.add_argument("--tiny", action="store_true", help="tiny VAE, for a CPU smoke run")
    p.add_argument("--synthetic", action="store_true",
                   help="the synthetic world's autoencoder (configs/synthetic.py; e.g. --height 128 --width 224)")
    p.add_argument("--codec", nargs="+", choices=["vae", "tae"], default=["vae"],
                   help="vae: the exact Wan2.2 VAE; tae: the tiny autoencoder (models/tae.py)")
    p.add_argument("--conv-impls", nargs="+", default=["fold2d"],
                   help="VAE conv_impl values to time (kernels/vae_conv.py), e.g. fold2d kernel_bf16 kernel_fp8")
    p.add_argument("--vae-fp8-static", action="store_true",
                   help="kernel_fp8 with calibrated static activation scales (kernels/vae_fp8.py)")
    p.add_argument("--only-torch", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--conv-tiles", choices=sorted(TILE_PRESETS), default=None,
                   help="kernel conv_impls: this conv_kernel.TILE_PRESETS entry instead of SERVING_TILES")
    p.add_argument("--image-batch", type=int, default=0,
                   help="only the image-encode rows: this many single frames, lone-frame vs every-tap program")
    p.add_argument("--out", default="bench/results/vae.json")
    a = p.parse_args()
    if a.image_batch:
        checks = Checks()
        rows = bench_image_encode(a.image_batch, a.height, a.width, a.dtype, a.iters, a.tiny, a.synthetic, checks)
        print(f"\n{'op':44s} {'median ms':>10s}")
        for r in rows:
            print(f"{r['op']:44s} {r['median_ms']:10.2f}")
        print(f"lone frame: {rows[1]['speedup_vs_every_tap']:.2f}× faster")
        write_json(a.out, dict(rows=rows, checks=checks.rows, argv=sys.argv[1:]))
        checks.exit_if_failed()
        return
    if a.only_torch:
        print("JSON" + json.dumps(bench_torch(a.latent_frames, a.height, a.width)))
        return
    rows = []
    if a.torch == "on":
        cmd = [sys.executable, __file__, "--only-torch", "--latent-frames", str(a.latent_frames),
               "--height", str(a.height), "--width", str(a.width)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        lines = [ln for ln in res.stdout.splitlines() if ln.startswith("JSON")]
        if lines:
            rows += json.loads(lines[-1][4:])
        else:
            print("torch reference skipped:", (res.stderr.strip().splitlines() or ["no output"])[-1])
    checks = Checks()
    for codec in a.codec:
        for conv_impl in a.conv_impls if codec == "vae" else ["fold2d"]:
            rows += bench_jax(a.latent_frames, a.height, a.width, a.dtype, a.iters, not a.no_whole, a.tiny,
                              checks, codec=codec, conv_impl=conv_impl, fp8_static=a.vae_fp8_static,
                              conv_tiles=a.conv_tiles, synthetic=a.synthetic)
    print(f"\n{'impl':18s} {'op':56s} {'median ms':>10s} {'ms/frame':>9s}")
    for r in rows:
        print(f"{r['impl']:18s} {r['op']:56s} {r['median_ms']:10.2f} {r['per_frame_ms']:9.2f}")
    write_json(a.out, dict(rows=rows, checks=checks.rows, argv=sys.argv[1:]))
    checks.exit_if_failed()


if __name__ == "__main__":
    main()
