"""CLI: an official Wan-family checkpoint → a rynn-jax model directory (orbax params + config.json).

    python -m rynn_jax.convert {dit,vae} SRC OUT [--config NAME] [--dtype bfloat16]

The architecture comes from the checkpoint's own config.json (`checkpoint_dit_config`,
`checkpoint_vae_config`) unless a preset is named; the name maps live beside each model
(`models/dit_weights.py`, `models/vae_weights.py`), the engine in `rynn_jax.weights`.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rynn_jax import checkpoints
from rynn_jax.models.dit import WanDiTConfig
from rynn_jax.models.dit_weights import checkpoint_dit_config, load_dit_checkpoint
from rynn_jax.models.vae import WanVAEConfig
from rynn_jax.models.vae_weights import checkpoint_vae_config, load_vae_checkpoint
from rynn_jax.weights import flatten_params


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rynn_jax.convert",
        description="Convert an official Wan-family checkpoint (original or diffusers layout; the architecture "
        "from its config.json) into a rynn-jax model directory (orbax params + config.json).")
    parser.add_argument("model", choices=["dit", "vae"])
    parser.add_argument("src", help="safetensors file, *.index.json, directory, or diffusers pipeline dir "
                        "(also Wan2.2_VAE.pth for the VAE)")
    parser.add_argument("out", help="output directory")
    parser.add_argument("--config", default=None,
                        help="architecture preset: DiT 'ti2v_5b' or 'tiny'; VAE 'wan22' or 'tiny' (default: the "
                        "checkpoint's own config.json, else ti2v_5b / wan22; both given: they must agree)")
    parser.add_argument("--dtype", default=None, help="cast parameters, e.g. bfloat16 (default: keep fp32)")
    args = parser.parse_args(argv)

    if args.model == "dit":
        presets = {"ti2v_5b": WanDiTConfig.ti2v_5b, "tiny": WanDiTConfig.tiny}
        _check_preset(parser, args, presets)
        cfg = checkpoint_dit_config(args.src, presets[args.config]() if args.config else None)
        cfg = dataclasses.replace(cfg, param_dtype=args.dtype) if args.dtype else cfg
        params = load_dit_checkpoint(args.src, cfg, args.dtype)
    else:
        presets = {"wan22": WanVAEConfig.wan22, "tiny": WanVAEConfig.tiny}
        _check_preset(parser, args, presets)
        cfg = checkpoint_vae_config(args.src, presets[args.config]() if args.config else None)
        params = load_vae_checkpoint(args.src, cfg, args.dtype)
    n = sum(int(np.prod(np.shape(v))) for v in flatten_params(params).values())
    checkpoints.save_params(args.out, params, cfg)
    print(f"wrote {args.model} ({n:,} parameters) to {args.out}")


def _check_preset(parser: Any, args: Any, presets: Mapping[str, Any]) -> None:
    if args.config is not None and args.config not in presets:
        parser.error(f"--config {args.config!r}: the {args.model} presets are {', '.join(sorted(presets))}")


if __name__ == "__main__":
    main()
