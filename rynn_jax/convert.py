"""CLI: an official Wan-family checkpoint → a rynn-jax model directory (orbax params + config.json).

    python -m rynn_jax.convert {dit,vae} SRC OUT [--config NAME] [--dtype bfloat16] [--control add-plus]

The architecture comes from the checkpoint's own config.json (`checkpoint_dit_config`,
`checkpoint_vae_config`) unless a preset is named; the name maps live beside each model
(`models/dit_weights.py`, `models/vae_weights.py`), the engine in `rynn_jax.weights`.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Sequence

import numpy as np

from rynn_jax import converted_weights, errors
from rynn_jax.atomic import atomic_dir
from rynn_jax.models import control
from rynn_jax.models.dit import WanDiTConfig
from rynn_jax.models.dit_weights import checkpoint_dit_config, load_dit_checkpoint
from rynn_jax.models.vae import WanVAEConfig
from rynn_jax.models.vae_weights import checkpoint_vae_config, load_vae_checkpoint
from rynn_jax.weights import flatten_params


def main(argv: Sequence[str] | None = None) -> None:
    parser = errors.ArgumentParser(
        prog="python -m rynn_jax.convert",
        description="Convert an official Wan-family checkpoint (original or diffusers layout; the architecture "
        "from its config.json) into a rynn-jax model directory (orbax params + config.json).",
        epilog="examples:\n"
        "  python -m rynn_jax.convert dit /ckpt/Wan2.2-TI2V-5B-Diffusers weights/dit --dtype bfloat16\n"
        "  python -m rynn_jax.convert vae /ckpt/Wan2.2-TI2V-5B/Wan2.2_VAE.pth weights/vae")
    parser.add_argument("model", choices=["dit", "vae"], help="which network")
    parser.add_argument("src", help="safetensors file, *.index.json, directory, or diffusers pipeline dir "
                        "(also Wan2.2_VAE.pth for the VAE)")
    parser.add_argument("out", help="output directory (written whole or not at all)")
    parser.add_argument("--config", default=None,
                        help="architecture preset: DiT 'ti2v_5b' or 'tiny'; VAE 'wan22' or 'tiny' (default: the "
                        "checkpoint's own config.json, else ti2v_5b / wan22; both given: they must agree)")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                        help="cast parameters (default: keep fp32)")
    parser.add_argument("--control", default="none", choices=["none", "add", "add-plus", "concat"],
                        help="DiT: the checkpoint's control branch (RynnWorld-Teleop releases: add or add-plus)")
    parser.add_argument("--control-stats", default=None, metavar="JSON",
                        help="DiT, add-plus: the control statistics record to keep beside the weights")
    args = parser.parse_args(argv)
    if args.model != "dit" and (args.control != "none" or args.control_stats):
        raise errors.UsageError("--control / --control-stats: apply to the DiT only")
    presets = ("ti2v_5b", "tiny") if args.model == "dit" else ("wan22", "tiny")
    if args.config is not None and args.config not in presets:
        raise errors.UsageError(f"--config {args.config}: not a {args.model} preset", fix=f"choose from {', '.join(presets)}")
    errors.existing(args.src, "src")
    if args.control_stats:
        errors.existing(args.control_stats, "--control-stats", kind="file")
    errors.writable_dir(args.out, "out")

    stats = None
    if args.model == "dit":
        preset = getattr(WanDiTConfig, args.config)(control=args.control) if args.config else None
        cfg = checkpoint_dit_config(args.src, preset)
        cfg = dataclasses.replace(cfg, control=args.control)  # config.json does not describe our branch
        cfg = dataclasses.replace(cfg, param_dtype=args.dtype) if args.dtype else cfg
        if args.control_stats:  # read (and checked) before anything is written
            try:
                stats = control.read_stats(args.control_stats, cfg)
            except ValueError as e:
                raise errors.UsageError(f"--control-stats {args.control_stats}: {e}") from None
        params = load_dit_checkpoint(args.src, cfg, args.dtype)
    else:
        cfg = checkpoint_vae_config(args.src, getattr(WanVAEConfig, args.config)() if args.config else None)
        params = load_vae_checkpoint(args.src, cfg, args.dtype)
    n = sum(int(np.prod(np.shape(v))) for v in flatten_params(params).values())
    with atomic_dir(args.out) as tmp:  # a cut conversion never looks like a finished one
        converted_weights.save_params(tmp, params, cfg)
        if stats is not None:
            control.write_stats(os.path.join(tmp, control.STATS_FILE), stats, cfg)
    print(f"wrote {args.model} ({n:,} parameters) to {args.out}")


if __name__ == "__main__":
    sys.exit(errors.run(main))
