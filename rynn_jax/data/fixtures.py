"""Tiny synthetic episodes in the exact on-disk formats of EgoDex, VITRA and robot teleop.

Each writer takes a *known* camera-frame hand pose (joints (N, 2, 21, 3), elbows (N, 2, 3)) and
stores it the way the real data does (EgoDex: ARKit-world transforms + camera poses; VITRA:
camera-space joints + world→camera extrinsics; robot: our hand_skeleton.npz), so a reader's output
can be checked against the pose that went in. Videos are frame-coded: source frame i is a grey
image whose top half has level 8 + 16·(i // 16) and bottom half 8 + 16·(i % 16) (i < 256), which
survives compression and resizing — `decode_frame_code` reads i back.
"""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rynn_jax.data import robot as robot_lib
from rynn_jax.data import skeleton as sk
from rynn_jax.data import video as video_lib
from rynn_jax.render.synthetic import synthetic_hand_motion

SRC_FPS = 30.0


def frame_coded_video(n: int, width: int, height: int) -> np.ndarray:
    if n > 256:
        raise ValueError("frame codes go up to 255")
    i = np.arange(n)
    hi, lo = 8 + 16 * (i // 16), 8 + 16 * (i % 16)
    img = np.empty((n, height, width, 3), np.uint8)
    img[:, : height // 2] = hi[:, None, None, None]
    img[:, height // 2:] = lo[:, None, None, None]
    return img


def decode_frame_code(frame_hw3: np.ndarray) -> int:
    h = frame_hw3.shape[0]
    top = frame_hw3[h // 8: 3 * h // 8].mean()
    bottom = frame_hw3[5 * h // 8: 7 * h // 8].mean()
    return int(round((top - 8) / 16)) * 16 + int(round((bottom - 8) / 16))


def source_intrinsics(width: int, height: int) -> np.ndarray:
    f = 0.9 * width
    return np.array([[f, 0, (width - 1) / 2], [0, f, (height - 1) / 2], [0, 0, 1]], np.float64)


def known_pose(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A deterministic two-hand motion at the source rate: joints (n, 2, 21, 3), elbows (n, 2, 3)."""
    return tuple(np.asarray(a, np.float64) for a in synthetic_hand_motion(n, seed=seed, fps=SRC_FPS))


def _rotation(rng: np.random.Generator, scale: float) -> np.ndarray:
    """A random rotation near identity (Rodrigues of a random axis-angle)."""
    w = rng.normal(size=3) * scale
    th = np.linalg.norm(w)
    k = np.array([[0, -w[2], w[1]], [w[2], 0, -w[0]], [-w[1], w[0], 0]]) / max(th, 1e-12)
    return np.eye(3) + np.sin(th) * k + (1 - np.cos(th)) * k @ k


def camera_trajectory(n: int, seed: int = 0) -> np.ndarray:
    """Smoothly moving camera poses (camera → world) (n, 4, 4)."""
    rng = np.random.default_rng(seed)
    poses = np.tile(np.eye(4), (n, 1, 1))
    base = _rotation(rng, 1.0)
    t = np.arange(n) / SRC_FPS
    for i in range(n):
        poses[i, :3, :3] = base @ _rotation(np.random.default_rng(seed * 1000 + i), 0.05)
        poses[i, :3, 3] = [0.3 * np.sin(t[i]), 1.4 + 0.05 * np.cos(t[i]), 0.2 * t[i]]
    return poses


# ---- EgoDex ----------------------------------------------------------------------------------------


def write_egodex_episode(root: str, task: str, episode: int, joints: np.ndarray, elbows: np.ndarray,
                         *, width: int = 128, height: int = 72, seed: int = 0,
                         confidences: np.ndarray | None = None, text: str = "pick up the cup",
                         camera_convention: str = "opencv", drop_joints: tuple[str, ...] = (),
                         num_video_frames: int | None = None) -> tuple[str, str]:
    """Write <root>/<task>/<episode>.hdf5 + .mp4; returns the two paths.

    confidences: optional (N, 2, 22) per point; drop_joints: ARKit names left out (bad data).
    """
    n = joints.shape[0]
    os.makedirs(os.path.join(root, task), exist_ok=True)
    h5_path = os.path.join(root, task, f"{episode}.hdf5")
    mp4_path = os.path.join(root, task, f"{episode}.mp4")
    cam = camera_trajectory(n, seed)
    pts_c = np.concatenate([joints, elbows[:, :, None]], 2)  # (N, 2, 22, 3)
    if camera_convention == "arkit":
        pts_c = pts_c @ sk.ARKIT_TO_OPENCV.T  # the inverse flip is itself
    pts_w = sk.apply_pose(pts_c.reshape(n, -1, 3), cam).reshape(n, 2, sk.NUM_POINTS, 3)
    rng = np.random.default_rng(seed + 7)
    with h5py.File(h5_path, "w") as f:
        f["camera/intrinsic"] = source_intrinsics(width, height).astype(np.float32)
        f["transforms/camera"] = cam.astype(np.float32)
        for h, side in enumerate(sk.SIDES):
            names = sk.arkit_hand_joints(side) + (sk.arkit_elbow(side),)
            for p, name in enumerate(names):
                if name in drop_joints:
                    continue
                tf = np.tile(np.eye(4), (n, 1, 1))
                tf[:, :3, :3] = _rotation(rng, 1.0)  # joint orientation: irrelevant to positions
                tf[:, :3, 3] = pts_w[:, h, p]
                f[f"transforms/{name}"] = tf.astype(np.float32)
                conf = np.ones(n) if confidences is None else confidences[:, h, p]
                f[f"confidences/{name}"] = conf.astype(np.float32)
            for extra in ("Shoulder", "Arm", "IndexFingerMetacarpal"):  # present in real files
                f[f"transforms/{side}{extra}"] = np.tile(np.eye(4, dtype=np.float32), (n, 1, 1))
        f.attrs["llm_description"] = text
        f.attrs["llm_type"] = "basic"
    video_lib.write_video(mp4_path, frame_coded_video(num_video_frames or n, width, height), SRC_FPS)
    return h5_path, mp4_path


# ---- VITRA -----------------------------------------------------------------------------------------


def write_vitra_episode(root: str, episode: str, video_name: str, joints: np.ndarray,
                        kept: np.ndarray | None = None, *, width: int = 128, height: int = 72,
                        first_frame: int = 0, num_video_frames: int | None = None, seed: int = 0,
                        text: dict | None = None) -> tuple[str, str]:
    """Write <root>/annotations/<episode>.npy and <root>/videos/<video_name>.mp4.

    Annotation row i describes raw video frame first_frame + i. kept: (T, 2) 0/1 per hand.
    """
    t = joints.shape[0]
    kept = np.ones((t, 2), np.int64) if kept is None else np.asarray(kept, np.int64)
    cam = camera_trajectory(t, seed)  # camera → world
    w2c = np.linalg.inv(cam)
    ep = {
        "extrinsics": w2c.astype(np.float32),
        "intrinsics": source_intrinsics(width, height).astype(np.float32),
        "video_name": video_name,
        "video_decode_frame": np.arange(first_frame, first_frame + t, dtype=np.int64),
        "anno_type": "right",
        "text": text or {"left": [("hold the bowl", (0, t))], "right": [("stir the soup", (0, t))]},
        "avg_speed": 0.01, "total_rotvec_degree": 1.0, "total_transl_dist": 0.1,
    }
    for h, side in enumerate(sk.SIDES):
        j_w = sk.apply_pose(joints[:, h], cam)
        ep[side] = {
            "beta": np.zeros(10, np.float32),
            "global_orient_camspace": np.tile(np.eye(3), (t, 1, 1)),
            "global_orient_worldspace": cam[:, :3, :3].copy(),
            "hand_pose": np.tile(np.eye(3), (t, 15, 1, 1)),
            "transl_worldspace": j_w[:, 0].copy(),
            "kept_frames": kept[:, h].copy(),
            "joints_camspace": joints[:, h].astype(np.float32),
            "joints_worldspace": j_w,
        }
    os.makedirs(os.path.join(root, "annotations"), exist_ok=True)
    os.makedirs(os.path.join(root, "videos"), exist_ok=True)
    npy = os.path.join(root, "annotations", episode + ".npy")
    np.save(npy, np.asarray(ep, dtype=object), allow_pickle=True)
    mp4 = os.path.join(root, "videos", video_name + ".mp4")
    if not os.path.exists(mp4):
        video_lib.write_video(mp4, frame_coded_video(num_video_frames or first_frame + t, width, height),
                              SRC_FPS)
    return npy, mp4


# ---- robot teleop ----------------------------------------------------------------------------------


def write_robot_episode(root: str, name: str, joints: np.ndarray, elbows: np.ndarray,
                        actions: np.ndarray, *, valid: np.ndarray | None = None, width: int = 128,
                        height: int = 72, task: str = "lift the lid with both hands") -> str:
    n = joints.shape[0]
    ep_dir = os.path.join(root, name)
    os.makedirs(ep_dir, exist_ok=True)
    video_lib.write_video(os.path.join(ep_dir, robot_lib.VIDEO_FILE),
                          frame_coded_video(n, width, height), SRC_FPS)
    vec = pa.list_(pa.float32(), actions.shape[1])
    table = pa.table({
        "frame_index": pa.array(np.arange(n), pa.int64()),
        "timestamp": pa.array(np.arange(n) / SRC_FPS, pa.float32()),
        robot_lib.ACTION_COLUMN: pa.FixedSizeListArray.from_arrays(
            pa.array(actions.astype(np.float32).ravel()), actions.shape[1]).cast(vec),
        robot_lib.STATE_COLUMN: pa.FixedSizeListArray.from_arrays(
            pa.array(actions.astype(np.float32).ravel()), actions.shape[1]).cast(vec),
    })
    pq.write_table(table, os.path.join(ep_dir, robot_lib.TIMESERIES_FILE))
    with open(os.path.join(ep_dir, robot_lib.METADATA_FILE), "w") as f:
        json.dump({"task_description": task, "total_frames": n, "fps": SRC_FPS}, f)
    np.savez(os.path.join(ep_dir, robot_lib.SKELETON_FILE),
             joints_cam=joints.astype(np.float32), elbows_cam=elbows.astype(np.float32),
             valid=np.ones((n, 2, sk.NUM_POINTS), bool) if valid is None else valid,
             intrinsics=source_intrinsics(width, height).astype(np.float32))
    return ep_dir


def write_action_stats(root: str, actions: np.ndarray) -> None:
    stats = {"mean": actions.mean(0), "std": actions.std(0),
             "q01": np.quantile(actions, 0.01, 0), "q99": np.quantile(actions, 0.99, 0)}
    with open(os.path.join(root, robot_lib.STATS_FILE), "w") as f:
        json.dump({k: [float(x) for x in v] for k, v in stats.items()}, f)


def known_actions(n: int, seed: int = 0) -> np.ndarray:
    t = np.arange(n)[:, None] / SRC_FPS
    rng = np.random.default_rng(seed)
    return (0.5 * np.sin(2 * np.pi * rng.uniform(0.1, 0.5, 54) * t + rng.uniform(0, 6, 54))
            + 0.01 * np.arange(n)[:, None]).astype(np.float32)


# ---- whole datasets --------------------------------------------------------------------------------


def make_dataset(kind: str, root: str, num_episodes: int, num_src_frames: int, seed: int = 0,
                 **kw) -> str:
    """A small dataset of `kind` in {"egodex", "vitra", "robot"} under root; returns root."""
    all_actions = []
    for e in range(num_episodes):
        joints, elbows = known_pose(num_src_frames, seed + e)
        if kind == "egodex":
            write_egodex_episode(root, f"task{e % 2}", e, joints, elbows, seed=seed + e, **kw)
        elif kind == "vitra":
            write_vitra_episode(root, f"Ego4D_vid{e}_ep_{e:06d}", f"vid{e}", joints, seed=seed + e, **kw)
        elif kind == "robot":
            actions = known_actions(num_src_frames, seed + e)
            all_actions.append(actions)
            write_robot_episode(root, f"episode_{e:06d}", joints, elbows, actions, **kw)
        else:
            raise ValueError(f"unknown dataset kind {kind!r}")
    if kind == "robot":
        write_action_stats(root, np.concatenate(all_actions))
    return root
