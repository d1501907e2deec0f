"""Action normalisation with the dataset's statistics (`<root>/action_stats.json`, written by the
synthetic world's export and read by `data.robot`): the head predicts (a − mean) / std per dimension."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from rynn_jax.data import robot
from rynn_jax.data.errors import DataError


@dataclasses.dataclass(frozen=True)
class ActionNormalizer:
    mean: np.ndarray  # (action_dim,) float32
    std: np.ndarray   # (action_dim,) float32, floored at STD_FLOOR

    STD_FLOOR = 1e-6  # constant dimensions (a joint that never moves) stay finite

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> "ActionNormalizer":
        """`action_stats.json` (or the dataset root holding it); a missing or malformed file is a
        DataError naming it."""
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, robot.STATS_FILE)
        try:
            with open(path) as f:
                raw = json.load(f)
        except (OSError, ValueError) as e:
            raise DataError(path, "unreadable action stats", str(e)) from e
        stats = robot.action_stats(raw, "meanstd", path)
        return cls(stats["mean"], np.maximum(stats["std"], cls.STD_FLOOR).astype(np.float32))

    def normalize(self, actions: np.ndarray) -> np.ndarray:
        return robot.normalize_actions(np.asarray(actions, np.float32), {"mean": self.mean, "std": self.std}, "meanstd")

    def denormalize(self, z: np.ndarray) -> np.ndarray:
        return np.asarray(z, np.float32) * self.std + self.mean

    def to_json(self) -> dict:
        return {"mean": self.mean.tolist(), "std": self.std.tolist()}
