r"""Exported autoencoders side by side on the same held-out clips, per video and per frame:

    python -m rynn_jax.eval.autoencoders weights/synthetic/autoencoder runs/synthetic/decoder_vae_wide/autoencoder \
        --set "data.heldout_dirs=('data/geo_heldout/*/episode_*',)" --clips 24 --out scores.json

The clips are the autoencoder trainer's held-out clips (`training.autoencoder.evaluate`: fixed
starts, spread over episodes × videos) of the recipe's `data` section — by default
configs/synthetic_ae4d.py:frozen's, i.e. the head-camera RGB and RynnWorld-4D's depth and flow
videos, so a candidate decoder is judged on everything the committed one decodes. Prints a Markdown
table (each video's PSNR, then RGB frame 0, which the encoder sees alone, against the frames by
their position inside a latent) and writes the scores as JSON (`psnr_frames_<video>`: each frame's
PSNR averaged over that video's clips).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence

import numpy as np
from flax import nnx

from rynn_jax import errors
from rynn_jax.training import autoencoder as ae
from rynn_jax.training import config as config_lib


def score(vae_dirs: Sequence[str], data: ae.AutoencoderDataConfig) -> dict[str, dict]:
    """{dir: `ae.evaluate(..., per_frame=True)` + the codec's temporal stride} on the same
    `data.eval_clips` clips of `data.heldout_dirs` (every video of `data.videos`)."""
    from rynn_jax.models.vae_weights import load_vae

    if not data.heldout_dirs:
        raise errors.UsageError("data.heldout_dirs is empty: nothing to score",
                                fix="--set \"data.heldout_dirs=('data/synthetic/heldout/*/episode_*',)\"")
    for d in vae_dirs:  # all checked before the first (slow) evaluation
        errors.existing(d, "autoencoder", kind="directory")
    items = ae.video_items(ae.episode_dirs(data.heldout_dirs, "data.heldout_dirs"), data.videos)
    out = {}
    for d in vae_dirs:
        codec = ae.Codec(*nnx.split(load_vae(d), nnx.Param))
        out[d] = ae.evaluate(codec, data, items, per_frame=True) | {"temporal_stride": codec.cfg.temporal_stride}
    return out


def table(scores: dict[str, dict], names: Sequence[str]) -> str:
    """Markdown: per autoencoder, the PSNR of each video, then the first video's frame 0 and its
    other frames by position inside their latent (frame 1 + k·stride + position)."""
    first, stride = names[0], next(iter(scores.values()))["temporal_stride"]
    head = (["autoencoder", *[f"{n} PSNR" for n in names], f"{first} frame 0"]
            + [f"{first} position {k + 1} of {stride}" for k in range(stride)])
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for d, r in scores.items():
        f = np.asarray(r[f"psnr_frames_{first}"])
        by_position = [f[1:][k::stride].mean() for k in range(stride)]
        cells = [d, *[f"{r[f'psnr_{n}']:.2f}" for n in names], f"{f[0]:.2f}", *[f"{v:.2f}" for v in by_position]]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> dict[str, dict]:
    p = errors.ArgumentParser(prog="python -m rynn_jax.eval.autoencoders", description=__doc__)
    p.add_argument("vae", nargs="+", help="exported autoencoder directories")
    p.add_argument("--config", default="configs/synthetic_ae4d.py:frozen",
                   help="recipe whose data section names the held-out episodes, videos and clip size")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    p.add_argument("--clips", type=int, default=0, help="clips (default: the recipe's data.eval_clips)")
    p.add_argument("--out", default="", help="also write the scores as JSON here")
    a = p.parse_args(argv)
    from rynn_jax.training.decoder import DecoderTrainConfig

    cfg = config_lib.apply_overrides(
        config_lib.load_config(a.config, (ae.AutoencoderTrainConfig, DecoderTrainConfig)), a.set)
    data = dataclasses.replace(cfg.data, eval_clips=a.clips) if a.clips else cfg.data
    scores = score(a.vae, data)
    print(table(scores, list(data.videos)))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(scores, f, indent=1)
    return scores


if __name__ == "__main__":
    sys.exit(errors.run(main))
