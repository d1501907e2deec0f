"""LeRobot v3 datasets: our robot-layout episodes written as one (pyarrow + PyAV, no `lerobot`
import), and `LeRobotSource`, a `ClipSource` that reads any v3 dataset for training.

    <out>/meta/info.json                          codebase_version "v3.0", fps, features, paths, totals
    <out>/meta/tasks.parquet                      task string (index) → task_index
    <out>/meta/stats.json                         per feature min/max/mean/std/count (+ q01/q99 of vectors)
    <out>/meta/episodes/chunk-000/file-000.parquet  one row per episode: where its rows and frames are
    <out>/data/chunk-000/file-000.parquet         one row per frame
    <out>/videos/<key>/chunk-000/file-000.mp4     the episodes of that file back to back

Field mapping (data/README.md has the full table): `observation.images.head` ← the head video,
`observation.images.skeleton` ← skeleton.mp4 (when every episode has one), `observation.state` and
`action` ← the 54-D columns, `observation.hand_points` (132: 2 hands × 22 points × xyz, the head
camera's OpenCV frame, metres, untracked = 0), `observation.hand_valid` (44, 1 = tracked) and
`observation.head_camera_intrinsics` (9, row-major K at the video's size) ← hand_skeleton.npz (when
every episode has one); `timestamp` = frame_index / fps.

Files: episodes go `episodes_per_file` at a time into file k (chunk k // 1000, file k % 1000) of
the data, every video key and the episode metadata. Each file is written beside its final name and
renamed; a group of files counts as done once `meta/rynn_jax_export.json` records its signature
(its episodes, their lengths and offsets, the settings), so a re-run redoes only groups that were
cut or changed. `meta/info.json` is removed while anything is rewritten and written last: a folder
with it is a whole dataset.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rynn_jax.atomic import atomic_file
from rynn_jax.data import clips as clips_lib
from rynn_jax.data import robot as robot_lib
from rynn_jax.data import video as video_lib
from rynn_jax.data.clips import ClipConfig, ClipRef
from rynn_jax.data.errors import DataError
from rynn_jax.data.formats import episode as ep_lib
from rynn_jax.data.source import ClipSource, Sample, check_finite, empty_actions
from rynn_jax.kinematics import layout

CODEBASE_VERSION = "v3.0"
INFO_FILE, STATS_FILE, TASKS_FILE = "meta/info.json", "meta/stats.json", "meta/tasks.parquet"
PROGRESS_FILE = "meta/rynn_jax_export.json"
EPISODES_DIR = "meta/episodes"
CHUNK_FILE = "chunk-{chunk_index:03d}/file-{file_index:03d}"
DATA_PATH = "data/" + CHUNK_FILE + ".parquet"
VIDEO_PATH = "videos/{video_key}/" + CHUNK_FILE + ".mp4"
EPISODES_PATH = EPISODES_DIR + "/" + CHUNK_FILE + ".parquet"
CHUNKS_SIZE = 1000  # files per chunk folder (LeRobot's default)
HEAD_KEY, SKELETON_KEY = "observation.images.head", "observation.images.skeleton"
STATE_KEY, ACTION_KEY = "observation.state", "action"
HAND_POINTS_KEY, HAND_VALID_KEY = "observation.hand_points", "observation.hand_valid"
INTRINSICS_KEY = "observation.head_camera_intrinsics"
INDEX_KEYS = ("timestamp", "frame_index", "episode_index", "index", "task_index")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LeRobotExportConfig:
    episodes_per_file: int = 100  # episodes per data/video file (81 frames at 480×832: ~100-200 MB of video)
    codec: str = "libx264"  # "libsvtav1" is LeRobot's own default; H.264 encodes faster, both decode there
    crf: int = 12  # quality: the robot layout's own (lower = larger files, closer frames)
    gop: int = 16  # keyframe interval in frames (random access cost)
    robot_type: str = "rynn_bimanual_54dof"


def chunk_file(k: int) -> dict[str, int]:
    return {"chunk_index": k // CHUNKS_SIZE, "file_index": k % CHUNKS_SIZE}


def _fps_value(fps: float) -> float | int:
    return int(fps) if float(fps).is_integer() else float(fps)


def features(infos: Sequence[ep_lib.EpisodeInfo], cfg: LeRobotExportConfig) -> dict:
    """info.json `features` for these episodes (optional keys only when every episode has them)."""
    fps = _fps_value(infos[0].fps)

    def video(hw: tuple[int, int]) -> dict:
        codec = {"libx264": "h264", "libsvtav1": "av1"}.get(cfg.codec, cfg.codec)
        return {"dtype": "video", "shape": [hw[0], hw[1], 3], "names": ["height", "width", "channels"],
                "info": {"video.height": hw[0], "video.width": hw[1], "video.codec": codec,
                         "video.pix_fmt": "yuv420p", "video.is_depth_map": False, "video.fps": fps,
                         "video.channels": 3, "has_audio": False}}

    def vector(names: Sequence[str]) -> dict:
        return {"dtype": "float32", "shape": [len(names)], "names": list(names)}

    out = {HEAD_KEY: video(infos[0].size)}
    if all(e.skeleton_size for e in infos):
        out[SKELETON_KEY] = video(infos[0].skeleton_size)
    out[STATE_KEY] = vector(layout.ACTION_NAMES)
    out[ACTION_KEY] = vector(layout.ACTION_NAMES)
    if all(e.hand_skeleton for e in infos):
        out[HAND_POINTS_KEY] = vector(ep_lib.HAND_JOINT_NAMES)
        out[HAND_VALID_KEY] = vector(ep_lib.HAND_POINT_NAMES)
        out[INTRINSICS_KEY] = vector(ep_lib.INTRINSICS_NAMES)
    out["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
    for k in INDEX_KEYS[1:]:
        out[k] = {"dtype": "int64", "shape": [1], "names": None}
    return out


# ---- export ----------------------------------------------------------------------------------------


def export(root: str | os.PathLike[str], out: str | os.PathLike[str],
           cfg: LeRobotExportConfig = LeRobotExportConfig()) -> dict:
    """Write (or bring up to date) the LeRobot v3 dataset at `out` from the robot-layout episodes
    under `root`; returns a summary."""
    root, out = os.fspath(root), Path(out)
    if cfg.episodes_per_file < 1:
        raise ValueError(f"episodes_per_file must be ≥ 1, got {cfg.episodes_per_file}")
    infos = ep_lib.survey(root)
    feats = features(infos, cfg)
    fps = infos[0].fps
    tasks = list(dict.fromkeys(e.task for e in infos))
    groups = [infos[i:i + cfg.episodes_per_file] for i in range(0, len(infos), cfg.episodes_per_file)]
    progress = _read_progress(out)
    settings = {**dataclasses.asdict(cfg), "features": feats}
    done = progress.get("groups", {}) if progress.get("settings") == settings else {}
    signatures, first = [], 0
    for k, g in enumerate(groups):
        signatures.append({"episodes": [e.name for e in g], "lengths": [e.length for e in g],
                           "first_index": first, "first_episode": k * cfg.episodes_per_file,
                           "task_index": [tasks.index(e.task) for e in g]})
        first += sum(e.length for e in g)
    records = {str(k): done[str(k)] for k, sig in enumerate(signatures)
               if str(k) in done and done[str(k)]["signature"] == sig and _group_files_exist(out, k, feats)}
    todo = [k for k in range(len(groups)) if str(k) not in records]
    if todo:
        (out / INFO_FILE).unlink(missing_ok=True)  # incomplete from here until it is written last
    for k in todo:
        image_stats = _write_group(root, out, k, groups[k], signatures[k], feats, fps, cfg)
        records[str(k)] = {"signature": signatures[k], "image_stats": image_stats}
        _write_json(out / PROGRESS_FILE, {"settings": settings, "groups": records})
    _remove_stale_files(out, len(groups), feats)
    _write_tasks(out, tasks)
    _write_json(out / STATS_FILE, _stats(out, len(groups), feats,
                                         [records[str(k)]["image_stats"] for k in range(len(groups))]))
    info = {"codebase_version": CODEBASE_VERSION, "robot_type": cfg.robot_type,
            "total_episodes": len(infos), "total_frames": first, "total_tasks": len(tasks),
            "chunks_size": CHUNKS_SIZE, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200,
            "fps": _fps_value(fps), "splits": {"train": f"0:{len(infos)}"}, "data_path": DATA_PATH,
            "video_path": VIDEO_PATH, "features": feats}
    _write_json(out / INFO_FILE, info)
    return {"format": "lerobot", "out": str(out), "episodes": len(infos), "frames": first,
            "files": len(groups), "files_written": len(todo)}


def _read_progress(out: Path) -> dict:
    try:
        return json.loads((out / PROGRESS_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _write_json(path: Path, obj: dict) -> None:
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=1))


def _video_keys(feats: dict) -> list[str]:
    return [k for k, f in feats.items() if f["dtype"] == "video"]


def _group_paths(out: Path, k: int, feats: dict) -> list[Path]:
    cf = chunk_file(k)
    return ([out / DATA_PATH.format(**cf), out / EPISODES_PATH.format(**cf)]
            + [out / VIDEO_PATH.format(video_key=v, **cf) for v in _video_keys(feats)])


def _group_files_exist(out: Path, k: int, feats: dict) -> bool:
    return all(p.is_file() for p in _group_paths(out, k, feats))


def _remove_stale_files(out: Path, num_groups: int, feats: dict) -> None:
    """Files past the last group (the dataset shrank since an earlier export)."""
    keep = {p for k in range(num_groups) for p in _group_paths(out, k, feats)}
    for sub in ("data", "videos", EPISODES_DIR):
        for p in (out / sub).rglob("*"):
            if p.is_file() and p not in keep:
                p.unlink()


def _write_tasks(out: Path, tasks: list[str]) -> None:
    table = pa.table({"task_index": pa.array(np.arange(len(tasks)), pa.int64()),
                      "__index_level_0__": pa.array(tasks, pa.string())})
    # pandas' on-disk index: LeRobot reads tasks.parquet with pandas, the task string as the index
    meta = {b"pandas": json.dumps({"index_columns": ["__index_level_0__"], "column_indexes": [],
                                   "columns": [{"name": "task_index", "field_name": "task_index",
                                                "pandas_type": "int64", "numpy_type": "int64", "metadata": None},
                                               {"name": None, "field_name": "__index_level_0__",
                                                "pandas_type": "unicode", "numpy_type": "object",
                                                "metadata": None}],
                                   "pandas_version": "2.2.0"}).encode()}
    with atomic_file(out / TASKS_FILE) as tmp:
        pq.write_table(table.replace_schema_metadata(meta), tmp)


def _write_group(root: str, out: Path, k: int, group: Sequence[ep_lib.EpisodeInfo], sig: dict, feats: dict,
                 fps: float, cfg: LeRobotExportConfig) -> dict:
    """Data, videos and episode metadata of file k; returns per-camera pixel sums for the stats."""
    cf = chunk_file(k)
    keys = _video_keys(feats)
    columns: dict[str, list] = {c: [] for c in feats if c not in keys}
    episodes: dict[str, list] = {}
    image_stats = {v: None for v in keys}
    index, frames_in_file = sig["first_index"], 0
    with contextlib.ExitStack() as stack:
        tmp = {"meta": stack.enter_context(atomic_file(out / EPISODES_PATH.format(**cf))),
               "data": stack.enter_context(atomic_file(out / DATA_PATH.format(**cf)))}
        writers = {}
        for v in keys:
            path = stack.enter_context(atomic_file(out / VIDEO_PATH.format(video_key=v, **cf)))
            h, w = feats[v]["shape"][:2]
            writers[v] = stack.enter_context(video_lib.VideoWriter(path, fps, w, h, cfg.codec, cfg.crf, cfg.gop))
        for j, info in enumerate(group):
            ep = ep_lib.read_episode(root, info.name)
            n = len(ep)
            if n != info.length:
                raise DataError(os.path.join(root, info.name), "changed while exporting")
            episode_index = sig["first_episode"] + j
            frames = {HEAD_KEY: ep.video, SKELETON_KEY: ep.skeleton_video}
            row = {"episode_index": episode_index, "tasks": [info.task], "length": n,
                   **{f"data/{a}": b for a, b in cf.items()},
                   "dataset_from_index": index, "dataset_to_index": index + n}
            for v in keys:
                writers[v].write(frames[v])
                image_stats[v] = _merge_sums(image_stats[v], _pixel_sums(frames[v]))
                row |= {f"videos/{v}/chunk_index": cf["chunk_index"], f"videos/{v}/file_index": cf["file_index"],
                        f"videos/{v}/from_timestamp": frames_in_file / fps,
                        f"videos/{v}/to_timestamp": (frames_in_file + n) / fps}
            row |= {f"meta/episodes/{a}": b for a, b in cf.items()}
            for c, val in row.items():
                episodes.setdefault(c, []).append(val)
            columns[STATE_KEY].append(ep.state)
            columns[ACTION_KEY].append(ep.actions)
            if HAND_POINTS_KEY in columns:
                columns[HAND_POINTS_KEY].append(ep.hand_points.reshape(n, -1))
                columns[HAND_VALID_KEY].append(ep.hand_valid.reshape(n, -1).astype(np.float32))
                columns[INTRINSICS_KEY].append(np.broadcast_to(ep.intrinsics.reshape(1, 9), (n, 9)))
            columns["timestamp"].append(np.arange(n, dtype=np.float64) / fps)
            columns["frame_index"].append(np.arange(n))
            columns["episode_index"].append(np.full(n, episode_index))
            columns["index"].append(index + np.arange(n))
            columns["task_index"].append(np.full(n, sig["task_index"][j]))
            index += n
            frames_in_file += n
        data = {}
        for c, parts in columns.items():
            x = np.concatenate(parts)
            data[c] = robot_lib.vectors(x) if x.ndim == 2 else pa.array(
                x.astype(np.float32 if c == "timestamp" else np.int64))
        pq.write_table(pa.table(data), tmp["data"])
        pq.write_table(pa.table(episodes), tmp["meta"])
    return {v: {a: b.tolist() if isinstance(b, np.ndarray) else b for a, b in s.items()}
            for v, s in image_stats.items()}


def _pixel_sums(frames_thw3: np.ndarray) -> dict:
    """Per-channel sums of pixel values in [0, 1] (LeRobot's image stats are per channel)."""
    x = frames_thw3.reshape(-1, 3).astype(np.float64) / 255.0
    return {"sum": x.sum(0), "sumsq": np.square(x).sum(0), "min": x.min(0), "max": x.max(0),
            "pixels": len(x), "frames": len(frames_thw3)}


def _merge_sums(a: dict | None, b: dict) -> dict:
    if a is None:
        return b
    return {"sum": np.add(a["sum"], b["sum"]), "sumsq": np.add(a["sumsq"], b["sumsq"]),
            "min": np.minimum(a["min"], b["min"]), "max": np.maximum(a["max"], b["max"]),
            "pixels": a["pixels"] + b["pixels"], "frames": a["frames"] + b["frames"]}


def _stats(out: Path, num_groups: int, feats: dict, image_stats: list[dict]) -> dict:
    """meta/stats.json: numeric features from the written data files, cameras from the pixel sums
    recorded per file (shape (3, 1, 1) as LeRobot stores them)."""
    stats = {}
    numeric = [c for c, f in feats.items() if f["dtype"] != "video"]
    tables = [pq.read_table(out / DATA_PATH.format(**chunk_file(k)), columns=numeric) for k in range(num_groups)]
    table = pa.concat_tables(tables)
    for c in numeric:
        width = feats[c]["shape"][0]
        x = (robot_lib.column_vectors(table, c, width, str(out / "data")) if feats[c]["names"]
             else table.column(c).to_numpy().reshape(-1, 1)).astype(np.float64)
        stats[c] = {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0), "count": [len(x)]}
        if feats[c]["names"]:  # vectors: the quantiles `action_norm="quantile"` uses
            stats[c] |= {"q01": np.quantile(x, 0.01, axis=0), "q99": np.quantile(x, 0.99, axis=0)}
    for v in _video_keys(feats):
        acc = None
        for part in image_stats:
            acc = _merge_sums(acc, part[v])
        n = acc["pixels"]
        mean = np.asarray(acc["sum"]) / n
        std = np.sqrt(np.maximum(np.asarray(acc["sumsq"]) / n - mean ** 2, 0.0))
        stats[v] = {k: np.asarray(val).reshape(3, 1, 1) for k, val in
                    (("min", acc["min"]), ("max", acc["max"]), ("mean", mean), ("std", std))}
        stats[v]["count"] = [acc["frames"]]
    return {c: {k: np.asarray(val).tolist() for k, val in s.items()} for c, s in stats.items()}


# ---- import ----------------------------------------------------------------------------------------


def _read_table(path: str, **kw) -> pa.Table:
    if not os.path.isfile(path):
        raise DataError(path, "missing file")
    try:
        return pq.read_table(path, **kw)
    except (OSError, ValueError, KeyError) as e:  # ArrowInvalid is a ValueError
        raise DataError(path, "unreadable parquet", str(e)) from e


class LeRobotSource(ClipSource):
    """Clips of a LeRobot v3 dataset (ours or anyone's) in the sample schema of `clips`.

    `video_key`: the camera that becomes `video`. Actions come from `action` when it is 54-D (our
    layout); `actions=False` reads datasets of other robots without them (has_actions False). The
    skeleton comes from `observation.hand_points`/`hand_valid`/`head_camera_intrinsics` when the
    dataset has them, else every point is untracked. `action_norm` uses meta/stats.json.
    Dataset-level problems (no info.json, not v3, a missing feature) raise `DataError` at once;
    per-episode ones (a truncated or missing file, lengths that disagree) follow the bad-data policy.
    """

    name = "lerobot"

    def __init__(self, root, cfg: ClipConfig = ClipConfig(num_frames=81), *, strict: bool = False,
                 action_norm: str | None = None, video_key: str = HEAD_KEY, actions: bool = True):
        super().__init__(root, cfg, strict=strict)
        robot_lib.check_action_norm(action_norm)
        self.video_key, self.actions, self.action_norm = video_key, actions, action_norm
        info_path = self.path(INFO_FILE)
        try:
            with open(info_path) as f:
                self.info = json.load(f)
            self.fps, feats = float(self.info["fps"]), self.info["features"]
            version = self.info["codebase_version"]
        except FileNotFoundError as e:
            raise DataError(info_path, "missing file", "not a LeRobot dataset, or an unfinished export") from e
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DataError(info_path, "unreadable LeRobot info", str(e)) from e
        if version != CODEBASE_VERSION:
            raise DataError(info_path, "unsupported LeRobot version",
                            f"{version}; convert it to v3.0 with lerobot's convert_dataset_v21_to_v30")
        if feats.get(video_key, {}).get("dtype") != "video":
            cams = [k for k, f in feats.items() if f.get("dtype") == "video"]
            raise DataError(info_path, "no such camera", f"{video_key!r} is not a video feature; cameras: {cams}")
        if actions and feats.get(ACTION_KEY, {}).get("shape") != [clips_lib.ACTION_DIM]:
            raise DataError(info_path, "not our action layout",
                            f"{ACTION_KEY!r} has shape {feats.get(ACTION_KEY, {}).get('shape')}, not "
                            f"[{clips_lib.ACTION_DIM}]; read it with actions=False")
        self.has_hands = all(k in feats for k in (HAND_POINTS_KEY, HAND_VALID_KEY, INTRINSICS_KEY))
        self.size = tuple(feats[video_key]["shape"][:2])
        self.rows = self._episode_rows()
        self.tasks = self._tasks()
        self.action_stats = self._stats() if action_norm else None

    def _episode_rows(self) -> list[dict]:
        files = sorted(Path(self.path(EPISODES_DIR)).glob("*/*.parquet"))
        if not files:
            raise DataError(self.path(EPISODES_DIR), "missing file", "no episode metadata parquet")
        rows = []
        for f in files:
            rows += _read_table(str(f)).to_pylist()
        if [r.get("episode_index") for r in rows] != list(range(len(rows))):
            raise DataError(str(files[0].parent.parent), "bad episode metadata", "episode_index is not 0, 1, 2, ...")
        return rows

    def _tasks(self) -> dict[int, str]:
        table = _read_table(self.path(TASKS_FILE))
        names = [c for c in table.column_names if c != "task_index"]
        if "task_index" not in table.column_names or not names:
            raise DataError(self.path(TASKS_FILE), "bad tasks table", f"columns {table.column_names}")
        return dict(zip(table.column("task_index").to_pylist(), table.column(names[0]).to_pylist()))

    def _stats(self) -> dict[str, np.ndarray]:
        path = self.path(STATS_FILE)
        try:
            with open(path) as f:
                raw = json.load(f)[ACTION_KEY]
        except (OSError, ValueError, KeyError) as e:
            raise DataError(path, "unreadable action stats", str(e)) from e
        return robot_lib.action_stats(raw, self.action_norm, path)

    def episodes(self) -> list[str]:
        return [f"episode_{i:06d}" for i in range(len(self.rows))]

    def _row(self, episode: str) -> dict:
        return self.rows[int(episode.rsplit("_", 1)[1])]

    def _data_path(self, row: dict) -> str:
        return self.path(self.info["data_path"].format(chunk_index=row["data/chunk_index"],
                                                       file_index=row["data/file_index"]))

    def _video_path(self, row: dict) -> str:
        k = self.video_key
        return self.path(self.info["video_path"].format(video_key=k, chunk_index=row[f"videos/{k}/chunk_index"],
                                                        file_index=row[f"videos/{k}/file_index"]))

    def _first_frame(self, row: dict) -> int:
        return int(round(row[f"videos/{self.video_key}/from_timestamp"] * self.fps))

    def num_samples(self, episode: str) -> int:
        row = self._row(episode)
        n = int(row["length"])
        meta_path = self.path(EPISODES_DIR)
        if row["dataset_to_index"] - row["dataset_from_index"] != n:
            raise DataError(meta_path, "length mismatch", f"{episode}: length {n}, index range "
                            f"[{row['dataset_from_index']}, {row['dataset_to_index']})")
        span = row[f"videos/{self.video_key}/to_timestamp"] - row[f"videos/{self.video_key}/from_timestamp"]
        if abs(span * self.fps - n) > 0.5:
            raise DataError(meta_path, "length mismatch", f"{episode}: {n} frames, video span {span:g} s")
        data_path = self._data_path(row)
        ids = _read_table(data_path, columns=["episode_index"]).column("episode_index").to_numpy()
        if (got := int((ids == row["episode_index"]).sum())) != n:
            raise DataError(data_path, "length mismatch", f"{episode}: {got} rows, metadata says {n}")
        vid_path = self._video_path(row)
        if not os.path.isfile(vid_path):
            raise DataError(vid_path, "missing file")
        frames = video_lib.probe_video(vid_path).num_frames
        if frames < self._first_frame(row) + n:
            raise DataError(vid_path, "truncated video", f"{frames} frames, {episode} ends at "
                            f"{self._first_frame(row) + n}")
        return clips_lib.resampled_length(n, self.fps, self.cfg.fps)

    def prompt(self, ref: ClipRef) -> str | None:
        tasks = self._row(ref.episode).get("tasks") or [""]
        return tasks[0]

    def load(self, ref: ClipRef) -> Sample:
        cfg, row = self.cfg, self._row(ref.episode)
        idx = clips_lib.resample_indices(ref.start, cfg.num_frames, self.fps, cfg.fps)
        data_path = self._data_path(row)
        table = _read_table(data_path, filters=[("episode_index", "=", row["episode_index"])])
        table = table.sort_by("frame_index")
        if table.num_rows != row["length"] or idx[-1] >= table.num_rows:
            raise DataError(data_path, "length mismatch", f"{table.num_rows} rows for {ref.episode}")
        rows = table.take(pa.array(idx))
        out: Sample = {"frame_index": idx, "text": clips_lib.text_array(self.tasks.get(
            rows.column("task_index")[0].as_py(), self.prompt(ref)))}
        if self.actions:
            acts = check_finite(data_path, "actions", robot_lib.column_vectors(
                rows, ACTION_KEY, clips_lib.ACTION_DIM, data_path))
            out |= {"actions": robot_lib.normalize_actions(acts, self.action_stats, self.action_norm)
                    .astype(np.float32), "has_actions": np.asarray(True)}
        else:
            out |= empty_actions(cfg.num_frames)
        hands = (robot_lib.column_vectors(rows, HAND_POINTS_KEY, len(ep_lib.HAND_JOINT_NAMES), data_path),
                 robot_lib.column_vectors(rows, HAND_VALID_KEY, len(ep_lib.HAND_POINT_NAMES), data_path),
                 robot_lib.column_vectors(rows, INTRINSICS_KEY, 9, data_path)[0].reshape(3, 3)
                 ) if self.has_hands else (None, None, None)
        out |= ep_lib.skeleton_sample(data_path, *hands, self.size, cfg, cfg.min_valid_fraction)
        out["video"] = video_lib.read_frames(self._video_path(row), self._first_frame(row) + idx,
                                             cfg.width, cfg.height)
        return out
