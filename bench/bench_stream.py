"""End-to-end streaming FPS: skeleton render → streaming VAE encode → 4-step causal DiT with KV cache
→ clean cache pass → streaming VAE decode, one jitted step per block (random weights).

    python bench/bench_stream.py --batch 1 2 4 8 --out bench/results/stream_h200.json   # 5B, 480×832, bf16
    python bench/bench_stream.py --tiny --height 64 --width 64 --out /tmp/s.json      # CPU smoke
    python bench/bench_stream.py --synthetic --chunks 2 --warm-chunks 1 --out bench/results/stream_synthetic_cpu.json
        # the synthetic world's student (bundled size, random weights) at 128×224
    python bench/bench_stream.py --compile-cache /tmp/xla ...   # twice: cold, then warm time to first frame

Per batch size B (B sessions in lock step in one executable): time to first frame (start + first
block, compilation included), per-block latency, and aggregate output FPS (generated video frames of
all sessions per second of wall time, skeleton rendering included) over the chunks after the
warm-up chunks. The render is compiled for each block length before any clock starts; with
`--precompile` (`StreamingSession.compile` first, as a server at boot) no block compiles anything.
Prints a table, writes JSON. `--decoder tae` / `--encoder tae` swap the exact Wan2.2 VAE for the
tiny autoencoder of the same latent space (models/tae.py) on that side; with `--synthetic`,
`--decoder tae` is the synthetic autoencoder's tiny decoder (TAEConfig.synthetic: the trained one in
weights/synthetic/tiny_decoder when present, or `--tae-weights DIR`, else random weights).
`--vae-conv kernel_fp8 --vae-fp8-static` decodes with our FP8 conv kernel and calibrated static
scales (kernels/vae_fp8.py; Hopper GPUs). `--fp8 --fp8-activations static` serves the FP8 DiT with calibrated activation scales
(fp8.calibrate on random block-shaped inputs at the session's timesteps, not timed) and records how
far one held-out forward lands from the bf16 model, next to the per-token FP8 model's distance.
Blocks run as served (`serving.block_step.SERVING_STEPS`: each block's clean cache pass merged into the
next block's first denoising pass); `--clean-pass sequential` runs the passes in turn, as before
the merged pass was served. `--ab merge` / `--ab fp8-static` / `--ab working-cache` (every pass
copying the KV cache, as before the working cache was served, vs one working copy per block) / `--ab
decoder` (the VAE's decoder vs the tiny one) time a variant and its baseline in one process, taking
turns chunk by chunk after their warm-up (this bench's run-to-run spread between calls is ±3%, more
than the differences being measured; on a shared CPU, far more).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import Checks, write_json  # noqa: E402

from rynn_jax.kernels.conv_kernel import TILE_PRESETS  # noqa: E402


def _write(path: str, results: list[dict], a: argparse.Namespace, vae_cfg, dtype: str, checks: Checks,
           fp8_calibration: dict | None, vae_calibration: dict | None = None, tae_source: str | None = None) -> None:
    import jax

    out = dict(results=results, backend=jax.default_backend(), dtype=dtype, tiny=a.tiny, synthetic=a.synthetic,
               unrolled_layers=not a.no_unroll, vae_conv_impl=vae_cfg.conv_name,
               vae_conv_fp8_scales=vae_cfg.kernel_conv and vae_cfg.kernel_conv.fp8_scales, vae_fp8_calibration=vae_calibration, fp8_dit=a.fp8,
               fp8_activations=a.fp8_activations if a.fp8 else None, fp8_calibration=fp8_calibration,
               token_multiple=a.token_multiple, merge_clean_pass=None if a.ab == "merge" else a.clean_pass == "merged", ab=a.ab, encoder=a.encoder, decoder=a.decoder,
               vae_conv_tiles=a.conv_tiles, resolution=[a.height, a.width], tae_weights=tae_source, checks=checks.rows,
               argv=sys.argv[1:])
    write_json(path, out)


def synthetic_tiny_decoder(path: str | None, dtype: str):
    """The synthetic autoencoder's tiny decoder: `path`, else the bundled trained one when present,
    else TAEConfig.synthetic at random (same shapes, same time). Returns (model, where from)."""
    from rynn_jax.models.tae import TAEConfig, init_tae
    from rynn_jax.models.tae_weights import load_tae
    from rynn_jax.serving import student

    path = path or student.bundled_tiny_decoder()
    if path is None:
        return init_tae(TAEConfig.synthetic(dtype=dtype), 0), "random TAEConfig.synthetic"
    return load_tae(path), path


def calibrate_vae_static(vae, height: int, width: int):
    """The VAE with static FP8 activation scales for its decoder convs (vae_fp8.calibrate on two
    random normalized latent frames at the session's size, decoded whole; the served latents are the
    DiT's, of about that range). Returns (model, JSON row)."""
    import jax

    from rynn_jax.kernels import vae_fp8

    stride = vae.cfg.spatial_stride
    z = jax.random.normal(jax.random.key(2), (1, 2, height // stride, width // stride, vae.cfg.z_dim))
    t0 = time.perf_counter()
    scales = vae_fp8.calibrate(vae, vae_fp8.decode_clip, [z])
    row = dict(calibration_s=time.perf_counter() - t0, convs=len(scales))
    print(f"vae fp8 calibration: {row['convs']} convs in {row['calibration_s']:.1f} s", flush=True)
    return vae_fp8.with_static_scales(vae, scales, conv_impl=vae.cfg.conv_name), row


def calibrate_static(dit_float, dit_fp8, latent_shape: tuple[int, ...], ctx, checks: Checks):
    """fp8.calibrate on random block latents/control latents at the 4 denoising timesteps and the
    t = 0 cache pass; then one held-out block (t = 833) through the bf16, per-token FP8 and static
    FP8 models. Returns (static model, JSON row)."""
    import jax.numpy as jnp
    import numpy as np

    from rynn_jax.models import fp8
    from rynn_jax.teleop.calibrate_fp8 import calibration_timesteps, fp8_distance

    rng = np.random.default_rng(1)
    lat = lambda: jnp.asarray(rng.standard_normal(latent_shape), jnp.float32)  # noqa: E731

    def batch(t: float):
        return lat(), jnp.full(latent_shape[:2], t, jnp.float32), ctx, lat()

    timesteps = calibration_timesteps()
    t0 = time.perf_counter()
    static = fp8.calibrate(dit_fp8, lambda m, b: m(*b), [batch(t) for t in timesteps])
    calib_s = time.perf_counter() - t0
    rel = fp8_distance(dit_float, dit_fp8, static, batch(833.0))  # a held-out block
    row = dict(calibration_timesteps=timesteps, calibration_s=calib_s, rel_l2_vs_bf16=rel)
    checks.finite("fp8 static: held-out forward", np.asarray(list(rel.values())))  # NaN/Inf output → NaN distance
    print(f"fp8 calibration {calib_s:.1f} s; held-out block rel L2 vs bf16: {row['rel_l2_vs_bf16']}", flush=True)
    return static, row


def stream_chunks(session, render, joints, elbows, image, ctx, chunks: int):
    """Generator: starts the session, then streams `chunks` 81-frame chunks, timing every block
    (skeleton render included); yields (the chunk's block rows, the last RGB block) after each
    chunk. The first row carries `time_to_first_frame_s` (start + first block, compiles included)."""
    import jax
    import jax.numpy as jnp

    b = image.shape[0]
    total = 1 + 80 * chunks
    t0 = time.perf_counter()
    session.start(image, ctx, jax.random.key(0))
    used, rows = 0, []
    while used < total:
        n = session.frames_needed
        if used + n > total:
            break
        tb = time.perf_counter()
        rgb = session.step(render(jnp.asarray(joints[used:used + n]), jnp.asarray(elbows[used:used + n]), b))
        rgb.block_until_ready()
        dt = time.perf_counter() - tb
        used += n
        rows.append(dict(block=session.blocks, chunk=session.chunks, frames_out=int(rgb.shape[1]), ms=dt * 1e3))
        if session.blocks == 1:
            rows[-1]["time_to_first_frame_s"] = time.perf_counter() - t0
        print(rows[-1], flush=True)
        if session._chunk_done or used == total:
            yield rows, rgb
            rows = []


def summarize(rows: list[dict], b: int, warm_chunks: int) -> dict:
    """Steady state over the chunks after the first `warm_chunks` (without `--precompile` they
    include the session's compiles; reported, not averaged)."""
    steady = [r for r in rows if r["chunk"] >= warm_chunks]
    frames = b * sum(r["frames_out"] for r in steady)
    ms_per_frame = sum(r["ms"] for r in steady) / max(1, frames)
    return dict(batch=b, time_to_first_frame_s=rows[0]["time_to_first_frame_s"], steady_ms_per_frame=ms_per_frame,
                steady_fps=1e3 / ms_per_frame, median_block_ms=statistics.median(r["ms"] for r in steady),
                rows=rows)


def run_session(session, render, joints, elbows, image, ctx, chunks: int, warm_chunks: int):
    """All chunks of one session → (last RGB block, summary)."""
    rows = []
    for chunk_rows, rgb in stream_chunks(session, render, joints, elbows, image, ctx, chunks):
        rows += chunk_rows
    return rgb, summarize(rows, image.shape[0], warm_chunks)


def breakdown(render, joints, elbows, encoder, decoder, b: int, h: int, w: int, frames_per_block: int,
              z_dim: int, stride: int, reps: int = 5) -> dict:
    """Where a later block's time goes, outside the fused step: the skeleton render, the streaming
    encode of its 4F frames and the decode of F latents, each jitted alone at the session's shapes
    (median of `reps` after a warm-up); the rest of a block is the DiT's (4 passes + the clean pass)."""
    import jax
    import jax.numpy as jnp

    from rynn_jax.serving import codecs

    enc, enc_p = codecs.split(encoder)
    dec, dec_p = codecs.split(decoder)
    n = 4 * frames_per_block
    x = jnp.zeros((b, n, h, w, 3), jnp.float32)
    z = jnp.zeros((b, frames_per_block, h // stride, w // stride, z_dim), jnp.float32)
    ecache, dcache = enc.init_encode_cache(b, h, w), dec.init_decode_cache(b, h, w)
    encode = jax.jit(lambda p, c, v: codecs.encode_block(enc, p, c, v, first=False)[0])
    decode = jax.jit(lambda p, c, v: codecs.decode_block(dec, p, c, v, first=False)[0])
    calls = {"render_ms": lambda: render(jnp.asarray(joints[:n]), jnp.asarray(elbows[:n]), b),
             "encode_ms": lambda: encode(enc_p, ecache, x), "decode_ms": lambda: decode(dec_p, dcache, z)}
    out = {}
    for name, call in calls.items():
        call().block_until_ready()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            call().block_until_ready()
            times.append((time.perf_counter() - t0) * 1e3)
        out[name] = statistics.median(times)
    return out


def run_ab(sessions: dict, render, joints, elbows, image, ctx, chunks: int, warm_chunks: int):
    """Two sessions in one process: each streams its warm-up chunks, then they take turns chunk by
    chunk, so slow drifts of the machine (clocks, other tenants) hit both alike. → {name: (rgb, summary)}."""
    streams = {name: stream_chunks(s, render, joints, elbows, image, ctx, chunks) for name, s in sessions.items()}
    rows = {name: [] for name in sessions}
    last = {}
    for name, gen in streams.items():  # warm-up (compiles), one session after the other
        for _ in range(warm_chunks):
            chunk_rows, last[name] = next(gen)
            rows[name] += chunk_rows
    for _ in range(chunks - warm_chunks):
        for name, gen in streams.items():
            chunk_rows, last[name] = next(gen)
            rows[name] += chunk_rows
    return {name: (last[name], summarize(rows[name], image.shape[0], warm_chunks)) for name in sessions}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tiny", action="store_true", help="tiny DiT + VAE (CPU smoke check)")
    p.add_argument("--synthetic", action="store_true",
                   help="the synthetic world's student as bundled (configs/synthetic.py: teacher_model() and the "
                        "bundled autoencoder's architecture, else the 32-channel WanVAEConfig.synthetic), random weights, default 128×224")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                   help="compute dtype (default: float32 for --tiny, bfloat16 otherwise, as bundled/released)")
    p.add_argument("--height", type=int, default=None, help="default 480 (128 with --synthetic)")
    p.add_argument("--width", type=int, default=None, help="default 832 (224 with --synthetic)")
    p.add_argument("--chunks", type=int, default=3, help="81-frame chunks to stream per batch size")
    p.add_argument("--warm-chunks", type=int, default=2,
                   help="leading chunks left out of the steady state (they compile the step, the "
                        "re-anchor and every skeleton-render length)")
    p.add_argument("--batch", type=int, nargs="+", default=[1], help="concurrent sessions (one executable each)")
    p.add_argument("--no-unroll", action="store_true",
                   help="keep the DiT's layer scan rolled (shorter compile, slower steps; see dit.unrolled)")
    p.add_argument("--vae-conv", default=None, help="VAE conv_impl (kernels/vae_conv.py; default: the config's)")
    p.add_argument("--vae-fp8-static", action="store_true",
                   help="with --vae-conv kernel_fp8 (or emulate_fp8): the decoder's FP8 convs with static activation "
                        "scales (vae_fp8.calibrate on random latents at the session's size, not timed)")
    p.add_argument("--fp8", action="store_true", help="serve the DiT with FP8 block linears (fp8.quantize_dit)")
    p.add_argument("--fp8-activations", choices=["per_token", "static"], default="per_token",
                   help="with --fp8: activation scales per token at every call, or static ones (fp8.calibrate)")
    p.add_argument("--compile-cache", default="", metavar="DIR",
                   help="persistent XLA compilation cache (rynn_jax.compile_cache); run twice to time a warm start")
    p.add_argument("--token-multiple", type=int, default=1,
                   help="WanDiTConfig.token_multiple of the 5B DiT (16: a 1170-token block runs as 1184)")
    p.add_argument("--decoder", choices=["vae", "tae"], default="vae",
                   help="pixel decoder: the exact Wan2.2 VAE or the tiny autoencoder (models/tae.py)")
    p.add_argument("--tae-weights", default=None, metavar="DIR",
                   help="with --synthetic --decoder tae: this trained tiny decoder (default: the bundled one when "
                        "present, else random weights)")
    p.add_argument("--encoder", choices=["vae", "tae"], default="vae",
                   help="skeleton/reference encoder: the exact Wan2.2 VAE or the tiny autoencoder")
    p.add_argument("--clean-pass", choices=["merged", "sequential"], default="merged",
                   help="merged (as served, StepConfig.merge_clean_pass): each block's clean cache pass runs in "
                        "one forward with the next block's first denoising pass; sequential: in turn")
    p.add_argument("--steps", type=int, default=None,
                   help="denoising passes per block (default: the served student's, SERVING_STEPS.num_steps = 4)")
    p.add_argument("--ab", choices=["merge", "fp8-static", "working-cache", "decoder", "steps"], default=None,
                   help="time two variants in one process, taking turns chunk by chunk: 'merge' = without / "
                        "with the merged clean pass; 'fp8-static' (needs --fp8) = per-token / static activation scales; "
                        "'working-cache' = every pass copying the cache / one working copy per block; 'decoder' = "
                        "the VAE's decoder / the tiny decoder (--decoder tae's); 'steps' = the served passes per block / "
                        "--steps passes")
    p.add_argument("--precompile", action="store_true",
                   help="StreamingSession.compile() before start (reported as precompile_s: every program "
                        "compiled and run once on zeros): the first blocks then neither compile nor load anything")
    p.add_argument("--conv-tiles", choices=sorted(TILE_PRESETS), default=None,
                   help="VAE kernel convs: this conv_kernel.TILE_PRESETS entry instead of KernelConv's SERVING_TILES")
    p.add_argument("--breakdown", action="store_true",
                   help="also time the skeleton render, the block's encode and decode alone (the rest of a block: "
                        "the DiT)")
    p.add_argument("--out", default="bench/results/stream.json")
    a = p.parse_args()
    if a.conv_tiles and not (a.vae_conv or "").startswith("kernel"):
        p.error("--conv-tiles needs --vae-conv kernel_fp8 (or kernel_bf16)")
    if a.ab == "fp8-static":
        if not a.fp8:
            p.error("--ab fp8-static needs --fp8")
        a.fp8_activations = "static"
    if a.ab == "decoder":
        if "--decoder" in sys.argv:
            p.error("--ab decoder times both decoders; leave out --decoder")
        a.decoder = "tae"  # builds the tiny decoder; the VAE's is the baseline
    if a.ab == "steps" and a.steps is None:
        p.error("--ab steps times the served passes per block against --steps N: give --steps")
    if a.steps is not None and a.steps < 1:
        p.error("--steps must be ≥ 1")
    if a.ab == "merge" and "--clean-pass" in sys.argv:
        p.error("--ab merge times both clean passes; leave out --clean-pass")
    if a.tiny and a.synthetic:
        p.error("--tiny or --synthetic, not both")
    if a.synthetic and a.encoder == "tae":
        p.error("--encoder tae: the synthetic autoencoder has a tiny decoder only")
    if a.tae_weights is not None and not (a.synthetic and a.decoder == "tae"):
        p.error("--tae-weights needs --synthetic --decoder tae")
    if a.tae_weights is not None and not os.path.isdir(a.tae_weights):
        p.error(f"--tae-weights {a.tae_weights}: no such directory")
    a.height = a.height or (128 if a.synthetic else 480)
    a.width = a.width or (224 if a.synthetic else 832)
    if a.chunks <= a.warm_chunks:
        p.error("--chunks must exceed --warm-chunks (nothing left to time)")
    if a.fp8_activations != "per_token" and not a.fp8:
        p.error("--fp8-activations needs --fp8")
    if a.vae_fp8_static and a.vae_conv not in ("kernel_fp8", "emulate_fp8"):
        p.error("--vae-fp8-static needs --vae-conv kernel_fp8 (or emulate_fp8)")

    import jax
    import jax.numpy as jnp
    import numpy as np

    from rynn_jax.kernels import vae_conv
    from rynn_jax.models.causal import CausalConfig
    from rynn_jax.models.dit import WanDiTConfig, init_dit
    from rynn_jax.models.vae import WanVAEConfig, init_vae
    from rynn_jax.render import RenderConfig, default_intrinsics, render_video_unchecked, synthetic_hand_motion
    from rynn_jax.serving.block_step import SERVING_STEPS
    from rynn_jax.serving.session import BlockFrames, StreamingSession

    cache_entries_at_start = None
    if a.compile_cache:
        from rynn_jax import compile_cache

        cache_entries_at_start = compile_cache.entries(a.compile_cache)
        compile_cache.enable(a.compile_cache)
        print(f"compilation cache {a.compile_cache}: {cache_entries_at_start} entries at start", flush=True)

    dtype = a.dtype or ("float32" if a.tiny else "bfloat16")
    if a.synthetic:  # float32 master weights as exported, `dtype` compute (the bundled config: bfloat16)
        from configs import synthetic
        from rynn_jax import converted_weights
        from rynn_jax.serving import student as student_lib

        vae_cfg = WanVAEConfig.synthetic(z_dim=synthetic.LATENT_CHANNELS, dtype=dtype)
        if (found := student_lib.find_bundled()) is not None:  # the bundled autoencoder's architecture (widths included)
            saved = converted_weights.load_config(found.autoencoder, WanVAEConfig)
            vae_cfg = dataclasses.replace(saved, dtype=dtype, param_dtype=vae_cfg.param_dtype)
        dit_cfg = synthetic.teacher_model(dtype=dtype, token_multiple=a.token_multiple)
    elif a.tiny:
        vae_cfg = WanVAEConfig.tiny()
        dit_cfg = WanDiTConfig.tiny(control="add-plus", in_channels=4, out_channels=4, control_channels=4,
                                    token_multiple=a.token_multiple)
    else:
        vae_cfg = WanVAEConfig.wan22(dtype=dtype, param_dtype=dtype)
        dit_cfg = WanDiTConfig.ti2v_5b(control="add-plus", dtype=dtype, param_dtype=dtype, token_multiple=a.token_multiple)
    if a.vae_conv is not None:
        tiles = {} if a.conv_tiles is None else {"tiles": TILE_PRESETS[a.conv_tiles]}
        vae_cfg = vae_conv.configure(vae_cfg, a.vae_conv, **tiles)
    dit, vae = init_dit(dit_cfg, 0), init_vae(vae_cfg, 0)
    vae_calibration = None
    if a.vae_fp8_static:
        vae, vae_calibration = calibrate_vae_static(vae, a.height, a.width)
        vae_cfg = vae.cfg
    tiny_ae, tae_source = None, None
    if a.synthetic and a.decoder == "tae":
        tiny_ae, tae_source = synthetic_tiny_decoder(a.tae_weights, dtype)
    elif "tae" in (a.encoder, a.decoder):
        from rynn_jax.models.tae import TAEConfig, init_tae

        tiny_ae = init_tae(TAEConfig.tiny(dtype=dtype) if a.tiny else TAEConfig.wan22(dtype=dtype), 0)
    results, checks, fp8_calibration = [], Checks(), None
    if a.fp8:
        from rynn_jax.models.fp8 import quantize_dit

        dit_float, dit = dit, quantize_dit(dit)
        if a.fp8_activations == "static":
            stride = vae_cfg.spatial_stride
            latent_shape = (1, CausalConfig().frames_per_block, a.height // stride, a.width // stride,
                            dit_cfg.in_channels)
            ctx = jnp.zeros((1, dit_cfg.text_len, dit_cfg.text_dim), jnp.float32)  # as served below
            dit_per_token = dit
            dit, fp8_calibration = calibrate_static(dit_float, dit, latent_shape, ctx, checks)
            if a.ab != "fp8-static":
                del dit_per_token
        del dit_float
    rcfg = RenderConfig(width=a.width, height=a.height)
    k = default_intrinsics(rcfg)
    joints, elbows = synthetic_hand_motion(1 + 80 * a.chunks, seed=0)

    @functools.partial(jax.jit, static_argnums=2)
    def render(joints_n2213, elbows_n23, b: int):  # → (b, n, H, W, 3) in [-1, 1], one skeleton for all sessions
        valid = jnp.ones(joints_n2213.shape[:1] + (2, 22), bool)
        frames = render_video_unchecked(rcfg, joints_n2213, elbows_n23, k, valid) * 2 - 1
        return jnp.broadcast_to(frames[None], (b, *frames.shape))

    decoder = tiny_ae if a.decoder == "tae" else vae

    def make_session(model, merge: bool, working_cache: bool = True, decoder=decoder, num_steps=a.steps):
        scfg = dataclasses.replace(SERVING_STEPS, merge_clean_pass=merge, working_cache=working_cache,
                                   num_steps=num_steps or SERVING_STEPS.num_steps)
        return StreamingSession(model, vae, CausalConfig(), scfg,
                                unroll_layers=not a.no_unroll, encoder=tiny_ae if a.encoder == "tae" else None,
                                decoder=decoder)

    merged = a.clean_pass == "merged"
    variants = {"": (dit, merged)}  # name → (DiT, merge_clean_pass)
    if a.ab == "merge":
        variants = {"sequential clean pass": (dit, False), "merged clean pass": (dit, True)}
    elif a.ab == "working-cache":
        variants = {"cache copied every pass": (dit, merged, False), "working cache per block": (dit, merged, True)}
    elif a.ab == "decoder":
        variants = {"vae decoder": (dit, merged, True, vae), "tiny decoder": (dit, merged, True, tiny_ae)}
    elif a.ab == "steps":
        variants = {f"{SERVING_STEPS.num_steps} steps": (dit, merged, True, decoder, SERVING_STEPS.num_steps),
                    f"{a.steps} steps": (dit, merged, True, decoder, a.steps)}
    elif a.ab == "fp8-static":
        variants = {"fp8 per-token scales": (dit_per_token, merged),
                    "fp8 static scales": (dit, merged)}
    for b in a.batch:
        image = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (b, a.height, a.width, 3)), jnp.float32)
        ctx = jnp.zeros((b, dit_cfg.text_len, dit_cfg.text_dim), jnp.float32)
        sessions = {name: make_session(*v) for name, v in variants.items()}
        # The render stands in for the operator's side: compiled for every block length (the session's
        # first block, later blocks, a re-anchored chunk's first block) before any clock starts, so the
        # block times are the session's own.
        for n in sorted(set(dataclasses.astuple(BlockFrames.of(CausalConfig().frames_per_block)))):
            render(jnp.asarray(joints[:n]), jnp.asarray(elbows[:n]), b).block_until_ready()
        precompile_s = {}
        if a.precompile:  # every program compiled before the session starts, as a server at boot
            for name, session in sessions.items():
                t0 = time.perf_counter()
                session.compile(image.shape, ctx.shape)
                precompile_s[name] = time.perf_counter() - t0
                print(f"B={b}{' ' + name if name else ''}: compiled ahead and run once in {precompile_s[name]:.1f} s", flush=True)
        if a.ab:
            out = run_ab(sessions, render, joints, elbows, image, ctx, a.chunks, a.warm_chunks)
        else:
            out = {"": run_session(sessions[""], render, joints, elbows, image, ctx, a.chunks, a.warm_chunks)}
        if a.ab in ("merge", "working-cache"):  # same weights, seeds and inputs: the same frames up to rounding
            (name_a, (rgb_a, _)), (name_b, (rgb_b, _)) = out.items()
            checks.close(f"B={b} {name_b} vs {name_a}: last block's frames", rgb_b, rgb_a, 1e-1)
        # the codecs are every variant's (timed once per batch size), but for --ab decoder's decoders
        decoders = {name: v[3] for name, v in variants.items()} if a.ab == "decoder" else {name: decoder for name in out}
        parts_of = {} if not a.breakdown else {id(d): breakdown(
            render, joints, elbows, tiny_ae if a.encoder == "tae" else vae, d,
            b, a.height, a.width, CausalConfig().frames_per_block, dit_cfg.in_channels, vae_cfg.spatial_stride)
            for d in {id(d): d for d in decoders.values()}.values()}
        for name, (last_rgb, res) in out.items():
            parts = parts_of.get(id(decoders[name]))
            checks.finite(f"B={b}{' ' + name if name else ''}: last block's frames", last_rgb)
            res["compile_cache_entries_at_start"] = cache_entries_at_start
            if name in precompile_s:
                res["precompile_s"] = precompile_s[name]
            if name:
                res["variant"] = name
            if parts is not None:
                res["breakdown"] = {**parts, "dit_and_rest_ms": res["median_block_ms"] - sum(parts.values())}
                print(f"B={b}: median block {res['median_block_ms']:.1f} ms = " + ", ".join(
                    f"{k[:-3]} {v:.1f}" for k, v in res["breakdown"].items()) + " ms", flush=True)
            results.append(res)
            compiled = "after compiling ahead" if a.precompile else "includes compilation"
            print(f"B={b}{' ' + name if name else ''}: time to first frame {res['time_to_first_frame_s']:.2f} s "
                  f"({compiled}); steady {res['steady_ms_per_frame']:.2f} ms per output frame = "
                  f"{res['steady_fps']:.1f} FPS aggregate, {res['steady_fps'] / b:.1f} per session "
                  f"(median block {res['median_block_ms']:.1f} ms)", flush=True)
        del sessions
        _write(a.out, results, a, vae_cfg, dtype, checks, fp8_calibration, vae_calibration, tae_source)  # a cut run keeps its rows

    print("\n| sessions | variant | aggregate FPS | FPS per session | ms per frame | median block ms | first frame s |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['batch']} | {r.get('variant', '-')} | {r['steady_fps']:.1f} | {r['steady_fps'] / r['batch']:.1f} | "
              f"{r['steady_ms_per_frame']:.2f} | {r['median_block_ms']:.1f} | {r['time_to_first_frame_s']:.1f} |")
    checks.exit_if_failed()


if __name__ == "__main__":
    main()
