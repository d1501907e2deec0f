"""Our own latent space: the Wan2.2 VAE layout (models/vae.py) at a small config, trained on the
synthetic world's videos and exported as a VAE directory that every VAE loader of the project reads.

    python train.py --config configs/synthetic_ae.py                  # train (+ export, + held-out eval)
    python -m rynn_jax.training.autoencoder export --config configs/synthetic_ae.py --out DIR
    python -m rynn_jax.eval.autoencoders DIR [DIR ...]               # exports side by side on held-out clips

The contract is the Wan2.2 VAE's: causal in time, 4× temporal compression (clips of 1 + 4·k
frames → 1 + k latent frames), streaming encode/decode with static caches — the same code
(`vae.encode`, `vae.encode_chunk`, ...), only smaller widths. Each episode directory gives two
training videos, the head-camera RGB and the rendered skeleton: the same autoencoder encodes the
skeleton control video during pre-encoding (rynn_jax.data.preencode).

Loss: L1 + MSE on pixels of the unclamped reconstruction, plus `kl_weight` · KL of the posterior
(0 by default: the decoder sees the posterior mean, a deterministic autoencoder like the tiny
autoencoders that serve video diffusion; the latent scale the KL term would pin down is instead
set by the export, which normalizes by the measured per-channel statistics).

Export: parameters in `export_dtype` (bfloat16) + config.json (rynn_jax.converted_weights layout) whose
latents_mean/std are the per-channel mean/std of the posterior means over `data.stats_clips`
training clips, measured with the exported weights, so the DiT sees ~unit-variance latents; then
the held-out PSNR of the exported model, whole clip and streaming (`heldout.json`).

Read top to bottom: Config → Input → State → Update → Evaluation → Export → Loop → CLI.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import glob
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rynn_jax import converted_weights, errors
from rynn_jax.atomic import atomic_dir, is_partial_dir
from rynn_jax.data import geometry_video
from rynn_jax.data import pipeline as pipeline_lib
from rynn_jax.data import video as video_lib
from rynn_jax.data.errors import DataError
from rynn_jax.models import build
from rynn_jax.models import vae as vae_lib
from rynn_jax.models.vae import WanVAE, WanVAEConfig
from rynn_jax.training import checkpointing, optim
from rynn_jax.training import config as config_lib
from rynn_jax.training import loop as loop_lib
from rynn_jax.training import metrics as metrics_lib
from rynn_jax.training.config import CheckpointConfig, LogConfig, OptimConfig
from rynn_jax.training.state import TrainState
from rynn_jax.training.step import apply_gradients

log = logging.getLogger("rynn_jax.training")

# --------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------

SIM_VIDEOS = {"rgb": "observation.images.head.mp4", "skeleton": "skeleton.mp4"}  # docs/sim.md
# The exact depth and flow renders as the 4D model's grey / colour-wheel videos (data/geometry_video.py)
GEOMETRY_VIDEOS = {"depth": "depth.npz", "flow": "flow.npz"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class AutoencoderDataConfig:
    train_dirs: tuple[str, ...] = ()  # episode directories or globs of them ("data/sim/train/*/episode_*")
    heldout_dirs: tuple[str, ...] = ()  # held-out episodes, for evaluation only (empty: no evaluation)
    videos: dict[str, str] = dataclasses.field(default_factory=lambda: dict(SIM_VIDEOS))  # name → file per episode
    height: int = 128  # frames are resized to cover height × width, then centre-cropped (data.video)
    width: int = 224
    num_frames: int = 17  # frames per clip, 1 + 4·k; a clip starts at a random frame of its video
    batch_size: int = 16  # clips per step (also per evaluation batch)
    seed: int = 0  # shuffle order and clip starts
    worker_count: int = 0  # grain worker processes decoding clips; 0 = threads of this process
    worker_buffer_size: int = 2  # batches each worker prepares ahead
    read_threads: int = 4  # decoding threads per process (PyAV releases the GIL)
    eval_clips: int = 64  # held-out clips evaluated, spread evenly over episodes × videos
    flow_max_px: float = geometry_video.FLOW_MAX_PX  # colour-wheel radius of flow.npz videos (px)
    stats_clips: int = 256  # training clips whose posterior means give the exported latents_mean/std


@dataclasses.dataclass(frozen=True, kw_only=True)
class AutoencoderTrainConfig:
    model: WanVAEConfig = dataclasses.field(default_factory=WanVAEConfig.synthetic)  # dtype = compute dtype
    data: AutoencoderDataConfig = dataclasses.field(default_factory=AutoencoderDataConfig)
    optim: OptimConfig = dataclasses.field(default_factory=lambda: OptimConfig(lr=5e-4, ema_decay=0.0))
    ckpt: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    log: LogConfig = dataclasses.field(default_factory=LogConfig)
    l1_weight: float = 1.0  # pixel L1 (sharp edges)
    mse_weight: float = 1.0  # pixel MSE (what PSNR measures)
    kl_weight: float = 0.0  # KL(posterior ‖ N(0, 1)); 0 = decode the posterior mean (no sampling)
    total_steps: int = 4000  # optimizer steps (the cosine schedule spans them)
    seed: int = 0  # parameter init and posterior samples (fold_in(rng, step))
    eval_every: int = 0  # held-out whole-clip PSNR every N steps (0 = only after training)
    export_dir: str = ""  # after training: write the VAE directory here and evaluate it ("" = no export)
    export_dtype: str = "bfloat16"  # storage dtype of the exported parameters
    # Fault injection for tests: SIGKILL this process right after dispatching this step (0 = never).
    debug_kill_at_step: int = 0

    def __post_init__(self):
        m, d = self.model, self.data
        if d.num_frames < 1 + m.temporal_stride or (d.num_frames - 1) % m.temporal_stride:
            raise ValueError(f"data.num_frames must be 1 + {m.temporal_stride}·k with k ≥ 1 (the VAE's "
                             f"temporal stride), got {d.num_frames}")
        if d.height % m.spatial_stride or d.width % m.spatial_stride or min(d.height, d.width) <= 0:
            raise ValueError(f"data.height and data.width must be positive multiples of the VAE's spatial "
                             f"stride {m.spatial_stride}, got {d.height}×{d.width}")
        for name, value in (("data.batch_size", d.batch_size), ("total_steps", self.total_steps),
                            ("data.eval_clips", d.eval_clips), ("data.stats_clips", d.stats_clips)):
            if value < 1:
                raise ValueError(f"{name} must be ≥ 1, got {value}")
        if not d.videos:
            raise ValueError("data.videos names no video file")
        if min(self.l1_weight, self.mse_weight, self.kl_weight) < 0:
            raise ValueError("l1_weight, mse_weight and kl_weight must be ≥ 0")
        if self.export_dtype not in ("bfloat16", "float32"):
            raise ValueError(f"export_dtype must be 'bfloat16' or 'float32', got {self.export_dtype!r}")


# --------------------------------------------------------------------------------------------------
# Input: (kind, video path) items → random clips of num_frames decoded frames (only those frames)
# --------------------------------------------------------------------------------------------------

Item = tuple[int, str]  # (index into data.videos, path of the video file)


def episode_dirs(patterns: Sequence[str], field: str) -> list[str]:
    """The episode directories that `patterns` (paths or globs) name, in order, each once; episodes
    still being written (a data run in progress beside training) are left out."""
    if isinstance(patterns, str):
        patterns = (patterns,)
    dirs: dict[str, None] = {}
    for pattern in patterns:
        hits = sorted(p for p in glob.glob(os.path.expanduser(pattern)) if os.path.isdir(p) and not is_partial_dir(p))
        if not hits:
            raise FileNotFoundError(f"{field}: no episode directory matches {pattern!r}")
        dirs.update(dict.fromkeys(hits))
    if not dirs:
        raise ValueError(f"{field} is empty")
    return list(dirs)


def video_items(dirs: Sequence[str], videos: dict[str, str]) -> list[Item]:
    """Every (kind, file) of every episode, grouped by kind; a missing file is an error."""
    items = []
    for kind, name in enumerate(videos.values()):
        for d in dirs:
            path = os.path.join(d, name)
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{path}: missing (data.videos names {name!r} in every episode)")
            items.append((kind, path))
    return items


class LoadClip:
    """(item, rng) → {"video": uint8 (T, H, W, 3), "kind": int32}: a clip at a random start,
    decoding only its frames (seek to the keyframe before it); depth.npz / flow.npz items become
    the 4D model's depth and flow videos of the same window. Picklable for grain workers."""

    def __init__(self, data: AutoencoderDataConfig):
        self.t, self.h, self.w, self.max_px = data.num_frames, data.height, data.width, data.flow_max_px

    def __call__(self, item: Item, rng: np.random.Generator) -> dict[str, np.ndarray]:
        kind, path = item
        render = geometry_video.read_render(path) if path.endswith(".npz") else None  # read once
        is_flow = path.endswith(geometry_video.FLOW_FILE)
        n = video_lib.probe_video(path).num_frames if render is None else geometry_video.render_frames(is_flow, render)
        if n < self.t:
            raise DataError(path, "too short", f"{n} frames < data.num_frames {self.t}")
        start = int(rng.integers(0, n - self.t + 1))
        if render is not None:
            frames = geometry_video.render_window(is_flow, render, start, self.t, self.h, self.w, self.max_px)
        else:
            frames = video_lib.read_frames(path, range(start, start + self.t), self.w, self.h)
        return {"video": frames, "kind": np.int32(kind)}


def make_iterator(data: AutoencoderDataConfig, items: Sequence[Item]) -> grain.DatasetIterator:
    """Checkpointable iterator of {"video": (B, T, H, W, 3) uint8, "kind": (B,)} batches: items
    shuffled anew every epoch, each with a random start (a pure function of seed and position)."""
    ds = (grain.MapDataset.source(list(items)).shuffle(seed=data.seed).repeat(None)
          .random_map(LoadClip(data), seed=data.seed))
    read = grain.ReadOptions(num_threads=data.read_threads, prefetch_buffer_size=2 * data.batch_size)
    ds = ds.to_iter_dataset(read).batch(data.batch_size, drop_remainder=True)
    loader = pipeline_lib.LoaderConfig(batch_size=data.batch_size, worker_count=data.worker_count,
                                       worker_buffer_size=data.worker_buffer_size)
    return iter(pipeline_lib.prefetch(ds, loader))


def fixed_clips(data: AutoencoderDataConfig, items: Sequence[Item], n: int, stream: int
                ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """n clips spread evenly over `items` (kinds, uint8 videos) in batches of data.batch_size; clip
    i starts where rng (seed, stream, i) puts it, so every call sees the same clips."""
    load = LoadClip(data)
    picks = (np.arange(n) * len(items)) // n if n <= len(items) else np.arange(n) % len(items)

    def one(i: int) -> dict[str, np.ndarray]:
        return load(items[picks[i]], np.random.default_rng((data.seed, stream, i)))

    with concurrent.futures.ThreadPoolExecutor(max(1, data.read_threads)) as pool:
        for i0 in range(0, n, data.batch_size):
            clips = list(pool.map(one, range(i0, min(n, i0 + data.batch_size))))
            yield np.stack([c["kind"] for c in clips]), np.stack([c["video"] for c in clips])


EVAL_STREAM, STATS_STREAM = 1, 2  # fixed_clips streams: held-out evaluation, latent statistics

# --------------------------------------------------------------------------------------------------
# State
# --------------------------------------------------------------------------------------------------


def init_state(cfg: AutoencoderTrainConfig, tx: optax.GradientTransformation) -> tuple[nnx.GraphDef, TrainState]:
    """Fresh model (float32 parameters, cfg.model.dtype compute) and optimizer state. The VAE has no
    frozen parameters and no running statistics: those TrainState fields stay empty."""
    model = build.init_model(WanVAE, dataclasses.replace(cfg.model, param_dtype="float32"), cfg.seed)
    graphdef, params = nnx.split(model, nnx.Param)
    if cfg.ckpt.init_from:  # continue from exported weights (a run on another machine): fresh optimizer
        params = _exported_params(cfg.ckpt.init_from, cfg.model, params)
    ema = jax.tree.map(jnp.copy, params) if cfg.optim.ema_decay > 0 else nnx.State({})
    return graphdef, TrainState(step=jnp.zeros((), jnp.int32), params=params, frozen=nnx.State({}),
                                stats=nnx.State({}), opt_state=tx.init(params), ema=ema,
                                rng=jax.random.PRNGKey(cfg.seed))


def architecture(cfg: WanVAEConfig) -> dict:
    """What an exported autoencoder must share with a recipe's model to continue from it: every
    field but the dtypes and the latent statistics (which training measures again)."""
    return {k: v for k, v in dataclasses.asdict(cfg).items()
            if k not in ("dtype", "param_dtype", "latents_mean", "latents_std")}


def _exported_params(path: str, model_cfg: WanVAEConfig, like: nnx.State) -> nnx.State:
    """float32 parameters of an exported autoencoder directory, checked against the recipe's model."""
    from rynn_jax.models.vae_weights import load_vae

    errors.existing(path, "ckpt.init_from", kind="directory")
    loaded = load_vae(path)
    want, got = architecture(model_cfg), architecture(loaded.cfg)
    if got != want:
        diff = sorted(k for k in want if want[k] != got.get(k))
        raise errors.UsageError(f"ckpt.init_from {path}: a different autoencoder ({', '.join(diff)} differ from the recipe)")
    params = nnx.split(loaded, nnx.Param)[1]
    return jax.tree.map(lambda p, q: jnp.asarray(p, jnp.float32).reshape(q.shape), params, like)


def final_params(state: TrainState, use_ema: bool = True) -> nnx.State:
    """The parameters to evaluate and export: the EMA when the run kept one."""
    return state.ema if use_ema and jax.tree.leaves(state.ema) else state.params


# --------------------------------------------------------------------------------------------------
# Update
# --------------------------------------------------------------------------------------------------


def to_unit(video_u8: jax.Array) -> jax.Array:
    return video_u8.astype(jnp.float32) / 127.5 - 1.0


def psnr(mse: jax.Array) -> jax.Array:
    """PSNR in dB of video in [-1, 1] (peak-to-peak 2), i.e. of 8-bit video on its 0..255 scale."""
    return 10.0 * jnp.log10(4.0 / jnp.maximum(mse, 1e-12))


def gaussian_kl(mean: jax.Array, logvar: jax.Array) -> jax.Array:
    """Mean over elements of KL(N(mean, exp(logvar)) ‖ N(0, 1))."""
    return jnp.mean(0.5 * (jnp.square(mean) + jnp.exp(logvar) - 1.0 - logvar))


def losses(model: WanVAE, video_u8: jax.Array, rng: jax.Array, cfg: AutoencoderTrainConfig
           ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Weighted L1 + MSE (+ KL) of one batch; pixels compared before the decoder's clamp."""
    x = to_unit(video_u8)
    mean, logvar, _ = model.posterior(x, None, first=True)
    logvar = jnp.clip(logvar, -30.0, 20.0)  # as diffusers' DiagonalGaussianDistribution
    z = mean
    if cfg.kl_weight > 0:
        z = mean + jnp.exp(0.5 * logvar) * jax.random.normal(rng, mean.shape)
    recon, _ = model.decode_frames(z, None, first=True, normalize=False, clip=False)
    err = recon - x
    l1, mse = jnp.mean(jnp.abs(err)), jnp.mean(jnp.square(err))
    kl = gaussian_kl(mean, logvar)
    loss = cfg.l1_weight * l1 + cfg.mse_weight * mse + cfg.kl_weight * kl
    return loss, {"l1": l1, "mse": mse, "kl": kl, "psnr": psnr(mse)}


def make_step(cfg: AutoencoderTrainConfig, graphdef: nnx.GraphDef, tx: optax.GradientTransformation):
    """(TrainState, {"video": uint8}) → (TrainState, metrics), pure; jit it with the state donated."""
    schedule_lr = optim.lr_schedule(cfg.optim, cfg.total_steps)

    def loss_fn(params: nnx.State, video_u8: jax.Array, rng: jax.Array):
        return losses(nnx.merge(graphdef, params), video_u8, rng, cfg)

    def step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, dict[str, jax.Array]]:
        rng = jax.random.fold_in(state.rng, state.step)
        (loss, parts), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch["video"], rng)
        new, metrics = apply_gradients(state, grads, loss, tx, cfg.optim, schedule_lr)
        return new, {**metrics, **parts}

    return step


# --------------------------------------------------------------------------------------------------
# Evaluation: PSNR of reconstructions, whole clip and streaming (the serving path)
# --------------------------------------------------------------------------------------------------


# One compiled program per (graphdef, shapes): every Codec of the same config shares them.
_encode = jax.jit(lambda g, p, x: vae_lib.encode(g, p, x, normalize=False), static_argnums=0)
_decode = jax.jit(lambda g, p, z: vae_lib.decode(g, p, z, normalize=False), static_argnums=0)
_encode_chunk = jax.jit(lambda g, p, c, x, first: vae_lib.encode_chunk(g, p, c, x, normalize=False, first=first),
                        static_argnums=(0, 4))
_decode_chunk = jax.jit(lambda g, p, c, z, first: vae_lib.decode_chunk(g, p, c, z, normalize=False, first=first),
                        static_argnums=(0, 4))


@dataclasses.dataclass
class Codec:
    """A VAE as (graphdef, params) with jitted whole-clip and streaming programs (raw latents)."""

    graphdef: nnx.GraphDef
    params: nnx.State

    @property
    def cfg(self) -> WanVAEConfig:
        return nnx.merge(self.graphdef, self.params).cfg

    def encode(self, video: jax.Array) -> jax.Array:
        return _encode(self.graphdef, self.params, video)

    def decode(self, z: jax.Array) -> jax.Array:
        return _decode(self.graphdef, self.params, z)

    def reconstruct(self, video: jax.Array) -> jax.Array:
        return self.decode(self.encode(video))

    def reconstruct_streaming(self, video: jax.Array) -> jax.Array:
        """Encode 4 frames per call (frame 0 alone first), decode one latent frame per call."""
        cfg, (b, t, h, w, _) = self.cfg, video.shape
        s = cfg.temporal_stride
        enc = vae_lib.init_encode_cache(cfg, b, h, w)
        dec = vae_lib.init_decode_cache(cfg, b, h, w)
        chunks = [jnp.repeat(video[:, :1], s, axis=1)] + [video[:, i:i + s] for i in range(1, t, s)]
        frames = []
        for i, chunk in enumerate(chunks):
            z, enc = _encode_chunk(self.graphdef, self.params, enc, chunk, i == 0)
            y, dec = _decode_chunk(self.graphdef, self.params, dec, z, i == 0)
            frames.append(y[:, s - 1:] if i == 0 else y)  # the first call returns frame 0 at index s−1
        return jnp.concatenate(frames, axis=1)


def evaluate(codec: Codec, data: AutoencoderDataConfig, items: Sequence[Item], streaming: bool = False,
             per_frame: bool = False) -> dict:
    """Mean per-clip PSNR (dB) of the reconstructions of `data.eval_clips` fixed clips, per video
    kind and over all; with `streaming`, also through the streaming programs and their largest
    difference from the whole-clip reconstruction; with `per_frame`, `psnr_frames_{kind}`: each
    frame's PSNR averaged over the kind's clips (frame 0 is encoded alone, the others 4 per latent)."""
    names = list(data.videos)
    per_kind: dict[str, list[float]] = {n: [] for n in names}
    per_kind_stream: dict[str, list[float]] = {n: [] for n in names}
    frames: dict[str, list[np.ndarray]] = {n: [] for n in names}
    max_diff = 0.0
    for kinds, video_u8 in fixed_clips(data, items, data.eval_clips, EVAL_STREAM):
        x = to_unit(jnp.asarray(video_u8))
        whole = codec.reconstruct(x)
        frame_mse = jnp.mean(jnp.square(whole - x), axis=(2, 3, 4))  # (B, T); a clip's MSE is their mean
        clip_psnr = np.asarray(psnr(jnp.mean(frame_mse, axis=1)))
        for k, p in zip(kinds, clip_psnr):
            per_kind[names[k]].append(float(p))
        if per_frame:
            for k, f in zip(kinds, np.asarray(psnr(frame_mse))):
                frames[names[k]].append(f)
        if streaming:
            stream = codec.reconstruct_streaming(x)
            max_diff = max(max_diff, float(jnp.max(jnp.abs(stream - whole))))
            stream_psnr = np.asarray(psnr(jnp.mean(jnp.square(stream - x), axis=(1, 2, 3, 4))))
            for k, p in zip(kinds, stream_psnr):
                per_kind_stream[names[k]].append(float(p))
    out = {f"psnr_{n}": float(np.mean(v)) for n, v in per_kind.items() if v}
    out["psnr"] = float(np.mean([p for v in per_kind.values() for p in v]))
    if streaming:
        out |= {f"psnr_streaming_{n}": float(np.mean(v)) for n, v in per_kind_stream.items() if v}
        out["psnr_streaming"] = float(np.mean([p for v in per_kind_stream.values() for p in v]))
        out["streaming_max_abs_diff"] = max_diff
    if per_frame:
        out |= {f"psnr_frames_{n}": np.mean(v, axis=0).tolist() for n, v in frames.items() if v}
    out["clips"] = data.eval_clips
    return out


# --------------------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------------------


def latent_statistics(codec: Codec, data: AutoencoderDataConfig, items: Sequence[Item]
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std (float64, population) of the raw posterior means of
    `data.stats_clips` fixed training clips, over batch, time and space."""
    s1 = s2 = 0.0
    count = 0
    for _, video_u8 in fixed_clips(data, items, data.stats_clips, STATS_STREAM):
        z = np.asarray(codec.encode(to_unit(jnp.asarray(video_u8))), np.float64)
        z = z.reshape(-1, z.shape[-1])
        s1, s2, count = s1 + z.sum(0), s2 + np.square(z).sum(0), count + z.shape[0]
    mean = s1 / count
    std = np.sqrt(np.maximum(s2 / count - np.square(mean), 0.0))
    if not np.all(std > 0):
        raise ValueError(f"latent channels {np.flatnonzero(std == 0).tolist()} are constant: cannot normalize")
    return mean, std


def export(cfg: AutoencoderTrainConfig, params: nnx.State, out_dir: str) -> dict:
    """Write the VAE directory (params in export_dtype + config.json with measured latent
    statistics) and evaluate what was written, loaded back by the project's loader. The directory
    appears whole, held-out scores included, or not at all (a run stopped during the evaluation
    leaves no folder that later stages would take for finished)."""
    from rynn_jax.models.vae_weights import load_vae

    export_cfg = dataclasses.replace(cfg.model, dtype="float32", param_dtype=cfg.export_dtype)
    stored = jax.tree.map(lambda p: p.astype(cfg.export_dtype), params)
    graphdef = nnx.split(vae_lib.abstract_vae(export_cfg), nnx.Param)[0]
    train_items = video_items(episode_dirs(cfg.data.train_dirs, "data.train_dirs"), cfg.data.videos)
    mean, std = latent_statistics(Codec(graphdef, stored), cfg.data, train_items)
    export_cfg = dataclasses.replace(export_cfg, latents_mean=tuple(map(float, mean)),
                                     latents_std=tuple(map(float, std)))
    pure = jax.tree.map(np.asarray, nnx.to_pure_dict(stored))
    size = sum(x.nbytes for x in jax.tree.leaves(pure))
    summary = {"parameters": int(sum(x.size for x in jax.tree.leaves(pure))), "bytes": int(size),
               "latents_mean": list(export_cfg.latents_mean), "latents_std": list(export_cfg.latents_std)}
    with atomic_dir(out_dir) as tmp:
        converted_weights.save_params(str(tmp), pure, export_cfg)
        if cfg.data.heldout_dirs:
            items = video_items(episode_dirs(cfg.data.heldout_dirs, "data.heldout_dirs"), cfg.data.videos)
            summary["heldout"] = evaluate(Codec(*nnx.split(load_vae(str(tmp)), nnx.Param)), cfg.data, items,
                                          streaming=True)
        with open(tmp / "heldout.json", "w") as f:
            json.dump(summary, f, indent=1)
    log.info("exported %s: %d parameters, %.1f MB; held-out %s", out_dir, summary["parameters"], size / 1e6,
             summary.get("heldout"))
    return summary


# --------------------------------------------------------------------------------------------------
# Loop
# --------------------------------------------------------------------------------------------------


def _flops(compiled) -> float:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    return float((cost or {}).get("flops", 0.0))


def train(cfg: AutoencoderTrainConfig) -> list[float]:
    """Runs (or resumes) `cfg`, then exports when cfg.export_dir is set; returns this call's losses."""
    train_items = video_items(episode_dirs(cfg.data.train_dirs, "data.train_dirs"), cfg.data.videos)
    heldout = (video_items(episode_dirs(cfg.data.heldout_dirs, "data.heldout_dirs"), cfg.data.videos)
               if cfg.data.heldout_dirs else [])
    log.info("%d training videos, %d held-out videos", len(train_items), len(heldout))
    data_iter = make_iterator(cfg.data, train_items)

    tx = optim.make_optimizer(cfg.optim, cfg.total_steps)
    graphdef, state = init_state(cfg, tx)
    log.info("autoencoder: %d parameters", vae_lib.count_params(state.params))
    evaluate_state = (lambda st: evaluate(Codec(graphdef, final_params(st)), cfg.data, heldout)) if heldout else None
    state, losses_seen = run_steps(cfg, state, make_step(cfg, graphdef, tx), data_iter, evaluate_state)
    if cfg.export_dir:
        export(cfg, final_params(state), cfg.export_dir)
    return losses_seen


def run_steps(cfg, state: TrainState, step_fn, data_iter: grain.DatasetIterator,
              evaluate_state: Callable[[TrainState], dict[str, float]] | None = None
              ) -> tuple[TrainState, list[float]]:
    """The loop of the clip trainers (this one and training/decoder.py; `cfg` has their common
    fields: data, ckpt, log, total_steps, eval_every, debug_kill_at_step): resume from cfg.ckpt.dir,
    compile `step_fn` (state, {"video": uint8}) ahead with the state donated, run to total_steps
    with checkpoints, logged throughput and MFU, and `evaluate_state` every cfg.eval_every steps.
    Returns the final state and the losses of the steps run."""
    ckpt = checkpointing.Checkpointer(cfg.ckpt) if cfg.ckpt.dir else None
    if ckpt is not None:
        state = ckpt.resume(state, data_iter)

    d = cfg.data
    batch_spec = {"video": jax.ShapeDtypeStruct((d.batch_size, d.num_frames, d.height, d.width, 3), jnp.uint8)}
    train_step = jax.jit(step_fn, donate_argnums=0).lower(state, batch_spec).compile()
    frames_per_step = d.batch_size * d.num_frames
    peak = cfg.log.peak_tflops_per_device * 1e12
    throughput = None
    losses_seen: list[float] = []

    def on_metrics(step: int, m: dict[str, float]) -> None:
        nonlocal throughput
        losses_seen.append(m["loss"])
        if throughput is None:  # timing starts once the first step (and its compile) is done
            throughput = metrics_lib.Throughput(frames_per_step, _flops(train_step), peak)
            return
        throughput.tick()
        if step % cfg.log.every == 0:
            perf = throughput.read()
            perf = {"perf/steps_per_s": perf["perf/steps_per_s"], "perf/frames_per_s": perf["perf/tokens_per_s"],
                    "perf/mfu": perf["perf/mfu"]}
            loop.bar.set_postfix(loss=f"{m['loss']:.4f}", psnr=f"{m['psnr']:.2f}",
                                 steps_per_s=f"{perf['perf/steps_per_s']:.2f}")
            loop.writer.scalars(step, {f"train/{k}": v for k, v in m.items()} | perf)

    loop = loop_lib.Loop(start=int(state.step), total_steps=cfg.total_steps, log=cfg.log, ckpt_cfg=cfg.ckpt,
                         ckpt=ckpt, data_iter=data_iter, on_metrics=on_metrics,
                         debug_kill_at_step=cfg.debug_kill_at_step)
    for s in loop.steps():
        batch = next(data_iter)
        state, m = train_step(state, {"video": jax.device_put(batch["video"])})
        loop.dispatched(s, m)
        loop.end_step(s, state)
        if evaluate_state is not None and cfg.eval_every and (s % cfg.eval_every == 0 or s == cfg.total_steps):
            result = evaluate_state(state)
            loop.writer.scalars(s, {f"heldout/{k}": v for k, v in result.items()})
            log.info("step %d held-out %s", s, result)
    loop.close()
    return state, losses_seen


# --------------------------------------------------------------------------------------------------
# CLI: export a run's newest checkpoint
# --------------------------------------------------------------------------------------------------


def restore(cfg: AutoencoderTrainConfig) -> TrainState:
    """The newest readable training state under cfg.ckpt.dir (for export)."""
    tx = optim.make_optimizer(cfg.optim, cfg.total_steps)
    return restore_newest(cfg.ckpt, jax.eval_shape(lambda: init_state(cfg, tx)[1]))


def restore_newest(ckpt_cfg: CheckpointConfig, abstract: TrainState) -> TrainState:
    """The newest readable checkpoint of a clip trainer's run (this module, training/decoder.py)
    into `abstract`'s structure, for export; a missing run is a one-line error."""
    if not ckpt_cfg.dir:
        raise errors.UsageError("set ckpt.dir to the training run to export")
    ckpt = checkpointing.Checkpointer(ckpt_cfg)
    restored = ckpt.restore_latest(abstract, None)
    ckpt.close()
    if restored is None:
        raise errors.InputError(f"ckpt.dir {ckpt_cfg.dir}: no checkpoint to export (train first, or point "
                                "--set ckpt.dir=... at the run)")
    return restored


def export_cli(prog: str, doc: str, config_cls: type, recipe: str, argv: Sequence[str] | None):
    """The `export` command line of the clip trainers (this module and training/decoder.py):
    (arguments, the recipe with its overrides), logging set up."""
    p = errors.ArgumentParser(prog=prog, description=doc)
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="export the newest checkpoint of a run (EMA if kept) and evaluate it")
    e.add_argument("--config", required=True, help=f"the run's recipe ({recipe})")
    e.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    e.add_argument("--out", required=True, help="directory to write")
    e.add_argument("--raw", action="store_true", help="export the raw (not EMA) weights")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("rynn_jax").setLevel(logging.INFO)
    return a, config_lib.apply_overrides(config_lib.load_config(a.config, (config_cls,)), a.set)


def main(argv: Sequence[str] | None = None) -> dict:
    a, cfg = export_cli("python -m rynn_jax.training.autoencoder", __doc__, AutoencoderTrainConfig,
                        "configs/synthetic_ae.py", argv)
    state = restore(cfg)
    summary = export(cfg, final_params(state, use_ema=not a.raw), a.out)
    print(json.dumps({"step": int(state.step), **{k: v for k, v in summary.items() if not k.startswith("latents")}},
                     indent=1))
    return summary


if __name__ == "__main__":
    # Through the importable module, so that the recipe's AutoencoderTrainConfig is the class checked.
    from rynn_jax.training import autoencoder

    sys.exit(errors.run(autoencoder.main))
