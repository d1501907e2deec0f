"""Batch generation of training episodes: operator streams → (video, 54-D action) robot episodes.

    python serve.py generate --streams DIR --out DIR [--batch 4] [--frames 81] [--dit DIR --vae DIR]
                             [--format robot|lerobot|rlds]

Weights: `--dit/--vae`, else the bundled student + autoencoder (`serving.student`) at the
resolution they were trained for, else (absent, or `--random-weights`) tiny random networks.

Input: every directory under `--streams` that holds `operator_stream.npz` (a recorded
`rynn-teleop-stream/1` file whose meta has the head camera pose `T_world_camera`) and
`reference.png` (the robot's head-camera view the episode starts from, resized and centre-cropped to
`--resolution`; `--image` gives one picture for all). The bundled sample (`data/sample/`) is such a directory.

Output: one episode per stream, in the robot layout that `rynn_jax.data.robot.RobotSource` reads
(data/README.md), plus `action_stats.json` — the output directory is a training source as it is:

    <out>/<stream dir, relative to --streams>/
        observation.images.head.mp4   the world model's video, 16 fps
        timeseries.parquet            `action` (the IK's 54-D joint commands), `observation.state`
                                      (the previous command: no robot measured it), frame_index, timestamp
        hand_skeleton.npz             the operator's hands in the head camera (what drove the video)
        skeleton.mp4, operator_stream.npz, metadata.json

Text: one embedding for all (`--text`), or per stream the umT5 embedding of its task description
(`--task-description`, else the stream's meta) from `--text-embeddings DIR/<sha256(prompt)>.safetensors`
(the pre-encoder's naming; a stream whose prompt has no file fails) or encoded on the fly by
`--text-encoder CKPT` (a umT5 checkpoint, rynn_jax.text_encoder); else the all-zero context.

`--batch B` streams run as one batched `StreamingSession` (one set of executables, compiled once);
a last, smaller batch is padded with copies of its last stream, whose extra outputs are dropped.
While the world model runs a batch, threads prepare the next one (IK, skeleton render) and write
the last one (MP4 encoding), so the accelerator does not wait for the host (`--sequential`: not).
Every episode has exactly `--frames` frames (81 fills a Wan training clip): the world model runs
in whole blocks, so the last block's missing skeleton frames repeat the stream's last one (the
operator holds still) and its frames past `--frames` are dropped. Each episode is written to `<dir>.tmp` and renamed when complete, so a re-run skips what
is finished and redoes what was cut. A stream that cannot be used (unreadable, too short, no
camera pose, no moment with all five trackers to calibrate on, no embedding for its prompt) is listed in `<out>/failures.json` with the reason; the others are
generated, and the exit status is 1.

`--format lerobot` / `rlds`: the episodes go to `<out>/episodes/` (the layout above, resumable as
above) and the finished ones are then exported to `<out>/lerobot/` (LeRobot v3) or `<out>/rlds/`
(RLDS, TFDS ArrayRecord) by `rynn_jax.data.formats.export`, which also brings an export up to date.

An episode's noise comes from `--seed` and its name alone (`episode_key`; the batched session
draws each sample from its own key), so the same episode comes out whatever `--batch`, whichever
streams share its batch, and whether a run is fresh or resumed.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import json
import os
import time
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from rynn_jax import compile_cache, errors
from rynn_jax.atomic import atomic_dir
from rynn_jax.data import robot as robot_data
from rynn_jax.data.formats import export as formats_export
from rynn_jax.data.robot import vectors
from rynn_jax.kinematics import layout, streams
from rynn_jax.kinematics.retarget import retarget_stream
from rynn_jax.render import RenderConfig, default_intrinsics, render_video
from rynn_jax.render.preview import save_video
from rynn_jax.serving.assemble import (DECODERS, TINY_SIM_RESOLUTION, check_model_flags, check_resolution,
                                       choose_weights, decoder_checkpoint, session_for)
from rynn_jax.serving.clip import episode_key, fit_image, noise_id, rollout
from rynn_jax.serving.prompts import text_contexts
from rynn_jax.serving.session import StreamingSession
from rynn_jax.sim.robot_shards import write_action_stats
from rynn_jax.teleop.camera_hands import hands_in_camera, video_times
from rynn_jax.teleop.inputs import IMAGE_FILE, STREAM_FILE, read_reference
from rynn_jax.text_encoder import load_text_encoder
from rynn_jax.tokenizer import find_tokenizer

FAILURES_FILE, SUMMARY_FILE, CONTROL_VIDEO = "failures.json", "generation.json", "skeleton.mp4"
# What makes one stream unusable (its episode is skipped and reported; the batch goes on).
INPUT_ERRORS = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile)  # ValueError: errors.UserError too


@dataclasses.dataclass
class Prepared:
    """One stream made ready for the world model: everything but the generated video."""

    name: str  # the stream directory, relative to --streams (--streams itself: its name)
    stream: streams.Stream
    image: np.ndarray  # (H, W, 3) uint8, the reference view at the generation resolution
    skeleton: np.ndarray  # (T, H, W, 3) uint8, the control video
    joints_cam: np.ndarray  # (T, 2, 21, 3) float32
    elbows_cam: np.ndarray  # (T, 2, 3) float32
    valid: np.ndarray  # (T, 2, 22) bool
    actions: np.ndarray  # (T, 54) float32, IK joint commands
    prompt: str  # the task description (metadata; with --text-embeddings, what picks the context)
    context: np.ndarray  # (text_len, text_dim) float32, the DiT's text context
    t: np.ndarray  # (T,) seconds on the stream's clock
    ik_pos_err: np.ndarray  # (T,) metres


def find_streams(root: Path) -> list[Path]:
    """Every directory at or under `root` holding an operator stream, sorted."""
    errors.existing(root, "--streams", kind="directory")
    found = sorted({p.parent for p in root.rglob(STREAM_FILE)})  # root's own file included
    return [d for d in found if not d.name.endswith(".tmp")]


def prepare(directory: Path, name: str, num_frames: int, rcfg: RenderConfig, context: Callable[[str], np.ndarray],
            image: np.ndarray | None = None, task_description: str | None = None) -> Prepared:
    """Read, check, render and retarget one stream; `context(prompt)` gives its text context.
    Raises one of INPUT_ERRORS naming the problem.

    The small JAX work (IK, image resize) runs on the host CPU: on an accelerator it would queue
    behind the world model's blocks (one stream of work per device), and each read-back would wait
    for them. Only the skeleton render, one call per stream, goes to the default device."""
    stream = streams.read(directory / STREAM_FILE)  # an InputError naming the file
    t = video_times(stream, num_frames)
    prompt = task_description or str(stream.meta.get("task_description", ""))
    ctx = context(prompt)
    if image is None:
        image = read_reference(directory / IMAGE_FILE)
    with jax.default_device(jax.local_devices(backend="cpu")[0]):  # thread-local
        image = fit_image(image, rcfg.height, rcfg.width)
        retargeted = retarget_stream(stream, hz=streams.VIDEO_FPS, where=str(directory / STREAM_FILE))
    joints, elbows, valid = hands_in_camera(stream, t)
    skeleton = np.asarray(render_video(rcfg, joints, elbows, default_intrinsics(rcfg), valid))
    if len(retargeted["actions"]) < num_frames:
        raise ValueError(f"retargeting gave {len(retargeted['actions'])} frames, fewer than {num_frames}")
    return Prepared(name, stream, image, skeleton, joints.astype(np.float32), elbows.astype(np.float32),
                    valid, retargeted["actions"][:num_frames].astype(np.float32), prompt, ctx, t,
                    retargeted["ik_pos_err"][:num_frames])


def write_episode(ep: Prepared, video: np.ndarray, directory: Path, meta: dict) -> Path:
    """One generated episode as a robot episode (written to .tmp, renamed when whole)."""
    with atomic_dir(directory) as tmp:
        _write_files(ep, video, tmp, meta)
    return directory


def _write_files(ep: Prepared, video: np.ndarray, tmp: Path, meta: dict) -> None:
    n = len(video)
    fps = int(streams.VIDEO_FPS)
    save_video(tmp / robot_data.VIDEO_FILE, video, fps=fps)
    save_video(tmp / CONTROL_VIDEO, ep.skeleton[:n], fps=fps)
    actions = ep.actions[:n]
    state = np.concatenate([actions[:1], actions[:-1]])  # the command of the step before (no robot measured it)
    pq.write_table(pa.table({
        "frame_index": pa.array(np.arange(n, dtype=np.int32)),
        "timestamp": pa.array((ep.t[:n] - ep.t[0]).astype(np.float32)),
        robot_data.ACTION_COLUMN: vectors(actions),
        robot_data.STATE_COLUMN: vectors(state),
    }), tmp / robot_data.TIMESERIES_FILE)
    np.savez_compressed(tmp / robot_data.SKELETON_FILE, joints_cam=ep.joints_cam[:n], elbows_cam=ep.elbows_cam[:n],
                        valid=ep.valid[:n], intrinsics=meta["intrinsics"])
    streams.write(tmp / STREAM_FILE, ep.stream)
    meta = {**meta, "total_frames": n, "fps": streams.VIDEO_FPS, "intrinsics": np.asarray(meta["intrinsics"]).tolist(),
            "ik_pos_err_mm_median": float(np.median(ep.ik_pos_err[:n]) * 1e3),
            "T_world_camera": np.asarray(ep.stream.meta["T_world_camera"]).tolist()}
    (tmp / robot_data.METADATA_FILE).write_text(json.dumps(meta, indent=1))


def _done(directory: Path) -> bool:
    return (directory / robot_data.METADATA_FILE).is_file()


def generate(streams_root: Path, out: Path, *, batch: int = 1, num_frames: int = 33, seed: int = 0,
             height: int | None = None, width: int | None = None, image: Path | None = None,
             task_description: str | None = None,
             dit: str | None = None, vae: str | None = None, text: str | None = None,
             text_embeddings: str | None = None, fp8: bool = False, fp8_scales: str | None = None,
             vae_fp8_scales: str | None = None, tae: str | None = None, pipeline: bool = True,
             session: StreamingSession | None = None, text_encoder: str | None = None,
             tokenizer: str | None = None, random_weights: bool = False) -> dict:
    """Generate every episode not yet finished under `out`; returns the run's summary.

    `pipeline`: while the world model runs a batch, threads prepare the next batch's streams
    (IK, skeleton render) and write the previous batch's episodes (MP4 encoding); else each step
    waits for the one before. Both give the same episodes. `session`: an already built
    `StreamingSession` to use instead of building one from `dit`, `vae`, `fp8…` and `tae`.
    `text_encoder`: a umT5 checkpoint encoding each stream's prompt (`tokenizer`: its
    SentencePiece model, default the one beside it). `height`/`width` default to the student's
    training size (tiny random networks: 96×160); `random_weights`: see `serving.assemble.choose_weights`."""
    # Every flag and shared file checked before anything is built or compiled.
    if batch < 1 or num_frames < 1:
        raise errors.UsageError(f"--batch {batch} / --frames {num_frames}: must be ≥ 1")
    check_model_flags(dit=dit, vae=vae, fp8=fp8, fp8_scales=fp8_scales, vae_fp8_scales=vae_fp8_scales, tae=tae,
                      text=text)
    chosen = None if session is not None else choose_weights(dit, vae, random_weights)
    if height is None or width is None:
        height, width = chosen.resolution(TINY_SIM_RESOLUTION) if chosen else TINY_SIM_RESOLUTION
    check_resolution(height, width)
    if text and text_embeddings:
        raise errors.UsageError("--text / --text-embeddings: give one, not both")
    if text_encoder and (text or text_embeddings):
        raise errors.UsageError("--text-encoder: encodes the prompts itself, not with --text / --text-embeddings")
    if text_embeddings:
        errors.existing(text_embeddings, "--text-embeddings", kind="directory")
    if tokenizer and not text_encoder:
        raise errors.UsageError("--tokenizer: goes with --text-encoder")
    if text_encoder:
        errors.existing(text_encoder, "--text-encoder")
        tokenizer = find_tokenizer(errors.existing(tokenizer, "--tokenizer") if tokenizer else text_encoder)
    t0 = time.perf_counter()
    # Episodes carry a copy of their stream: an --out inside --streams must not feed itself.
    dirs = [d for d in find_streams(streams_root) if not d.resolve().is_relative_to(out.resolve())]
    if not dirs:
        raise errors.MissingFileError(f"--streams {streams_root}: no {STREAM_FILE} at or under it")
    shared_image = read_reference(image) if image is not None else None
    errors.writable_dir(out, "--out")
    out.mkdir(parents=True, exist_ok=True)
    # An episode's name is its directory under --streams (--streams itself: its own name).
    names = [d.relative_to(streams_root).as_posix() if d != streams_root else streams_root.resolve().name
             for d in dirs]
    todo = [(d, n) for d, n in zip(dirs, names) if not _done(out / n)]
    rcfg = RenderConfig(width=width, height=height)
    K = np.asarray(default_intrinsics(rcfg), np.float32)
    weights = "given session" if session is not None else chosen.label
    if todo and session is None:  # built up front (its text sizes pick each stream's context), compiled at the first batch
        session = session_for(chosen, seed, fp8=fp8, fp8_scales=fp8_scales, vae_fp8_scales=vae_fp8_scales, tae=tae)
    encoder = load_text_encoder(text_encoder, tokenizer, max_len=session.dit_cfg.text_len,
                                dtype=session.dit_cfg.dtype) if todo and text_encoder else None
    contexts = text_contexts(text, text_embeddings, session.dit_cfg.text_len, session.dit_cfg.text_dim,
                             encoder, hashed=chosen is not None and chosen.bundled) if todo else None
    failures: dict[str, str] = {}
    written: dict[str, int] = {}  # episode → frames
    waits = dict.fromkeys(("prepare", "world_model", "write"), 0.0)  # main-thread seconds spent on (waiting for) each
    compiled = False
    bar = tqdm(total=len(todo), desc="generate", unit="episode", disable=not todo)

    def timed(kind: str, fn: Callable, *args):
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            waits[kind] += time.perf_counter() - t

    def prepared_groups(pool: ThreadPoolExecutor | None) -> Iterator[list[Prepared]]:
        """`todo` prepared, in groups of `batch` (the last may be smaller); with a pool, the next
        group's streams are prepared while the caller generates this one. Streams are prepared at
        most a batch ahead (a 480×832 skeleton video is ≈ 100 MB per 81 frames)."""
        items, queue = iter(todo), collections.deque()

        def submit_next() -> None:
            for d, name in itertools.islice(items, 1):
                args = (d, name, num_frames, rcfg, contexts, shared_image, task_description)
                queue.append((name, pool.submit(prepare, *args) if pool else functools.partial(prepare, *args)))

        for _ in range(2 * batch if pool else 1):
            submit_next()
        group: list[Prepared] = []
        while queue:
            name, job = queue.popleft()
            submit_next()
            try:
                group.append(timed("prepare", job.result if pool else job))
            except INPUT_ERRORS as e:
                failures[name] = f"{type(e).__name__}: {e}"
                bar.update()
            if len(group) == batch:
                yield group
                group = []
        if group:
            yield group

    writing: list[tuple[str, int, Future | None]] = []  # episodes handed to the writer, not yet counted

    def finish_writes() -> None:
        for name, n, job in writing:
            if job is not None:
                timed("write", job.result)  # a failed write raises here (finished episodes stay whole)
            written[name] = n
            bar.update()
        writing.clear()

    def run_batch(group: list[Prepared], write_pool: ThreadPoolExecutor | None) -> None:
        nonlocal compiled
        padded = group + [group[-1]] * (batch - len(group))  # one executable: pad the last batch
        ctx_bsk = np.stack([p.context for p in padded])
        keys_b = jnp.stack([episode_key(seed, p.name) for p in padded])  # (B,): sample b's noise from key b
        if not compiled:
            bar.set_postfix_str("compiling the world model")
            session.compile((batch, height, width, 3), ctx_bsk.shape, keys_b)
            bar.set_postfix_str("")
            bar.unpause()  # the rate and ETA count generation only, not the compile
            compiled = True
        video = timed("world_model", rollout, session, np.stack([p.image for p in padded]),
                      np.stack([p.skeleton for p in padded]), ctx_bsk, keys_b)
        finish_writes()  # the previous batch's, written while this one was generated
        for i, ep in enumerate(group):
            meta = {"task_description": ep.prompt,
                    "source": "rynn_jax.teleop.generate (world model)", "intrinsics": K,
                    "weights": weights, "seed": seed,
                    "noise_id": noise_id(ep.name),  # its key: fold_in(key(seed), noise_id)
                    "action_names": list(layout.ACTION_NAMES),
                    "observation.state": "the previous step's command (generated: no robot measured it)"}
            args = (ep, video[i], out / ep.name, meta)
            if write_pool is not None:
                writing.append((ep.name, len(video[i]), write_pool.submit(write_episode, *args)))
            else:
                timed("write", write_episode, *args)
                writing.append((ep.name, len(video[i]), None))
        if write_pool is None:
            finish_writes()

    prep_pool = ThreadPoolExecutor(1, "rynn-prepare") if pipeline and todo else None
    write_pool = ThreadPoolExecutor(2, "rynn-write") if pipeline and todo else None
    try:
        for group in prepared_groups(prep_pool):
            run_batch(group, write_pool)
        finish_writes()
    finally:  # on an error: started writes finish (whole episodes), queued preparation is dropped
        for pool in (prep_pool, write_pool):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=pool is prep_pool)
    bar.close()
    finished = [n for n in names if _done(out / n)]
    if finished:
        write_action_stats(out)
    fail_path = out / FAILURES_FILE
    if failures:
        fail_path.write_text(json.dumps(failures, indent=1))
    elif fail_path.exists():
        fail_path.unlink()
    summary = {"streams": len(names), "skipped_done": len(names) - len(todo), "written": written,
               "failed": failures, "episodes_in_out": len(finished), "batch": batch, "frames_asked": num_frames,
               "resolution": [height, width], "seconds": round(time.perf_counter() - t0, 3),
               "waited_seconds": {k: round(v, 3) for k, v in waits.items()}, "pipeline": pipeline,
               "backend": jax.default_backend()}
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=1))
    return summary


def main(argv: list[str] | None = None) -> int:
    p = errors.ArgumentParser(prog="python serve.py generate", description=__doc__)
    p.add_argument("--streams", required=True, help="directory searched for operator_stream.npz (+ reference.png)")
    p.add_argument("--out", required=True, help="output root (robot episode layout; re-run to resume)")
    p.add_argument("--batch", type=int, default=1, help="streams generated together in one batched session")
    p.add_argument("--frames", type=int, default=33, help="video frames per episode")
    p.add_argument("--resolution", default=None, type=errors.height_width,
                   help="HxW of the generated video (default: the bundled student's 128x224; tiny random "
                        "networks 96x160; 480x832 for the released models)")
    p.add_argument("--image", default=None, help="one reference picture for every stream (else each dir's reference.png)")
    p.add_argument("--task-description", default=None, help="metadata text (default: each stream's meta)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dit", default=None, help="converted DiT directory (with a control branch)")
    p.add_argument("--vae", default=None, help="converted VAE directory")
    p.add_argument("--random-weights", action="store_true",
                   help="tiny random networks instead of the bundled weights (shape and timing work)")
    p.add_argument("--text", default=None, help="one precomputed umT5 embedding (.safetensors) for every stream")
    p.add_argument("--text-embeddings", default=None, metavar="DIR",
                   help="per-stream prompts: DIR/<sha256(task description)>.safetensors (data/README.md)")
    p.add_argument("--text-encoder", default=None, metavar="CKPT",
                   help="encode each stream's prompt with this umT5 checkpoint (serve.py encode-prompts --help)")
    p.add_argument("--tokenizer", default=None, metavar="FILE", help="with --text-encoder: its spiece.model "
                   "(default: found beside the checkpoint)")
    p.add_argument("--fp8", action="store_true", help="FP8 DiT block linears (serve.py demo --help)")
    p.add_argument("--fp8-scales", default=None, metavar="FILE", help="with --fp8: static activation scales")
    p.add_argument("--vae-fp8-scales", default=None, metavar="FILE", help="with --vae: FP8 decoder convs")
    p.add_argument("--tae", default=None, metavar="CKPT",
                   help="decode with this tiny autoencoder (official taew2_2 file or trained tiny decoder directory)")
    p.add_argument("--decoder", default="vae", choices=DECODERS,
                   help="tiny: the bundled autoencoder's trained tiny decoder (serve.py demo --help)")
    p.add_argument("--compile-cache", default=None, metavar="DIR", help="persistent XLA compilation cache")
    p.add_argument("--sequential", action="store_true",
                   help="no threads: prepare, generate and write one after the other (same episodes, slower)")
    p.add_argument("--format", default="robot", choices=("robot",) + formats_export.FORMATS,
                   help="robot: the episodes in --out; lerobot / rlds: episodes in --out/episodes, then "
                        "exported to --out/lerobot or --out/rlds (data/README.md)")
    formats_export.add_arguments(p)
    a = p.parse_args(argv)
    a.tae = decoder_checkpoint(a.decoder, a.tae, dit=a.dit, vae=a.vae, random_weights=a.random_weights)
    if a.format != "robot":
        formats_export.check_arguments(a)
    episodes = Path(a.out) / "episodes" if a.format != "robot" else Path(a.out)
    if a.compile_cache:
        compile_cache.enable(a.compile_cache)
    height, width = a.resolution or (None, None)
    summary = generate(Path(a.streams), episodes, batch=a.batch, num_frames=a.frames, seed=a.seed,
                       height=height, width=width, image=Path(a.image) if a.image else None,
                       task_description=a.task_description, dit=a.dit, vae=a.vae, text=a.text,
                       text_embeddings=a.text_embeddings, fp8=a.fp8,
                       fp8_scales=a.fp8_scales, vae_fp8_scales=a.vae_fp8_scales, tae=a.tae,
                       pipeline=not a.sequential, text_encoder=a.text_encoder, tokenizer=a.tokenizer,
                       random_weights=a.random_weights)
    if a.format != "robot" and summary["episodes_in_out"]:  # what finished is exported, failures or not
        summary["export"] = formats_export.export(a.format, str(episodes), os.path.join(a.out, a.format), a)
    print(json.dumps(summary, indent=1))
    if summary["failed"]:
        print(f"{len(summary['failed'])} stream(s) failed, see {episodes / FAILURES_FILE}")
        return 1
    return 0
