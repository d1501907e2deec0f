"""Training input: a checkpointable grain iterator of host batches (this process's rows).

`latents`: the pre-encoded ArrayRecord shards of each source, mixed per batch (rynn_jax.data).
`synthetic`: records shaped like the latent records, built from a few fixed prototype clips plus
noise — a tiny model can learn them, so a CI run shows the loss falling.
"""

from __future__ import annotations

import glob

import grain
import jax
import numpy as np

from rynn_jax import data as data_lib
from rynn_jax.training import loss4d
from rynn_jax.training.config import DataConfig, TrainConfig, World4DLossConfig

# What the loss reads; everything else in a record (text, actions, ids) stays on the host.
TRAIN_KEYS = ("video_latents", "control_video_latents", "img_latent", "text_embedding")


def train_keys(cfg: TrainConfig) -> tuple[str, ...]:
    """The batch keys the run's loss reads (RynnWorld-4D: the three modalities' latents)."""
    return loss4d.train_keys(cfg.model) if isinstance(cfg.loss, World4DLossConfig) else TRAIN_KEYS


class SyntheticClip:
    """Index → a latent record; a pure function of (seed, index)."""

    def __init__(self, cfg: DataConfig, channels: int, text_dim: int):
        t, h, w = cfg.synthetic_shape
        rng = np.random.default_rng(cfg.seed)
        k = cfg.synthetic_clips
        self.seed = cfg.seed
        self.video = rng.standard_normal((k, t, h, w, channels)).astype(np.float32)
        self.text = rng.standard_normal((k, cfg.text_len, text_dim)).astype(np.float32)
        # the skeleton latent is a fixed function of the video: something for control to explain
        self.mix = rng.standard_normal((channels, channels)).astype(np.float32) / np.sqrt(channels)
        # RynnWorld-4D's depth and flow latents: other fixed functions of it (what JA can share)
        self.mix_depth, self.mix_flow = (rng.standard_normal((2, channels, channels)).astype(np.float32)
                                         / np.sqrt(channels))

    def __call__(self, index: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng((self.seed, int(index)))
        proto = int(index) % len(self.video)
        video = self.video[proto] + 0.1 * rng.standard_normal(self.video.shape[1:]).astype(np.float32)
        depth, flow = np.tanh(video @ self.mix_depth), np.tanh(video @ self.mix_flow)
        return {
            "video_latents": video,
            "control_video_latents": video @ self.mix,
            "img_latent": video[:1].copy(),
            "depth_latents": depth, "depth_img_latent": depth[:1].copy(),
            "flow_latents": flow, "flow_img_latent": flow[:1].copy(),
            "text_embedding": self.text[proto],
        }


def make_iterator(cfg: TrainConfig) -> grain.DatasetIterator:
    d = cfg.data
    keys = train_keys(cfg)
    select = lambda batch: {k: batch[k] for k in keys}  # noqa: E731
    if d.batch_size % jax.process_count():
        raise ValueError(f"batch_size {d.batch_size} does not split over {jax.process_count()} processes")
    loader = data_lib.LoaderConfig(batch_size=d.batch_size // jax.process_count(), seed=d.seed,
                                   worker_count=d.worker_count, text_len=d.text_len)
    if d.kind == "synthetic":
        clip = SyntheticClip(d, cfg.model.in_channels, cfg.model.text_dim)
        ds = (grain.MapDataset.range(1 << 30)[jax.process_index()::jax.process_count()]
              .map(clip).to_iter_dataset().batch(loader.batch_size, drop_remainder=True))
        return iter(ds.map(select))
    if not d.sources:
        raise ValueError("data.kind='latents' needs data.sources {name: shard glob}")
    per_source = {}
    for i, (name, pattern) in enumerate(sorted(d.sources.items())):
        shards = sorted(glob.glob(pattern))
        if not shards:
            raise FileNotFoundError(f"data source {name}: no shards match {pattern}")
        per_source[name] = data_lib.latent_dataset(shards, loader, seed_offset=i).map(select)
    weights = d.weights or None
    return iter(data_lib.mixture(per_source, weights, loader))
