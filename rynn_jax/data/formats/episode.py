"""A robot-layout episode folder read whole (what both exporters write out), and the per-frame
hand features that carry our skeleton through formats that only know flat vectors.

An episode's length is its `timeseries.parquet` row count; the head video must hold at least that
many frames and the skeleton file exactly that many rows (a file that disagrees is a `DataError`
naming it). Two optional parts: the hand skeleton (`hand_skeleton.npz`, absent in the released
sample layout) and the rendered skeleton video (`skeleton.mp4`, written by `serve.py generate` and
`rynn_jax.sim`).
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pyarrow.parquet as pq

from rynn_jax.data import clips as clips_lib
from rynn_jax.data import robot as robot_lib
from rynn_jax.data import skeleton as sk
from rynn_jax.data import video as video_lib
from rynn_jax.data.errors import DataError

SKELETON_VIDEO_FILE = "skeleton.mp4"  # the depth-aware skeleton render of the hands (control video)
POINT_NAMES = ("wrist", "thumb_cmc", "thumb_mcp", "thumb_ip", "thumb_tip") + tuple(
    f"{f}_{j}" for f in ("index", "middle", "ring", "pinky") for j in ("mcp", "pip", "dip", "tip")) + ("elbow",)
HAND_POINT_NAMES = tuple(f"{side}_{p}" for side in sk.SIDES for p in POINT_NAMES)  # 44 = 2 × 22
HAND_JOINT_NAMES = tuple(f"{p}_{axis}" for p in HAND_POINT_NAMES for axis in "xyz")  # 132
INTRINSICS_NAMES = tuple(f"k{r}{c}" for r in range(3) for c in range(3))  # row-major 3×3


@dataclasses.dataclass
class RobotEpisode:
    name: str  # folder relative to the dataset root (posix)
    task: str  # task_description
    fps: float
    video: np.ndarray  # (T, H, W, 3) uint8, head camera at its native size
    actions: np.ndarray  # (T, 54) float32
    state: np.ndarray  # (T, 54) float32
    skeleton_video: np.ndarray | None = None  # (T, H', W', 3) uint8
    hand_points: np.ndarray | None = None  # (T, 2, 22, 3) float32, untracked points zeroed
    hand_valid: np.ndarray | None = None  # (T, 2, 22) bool
    intrinsics: np.ndarray | None = None  # (3, 3) float32, head camera K at the native size

    def __len__(self) -> int:
        return len(self.actions)


def list_episodes(root: str) -> list[str]:
    """Finished episodes under a robot-layout root (a `.tmp` folder is an unfinished write)."""
    src = robot_lib.RobotSource(root, clips_lib.ClipConfig(num_frames=1))
    return [e for e in src.episodes() if not any(part.endswith(".tmp") for part in e.split(os.sep))]


def read_metadata(root: str, name: str) -> dict:
    """metadata.json with `fps` and `task_description` checked; one `DataError` naming it."""
    path = os.path.join(root, name, robot_lib.METADATA_FILE)
    try:
        with open(path) as f:
            meta = json.load(f)
        meta["fps"] = float(meta["fps"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(path, "unreadable metadata", str(e)) from e
    if meta["fps"] <= 0:
        raise DataError(path, "bad metadata", f"fps {meta['fps']}")
    meta["task_description"] = str(meta.get("task_description", ""))
    return meta


def num_rows(path: str) -> int:
    try:
        return pq.ParquetFile(path).metadata.num_rows
    except (OSError, ValueError) as e:
        raise DataError(path, "unreadable parquet", str(e)) from e


def read_episode(root: str, name: str) -> RobotEpisode:
    """Every frame of one episode (both videos decoded at their native size)."""
    d = os.path.join(root, name)
    meta = read_metadata(root, name)
    ts = os.path.join(d, robot_lib.TIMESERIES_FILE)
    actions = robot_lib.read_vectors(ts, robot_lib.ACTION_COLUMN, clips_lib.ACTION_DIM)
    state = robot_lib.read_vectors(ts, robot_lib.STATE_COLUMN, clips_lib.ACTION_DIM)
    n = len(actions)
    if n == 0:
        raise DataError(ts, "empty timeseries")
    for what, x in (("actions", actions), ("observation.state", state)):
        if not np.isfinite(x).all():
            raise DataError(ts, f"nan {what}")
    ep = RobotEpisode(name.replace(os.sep, "/"), meta["task_description"], meta["fps"],
                      _read_all(os.path.join(d, robot_lib.VIDEO_FILE), n), actions, state)
    skel_video = os.path.join(d, SKELETON_VIDEO_FILE)
    if os.path.exists(skel_video):
        ep.skeleton_video = _read_all(skel_video, n)
    skel_path = os.path.join(d, robot_lib.SKELETON_FILE)
    if os.path.exists(skel_path):
        skel = robot_lib.read_skeleton(skel_path)
        if len(skel["joints_cam"]) != n:
            raise DataError(skel_path, "length mismatch", f"{len(skel['joints_cam'])} rows, {ts} has {n}")
        # finish_skeleton checks tracked points are finite and zeroes the untracked ones
        done = sk.finish_skeleton(skel_path, skel["joints_cam"], skel["elbows_cam"], skel["valid"],
                                  skel["intrinsics"])
        ep.hand_points = np.concatenate([done["joints_cam"], done["elbows_cam"][:, :, None]], axis=2)
        ep.hand_valid, ep.intrinsics = done["valid"], done["intrinsics"]
    return ep


def _read_all(path: str, n: int) -> np.ndarray:
    info = video_lib.probe_video(path)
    return video_lib.read_frames(path, range(n), info.width, info.height)


def split_hand_points(points_t132: np.ndarray, valid_t44: np.ndarray, path: str
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flat per-frame hand features → joints_cam (T, 2, 21, 3), elbows_cam (T, 2, 3), valid (T, 2, 22)."""
    t = len(points_t132)
    if points_t132.shape != (t, len(HAND_JOINT_NAMES)) or valid_t44.shape != (t, len(HAND_POINT_NAMES)):
        raise DataError(path, "bad shape", f"hand features {points_t132.shape}, {valid_t44.shape}")
    points = points_t132.reshape(t, 2, sk.NUM_POINTS, 3)
    return points[:, :, :sk.NUM_JOINTS], points[:, :, sk.ELBOW], valid_t44.reshape(t, 2, sk.NUM_POINTS) > 0.5


@dataclasses.dataclass(frozen=True)
class EpisodeInfo:
    """What a writer needs to plan a dataset before decoding anything."""

    name: str
    task: str
    fps: float
    length: int
    size: tuple[int, int]  # head video (height, width)
    skeleton_size: tuple[int, int] | None  # skeleton video (height, width), None when absent
    hand_skeleton: bool  # hand_skeleton.npz present


def survey(root: str) -> list[EpisodeInfo]:
    """Every finished episode under `root`, checked to share one frame rate and frame sizes (a
    dataset in either format has one of each); optional parts are kept only if all have them."""
    names = list_episodes(root)
    if not names:
        raise DataError(root, "no episodes", f"no */{robot_lib.METADATA_FILE} under it")
    infos = []
    for name in names:
        d = os.path.join(root, name)
        meta = read_metadata(root, name)
        head = video_lib.probe_video(os.path.join(d, robot_lib.VIDEO_FILE))
        skel = os.path.join(d, SKELETON_VIDEO_FILE)
        skel_info = video_lib.probe_video(skel) if os.path.exists(skel) else None
        infos.append(EpisodeInfo(
            name.replace(os.sep, "/"), meta["task_description"], meta["fps"],
            num_rows(os.path.join(d, robot_lib.TIMESERIES_FILE)), (head.height, head.width),
            (skel_info.height, skel_info.width) if skel_info else None,
            os.path.exists(os.path.join(d, robot_lib.SKELETON_FILE))))
    first = infos[0]
    for e in infos[1:]:
        if (e.fps, e.size) != (first.fps, first.size) or (
                e.skeleton_size and first.skeleton_size and e.skeleton_size != first.skeleton_size):
            raise DataError(os.path.join(root, e.name), "not like the first episode",
                            f"{e.fps:g} fps, {e.size} frames vs {first.name}: {first.fps:g} fps, {first.size}")
    return infos


def skeleton_sample(path: str, points_t132: np.ndarray | None, valid_t44: np.ndarray | None,
                    K_native: np.ndarray | None, src_size: tuple[int, int], cfg: clips_lib.ClipConfig,
                    min_valid_fraction: float = 0.0) -> dict[str, np.ndarray]:
    """The sample's skeleton entries (`clips`) from flat hand features at the clip's frames, with the
    intrinsics moved to the output crop; a dataset without hand features gives an all-untracked
    skeleton and zero intrinsics (there is nothing to render)."""
    if points_t132 is None:
        t = cfg.num_frames
        points_t132 = np.zeros((t, len(HAND_JOINT_NAMES)), np.float32)
        valid_t44 = np.zeros((t, len(HAND_POINT_NAMES)), np.float32)
        K_out = np.zeros((3, 3), np.float32)
    else:
        h, w = src_size
        K_out = video_lib.crop_intrinsics(K_native, w, h, video_lib.crop_geometry(w, h, cfg.width, cfg.height))
    joints, elbows, valid = split_hand_points(points_t132, valid_t44, path)
    return sk.finish_skeleton(path, joints, elbows, valid, K_out, min_valid_fraction)
