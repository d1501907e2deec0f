"""Robot teleop reader (the released RynnWorld sample layout) → 16 fps clips with 54-D actions.

  <root>/action_stats.json                 dataset-level statistics of `action`: per-dimension
                                           lists "mean", "std" and/or "q01", "q99" (54 each)
  <root>/.../episode_<k>/
      observation.images.head.mp4          head-camera video
      timeseries.parquet                   one row per video frame: `action` (54 floats, the
                                           layout [left arm 7 | left hand 20 | right arm 7 |
                                           right hand 20]) and `observation.state` (54 floats)
      metadata.json                        {"task_description": str, "total_frames": int, "fps": float}
      hand_skeleton.npz                    OUR file (the skeleton is what drives the model), one
                                           entry per video frame:
          joints_cam  float32 (N, 2, 21, 3)  operator hand joints (0 left, 1 right, MediaPipe
                                             order) retargeted into the head camera's OpenCV frame, m
          elbows_cam  float32 (N, 2, 3)      elbow points, same frame
          valid       bool    (N, 2, 22)     tracked flags (index 21 = elbow)
          intrinsics  float32 (3, 3)         head-camera K at the video's native resolution

Actions are returned raw by default; `action_norm="meanstd"` gives (a − mean)/std and
`"quantile"` maps [q01, q99] to [−1, 1] (both from action_stats.json).
"""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rynn_jax.data import clips as clips_lib
from rynn_jax.data import skeleton as sk
from rynn_jax.data.clips import ClipConfig, ClipRef
from rynn_jax.data.errors import DataError
from rynn_jax.data.source import ClipSource, Sample, check_finite, check_shape

VIDEO_FILE = "observation.images.head.mp4"
TIMESERIES_FILE = "timeseries.parquet"
METADATA_FILE = "metadata.json"
SKELETON_FILE = "hand_skeleton.npz"
STATS_FILE = "action_stats.json"
ACTION_COLUMN = "action"
STATE_COLUMN = "observation.state"
# Exact ground truth of a synthetic episode (rynn_jax.sim.robot_shards writes them; docs/sim.md)
DEPTH_FILE, FLOW_FILE, SEG_FILE = "depth.npz", "flow.npz", "segmentation.npz"


def read_vectors(path: str, column: str, width: int) -> np.ndarray:
    """A list/fixed-size-list column of a parquet file → float32 (rows, width)."""
    try:
        table = pq.read_table(path, columns=[column])
    except (OSError, ValueError, KeyError) as e:  # ArrowInvalid is a ValueError
        raise DataError(path, "unreadable parquet", str(e)) from e
    return column_vectors(table, column, width, path)


def vectors(x: np.ndarray) -> pa.Array:
    """(rows, width) floats → a fixed-size-list parquet column (the robot layout's vectors)."""
    x = np.ascontiguousarray(x, np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])


def column_vectors(table: pa.Table, column: str, width: int, path: str) -> np.ndarray:
    """A list/fixed-size-list column of a table read from `path` → float32 (rows, width)."""
    if column not in table.column_names:
        raise DataError(path, "bad parquet column", f"no column {column!r}")
    col = table.column(column).combine_chunks()
    try:
        values = np.asarray(col.flatten().to_numpy(zero_copy_only=False), np.float32)
    except (AttributeError, ValueError) as e:
        raise DataError(path, "bad parquet column", f"{column}: {e}") from e
    if values.size != len(col) * width:
        raise DataError(path, "bad parquet column", f"{column} rows are not {width} wide")
    return values.reshape(len(col), width)


def action_stats(raw: dict, action_norm: str, path: str) -> dict[str, np.ndarray]:
    """The statistics `action_norm` needs ("meanstd": mean, std; "quantile": q01, q99), 54 each."""
    need = ("mean", "std") if action_norm == "meanstd" else ("q01", "q99")
    stats = {}
    for k in need:
        if k not in raw or np.size(raw[k]) != clips_lib.ACTION_DIM:
            raise DataError(path, "bad action stats", f"needs {k} with {clips_lib.ACTION_DIM} values")
        stats[k] = np.asarray(raw[k], np.float32).reshape(clips_lib.ACTION_DIM)
    return stats


def check_action_norm(action_norm: str | None) -> None:
    if action_norm not in (None, "meanstd", "quantile"):
        raise ValueError(f"action_norm must be None, 'meanstd' or 'quantile', got {action_norm!r}")


def normalize_actions(actions: np.ndarray, stats: dict[str, np.ndarray] | None, action_norm: str | None
                      ) -> np.ndarray:
    """Raw actions, (a − mean)/std, or [q01, q99] → [−1, 1]."""
    if action_norm == "meanstd":
        return (actions - stats["mean"]) / np.maximum(stats["std"], 1e-6)
    if action_norm == "quantile":
        return 2 * (actions - stats["q01"]) / np.maximum(stats["q99"] - stats["q01"], 1e-6) - 1
    return actions


def read_skeleton(path: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            out = {k: z[k] for k in ("joints_cam", "elbows_cam", "valid", "intrinsics")}
    except KeyError as e:
        raise DataError(path, "missing key", str(e)) from e
    except (OSError, ValueError, EOFError) as e:
        raise DataError(path, "unreadable skeleton", str(e)) from e
    n = out["joints_cam"].shape[0]
    check_shape(path, "joints_cam", out["joints_cam"], (n, 2, sk.NUM_JOINTS, 3))
    check_shape(path, "elbows_cam", out["elbows_cam"], (n, 2, 3))
    check_shape(path, "valid", out["valid"], (n, 2, sk.NUM_POINTS))
    check_shape(path, "intrinsics", out["intrinsics"], (3, 3))
    return out


class RobotSource(ClipSource):
    name = "robot"

    def __init__(self, root, cfg: ClipConfig = ClipConfig(num_frames=81), *, strict: bool = False,
                 action_norm: str | None = None):
        super().__init__(root, cfg, strict=strict)
        check_action_norm(action_norm)
        self.action_norm = action_norm
        self.action_stats = self._stats() if action_norm else None

    def _stats(self) -> dict[str, np.ndarray]:
        path = self.path(STATS_FILE)
        try:
            with open(path) as f:
                raw = json.load(f)
        except (OSError, ValueError) as e:
            raise DataError(path, "unreadable action stats", str(e)) from e
        return action_stats(raw, self.action_norm, path)

    def normalize(self, actions: np.ndarray) -> np.ndarray:
        return normalize_actions(actions, self.action_stats, self.action_norm)

    def episodes(self) -> list[str]:
        found = glob.glob(os.path.join(self.root, "**", METADATA_FILE), recursive=True)
        return sorted(os.path.relpath(os.path.dirname(p), self.root) for p in found)

    def _metadata(self, episode: str) -> dict:
        path = self.path(episode, METADATA_FILE)
        try:
            with open(path) as f:
                meta = json.load(f)
            fps, total = float(meta["fps"]), int(meta["total_frames"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DataError(path, "unreadable metadata", str(e)) from e
        if fps <= 0:
            raise DataError(path, "bad metadata", f"fps {fps}")
        return {"fps": fps, "total_frames": total, "text": str(meta.get("task_description", ""))}

    def num_samples(self, episode: str) -> int:
        from rynn_jax.data import video as video_lib  # PyAV: only where frames are read, not for the statistics

        meta = self._metadata(episode)
        info = video_lib.probe_video(self.path(episode, VIDEO_FILE))
        rows = pq.ParquetFile(self.path(episode, TIMESERIES_FILE)).metadata.num_rows \
            if os.path.exists(self.path(episode, TIMESERIES_FILE)) else 0
        if rows == 0:
            raise DataError(self.path(episode, TIMESERIES_FILE), "missing timeseries")
        skel_path = self.path(episode, SKELETON_FILE)
        if not os.path.exists(skel_path):
            raise DataError(skel_path, "missing skeleton")
        skel_n = read_skeleton(skel_path)["joints_cam"].shape[0]
        n = min(meta["total_frames"], info.num_frames, rows, skel_n)
        if info.num_frames < meta["total_frames"] - 1:
            raise DataError(self.path(episode, VIDEO_FILE), "truncated video",
                            f"{info.num_frames} frames, metadata says {meta['total_frames']}")
        return clips_lib.resampled_length(n, meta["fps"], self.cfg.fps)

    def prompt(self, ref: ClipRef) -> str | None:
        return self._metadata(ref.episode)["text"]

    def load(self, ref: ClipRef) -> Sample:
        from rynn_jax.data import video as video_lib

        cfg = self.cfg
        meta = self._metadata(ref.episode)
        idx = clips_lib.resample_indices(ref.start, cfg.num_frames, meta["fps"], cfg.fps)
        ts_path = self.path(ref.episode, TIMESERIES_FILE)
        actions = read_vectors(ts_path, ACTION_COLUMN, clips_lib.ACTION_DIM)
        if idx[-1] >= len(actions):
            raise DataError(ts_path, "truncated parquet", f"{len(actions)} rows")
        actions = check_finite(ts_path, "actions", actions[idx])
        skel_path = self.path(ref.episode, SKELETON_FILE)
        skel = read_skeleton(skel_path)
        if idx[-1] >= skel["joints_cam"].shape[0]:
            raise DataError(skel_path, "truncated skeleton")
        vid_path = self.path(ref.episode, VIDEO_FILE)
        info = video_lib.probe_video(vid_path)
        g = video_lib.crop_geometry(info.width, info.height, cfg.width, cfg.height)
        K_out = video_lib.crop_intrinsics(skel["intrinsics"], info.width, info.height, g)
        out = sk.finish_skeleton(skel_path, skel["joints_cam"][idx], skel["elbows_cam"][idx],
                                 skel["valid"][idx], K_out, cfg.min_valid_fraction)
        frames = video_lib.read_frames(vid_path, idx, cfg.width, cfg.height)
        return {"video": frames, **out, "actions": self.normalize(actions).astype(np.float32),
                "has_actions": np.asarray(True), "frame_index": idx,
                "text": clips_lib.text_array(meta["text"])}


def write_depth_flow(directory: str | os.PathLike, depth_thw: np.ndarray, flow_thw2: np.ndarray) -> None:
    """`DEPTH_FILE` (metres → uint16 mm, 0 = nothing) and `FLOW_FILE` (pixels, float16) into
    `directory`: what `read_ground_truth` reads back."""
    d = Path(directory)
    depth_mm = np.clip(np.round(np.asarray(depth_thw) * 1000.0), 0, np.iinfo(np.uint16).max).astype(np.uint16)
    np.savez_compressed(d / DEPTH_FILE, depth_mm=depth_mm)
    np.savez_compressed(d / FLOW_FILE, flow=np.asarray(flow_thw2).astype(np.float16))


def read_ground_truth(directory: str | os.PathLike, missing_ok: bool = False) -> dict[str, np.ndarray]:
    """Depth (metres, float32), flow (float32), segmentation labels and names of an exported episode.
    `missing_ok`: leave out the kinds whose file is absent (a copy without depth/flow) instead of raising."""
    d = Path(directory)
    gt: dict[str, np.ndarray] = {}
    if not missing_ok or (d / DEPTH_FILE).exists():
        with np.load(d / DEPTH_FILE) as z:
            gt["depth"] = z["depth_mm"].astype(np.float32) / 1000.0
    if not missing_ok or (d / FLOW_FILE).exists():
        with np.load(d / FLOW_FILE) as z:
            gt["flow"] = z["flow"].astype(np.float32)
    if not missing_ok or (d / SEG_FILE).exists():
        with np.load(d / SEG_FILE) as z:
            gt["labels"], gt["names"] = z["labels"], [str(n) for n in z["names"]]
    return gt
