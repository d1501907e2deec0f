"""Behaviour-cloning samples from robot-layout episodes (docs/sim.md's shards):

    observation  frame k: head-camera RGB, depth (depth.npz) as the 4D model's grey RGB, both
                 resized and centre-cropped to the policy's image size; observation.state[k] (54)
    goal         the task description's text tokens (umT5 embeddings from a directory, or the
                 hashed per-prompt embedding of `rynn_jax.text` when none is given)
    target       action[k+1 … k+chunk], the last action repeated past the episode's end, normalised

An episode's arrays are read once and kept (`cache_episodes` most recent); a sample is a slice.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import threading
from collections.abc import Sequence

import grain
import numpy as np

from rynn_jax import text as text_lib
from rynn_jax.data import robot
from rynn_jax.data import video as video_lib
from rynn_jax.data.errors import DataError
from rynn_jax.data.geometry_video import depth_to_rgb
from rynn_jax.kinematics import layout
from rynn_jax.policy.normalize import ActionNormalizer

def goal_tokens(prompt: str, length: int, dim: int, text_dir: str = "") -> np.ndarray:
    """(length, dim) goal tokens: the first `length` of the prompt's embedding in `text_dir`
    (`<sha256(prompt)>.safetensors`), or its hashed embedding when text_dir is ""."""
    if not text_dir:
        return text_lib.hashed_embedding(prompt, length, dim)
    path = os.path.join(text_dir, text_lib.prompt_file_name(prompt))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no embedding of {prompt!r} (python serve.py encode-prompts ...)")
    return text_lib.load_text_context(path, length, dim)


def observation(rgb_hw3: np.ndarray, depth_m_hw: np.ndarray, size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """RGB and depth-as-grey-RGB uint8 (H, W, 3) at `size` (resized to cover, centre-cropped)."""
    h, w = size
    rgb, depth_rgb = np.asarray(rgb_hw3, np.uint8), depth_to_rgb(depth_m_hw)
    if rgb.shape[:2] != (h, w):
        rgb, depth_rgb = (video_lib.resize_crop(x[None], w, h)[0] for x in (rgb, depth_rgb))
    return rgb, depth_rgb


def load_episode(directory: str, size: tuple[int, int], chunk: int, goal_len: int, goal_dim: int,
                 text_dir: str = "") -> dict[str, np.ndarray]:
    """Every frame's observation and target chunk of one episode (raw actions)."""
    ts = os.path.join(directory, robot.TIMESERIES_FILE)
    actions = robot.read_vectors(ts, robot.ACTION_COLUMN, layout.ACTION_DIM)
    state = robot.read_vectors(ts, robot.STATE_COLUMN, layout.ACTION_DIM)
    try:
        with open(os.path.join(directory, robot.METADATA_FILE)) as f:
            prompt = str(json.load(f)["task_description"])
        with np.load(os.path.join(directory, robot.DEPTH_FILE)) as z:
            depth = z["depth_mm"].astype(np.float32) / 1000.0
    except (OSError, ValueError, KeyError) as e:
        raise DataError(directory, "unreadable episode", str(e)) from e
    n = min(len(actions), len(depth))
    video = os.path.join(directory, robot.VIDEO_FILE)
    frames = video_lib.read_frames(video, range(n), depth.shape[2], depth.shape[1])
    obs = [observation(frames[k], depth[k], size) for k in range(n)]
    idx = np.minimum(np.arange(n)[:, None] + 1 + np.arange(chunk)[None], n - 1)
    return {"rgb": np.stack([o[0] for o in obs]), "depth_rgb": np.stack([o[1] for o in obs]),
            "state": state[:n], "actions": actions[idx], "goal": goal_tokens(prompt, goal_len, goal_dim, text_dir)}


class EpisodeCache:
    """The last `size` episodes' arrays (thread-safe; grain reads with threads)."""

    def __init__(self, episodes: int, **load_kwargs):
        self.size, self.kw = episodes, load_kwargs
        self.items: collections.OrderedDict[str, dict] = collections.OrderedDict()
        self.lock = threading.Lock()

    def __call__(self, directory: str) -> dict[str, np.ndarray]:
        with self.lock:
            if directory in self.items:
                self.items.move_to_end(directory)
                return self.items[directory]
        ep = load_episode(directory, **self.kw)
        with self.lock:
            self.items[directory] = ep
            while len(self.items) > self.size:
                self.items.popitem(last=False)
        return ep


@dataclasses.dataclass
class LoadSample:
    """(episode dir, frame) → one training example (normalised target chunk)."""
    cache: EpisodeCache
    normalizer: ActionNormalizer

    def __call__(self, item: tuple[str, int]) -> dict[str, np.ndarray]:
        directory, k = item
        ep = self.cache(directory)
        return {"rgb": ep["rgb"][k], "depth_rgb": ep["depth_rgb"][k], "state": ep["state"][k],
                "goal": ep["goal"], "actions": self.normalizer.normalize(ep["actions"][k])}


def samples(dirs: Sequence[str]) -> list[tuple[str, int]]:
    """Every (episode, frame) whose target chunk starts inside the episode (frames 0 … T−2)."""
    out = []
    for d in dirs:
        n = robot.read_vectors(os.path.join(d, robot.TIMESERIES_FILE), robot.ACTION_COLUMN, layout.ACTION_DIM).shape[0]
        out += [(d, k) for k in range(n - 1)]
    if not out:
        raise ValueError("no training samples (episodes shorter than 2 frames?)")
    return out


def make_iterator(items: list[tuple[str, int]], load: LoadSample, batch_size: int, seed: int) -> grain.DatasetIterator:
    """Checkpointable iterator of batches: items shuffled anew each epoch."""
    ds = grain.MapDataset.source(items).shuffle(seed=seed).repeat(None).map(load)
    return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=2 * batch_size))
                .batch(batch_size, drop_remainder=True))
