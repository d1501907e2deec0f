"""Clip geometry shared by every source: the resampled timeline, clip slicing, the sample schema.

Every episode is put on a uniform `fps` (16 Hz) timeline: sample k sits at time k/fps and takes
the source frame nearest to it (ties round up), so a 30 Hz episode of N frames yields
floor((N-1)·16/30)+1 samples. Clips are `num_frames` consecutive samples starting every
`stride` samples (default: back to back, as the paper's clip counts imply: EgoDex 74.0M frames /
0.91M clips ≈ 81, VITRA 30.7M / 1.23M ≈ 25). Nearest-frame resampling keeps every pose exactly a
recorded pose (no interpolated hands).

A pixel-path sample is a dict of numpy arrays with one fixed structure across sources (so a
pipeline can batch and a checkpoint can restore without caring where a clip came from):

  video        uint8   (T, H, W, 3)   RGB frames, resized + centre-cropped to H×W
  joints_cam   float32 (T, 2, 21, 3)  MediaPipe joints, hand 0 left / 1 right, OpenCV camera frame
                                      (x right, y down, z forward, metres) of that frame's camera
  elbows_cam   float32 (T, 2, 3)      elbow points, same frame
  valid        bool    (T, 2, 22)     joint tracked (index 21 = elbow); invalid entries are zeroed
  uv           float32 (T, 2, 22, 2)  pixel coordinates in the output frame (OpenCV: integer =
                                      pixel centre); 0 where invalid
  depth        float32 (T, 2, 22)     camera-space z (metres) for the depth-aware renderer
  intrinsics   float32 (3, 3)         K of the output frames (after resize + crop)
  actions      float32 (T, 54)        robot joint targets, zeros when the source has none
  has_actions  bool    ()
  frame_index  int64   (T,)           source video frame of each sample
  clip_id      int64   ()             position of the clip in its source's index
  text         str     ()             task / caption prompt
"""

from __future__ import annotations

import dataclasses

import numpy as np

ACTION_DIM = 54  # [left arm 7 | left hand 20 | right arm 7 | right hand 20]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClipConfig:
    num_frames: int = 81  # frames per clip on the resampled timeline (EgoDex/robot 81, VITRA 25)
    fps: float = 16.0  # resampled frame rate (the model's)
    height: int = 480  # output frame height
    width: int = 832  # output frame width
    stride: int | None = None  # clip start spacing in resampled frames; None: num_frames
    max_clips_per_episode: int | None = None  # cap per episode (None: all)
    min_valid_fraction: float = 0.0  # skip clips with fewer tracked (frame, hand) pairs than this
    camera_convention: str = "opencv"  # EgoDex camera axes: "opencv" (z forward) or "arkit" (z back)

    def __post_init__(self):
        if self.num_frames < 1 or self.fps <= 0 or self.height < 1 or self.width < 1:
            raise ValueError(f"bad clip config {self}")
        if self.camera_convention not in ("opencv", "arkit"):
            raise ValueError(f"camera_convention must be 'opencv' or 'arkit', got {self.camera_convention!r}")

    @property
    def clip_stride(self) -> int:
        return self.stride or self.num_frames


@dataclasses.dataclass(frozen=True)
class ClipRef:
    """One clip of one episode; small and picklable (it is what grain shuffles and shards)."""

    episode: str  # episode key, relative to the source root
    start: int  # first sample on the episode's resampled timeline
    clip_id: int = -1  # position in the source's index, filled in by the index


def resampled_length(num_src: int, src_fps: float, fps: float) -> int:
    """Samples on the `fps` timeline whose nearest source frame exists."""
    if num_src < 1:
        return 0
    # largest k with floor(k·src/fps + 1/2) <= num_src - 1  ⇔  k·src/fps < num_src - 1/2
    return int(np.ceil((num_src - 0.5) * fps / src_fps - 1e-9))


def resample_indices(start: int, num: int, src_fps: float, fps: float) -> np.ndarray:
    """Source frame nearest to each time (start + i)/fps, i < num (ties round up)."""
    k = np.arange(start, start + num, dtype=np.float64)
    return np.floor(k * src_fps / fps + 0.5 + 1e-9).astype(np.int64)


def clip_starts(num_samples: int, cfg: ClipConfig) -> list[int]:
    starts = list(range(0, num_samples - cfg.num_frames + 1, cfg.clip_stride))
    if cfg.max_clips_per_episode is not None:
        starts = starts[: cfg.max_clips_per_episode]
    return starts


def text_array(text: str) -> np.ndarray:
    return np.asarray(text, dtype=np.str_)
