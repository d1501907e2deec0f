"""Ground-truth and generated episodes as the evaluation reads them.

Ground truth is any robot-layout episode set (data/README.md) — the synthetic world's held-out
episodes, or recorded robot shards. Frames and the skeleton come through the training data path
(`data.robot.RobotSource`: 16 fps timeline, resize + centre crop to the evaluation resolution,
intrinsics cropped alike) and the control video is rendered as the pre-encoder renders it
(`data.preencode.skeleton_renderer`), so a model sees the control it was trained on. The sim's
extra ground truth (depth, flow, segmentation; `data.robot.read_ground_truth`) is mapped to the
same crop by nearest neighbour (flow vectors scaled with the pixels); episodes without it simply
have no depth/flow/robot-region scores.

Generated episodes (`serve.py generate` or any directory of the same layout) are paired with ground
truth by their path relative to their root; they may carry predicted `depth.npz` / `flow.npz`
in the sim's format.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from rynn_jax.data import robot as robot_data
from rynn_jax.data import video as video_lib
from rynn_jax.data.clips import ClipConfig, ClipRef
from rynn_jax.data.robot import VIDEO_FILE, RobotSource


@dataclasses.dataclass
class Truth:
    name: str  # episode path relative to the ground-truth root
    frames: np.ndarray  # (T, H, W, 3) uint8
    skeleton: np.ndarray  # (T, H, W, 3) uint8, the rendered control video
    prompt: str  # task description
    depth: np.ndarray | None = None  # (T, H, W) float32 metres, 0 = nothing
    flow: np.ndarray | None = None  # (T − 1, H, W, 2) float32 pixels
    robot: np.ndarray | None = None  # (T, H, W) bool, the robot mask
    depth_video: np.ndarray | None = None  # (T, H, W, 3) uint8 grey encoding of `depth` (RynnWorld-4D)
    flow_video: np.ndarray | None = None  # (T, H, W, 3) uint8 colour encoding of `flow`, frame 0 white


def list_episodes(root: str | os.PathLike) -> list[str]:
    """Episode names (paths relative to `root`) of a robot-layout episode set, sorted."""
    if not Path(root).is_dir():
        raise FileNotFoundError(f"--episodes {root}: not a directory")
    names = [n for n in RobotSource(root, ClipConfig(num_frames=1)).episodes() if not n.endswith(".tmp")]
    if not names:
        raise FileNotFoundError(f"--episodes {root}: no episodes (directories with metadata.json) under it")
    return names


def video_size(path: str | os.PathLike) -> tuple[int, int, int]:
    """(frames, height, width) of a video file."""
    info = video_lib.probe_video(path)
    return info.num_frames, info.height, info.width


def available_frames(root: str | os.PathLike, name: str) -> int:
    """Frames of episode `name` on the 16 fps timeline."""
    return RobotSource(root, ClipConfig(num_frames=1)).num_samples(name)


def load_truth(root: str | os.PathLike, name: str, num_frames: int, height: int, width: int) -> Truth:
    """The first `num_frames` frames of an episode at height × width, its control video, and (for
    sim episodes) depth, flow and robot mask on the same crop."""
    from rynn_jax.data.preencode import skeleton_renderer

    cfg = ClipConfig(num_frames=num_frames, height=height, width=width)
    sample = RobotSource(root, cfg, strict=True).load(ClipRef(name, 0))
    skeleton = np.asarray(skeleton_renderer(height, width, cfg.fps)(sample), np.uint8)
    truth = Truth(name, np.asarray(sample["video"], np.uint8), skeleton, str(sample["text"]))
    d = Path(root) / name
    gt = robot_data.read_ground_truth(d, missing_ok=True)  # each kind the episode has (copies may drop some)
    if gt:
        _, src_h, src_w = video_size(d / VIDEO_FILE)
        idx = np.asarray(sample["frame_index"])
    if "depth" in gt:
        truth.depth = crop_like_frames(gt["depth"][idx], src_h, src_w, height, width)
    if "labels" in gt:
        truth.robot = np.isin(crop_like_frames(gt["labels"][idx], src_h, src_w, height, width), (1, 2))
    if "flow" in gt:
        pairs = idx[:-1][idx[:-1] < len(gt["flow"])]
        truth.flow = crop_like_frames(gt["flow"][pairs], src_h, src_w, height, width, vectors=True)
    return truth


def crop_like_frames(x_thw: np.ndarray, src_h: int, src_w: int, height: int, width: int,
                     vectors: bool = False) -> np.ndarray:
    """A per-pixel field (T, src_h, src_w, ...) resized + centre-cropped like the video frames
    (`data.video.crop_geometry`), by nearest neighbour; `vectors`: the last axis holds (dx, dy)
    pixel displacements, scaled with the resize."""
    if (src_h, src_w) == (height, width):
        return x_thw
    g = video_lib.crop_geometry(src_w, src_h, width, height)
    sx, sy = g.resized_w / src_w, g.resized_h / src_h
    cols = np.clip(np.round((np.arange(width) + g.x0 + 0.5) / sx - 0.5).astype(int), 0, src_w - 1)
    rows = np.clip(np.round((np.arange(height) + g.y0 + 0.5) / sy - 0.5).astype(int), 0, src_h - 1)
    out = x_thw[:, rows][:, :, cols]
    return out * np.asarray([sx, sy], np.float32) if vectors else out


@dataclasses.dataclass
class Generated:
    frames: np.ndarray  # (T, H, W, 3) uint8
    depth: np.ndarray | None = None  # (T, H, W) float32 metres
    flow: np.ndarray | None = None  # (T − 1, H, W, 2) float32 pixels
    depth_video: np.ndarray | None = None  # (T, H, W, 3) uint8, a 4D model's generated depth encoding
    flow_video: np.ndarray | None = None  # (T, H, W, 3) uint8, its generated flow encoding


def with_encodings(x: Truth | Generated) -> Truth | Generated:
    """`x` with the depth/flow videos a 4D model generates, encoded from its depth and flow
    (`data/geometry_video.py`) where it has those and not the videos."""
    from rynn_jax.data import geometry_video as gv

    if x.depth_video is None and x.depth is not None:
        x = dataclasses.replace(x, depth_video=gv.depth_to_rgb(x.depth))
    if x.flow_video is None and x.flow is not None:
        white = np.full((1, *x.flow.shape[1:3], 3), 255, np.uint8)
        x = dataclasses.replace(x, flow_video=np.concatenate([white, gv.flow_to_rgb(x.flow)]))
    return x


def load_generated(root: str | os.PathLike, name: str, num_frames: int) -> Generated:
    """The first `num_frames` frames of a generated episode (and its depth/flow, if it has them)."""
    d = Path(root) / name
    path = d / VIDEO_FILE
    if not path.is_file():
        raise FileNotFoundError(f"--generated {root}: no {VIDEO_FILE} for episode {name}")
    n, h, w = video_size(path)
    frames = video_lib.read_frames(path, list(range(min(num_frames, n))), w, h)
    out = Generated(np.asarray(frames, np.uint8))
    if (d / robot_data.DEPTH_FILE).exists():
        with np.load(d / robot_data.DEPTH_FILE) as z:
            out.depth = z["depth_mm"][:num_frames].astype(np.float32) / 1000.0
    if (d / robot_data.FLOW_FILE).exists():
        with np.load(d / robot_data.FLOW_FILE) as z:
            out.flow = z["flow"][:num_frames - 1].astype(np.float32)
    return out
