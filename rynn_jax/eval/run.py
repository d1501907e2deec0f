"""The evaluation loop behind `python eval.py`: per episode, generate (or read) the prediction, score
it and the baselines against ground truth, keep I3D features for FVD; then aggregate and report.

    <out>/episodes/<name>.json    per-frame and per-video scores of every variant (written last:
                                  an episode with this file is done and skipped on a re-run)
    <out>/episodes/<name>.npz     I3D features of every variant and of the truth (FVD)
    <out>/strips/<name>.png       frame strip: skeleton | generated (| swapped) | truth
    <out>/generated/<name>/       the model's video (and control) in the robot episode layout
    <out>/metrics.json, episodes.csv, episodes.parquet, plots, report.md (`report.write_report`;
                                  with ≥ 2 whole chunks of `chunk_frames`, PSNR per chunk: drift)

The student streams through `StreamingSession` in the layout it was distilled for (an exported
student's `student.json`: blocks, cache, chunk re-anchoring on its own last frame), for any number
of frames; `--frames 481` on 30-s episodes gives six 80-frame chunks for the drift table and plot.

RynnWorld-4D (`world4d`): the model starts from the episode's first frame and its depth (with a
control branch it also reads the skeleton video, and `swap` applies) and generates RGB, depth and
flow; every variant is also scored on depth (AbsRel, δ1), flow (EPE in pixels) and the PSNR of the
depth / flow videos as the model sees them
(`episodes.with_encodings`); its "autoencoder" variant sends all three videos through the shared
VAE. The generated depth and flow are saved beside the video in the sim's `depth.npz` / `flow.npz`
format (so `--model generated` scores them again), with `depth.mp4` / `flow.mp4` to watch.

Batching (`batch`, teacher and student): up to `batch` episodes of one frame count and size are
generated per model call (their swapped variants in the next call), then scored one by one.

Variants: "model" (the model with the episode's own control), "model_swapped" (`swap`: the same
first frame and noise, the next episode's control — a model that follows its control must lose
PSNR here), "autoencoder" (teacher: the truth through its VAE and back, the ceiling of any model in
that latent space), and the baselines of `baselines.BASELINES`. `autoencoder` has no generator:
its "model" is that round trip through `vae` alone (all three videos where the episode has depth and
flow), so an autoencoder is scored on a world model's metrics without one.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Literal

import numpy as np
from tqdm import tqdm

from rynn_jax.atomic import atomic_dir
from rynn_jax.data.robot import DEPTH_FILE, FLOW_FILE, write_depth_flow
from rynn_jax.eval import baselines, episodes, fvd, report
from rynn_jax.eval.report import file_stem
from rynn_jax.eval.score import score, summarize
from rynn_jax.render.preview import save_png, save_video
from rynn_jax.serving.bidirectional import SamplingConfig

MODELS = ("generated", "teacher", "student", "world4d", "autoencoder")
STRIP_FRAMES = 6


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalConfig:
    model: Literal["generated", "teacher", "student", "world4d"]
    episodes: str  # ground-truth episode root (robot layout)
    out: str
    generated: str | None = None  # model "generated": root of the generated episodes
    dit: str | None = None  # teacher/student weights (both or neither: tiny random models)
    vae: str | None = None
    frames: int = 33  # frames compared per episode (teacher, world4d: rounded down to 1 + 4k)
    resolution: tuple[int, int] | None = None  # H, W (default: the generated or ground-truth video's)
    steps: int = 8  # teacher / world4d sampler steps
    max_episodes: int | None = None  # the first K episodes (sorted by name)
    seed: int = 0
    swap: bool = False  # also generate with the next episode's control (teacher/student)
    shift_frames: int = baselines.SHIFT_FRAMES
    fvd: bool = True
    text: str | None = None  # one umT5 embedding for every prompt
    text_embeddings: str | None = None  # or DIR/<sha256(prompt)>.safetensors
    chunk_frames: int = report.CHUNK_FRAMES  # drift: PSNR per chunk of this many frames (1..c, c+1..2c, ...)
    batch: int = 1  # teacher/student: episodes generated per model call (not a setting of the scores)

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"--model must be one of {MODELS}, got {self.model!r}")
        if (self.model == "generated") != (self.generated is not None):
            raise ValueError("--generated DIR is needed with --model generated, and only with it")
        if self.model == "generated" and (self.dit or self.vae or self.swap):
            raise ValueError("--dit/--vae/--swap need a model to run (--model teacher or student)")
        if self.model == "autoencoder" and (self.dit or self.swap):
            raise ValueError("--model autoencoder scores the --vae round trip alone: no --dit, no --swap")
        if self.model == "world4d" and self.swap and not _world4d_controlled(self.dit):
            raise ValueError("--swap: this RynnWorld-4D model has no control branch (no skeleton to swap)")
        if self.frames < 2 or self.steps < 1 or (self.max_episodes is not None and self.max_episodes < 1):
            raise ValueError(f"--frames must be ≥ 2, --steps and --max-episodes ≥ 1; got {self.frames}, "
                             f"{self.steps}, {self.max_episodes}")
        if self.batch < 1:
            raise ValueError(f"--batch must be ≥ 1, got {self.batch}")
        if self.batch > 1 and self.model not in ("teacher", "student"):
            raise ValueError(f"--batch: only the teacher and the student generate in batches (--model {self.model})")
        if self.shift_frames < 1 or self.chunk_frames < 1:
            raise ValueError(f"--shift-frames and --chunk-frames must be ≥ 1, got {self.shift_frames}, "
                             f"{self.chunk_frames}")


def _frames_for(cfg: EvalConfig, available: int) -> int:
    n = min(cfg.frames, available)
    return 1 + 4 * ((n - 1) // 4) if cfg.model in ("teacher", "world4d", "autoencoder") else n


def _world4d_controlled(dit: str | None) -> bool:
    """Whether the 4D model at `dit` reads a skeleton video (the tiny random one does not); an
    unreadable directory counts as yes, and its loader says what is wrong with it."""
    from rynn_jax import converted_weights
    from rynn_jax.models.dit4d import WanDiT4DConfig

    if dit is None:
        return False
    try:
        return converted_weights.load_config(dit, WanDiT4DConfig).base.control != "none"
    except (OSError, ValueError):
        return True


def evaluate(cfg: EvalConfig) -> dict:
    """Evaluate every episode not done yet under `cfg.out`, then write the aggregate and the report."""
    names = episodes.list_episodes(cfg.episodes)[:cfg.max_episodes]
    if cfg.swap and len(names) < 2:
        raise ValueError("--swap needs at least 2 episodes (each takes the next one's control)")
    if cfg.model == "generated":
        missing = [n for n in names if not (Path(cfg.generated) / n / episodes.VIDEO_FILE).is_file()]
        if missing:
            raise FileNotFoundError(f"--generated {cfg.generated}: {len(missing)} of {len(names)} episodes have no "
                                    f"{episodes.VIDEO_FILE}, e.g. {missing[0]}")
    if cfg.model == "world4d":  # before any model is built
        missing = [n for n in names if not all((Path(cfg.episodes) / n / f).is_file() for f in (DEPTH_FILE, FLOW_FILE))]
        if missing:
            raise FileNotFoundError(f"--episodes {cfg.episodes}: {len(missing)} of {len(names)} episodes have no "
                                    f"{DEPTH_FILE} / {FLOW_FILE} (RynnWorld-4D starts from the first frame's depth), "
                                    f"e.g. {missing[0]}")
    out = Path(cfg.out)
    (out / "episodes").mkdir(parents=True, exist_ok=True)
    _check_same_run(cfg, out)
    todo = [n for n in names if not (out / "episodes" / f"{file_stem(n)}.json").exists()]
    runner = _runner(cfg) if todo and cfg.model != "generated" else None
    with tqdm(total=len(todo), desc=f"eval {cfg.model}", unit="episode", disable=not todo) as bar:
        for group in _groups(cfg, todo):
            partners = [names[(names.index(n) + 1) % len(names)] if cfg.swap else None for n, _, _ in group]
            truths = [episodes.load_truth(cfg.episodes, name, n, *hw) for name, n, hw in group]
            for truth, partner, preds in zip(truths, partners, _predict(cfg, out, truths, partners, runner)):
                _score_episode(cfg, out, truth, preds, partner)
                bar.update()
    return report.write_report(out, names, config=_config_record(cfg), chunk_frames=cfg.chunk_frames)


def _groups(cfg: EvalConfig, todo: list[str]) -> list[list[tuple[str, int, tuple[int, int]]]]:
    """Episodes as (name, frames, (H, W)), in runs of at most `cfg.batch` consecutive episodes of one
    frame count and size (what one model call takes)."""
    groups: list[list[tuple[str, int, tuple[int, int]]]] = []
    for name in todo:
        available = episodes.available_frames(cfg.episodes, name)
        if cfg.model == "generated":
            available = min(available, episodes.video_size(Path(cfg.generated) / name / episodes.VIDEO_FILE)[0])
        n = _frames_for(cfg, available)
        if n < 2:
            raise ValueError(f"episode {name}: {n} frame(s) to compare (needs ≥ 2; the teacher needs 1 + 4k ≥ 5)")
        item = (name, n, _size(cfg, name))
        if groups and len(groups[-1]) < cfg.batch and groups[-1][-1][1:] == item[1:]:
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


def _runner(cfg: EvalConfig):
    from rynn_jax.eval import models

    if cfg.model == "autoencoder":
        return models.autoencoder(cfg.vae, cfg.seed)
    if cfg.model == "world4d":
        return models.world4d(cfg.dit, cfg.vae, cfg.seed, SamplingConfig(num_steps=cfg.steps), text=cfg.text,
                              text_embeddings=cfg.text_embeddings)
    if cfg.model == "teacher":
        return models.teacher(cfg.dit, cfg.vae, cfg.seed, SamplingConfig(num_steps=cfg.steps), text=cfg.text,
                              text_embeddings=cfg.text_embeddings, batch=cfg.batch)
    return models.student(cfg.dit, cfg.vae, cfg.seed, text=cfg.text, text_embeddings=cfg.text_embeddings,
                          batch=cfg.batch)


def _size(cfg: EvalConfig, name: str) -> tuple[int, int]:
    if cfg.resolution is not None:
        return cfg.resolution
    root = cfg.generated if cfg.model == "generated" else cfg.episodes
    _, h, w = episodes.video_size(Path(root) / name / episodes.VIDEO_FILE)
    return h, w


def _predict(cfg: EvalConfig, out: Path, truths: list[episodes.Truth], partners: list[str | None],
             runner) -> list[dict[str, episodes.Generated]]:
    """The model's variants for a group of episodes (one size): "model", and with `swap`
    "model_swapped" (the partner's skeleton); the generated videos are saved as episodes."""
    if cfg.model == "generated":
        preds = [{"model": episodes.load_generated(cfg.generated, t.name, len(t.frames))} for t in truths]
        for t, p in zip(truths, preds):
            if p["model"].frames.shape[1:3] != t.frames.shape[1:3]:
                raise ValueError(f"--generated {cfg.generated}/{t.name}: frames {p['model'].frames.shape[1:3]}, "
                                 f"evaluating at {t.frames.shape[1:3]} (drop --resolution)")
        return preds
    if cfg.model in ("world4d", "autoencoder"):
        preds = []
        for t, partner in zip(truths, partners):
            p = {"model": runner(t.name, t)}
            _save_generated(out / "generated" / t.name, p["model"].frames, t.skeleton,
                            p["model"] if p["model"].depth is not None else None)
            if partner is not None:
                other = _partner_skeleton(cfg, partner, t)
                p["model_swapped"] = swapped = runner(t.name, dataclasses.replace(t, skeleton=other))
                _save_generated(out / "generated_swapped" / t.name, swapped.frames, other, swapped)
            preds.append(p)
    else:
        preds = _predict_controlled(cfg, out, truths, partners, runner)
    if hasattr(runner, "reconstruct"):  # the latent space's own ceiling (teacher: its VAE round trip)
        for t, p in zip(truths, preds):
            p["autoencoder"] = runner.reconstruct(t)
    return preds


def _predict_controlled(cfg: EvalConfig, out: Path, truths: list[episodes.Truth], partners: list[str | None],
                        runner) -> list[dict[str, episodes.Generated]]:
    """Teacher / student: the group's clips, then its swapped clips, in batched model calls."""
    from rynn_jax.eval.models import Request

    requests = [Request(t.name, t.frames[0], t.skeleton, t.prompt) for t in truths]
    for t, partner in zip(truths, partners):  # the swapped clips after the group's own
        if partner is not None:
            requests.append(Request(t.name, t.frames[0], _partner_skeleton(cfg, partner, t), t.prompt))
    videos = iter(runner(requests))
    preds = [{"model": episodes.Generated(next(videos))} for _ in truths]
    for t, p in zip(truths, preds):
        _save_generated(out / "generated" / t.name, p["model"].frames, t.skeleton)
    swapped = iter(requests[len(truths):])
    for t, partner, p in zip(truths, partners, preds):
        if partner is not None:
            p["model_swapped"] = episodes.Generated(next(videos))
            _save_generated(out / "generated_swapped" / t.name, p["model_swapped"].frames, next(swapped).skeleton_thw3)
    return preds


def _partner_skeleton(cfg: EvalConfig, partner: str, truth: episodes.Truth) -> np.ndarray:
    """The partner episode's skeleton video at `truth`'s length and size (the swap test's control)."""
    (h, w) = truth.frames.shape[1:3]
    other = episodes.load_truth(cfg.episodes, partner, episodes.available_frames(cfg.episodes, partner), h, w)
    return _fit_length(other.skeleton, len(truth.frames))


def _score_episode(cfg: EvalConfig, out: Path, truth: episodes.Truth, preds: dict[str, episodes.Generated],
                   partner: str | None) -> None:
    """Score every variant and the baselines of one episode; write its record (last), features, strip."""
    name, n, (h, w) = truth.name, len(truth.frames), truth.frames.shape[1:3]
    preds["copy_first_frame"] = baselines.copy_first_frame(truth)
    preds["shifted"] = baselines.shifted(truth, cfg.shift_frames)
    m = preds["model"]  # a 4D model's output, the three videos' round trip, or generated files with them
    geometric = all(x is not None for x in (m.depth, m.flow, truth.depth, truth.flow))
    if geometric:  # depth and flow also scored as the videos the model generates
        truth = episodes.with_encodings(truth)
        preds = {v: episodes.with_encodings(p) for v, p in preds.items()}

    record = {"episode": name, "frames": n, "height": h, "width": w, "prompt": truth.prompt,
              "swap_partner": partner, "variants": {}}
    for variant, pred in preds.items():
        per_frame = score(pred, truth)
        record["variants"][variant] = {"per_frame": per_frame, "video": summarize(per_frame)}
    stem = file_stem(name)
    if cfg.fvd and n >= fvd.MIN_FRAMES:  # one I3D batch: every variant and the truth
        variants = [*preds, "truth"]
        clips = np.stack([p.frames[:n] for p in preds.values()] + [truth.frames])
        feats = dict(zip(variants, fvd.i3d_features(clips)))
        _atomic(out / "episodes" / f"{stem}.npz", lambda p: np.savez(p, **feats))
    if geometric:
        m = preds["model"]  # with its encoded videos now
        rows = [m.frames[:n], truth.frames, m.depth_video[:n], truth.depth_video, m.flow_video[:n], truth.flow_video]
        record["strip_rows"] = ["generated", "truth", "gen. depth", "true depth", "gen. flow", "true flow"]
        if "model_swapped" in preds:  # a controlled model: what drove it, and the swapped skeleton's RGB
            rows = [truth.skeleton, *rows[:1], preds["model_swapped"].frames[:n], *rows[1:]]
            record["strip_rows"] = ["skeleton", "generated", "swapped skeleton", *record["strip_rows"][1:]]
    else:
        rows = [truth.skeleton, preds["model"].frames[:n]]
        if "model_swapped" in preds:
            rows.append(preds["model_swapped"].frames[:n])
        rows.append(truth.frames)
    (out / "strips").mkdir(exist_ok=True)
    save_png(out / "strips" / f"{stem}.png", strip(rows))
    _atomic(out / "episodes" / f"{stem}.json", lambda p: Path(p).write_text(json.dumps(record)))


def strip(rows: list[np.ndarray], num: int = STRIP_FRAMES) -> np.ndarray:
    """Rows of videos (T, H, W, 3), `num` frames evenly spaced from 0 to T − 1, as one image."""
    t = min(len(r) for r in rows)
    idx = np.unique(np.linspace(0, t - 1, min(num, t)).round().astype(int))
    return np.concatenate([np.concatenate(list(r[idx]), axis=1) for r in rows], axis=0)


def _fit_length(video: np.ndarray, n: int) -> np.ndarray:
    """The first n frames; a shorter video holds its last frame."""
    if len(video) >= n:
        return video[:n]
    return np.concatenate([video, np.repeat(video[-1:], n - len(video), axis=0)])


def _save_generated(directory: Path, frames: np.ndarray, skeleton: np.ndarray,
                    geometry: episodes.Generated | None = None) -> None:
    """The generated episode; with `geometry` (a 4D model's output) also its depth and flow in the
    sim's files (depth in mm, uint16; flow float16) and their encoded videos."""
    with atomic_dir(directory) as tmp:
        save_video(tmp / episodes.VIDEO_FILE, frames, fps=16)
        save_video(tmp / "skeleton.mp4", skeleton[:len(frames)], fps=16)
        if geometry is not None:
            write_depth_flow(tmp, geometry.depth, geometry.flow)
            save_video(tmp / "depth.mp4", geometry.depth_video, fps=16)
            save_video(tmp / "flow.mp4", geometry.flow_video, fps=16)


def _atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp" + path.suffix)
    write(tmp)
    os.replace(tmp, path)


def _config_record(cfg: EvalConfig) -> dict:
    rec = dataclasses.asdict(cfg)
    rec["resolution"] = list(cfg.resolution) if cfg.resolution else None
    given = cfg.vae if cfg.model == "autoencoder" else cfg.dit
    rec["weights"] = ("given" if given else "tiny random (smoke test)") if cfg.model != "generated" else "n/a"
    return rec


def _check_same_run(cfg: EvalConfig, out: Path) -> None:
    """A re-run resumes only the same evaluation: settings that change the scores must match."""
    keys = ("model", "episodes", "generated", "dit", "vae", "frames", "resolution", "steps", "seed", "swap",
            "shift_frames", "text", "text_embeddings")
    mine = {k: v for k, v in _config_record(cfg).items() if k in keys}
    mine["episodes"] = os.path.abspath(cfg.episodes)
    path = out / "run.json"
    if path.exists():
        before = json.loads(path.read_text())
        diff = sorted(k for k in keys if before.get(k) != mine.get(k))
        if diff:
            raise ValueError(f"--out {out} holds an evaluation with other settings ({', '.join(diff)} differ); "
                             "use a new --out")
    else:
        path.write_text(json.dumps(mine, indent=1))
