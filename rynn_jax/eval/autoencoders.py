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

Clips longer than the recipe trains on (`--set data.num_frames=49`) add a table of each video's
PSNR inside and past that length (a causal autoencoder trained on short clips can fail past it).

`--regions N` also says where the RGB round trip's error lies: the first N frames of every held-out
episode that has the sim's segmentation, its squared error split between the background, the robot
and the task's objects (share of the pixels, share of the error, PSNR inside), and the share of the
error held by the worst 1 % and 5 % of the pixels; `--error-map IMAGE` draws, per task, the last of
those frames, each autoencoder's reconstruction and its squared error.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
from flax import nnx

from rynn_jax import errors
from rynn_jax.data.robot import SEG_FILE
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


REGIONS = ("background", "robot", "objects")  # segmentation labels 0, (1, 2) and the rest (docs/sim.md)


Example = tuple[np.ndarray, np.ndarray, np.ndarray]  # a frame's truth, reconstruction (uint8), squared error


def region_errors(vae_dir: str, data: ae.AutoencoderDataConfig, num_frames: int,
                  examples: dict[str, Example] | None = None) -> dict:
    """The RGB round trip's squared error by segmentation region over the first `num_frames` frames
    of every held-out episode with a segmentation.npz: {region: {pixels, error, psnr}} (shares of the
    pixels and of the summed squared error; PSNR inside the region), `worst_1pct` / `worst_5pct`
    (error share of the worst pixels, per-pixel error averaged over colour), `psnr` (all pixels),
    `episodes` and `by_task` ({task: PSNR over all pixels and inside each region}; the task is the
    episode's parent folder). `examples`: filled with {task: the last frame of its first episode}
    (squared error averaged over colour, as PSNR counts it)."""
    from rynn_jax.data import video as video_lib
    from rynn_jax.eval.episodes import crop_like_frames
    from rynn_jax.models.vae_weights import load_vae

    if "rgb" not in data.videos:
        raise errors.UsageError(f"--regions scores the 'rgb' video: data.videos has {sorted(data.videos)}")
    dirs = [d for d in ae.episode_dirs(data.heldout_dirs, "data.heldout_dirs")
            if os.path.isfile(os.path.join(d, SEG_FILE))]
    if not dirs:
        raise errors.UsageError(f"--regions: no held-out episode has a {SEG_FILE} (the sim writes one)")
    codec = ae.Codec(*nnx.split(load_vae(vae_dir), nnx.Param))
    s = codec.cfg.temporal_stride
    if num_frames < 1 or (num_frames - 1) % s:
        raise errors.UsageError(f"--regions {num_frames}: frames must be 1 + {s}·k (the autoencoder's temporal stride)")
    tasks = [os.path.basename(os.path.dirname(os.path.normpath(d))) for d in dirs]
    sq, labels = [], []
    for d, task in zip(dirs, tasks):
        path = os.path.join(d, data.videos["rgb"])
        info = video_lib.probe_video(path)
        if info.num_frames < num_frames:
            raise errors.InputError(f"{path}: {info.num_frames} frames < --regions {num_frames}")
        frames = video_lib.read_frames(path, range(num_frames), data.width, data.height)
        x = ae.to_unit(jnp.asarray(frames[None]))
        y = codec.reconstruct(x)
        sq.append(np.asarray(jnp.mean(jnp.square(y - x), axis=-1))[0])  # (T, H, W), on [-1, 1] like ae.psnr
        if examples is not None and task not in examples:  # the task's first episode
            recon = np.asarray(jnp.clip(jnp.round((y[0, -1] + 1) * 127.5), 0, 255), np.uint8)
            examples[task] = frames[-1], recon, sq[-1][-1]
        with np.load(os.path.join(d, SEG_FILE)) as z:
            lab = z["labels"][:num_frames]
        labels.append(crop_like_frames(lab, lab.shape[1], lab.shape[2], data.height, data.width))
    e, lab = np.concatenate(sq).ravel().astype(np.float64), np.concatenate(labels).ravel()
    which = {"background": lab == 0, "robot": np.isin(lab, (1, 2)), "objects": lab > 2}
    to_psnr = lambda mse: float(ae.psnr(mse))  # noqa: E731
    out = {r: {"pixels": float(m.mean()), "error": float(e[m].sum() / e.sum()),
               "psnr": to_psnr(e[m].mean()) if m.any() else float("nan")} for r, m in which.items()}
    names = list(dict.fromkeys(tasks))  # first-seen order
    task_px = np.repeat(np.array([names.index(t) for t in tasks], np.int16), sq[0].size)  # every pixel's task
    by_task = {}
    for i, t in enumerate(names):
        in_task = task_px == i
        inside = {r: in_task & m for r, m in which.items()}
        by_task[t] = {"psnr": to_psnr(e[in_task].mean())} | {
            r: to_psnr(e[m].mean()) if m.any() else float("nan") for r, m in inside.items()}
    worst = np.sort(e)[::-1]
    return out | {"worst_1pct": float(worst[:len(e) // 100].sum() / e.sum()),
                  "worst_5pct": float(worst[:len(e) // 20].sum() / e.sum()),
                  "psnr": to_psnr(e.mean()), "episodes": len(dirs), "by_task": by_task}


def _markdown(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table: the header, its rule, one line per row of cells."""
    line = lambda cells: "| " + " | ".join(cells) + " |"
    return "\n".join([line(head), "|" + "---|" * len(head), *map(line, rows)])


def region_table(regions: dict[str, dict]) -> str:
    """Markdown: per autoencoder and region, its share of the pixels and of the error, PSNR inside."""
    head = ["autoencoder", "PSNR", *[f"{r}: pixels / error / PSNR" for r in REGIONS], "worst 1 % / 5 % of pixels"]
    return _markdown(head, [
        [d, f"{r['psnr']:.2f}",
         *[f"{100 * r[k]['pixels']:.1f} % / {100 * r[k]['error']:.1f} % / {r[k]['psnr']:.2f}" for k in REGIONS],
         f"{100 * r['worst_1pct']:.0f} % / {100 * r['worst_5pct']:.0f} %"] for d, r in regions.items()])


ERROR_MAP_FULL = 0.02  # squared error (unit range, summed over colour) drawn white: ≈ 0.08 per channel, 22 dB


def error_map_image(examples: dict[str, dict[str, Example]]) -> np.ndarray:
    """(rows × H, cols × W, 3) uint8 from {autoencoder: region_errors' examples}: per task, its truth,
    then each autoencoder's reconstruction and squared-error map (white = ERROR_MAP_FULL or more)."""
    rows = []
    for task, (truth, _, _) in next(iter(examples.values())).items():
        cells = [truth]
        for per_task in examples.values():
            _, recon, err = per_task[task]
            summed_unit = err * 3 / 4  # colour mean on [-1, 1] → colour sum on [0, 1]
            grey = (np.clip(summed_unit / ERROR_MAP_FULL, 0, 1) * 255).astype(np.uint8)
            cells += [recon, np.repeat(grey[..., None], 3, axis=-1)]
        rows.append(np.concatenate(cells, axis=1))
    return np.concatenate(rows, axis=0)


def table(scores: dict[str, dict], names: Sequence[str]) -> str:
    """Markdown: per autoencoder, the PSNR of each video, then the first video's frame 0 and its
    other frames by position inside their latent (frame 1 + k·stride + position)."""
    first, stride = names[0], next(iter(scores.values()))["temporal_stride"]
    head = (["autoencoder", *[f"{n} PSNR" for n in names], f"{first} frame 0"]
            + [f"{first} position {k + 1} of {stride}" for k in range(stride)])
    rows = []
    for d, r in scores.items():
        f = np.asarray(r[f"psnr_frames_{first}"])
        by_position = [f[1:][k::stride].mean() for k in range(stride)]
        rows.append([d, *[f"{r[f'psnr_{n}']:.2f}" for n in names], f"{f[0]:.2f}", *[f"{v:.2f}" for v in by_position]])
    return _markdown(head, rows)


def length_table(scores: dict[str, dict], names: Sequence[str], trained: int) -> str:
    """Markdown: per autoencoder and video, the mean per-frame PSNR over clip positions 1..trained−1
    (inside the clip length the recipe trains on) and trained.. (past it, where a causal encoder's
    latents may have settled into states the decoder never saw)."""
    n = len(next(iter(scores.values()))[f"psnr_frames_{names[0]}"])
    head = ["autoencoder", *[f"{v} {span}" for v in names
                             for span in (f"frames 1–{trained - 1}", f"frames {trained}–{n - 1}")]]
    rows = []
    for d, r in scores.items():
        frames = [np.asarray(r[f"psnr_frames_{v}"]) for v in names]
        rows.append([d, *[f"{m:.2f}" for f in frames for m in (f[1:trained].mean(), f[trained:].mean())]])
    return _markdown(head, rows)


def main(argv: Sequence[str] | None = None) -> dict[str, dict]:
    p = errors.ArgumentParser(prog="python -m rynn_jax.eval.autoencoders", description=__doc__)
    p.add_argument("vae", nargs="+", help="exported autoencoder directories")
    p.add_argument("--config", default="configs/synthetic_ae4d.py:frozen",
                   help="recipe whose data section names the held-out episodes, videos and clip size")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    p.add_argument("--clips", type=int, default=0, help="clips (default: the recipe's data.eval_clips)")
    p.add_argument("--regions", type=int, default=0, metavar="N",
                   help="also split the RGB round trip's error by segmentation region over each held-out "
                        "episode's first N frames (1 + 4k)")
    p.add_argument("--error-map", default="", metavar="IMAGE",
                   help="with --regions: per task, the last frame's truth, then each autoencoder's reconstruction "
                        "and its squared error (white ≥ 0.02, unit range, colours summed)")
    p.add_argument("--out", default="", help="also write the scores as JSON here")
    a = p.parse_args(argv)
    from rynn_jax.training.decoder import DecoderTrainConfig

    recipe = config_lib.load_config(a.config, (ae.AutoencoderTrainConfig, DecoderTrainConfig))
    cfg = config_lib.apply_overrides(recipe, a.set)
    data = dataclasses.replace(cfg.data, eval_clips=a.clips) if a.clips else cfg.data
    if a.regions < 0:
        raise errors.UsageError(f"--regions must be ≥ 1 frames (0: off), got {a.regions}")
    if a.error_map and not a.regions:
        raise errors.UsageError("--error-map draws the --regions frames: give --regions N too")
    scores = score(a.vae, data)
    print(table(scores, list(data.videos)))
    trained = recipe.data.num_frames
    if data.num_frames > trained:  # clips longer than the recipe trains on (data.num_frames raised by --set)
        print(length_table(scores, list(data.videos), trained))
    if a.regions:
        examples: dict[str, dict[str, Example]] = {d: {} for d in a.vae}
        for d in a.vae:
            scores[d]["regions"] = region_errors(d, data, a.regions, examples[d])
        print(region_table({d: scores[d]["regions"] for d in a.vae}))
        if a.error_map:
            from PIL import Image

            Image.fromarray(error_map_image(examples)).save(a.error_map, quality=90)  # format by extension; quality: JPEG's
    if a.out:
        with open(a.out, "w") as f:
            json.dump(scores, f, indent=1)
    return scores


if __name__ == "__main__":
    sys.exit(errors.run(main))
