"""How far an FP8 VAE decoder's frames are from the float32 decoder's (any backend, no timing).

    python bench/fidelity_vae_fp8.py --out bench/results/vae_fp8_fidelity_random_cpu.json  # random weights
    python bench/fidelity_vae_fp8.py --weights Wan2.2_VAE.pth --out ...                   # trained weights

A short clip (the bundled tabletop picture panned sideways) is encoded by the float32 encoder; its
latents are decoded by the float32 decoder (the reference) and by the FP8 decoder as our kernel
computes it (`conv_impl="emulate_fp8"`: the kernel's FP8 rounding and scales, XLA's float32 math),
with per-call activation scales and with static scales calibrated on another clip (panned the other
way). Reported: rel. L2 and PSNR (frames in [-1, 1]) against the reference, and streaming vs
whole-clip decoding of each FP8 decoder (per-call scales differ between the two by design; static
ones only by float rounding differences, which FP8's coarse grid amplifies from layer to layer).
Prints a table, writes JSON; exits non-zero if a decoder's output is not finite.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import Checks, decode_streamed, write_json  # noqa: E402


def panned_clip(frames: int, height: int, width: int, step: int):
    """(1, frames, H, W, 3) in [-1, 1]: the bundled reference picture, shifted `step` px per frame."""
    import numpy as np

    from rynn_jax.teleop.demo import reference_scene

    pad = abs(step) * frames
    img = reference_scene(height, width + pad).astype(np.float32) / 127.5 - 1
    start = 0 if step > 0 else pad
    return np.stack([img[:, start + i * step: start + i * step + width] for i in range(frames)])[None]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weights", help="official Wan2.2 VAE checkpoint or converted dir (default: random weights)")
    p.add_argument("--tiny", action="store_true", help="a small VAE whose decoder convs fit the kernel (tests)")
    p.add_argument("--height", type=int, default=128)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--latents", type=int, default=3, help="latent frames decoded (video: 1 + 4·(n−1) frames)")
    p.add_argument("--out", default="bench/results/vae_fp8_fidelity.json")
    a = p.parse_args()

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from rynn_jax.kernels import vae_conv, vae_fp8
    from rynn_jax.models import vae as V

    if a.weights:
        from rynn_jax.models.vae_weights import load_vae

        model = load_vae(a.weights, dtype=jnp.float32)
    elif a.tiny:
        model = V.init_vae(V.WanVAEConfig.tiny(decoder_base_dim=64, dim_mult=(1, 2, 2), temporal_downsample=(False, True)), 0)
    else:
        model = V.init_vae(V.WanVAEConfig.wan22(), 0)
    cfg = model.cfg
    if cfg.dtype != "float32" or cfg.conv_name != "fold2d":
        model = V.vae_from_params(dataclasses.replace(cfg, dtype="float32", conv_impl="fold2d", kernel_conv=None),
                                  nnx.to_pure_dict(nnx.state(model)))
        cfg = model.cfg
    frames = 1 + cfg.temporal_stride * (a.latents - 1)
    def run_whole(m, method, x):  # weights as arguments: closed over, XLA would embed GBs of constants
        graphdef, params = nnx.split(m)
        return jax.jit(lambda p, x: getattr(nnx.merge(graphdef, p), method)(x, None, True, True)[0])(params, x)

    z = run_whole(model, "encode_frames", panned_clip(frames, a.height, a.width, 2))
    z_calib = run_whole(model, "encode_frames", panned_clip(frames, a.height, a.width, -3))

    def decode_whole(m):
        return run_whole(m, "decode_frames", z)

    def stream(m):
        return decode_streamed(V, *nnx.split(m), z, a.height, a.width)

    ref = decode_whole(model)
    scales = vae_fp8.calibrate(model, vae_fp8.decode_clip, [z_calib])
    variants = {
        "fp8, per-call scales": V.vae_from_params(vae_conv.configure(cfg, "emulate_fp8"),
                                                  nnx.to_pure_dict(nnx.state(model))),
        "fp8, static scales": vae_fp8.with_static_scales(model, scales, conv_impl="emulate_fp8"),
    }
    checks, rows = Checks(), []
    rel = lambda x, y: float(jnp.linalg.norm(x - y) / jnp.linalg.norm(y))  # noqa: E731
    psnr = lambda x, y: float(10 * jnp.log10(4.0 / jnp.mean((x - y) ** 2)))  # noqa: E731 — range 2
    for name, m in variants.items():
        y = decode_whole(m)
        checks.finite(name, y)
        row = dict(decoder=name, rel_l2=rel(y, ref), psnr_db=psnr(y, ref), stream_vs_whole=rel(stream(m), y))
        rows.append(row)
        print(row, flush=True)
    print(f"\n{'decoder':24s} {'rel L2':>9s} {'PSNR dB':>8s} {'stream vs whole':>16s}")
    for r in rows:
        print(f"{r['decoder']:24s} {r['rel_l2']:9.2e} {r['psnr_db']:8.1f} {r['stream_vs_whole']:16.2e}")
    write_json(a.out, dict(rows=rows, checks=checks.rows, argv=sys.argv[1:], weights="given" if a.weights else "random",
                           kernel_convs=len(scales), height=a.height, width=a.width, latents=a.latents))
    checks.exit_if_failed()


if __name__ == "__main__":
    main()
