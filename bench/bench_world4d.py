"""Latency of RynnWorld-4D (models/dit4d.py; random weights, bf16): the full three-branch forward
and the policy's backbone feature pass (blocks 0–15 at t = 500, features of all branches).

    python bench/bench_world4d.py --out bench/results/world4d.json          # one H200
    python bench/bench_world4d.py --small                                  # CPU check of the script
    python bench/bench_world4d.py --fp8 --out ...      # + the same passes with FP8 block linears, side by side
    python bench/bench_world4d.py --fp8 --fp8-static --out ...   # + FP8 with calibrated static activation scales
    python bench/bench_world4d.py --fp8-static --fp8-attention --out ...   # + cuDNN FP8 attention (Hopper)

Full size: 480×640 video, 81 frames → latents (21, 30, 40), 3 × 6,300 tokens; text 226 slots for
the forward (the release pads prompts to 226), the first 32 for the feature pass (as the policy
reads them). JA at blocks 0, 3, …, 27, within frames, RoPE on, bidirectional. Checks: outputs
finite, features of the right shape, and the feature pass equal to the same blocks run by the
forward's code (`WanDiT4D.hidden` with num_layers = 16). `--fp8` adds both passes with the three branches'
block linears as FP8 GEMMs (`models/fp8.quantize_dit`, the policy's `backbone.fp8`), timed in the same
run, and checks their features within 10 % relative L2 of the bf16 ones. `--fp8-attention` adds the
passes with cuDNN's FP8 flash attention (`attention="cudnn_fp8"`, models/fp8_attention.py) on bf16
linears, and with `--fp8-static` on the static FP8 linears too (checked within 15 %). `--unrolled`
adds the feature pass in the serving layout the policy runs (`dit4d.unrolled4d`: per-layer weights,
joint attention placed statically, blocks past the cut dropped) for bf16, checked within 2 % of the
stacked scan, and for the last FP8 variant, checked like that variant against bf16 (FP8 re-quantizes
every layer's activations, so the layouts' GEMM rounding differences grow to FP8's own error; the
distance to the FP8 scan is reported).

    python bench/bench_world4d.py --fp8-static --fp8-attention --unrolled --out ...   # + serving layout
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import time_ms, write_json  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true", help="toy model and sizes (a CPU check of the script)")
    parser.add_argument("--attention", default="auto", choices=["auto", "xla", "cudnn"])
    parser.add_argument("--feature-layer", type=int, default=15, help="the policy's feature block (0-based)")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--fp8", action="store_true", help="also time both passes with FP8 block linears")
    parser.add_argument("--fp8-static", action="store_true",
                        help="and with static activation scales calibrated on 2 fresh inputs like the timed one")
    parser.add_argument("--fp8-attention", action="store_true",
                        help="also with cuDNN FP8 attention (Hopper GPU; with --fp8-static also on static FP8 linears)")
    parser.add_argument("--unrolled", action="store_true",
                        help="also the feature pass in the serving layout (dit4d.unrolled4d, the policy's default) "
                             "of bf16 and of the last FP8 variant")
    parser.add_argument("--out", default="", help="results JSON")
    args = parser.parse_args()
    if args.fp8_attention and args.small:
        parser.error("--fp8-attention: cuDNN's FP8 attention needs the GPU sizes (not --small)")

    import jax
    import jax.numpy as jnp
    import numpy as np

    if args.fp8_attention and jax.default_backend() != "gpu":
        parser.error("--fp8-attention needs a GPU (cuDNN FP8 attention, Hopper)")

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from rynn_jax.models.dit import WanDiTConfig
    from rynn_jax.models.dit4d import WanDiT4DConfig, init_dit4d
    from rynn_jax.models.dit4d_weights import param_count

    if args.small:
        cfg = WanDiT4DConfig.tiny(base=WanDiTConfig.tiny(num_layers=3, eps=1e-5, attention=args.attention))
        shape, text_len, feature_layer = (3, 4, 4), 16, 1
    else:
        cfg = WanDiT4DConfig.full(base=WanDiTConfig.ti2v_5b(eps=1e-5, dtype="bfloat16", param_dtype="bfloat16",
                                                           attention=args.attention))
        shape, text_len, feature_layer = (21, 30, 40), 226, args.feature_layer
    model = init_dit4d(cfg, seed=0)
    b = cfg.base
    key = jax.random.key(1)
    z = [jax.random.normal(jax.random.fold_in(key, i), (1, *shape, b.in_channels), jnp.float32) for i in range(3)]
    t = jnp.full((1, shape[0]), 500.0, jnp.float32).at[:, 0].set(0.0)
    ctx = jax.random.normal(jax.random.fold_in(key, 9), (1, text_len, b.text_dim), jnp.float32)

    from flax import nnx

    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda s, z, t, ctx: nnx.merge(graphdef, s)(*z, t, ctx))
    features = jax.jit(lambda s, z, t, ctx: nnx.merge(graphdef, s).features(z, t, ctx, layer=feature_layer))
    ctx_policy = ctx[:, :32]

    block = lambda out: jax.block_until_ready(out)  # noqa: E731
    rows, checks = {}, {}
    out = block(forward(state, z, t, ctx))
    checks["forward_finite"] = bool(all(np.isfinite(np.asarray(o, np.float32)).all() for o in out))
    rows["forward_ms"] = statistics.median(time_ms(lambda: block(forward(state, z, t, ctx)), 2, args.iters))
    f = block(features(state, z, t, ctx_policy))
    tokens = shape[0] * (shape[1] // 2) * (shape[2] // 2)
    checks["features_shape"] = tuple(f.shape) == (1, tokens, 3 * b.dim)
    f32 = np.asarray(f, np.float32)  # the bf16 features on the host once: every check below compares with them
    checks["features_finite"] = bool(np.isfinite(f32).all())
    rows["features_ms"] = statistics.median(time_ms(lambda: block(features(state, z, t, ctx_policy)), 2, args.iters))
    hidden = jax.jit(lambda s, z, t, ctx: jnp.concatenate(
        nnx.merge(graphdef, s).hidden(z, t, ctx, num_layers=feature_layer + 1)[0], -1))
    ref = np.asarray(block(hidden(state, z, t, ctx_policy)), np.float32)
    checks["features_match_hidden"] = bool(np.allclose(f32, ref, rtol=1e-3, atol=1e-3))

    def fp8_rows(prefix: str, variant, tolerance: float = 0.1) -> np.ndarray:
        """Both passes of an FP8 variant, timed and checked against the bf16 features; returns the
        variant's features."""
        graphdef_v, state_v = nnx.split(variant)
        forward_v = jax.jit(lambda s, z, t, ctx: nnx.merge(graphdef_v, s)(*z, t, ctx))
        features_v = jax.jit(lambda s, z, t, ctx: nnx.merge(graphdef_v, s).features(z, t, ctx, layer=feature_layer))
        checks[f"{prefix}_forward_finite"] = bool(all(np.isfinite(np.asarray(o, np.float32)).all()
                                                      for o in block(forward_v(state_v, z, t, ctx))))
        rows[f"{prefix}_forward_ms"] = statistics.median(
            time_ms(lambda: block(forward_v(state_v, z, t, ctx)), 2, args.iters))
        fv = np.asarray(block(features_v(state_v, z, t, ctx_policy)), np.float32)
        rows[f"{prefix}_features_rel_l2"] = float(np.linalg.norm(fv - f32) / np.linalg.norm(f32))
        checks[f"{prefix}_features_close"] = rows[f"{prefix}_features_rel_l2"] <= tolerance
        rows[f"{prefix}_features_ms"] = statistics.median(
            time_ms(lambda: block(features_v(state_v, z, t, ctx_policy)), 2, args.iters))
        return fv

    def unrolled_row(prefix: str, variant, stacked: np.ndarray, tolerance: float | None = None) -> None:
        """The feature pass of `variant` in the serving layout (blocks past the feature cut dropped),
        timed, and compared with the same variant's stacked-scan features `stacked`. bf16 (`tolerance`
        None): within 2 % of them (the fused q/k/v GEMMs round differently on the GPU: ≈ 0.2 %). FP8:
        within the variant's `tolerance` of the bf16 features, like the scan — every layer re-quantizes
        its activations to e4m3, so the layouts' rounding differences grow to the size of FP8's own
        error (≈ 3 % from bf16) and the distance to the scan is only reported."""
        from rynn_jax.models.dit4d import unrolled4d

        graphdef_u, state_u = nnx.split(unrolled4d(variant, num_layers=feature_layer + 1))
        features_u = jax.jit(lambda s, z, t, ctx: nnx.merge(graphdef_u, s).features(z, t, ctx, layer=feature_layer))
        fu = np.asarray(block(features_u(state_u, z, t, ctx_policy)), np.float32)
        rel_l2 = lambda a, b: float(np.linalg.norm(a - b) / np.linalg.norm(b))  # noqa: E731
        rows[f"{prefix}unrolled_features_rel_l2"] = rel_l2(fu, stacked)
        if tolerance is None:
            checks[f"{prefix}unrolled_features_match"] = rows[f"{prefix}unrolled_features_rel_l2"] <= 0.02
        else:
            rows[f"{prefix}unrolled_features_rel_l2_bf16"] = rel_l2(fu, f32)
            checks[f"{prefix}unrolled_features_close"] = rows[f"{prefix}unrolled_features_rel_l2_bf16"] <= tolerance
        rows[f"{prefix}unrolled_features_ms"] = statistics.median(
            time_ms(lambda: block(features_u(state_u, z, t, ctx_policy)), 2, args.iters))
        del state_u

    from rynn_jax.models.fp8 import calibrate, quantize_dit, with_fp8_attention

    if args.unrolled:
        unrolled_row("", model, f32)
    last = None  # the last FP8 variant (prefix, model, features, tolerance): its serving layout is timed at the end
    if args.fp8_attention:
        variant = with_fp8_attention(model)
        last = ("fp8_attention_", variant, fp8_rows("fp8_attention", variant, tolerance=0.15), 0.15)
    if args.fp8 or args.fp8_static:
        q = quantize_dit(model)
        if args.fp8:
            last = ("fp8_", q, fp8_rows("fp8", q), 0.1)
        if args.fp8_static:  # calibrated with the forward (every block) on inputs drawn as the timed ones
            fresh = [[jax.random.normal(jax.random.fold_in(key, 100 + 3 * k + i), z[0].shape, jnp.float32)
                      for i in range(3)] for k in range(2)]
            static = calibrate(q, lambda m, zs: m(*zs, t, ctx), fresh, progress=False)
            last = ("fp8_static_", static, fp8_rows("fp8_static", static), 0.1)
            if args.fp8_attention:
                variant = with_fp8_attention(static)
                last = ("fp8_static_attention_", variant,
                        fp8_rows("fp8_static_attention", variant, tolerance=0.15), 0.15)
    if args.unrolled and last is not None:
        unrolled_row(*last)

    result = {"device": str(jax.devices()[0]), "device_kind": jax.devices()[0].device_kind, "small": args.small,
              "tokens_per_branch": tokens, "params": param_count(cfg), "feature_layer": feature_layer, **rows,
              "checks": checks}
    variants = [p for p in ("fp8", "fp8_static", "fp8_attention", "fp8_static_attention") if f"{p}_forward_ms" in rows]
    print(f"{result['device']}: forward {rows['forward_ms']:.1f} ms, features (blocks 0–{feature_layer}) "
          f"{rows['features_ms']:.1f} ms, {tokens} tokens per branch"
          + "".join(f"; {p}: forward {rows[f'{p}_forward_ms']:.1f} ms, features {rows[f'{p}_features_ms']:.1f} ms "
                    f"(rel. L2 {rows[f'{p}_features_rel_l2']:.3f})" for p in variants)
          + "".join(f"; {k[:-3]} {v:.1f} ms" for k, v in rows.items() if k.endswith("unrolled_features_ms"))
          + f"; checks {checks}")
    if args.out:
        write_json(args.out, result)
    if not all(checks.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
