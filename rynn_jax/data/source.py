"""`ClipSource`: what EgoDex, VITRA and robot readers share — an episode scan that turns into a
clip index (bad episodes skipped with a reason, or raised when strict) and a per-clip loader.

A source is cheap to pickle (root path + config), so grain worker processes get their own copy;
files are opened per clip, never held open across calls.
"""

from __future__ import annotations

import abc
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from rynn_jax.data import clips as clips_lib
from rynn_jax.data.clips import ClipConfig, ClipRef
from rynn_jax.data.errors import DataError, handle

Sample = dict[str, Any]

# Library exceptions that mean "this file is damaged" (h5py raises OSError/KeyError, numpy
# ValueError/EOFError/UnpicklingError, pyarrow ArrowInvalid ⊂ ValueError).
_FILE_ERRORS = (OSError, KeyError, ValueError, EOFError, IndexError, TypeError, AttributeError)


class ClipSource(abc.ABC):
    name: str = "source"

    def __init__(self, root: str | os.PathLike[str], cfg: ClipConfig, *, strict: bool = False):
        self.root = os.fspath(root)
        self.cfg = cfg
        self.strict = strict
        self._index: list[ClipRef] | None = None

    # ---- to implement ---------------------------------------------------------------------------
    @abc.abstractmethod
    def episodes(self) -> list[str]:
        """Sorted episode keys (relative to root)."""

    @abc.abstractmethod
    def num_samples(self, episode: str) -> int:
        """Length of the episode on the resampled timeline; raises DataError for a bad episode."""

    @abc.abstractmethod
    def load(self, ref: ClipRef) -> Sample:
        """One clip as a sample dict (see `clips`); raises DataError."""

    def prompt(self, ref: ClipRef) -> str | None:
        """The clip's text without loading it, where the source can tell cheaply (metadata); None
        otherwise. Lets the pre-encoder check text embeddings before encoding anything."""
        return None

    # ---- shared ---------------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def index(self, cache_path: str | os.PathLike[str] | None = None) -> list[ClipRef]:
        """All clips of all good episodes, in a deterministic order. With `cache_path`, the scan
        is stored there (JSON) and reused while the config matches."""
        if self._index is not None:
            return self._index
        key = {"source": self.name, "cfg": repr(self.cfg)}
        if cache_path is not None and os.path.exists(cache_path):
            with open(cache_path) as f:
                cached = json.load(f)
            if cached.get("key") == key:
                self._index = [ClipRef(e, s, i) for i, (e, s) in enumerate(cached["clips"])]
                return self._index
        refs: list[ClipRef] = []
        for ep in self.episodes():
            try:
                n = self.num_samples(ep)
                starts = clips_lib.clip_starts(n, self.cfg)
                if not starts:
                    raise DataError(self.path(ep), "too short",
                                    f"{n} samples at {self.cfg.fps:g} fps < {self.cfg.num_frames}")
            except DataError as e:
                handle(e, self.strict)
                continue
            except _FILE_ERRORS as e:
                handle(DataError(self.path(ep), "unreadable", f"{type(e).__name__}: {e}"), self.strict)
                continue
            refs += [ClipRef(ep, s, len(refs) + i) for i, s in enumerate(starts)]
        if cache_path is not None:
            with open(cache_path, "w") as f:
                json.dump({"key": key, "clips": [[r.episode, r.start] for r in refs]}, f)
        self._index = refs
        return refs

    def load_or_none(self, ref: ClipRef) -> Sample | None:
        """`load` under the bad-data policy: None (counted, logged) or raise when strict."""
        try:
            sample = self.load(ref)
        except DataError as e:
            handle(e, self.strict)
            return None
        except _FILE_ERRORS as e:
            handle(DataError(self.path(ref.episode), "unreadable", f"{type(e).__name__}: {e}"),
                   self.strict)
            return None
        sample["clip_id"] = np.asarray(ref.clip_id, np.int64)
        return sample

    def __getstate__(self):  # the index can be large; workers only need refs they are handed
        state = dict(self.__dict__)
        state["_index"] = None
        return state


def empty_actions(num_frames: int) -> dict[str, np.ndarray]:
    return {"actions": np.zeros((num_frames, clips_lib.ACTION_DIM), np.float32),
            "has_actions": np.asarray(False)}


def check_finite(path: str, name: str, x: np.ndarray) -> np.ndarray:
    if not np.isfinite(x).all():
        raise DataError(path, f"nan {name}")
    return x


def check_shape(path: str, name: str, x: np.ndarray, shape: Sequence[int | None]) -> np.ndarray:
    if x.ndim != len(shape) or any(s is not None and s != d for s, d in zip(shape, x.shape)):
        raise DataError(path, "bad shape", f"{name} has shape {x.shape}, expected {tuple(shape)}")
    return x
