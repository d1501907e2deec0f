"""Synthetic episodes → robot shards (the layout `rynn_jax.data.robot.RobotSource` reads, data/README.md).

    <root>/action_stats.json                       mean / std / q01 / q99 of `action` (54 each)
    <root>/<task>/episode_<attempt:06d>/
        observation.images.head.mp4                head-camera RGB, 16 fps, H.264
        timeseries.parquet                         one row per frame: `frame_index`, `timestamp`,
                                                   `action` [54] (retargeted command), `observation.state`
                                                   [54] (simulated joints), `observation.object_poses`
                                                   [O·7] (free objects, [x,y,z,qw,qx,qy,qz] each)
        metadata.json                              task_description, total_frames, fps + simulation facts
                                                   (seed, success checks, intrinsics, camera pose, labels, …)
        hand_skeleton.npz                          joints_cam / elbows_cam / valid / intrinsics (data/README.md)
        operator_stream.npz                        the raw `rynn-teleop-stream/1` the actions came from
        skeleton.mp4                               the depth-aware skeleton control video (for viewing)
        depth.npz        depth_mm   uint16 [T,H,W] z-depth along the optical axis in mm (0 = nothing)
        flow.npz         flow       float16 [T-1,H,W,2] forward optical flow t → t+1 in pixels (dx, dy)
        segmentation.npz labels     uint8 [T,H,W], names [L] (0 background, 1/2 left/right robot, objects)

An episode is written to `<dir>.tmp` and renamed when complete, so a directory without `.tmp`
is always whole (resumable generation relies on this).
"""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rynn_jax.atomic import atomic_dir
from rynn_jax.data import robot as robot_data
from rynn_jax.data.robot import DEPTH_FILE, FLOW_FILE, SEG_FILE, vectors
from rynn_jax.kinematics import layout, streams
from rynn_jax.render.preview import save_video
from rynn_jax.sim import scenes
from rynn_jax.sim.episode import FPS, Episode

STREAM_FILE, CONTROL_VIDEO = "operator_stream.npz", "skeleton.mp4"


def episode_dir(root: str | os.PathLike, task: str, attempt: int) -> Path:
    return Path(root) / task / f"episode_{attempt:06d}"


def write_episode(ep: Episode, directory: str | os.PathLike) -> Path:
    """Write one rendered episode as a robot shard at `directory` (atomically)."""
    T = len(ep.t)
    if ep.rgb.shape[0] != T:
        raise ValueError("the episode was generated without rendering; nothing to export")
    with atomic_dir(Path(directory)) as tmp:
        _write_episode_files(ep, tmp)
    return Path(directory)


def _write_episode_files(ep: Episode, tmp: Path) -> None:
    T = len(ep.t)
    save_video(tmp / robot_data.VIDEO_FILE, ep.rgb, fps=int(FPS))
    save_video(tmp / CONTROL_VIDEO, ep.skeleton_rgb, fps=int(FPS))
    table = pa.table({
        "frame_index": pa.array(np.arange(T, dtype=np.int32)),
        "timestamp": pa.array(ep.t.astype(np.float32)),
        robot_data.ACTION_COLUMN: vectors(ep.actions),
        robot_data.STATE_COLUMN: vectors(ep.states),
        "observation.object_poses": vectors(ep.object_poses.reshape(T, -1)) if ep.object_poses.shape[1]
        else pa.array([[]] * T, pa.list_(pa.float32())),
    })
    pq.write_table(table, tmp / robot_data.TIMESERIES_FILE)
    np.savez_compressed(tmp / robot_data.SKELETON_FILE, joints_cam=ep.joints_cam, elbows_cam=ep.elbows_cam,
                        valid=ep.skeleton_valid, intrinsics=ep.intrinsics)
    streams.write(tmp / STREAM_FILE, ep.stream)
    robot_data.write_depth_flow(tmp, ep.depth, ep.flow)
    np.savez_compressed(tmp / SEG_FILE, labels=ep.segmentation, names=np.asarray(ep.labels))
    meta = {
        "task_description": scenes.DESCRIPTIONS[ep.task], "total_frames": T, "fps": FPS,
        "task": ep.task, "seed": ep.seed, "success": ep.success, "failures": ep.failures,
        "source": "rynn_jax.sim (MuJoCo synthetic world)", "action_names": list(layout.ACTION_NAMES),
        "intrinsics": ep.intrinsics.tolist(), "T_world_camera": ep.camera_pose.tolist(),
        "segmentation_labels": ep.labels, "object_names": [n for n in ep.labels[3:]],
        "files": {"depth": DEPTH_FILE, "flow": FLOW_FILE, "segmentation": SEG_FILE,
                  "operator_stream": STREAM_FILE, "control_video": CONTROL_VIDEO},
        **ep.info,
    }
    (tmp / robot_data.METADATA_FILE).write_text(json.dumps(meta, indent=1))


def write_action_stats(root: str | os.PathLike) -> dict:
    """Recompute `<root>/action_stats.json` over every finished episode under root."""
    paths = sorted(p for p in glob.glob(os.path.join(root, "**", robot_data.TIMESERIES_FILE), recursive=True)
                   if not os.path.dirname(p).endswith(".tmp"))
    if not paths:
        raise ValueError(f"no episodes under {root}")
    a = np.concatenate([robot_data.read_vectors(p, robot_data.ACTION_COLUMN, layout.ACTION_DIM) for p in paths])
    stats = {"mean": a.mean(0).tolist(), "std": a.std(0).tolist(),
             "q01": np.quantile(a, 0.01, axis=0).tolist(), "q99": np.quantile(a, 0.99, axis=0).tolist(),
             "episodes": len(paths), "frames": int(len(a))}
    tmp = Path(root) / (robot_data.STATS_FILE + ".tmp")
    tmp.write_text(json.dumps(stats))
    os.replace(tmp, Path(root) / robot_data.STATS_FILE)
    return stats
