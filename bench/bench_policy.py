"""Latency of one policy control step (observation → a chunk of 10 × 54 joint targets), the
jitted `LoadedPolicy.predict` the closed loop calls, on the default device:

    python bench/bench_policy.py --size full --out bench/results/policy_h200.json     # one H200
    python bench/bench_policy.py --size full --fp8 --out bench/results/policy_fp8_h200.json   # + FP8 backbone
    python bench/bench_policy.py --size full --fp8-static --out ...   # + FP8, static activation scales
    python bench/bench_policy.py --size full --fp8-static --fp8-attention --out ...   # + FP8 attention
    python bench/bench_policy.py --size full --fp8-static --fp8-attention --scanned --out ...   # + layer-scan rows
    python bench/bench_policy.py --size cnn cnn_cpu tiny --out bench/results/policy_cpu.json   # CPU

Sizes: `full` = SPEC size with the 4D backbone (5B-size branches to block 15 at t = 500, random
bf16 weights: `backbone.dit/vae = "random"`; the Wan2.2 VAE encodes the observation), the Flow
Former and the head's 4 Euler steps; `rgb` the same with the RGB-branch features only; `cnn` the
from-scratch CNN policy at SPEC size; `cnn_cpu` the CNN recipe trained on the CPU
(configs/policy_cnn_cpu.py); `synthetic` / `synthetic_cnn` the synthetic world's policy recipe
(configs/policy_world4d_synthetic.py, rows (a) / (c): the trained small 4D model from
`--synthetic-dit`, the committed autoencoder; head weights random, which does not change the
time); `tiny` the toy 4D policy of the tests. Batch 1 (one robot).
Per size: the whole step, and the vision encoder alone (for the 4D sizes: VAE + feature pass),
medians over `--iters` calls after a warm-up (compile excluded). The paper: 1,106 ms per chunk on
an RTX 5090 in FP8; the goal is ≥ 5 chunks/s on one H200 at full size.

`--fp8` adds, for each 4D size, a row with the backbone's block linears as FP8 GEMMs
(`backbone.fp8`, models/fp8.quantize_dit: per-channel weight and per-token activation scales; the
joint attention and the VAE unchanged), compiled with cuBLASLt FP8 GEMMs rather than Triton ones;
`--fp8-static` a row with static activation scales (what `backbone.fp8_scales` loads: calibrated
by `World4DFeatures.calibrate_fp8` on two random observations other than the timed one, on the
row's own backbone, so the full-size backbone is built once per row); `--fp8-attention` a row with
those and the backbone's attention as cuDNN's FP8 flash attention (`backbone.fp8_attention`;
Hopper GPU).

The 4D backbone runs in its serving layout (`backbone.unrolled`, models/dit4d.unrolled4d: per-layer
weights, the joint attention placed statically); `--scanned` adds the bf16 row and the last FP8 row
with the stacked layer scan instead (row names ending in /scan), in the same run.

Checks: the chunk has shape (1, 10, 54) and is finite; the same key gives the same chunk; an FP8
row's vision features are within 15 % (relative L2; 20 % with FP8 attention) of the bf16 row's on
the same input; a /scan row's within 2 % of its serving-layout twin's.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import Checks, time_ms, write_json  # noqa: E402

SIZES = ("full", "rgb", "cnn", "cnn_cpu", "synthetic", "synthetic_cnn", "tiny")
FP8_SIZES = ("full", "rgb", "synthetic", "tiny")  # the 4D sizes
SYNTHETIC_DIT = "weights/synthetic/world4d_stage3"  # --synthetic-dit: the synthetic 4D model's stage-3 export


def policy_config(size: str, fp8: bool = False, synthetic_dit: str = SYNTHETIC_DIT, fp8_attention: bool = False):
    from rynn_jax.policy.config import BackboneConfig, PolicyConfig

    if size.startswith("synthetic"):  # the synthetic world's recipe (rows (a) / (c) of its table)
        from rynn_jax.policy.train import PolicyTrainConfig
        from rynn_jax.training.config import run_recipe

        cfg = run_recipe(os.path.join(ROOT, "configs", "policy_world4d_synthetic.py"), PolicyTrainConfig,
                         "cnn" if size == "synthetic_cnn" else "world4d").policy
        return dataclasses.replace(cfg, backbone=dataclasses.replace(
            cfg.backbone, dit=synthetic_dit, vae=os.path.join(ROOT, "weights", "synthetic", "autoencoder"), fp8=fp8,
            fp8_attention=fp8_attention))

    if size in ("full", "rgb"):
        return PolicyConfig.full("world4d" if size == "full" else "world4d_rgb",
                                 backbone=BackboneConfig(dit="random", vae="random", fp8=fp8,
                                                         fp8_attention=fp8_attention))
    if size == "cnn":
        return PolicyConfig.full("cnn")
    if size == "cnn_cpu":  # the recipe the project's CPU trains: its policy config, read from the recipe
        from rynn_jax.policy.train import PolicyTrainConfig
        from rynn_jax.training.config import run_recipe

        return run_recipe(os.path.join(ROOT, "configs", "policy_cnn_cpu.py"), PolicyTrainConfig).policy
    cfg = PolicyConfig.tiny("world4d")
    return dataclasses.replace(cfg, backbone=dataclasses.replace(cfg.backbone, fp8=fp8, fp8_attention=fp8_attention))


def observation(cfg, seed: int):
    """A random observation batch of one: RGB, depth image, proprioception, goal tokens."""
    rng = np.random.default_rng(seed)
    h, w = cfg.image_size
    return (rng.integers(0, 256, (1, h, w, 3), dtype=np.uint8), rng.integers(0, 256, (1, h, w, 3), dtype=np.uint8),
            rng.standard_normal((1, 54)).astype(np.float32),
            rng.standard_normal((1, cfg.head.goal_len, cfg.head.goal_dim)).astype(np.float32))


def with_calibrated_scales(pol, cfg):
    """The per-token FP8 policy `pol` with static activation scales calibrated on 2 random
    observations other than the timed one (`World4DFeatures.calibrate_fp8`), on its own backbone."""
    import jax

    from rynn_jax.models import fp8
    from rynn_jax.policy import inference

    batches = []
    for k in (1, 2):
        rgb, depth, _, goal = observation(cfg, k)
        batches.append((rgb, depth, goal, jax.random.key(k)))
    enc = pol.encoder.with_static_scales(fp8.static_scales(pol.encoder.calibrate_fp8(batches)))
    return inference.LoadedPolicy(enc.cfg, pol.graphdef, pol.params, enc, pol.normalizer)


def bench(size: str, iters: int, checks: Checks, fp8: bool = False, ref_features: np.ndarray | None = None,
          static: bool = False, synthetic_dit: str = SYNTHETIC_DIT, fp8_attention: bool = False,
          unrolled: bool = True) -> tuple[dict, np.ndarray]:
    """One row, and the vision features of the benched input (the FP8 rows are checked against the
    bf16 row's, a scanned row against its unrolled twin). `static`: FP8 with static activation
    scales (needs fp8); `fp8_attention`: and cuDNN FP8 attention; `unrolled=False`: the backbone's
    stacked layer scan instead of the serving layout (`backbone.unrolled`)."""
    import jax

    from rynn_jax.policy import inference, model
    from rynn_jax.policy.normalize import ActionNormalizer

    cfg = policy_config(size, fp8, synthetic_dit, fp8_attention)
    if cfg.encoder != "cnn":
        cfg = dataclasses.replace(cfg, backbone=dataclasses.replace(cfg.backbone, unrolled=unrolled))
    name = (((f"{size}+fp8s" if static else f"{size}+fp8") if fp8 else size) + ("a" if fp8_attention else "")
            + ("" if unrolled else "/scan"))
    t0 = time.perf_counter()
    pol = inference.from_params(cfg, None, ActionNormalizer(np.zeros(54, np.float32), np.ones(54, np.float32)))
    if static:
        pol = with_calibrated_scales(pol, cfg)
    build_s = time.perf_counter() - t0
    h, w = cfg.image_size
    rgb, depth, state, goal = observation(cfg, 0)
    key = jax.random.key(0)

    t0 = time.perf_counter()
    chunk = pol.predict(rgb, depth, state, goal, key)
    compile_s = time.perf_counter() - t0
    checks.finite(f"{name}: chunk", chunk)
    checks.rows.append(dict(check=f"{name}: chunk shape (1, {cfg.head.chunk}, {cfg.head.action_dim})",
                            ok=chunk.shape == (1, cfg.head.chunk, cfg.head.action_dim)))
    again = pol.predict(rgb, depth, state, goal, key)
    checks.rows.append(dict(check=f"{name}: same key, same chunk", ok=bool(np.array_equal(chunk, again))))

    step_ms = statistics.median(time_ms(lambda: pol.predict(rgb, depth, state, goal, key), 1, iters))
    enc = pol.encoder
    vision = jax.jit(enc.apply)
    args = (enc.params, jax.numpy.asarray(rgb), jax.numpy.asarray(depth), jax.numpy.asarray(goal), key)
    vision_ms = statistics.median(time_ms(lambda: jax.block_until_ready(vision(*args)), 1, iters))
    features = np.asarray(vision(*args), np.float32)
    extra = {}
    if hasattr(enc, "latents"):  # the 4D encoders: the observation's VAE encode (+ noise) alone
        latents = jax.jit(enc.latents)
        largs = (enc.params, *args[1:3], key)
        extra["encode_ms"] = statistics.median(time_ms(lambda: jax.block_until_ready(latents(*largs)), 1, iters))
    if ref_features is not None:  # FP8 GEMMs move the features a little, never a lot; the layout not at all
        err = float(np.linalg.norm(features - ref_features) / np.linalg.norm(ref_features))
        if not unrolled:
            checks.rows.append(dict(check=f"{name}: features within 2 % of the serving layout's (rel L2 {err:.3f})",
                                    ok=err <= 0.02))
        else:
            limit = 0.2 if fp8_attention else 0.15
            checks.rows.append(dict(check=f"{name}: features within {limit * 100:.0f} % of bf16 (rel L2 {err:.3f})",
                                    ok=0 < err <= limit))
        extra["features_rel_l2_vs_bf16"] = err
    return {"size": name, "encoder": cfg.encoder, "image_size": [h, w], "trainable_params": model.count_params(cfg),
            "build_s": round(build_s, 1), "first_call_s": round(compile_s, 1), "step_ms": step_ms,
            "vision_ms": vision_ms, "head_and_rest_ms": step_ms - vision_ms, "chunks_per_s": 1e3 / step_ms,
            "actions_per_s": 1e3 / step_ms * cfg.head.chunk, **extra}, features


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", nargs="+", choices=SIZES, default=["full"])
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--fp8", action="store_true",
                   help="also time each 4D size (full, rgb, synthetic, tiny) with the block linears as FP8 GEMMs")
    p.add_argument("--fp8-static", action="store_true",
                   help="and with static activation scales calibrated on 2 other random observations")
    p.add_argument("--fp8-attention", action="store_true",
                   help="and with cuDNN FP8 attention on top of the static FP8 linears (Hopper GPU)")
    p.add_argument("--scanned", action="store_true",
                   help="4D sizes: also the bf16 row and the last FP8 row with the backbone's stacked layer scan "
                        "(backbone.unrolled=False), beside the serving layout")
    p.add_argument("--synthetic-dit", default=SYNTHETIC_DIT,
                   help="the synthetic RynnWorld-4D export the 'synthetic' size reads (not committed: a lease brings it)")
    p.add_argument("--out", default="")
    a = p.parse_args()
    if "synthetic" in a.size and not os.path.isdir(a.synthetic_dit):
        p.error(f"--synthetic-dit {a.synthetic_dit}: no such directory (the synthetic RynnWorld-4D stage-3 export)")
    # cuBLASLt FP8 GEMMs, not one autotuned Triton kernel per linear (models/fp8.py)
    if a.fp8 or a.fp8_static or a.fp8_attention:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_triton_gemm=false").strip()
    import jax

    if a.fp8_attention and jax.default_backend() != "gpu":
        p.error("--fp8-attention needs a GPU (cuDNN FP8 attention, Hopper)")
    checks = Checks()
    rows = []
    dev = jax.devices()[0]
    # each row is printed as it finishes: a run stopped by a time limit still reports what it timed
    print(f"\npolicy control step, batch 1, {dev.device_kind} ({dev.platform})")
    print("| size | encoder | image | trainable params | step ms | vision ms | of which VAE encode ms | "
          "head + rest ms | chunks/s |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)

    def add(row: dict) -> None:
        rows.append(row)
        encode = f"{row['encode_ms']:.1f}" if "encode_ms" in row else "–"
        print(f"| {row['size']} | {row['encoder']} | {row['image_size'][0]}×{row['image_size'][1]} | "
              f"{row['trainable_params'] / 1e6:.1f}M | {row['step_ms']:.1f} | {row['vision_ms']:.1f} | {encode} | "
              f"{row['head_and_rest_ms']:.1f} | {row['chunks_per_s']:.2f} |", flush=True)

    for s in a.size:
        row, features = bench(s, a.iters, checks, synthetic_dit=a.synthetic_dit)
        add(row)
        scanned = a.scanned and s in FP8_SIZES
        if scanned:
            add(bench(s, a.iters, checks, ref_features=features, synthetic_dit=a.synthetic_dit, unrolled=False)[0])
        last = None  # the last FP8 variant timed: its scanned twin follows it
        if a.fp8 and s in FP8_SIZES:
            last = dict(fp8=True)
            row8, feats8 = bench(s, a.iters, checks, ref_features=features, synthetic_dit=a.synthetic_dit, **last)
            add(row8)
        if a.fp8_static and s in FP8_SIZES:
            last = dict(fp8=True, static=True)
            row8, feats8 = bench(s, a.iters, checks, ref_features=features, synthetic_dit=a.synthetic_dit, **last)
            add(row8)
        if a.fp8_attention and s in FP8_SIZES:
            last = dict(fp8=True, static=True, fp8_attention=True)
            row8, feats8 = bench(s, a.iters, checks, ref_features=features, synthetic_dit=a.synthetic_dit, **last)
            add(row8)
        if scanned and last is not None:
            add(bench(s, a.iters, checks, ref_features=feats8, synthetic_dit=a.synthetic_dit, unrolled=False,
                      **last)[0])
        del features
    if a.out:
        write_json(a.out, {"device": dev.device_kind, "platform": dev.platform, "rows": rows, "checks": checks.rows})
    checks.exit_if_failed()


if __name__ == "__main__":
    main()
