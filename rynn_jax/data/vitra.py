"""VITRA reader: one `.npy` dict per episode + the raw video it annotates → 16 fps clips (25 frames).

Episode dict (facts from microsoft/VITRA's loaders): `extrinsics` (T, 4, 4) world → camera;
`intrinsics` (3, 3) in pixels of the raw video; `video_name`; `video_decode_frame` (T,) raw-video
frame of each annotation row; `anno_type` ("left"/"right", the primary hand); `text`
{"left"/"right": [(caption, (start, end)), ...]}; per hand `left`/`right` dicts with
`joints_camspace` (T, 21, 3, MediaPipe/OpenPose order, OpenCV camera frame), `kept_frames` (T,)
0/1 mask, and MANO parameters (`beta`, `hand_pose`, `global_orient_*`, `transl_worldspace`,
`joints_worldspace`; not needed for the skeleton).

Layout we read (put the release this way, see data/README.md):
  <root>/annotations/<Dataset>_<video_name>_ep_<k>.npy
  <root>/videos/<video_name>.mp4   or, when videos are split into parts of `video_part_len`
  frames as in VITRA's own loader, <root>/videos/<video_name>_part<p+1>.mp4.

Timeline: sample k sits at raw frame vdf[0] + round(k·fps_video/16); the annotation row with that
`video_decode_frame` supplies the hands (none → both hands untracked in that frame). VITRA has no
elbows; they are always untracked.
"""

from __future__ import annotations

import glob
import os
import pickle

import numpy as np

from rynn_jax.data import clips as clips_lib
from rynn_jax.data import skeleton as sk
from rynn_jax.data import video as video_lib
from rynn_jax.data.clips import ClipConfig, ClipRef
from rynn_jax.data.errors import DataError
from rynn_jax.data.source import ClipSource, Sample, check_finite, check_shape, empty_actions


def load_episode(path: str) -> dict:
    """The episode dict. VITRA stores it pickled inside .npy, so loading needs allow_pickle:
    only read annotation files from a source you trust."""
    try:
        obj = np.load(path, allow_pickle=True)
        ep = obj.item() if isinstance(obj, np.ndarray) and obj.dtype == object else None
    except (OSError, ValueError, EOFError, pickle.UnpicklingError) as e:
        raise DataError(path, "unreadable npy", f"{type(e).__name__}: {e}") from e
    if not isinstance(ep, dict):
        raise DataError(path, "unreadable npy", "not a pickled dict")
    for key in ("extrinsics", "intrinsics", "video_name", "video_decode_frame", "left", "right"):
        if key not in ep:
            raise DataError(path, "missing key", key)
    for side in sk.SIDES:
        for key in ("joints_camspace", "kept_frames"):
            if key not in ep[side]:
                raise DataError(path, "missing key", f"{side}/{key}")
    return ep


def caption(ep: dict, frame: int) -> str:
    """'Left hand: … Right hand: …' from the captions whose interval holds annotation row `frame`."""
    text = ep.get("text") or {}
    parts = []
    for side in sk.SIDES:
        entries = list(text.get(side) or [])
        pick = next((c for c, (s, e) in entries if s <= frame <= e), entries[0][0] if entries else "None.")
        parts.append(f"{side.capitalize()} hand: {str(pick).strip()}")
    return " ".join(p if p.endswith(".") else p + "." for p in parts)


class VitraSource(ClipSource):
    name = "vitra"

    def __init__(self, root, cfg: ClipConfig = ClipConfig(num_frames=25), *, strict: bool = False,
                 video_part_len: int | None = None):
        super().__init__(root, cfg, strict=strict)
        self.video_part_len = video_part_len  # frames per video part file (VITRA uses 2000), or None

    def episodes(self) -> list[str]:
        found = glob.glob(os.path.join(self.root, "annotations", "**", "*.npy"), recursive=True)
        return sorted(os.path.relpath(p, self.path("annotations"))[: -len(".npy")] for p in found)

    def _video(self, ep: dict, raw_frame: int) -> tuple[str, int]:
        name = str(ep["video_name"])
        if self.video_part_len is None:
            return self.path("videos", name + ".mp4"), raw_frame
        part, local = divmod(raw_frame, self.video_part_len)
        return self.path("videos", f"{name}_part{part + 1}.mp4"), local

    def _episode(self, episode: str) -> tuple[str, dict, np.ndarray]:
        npy = self.path("annotations", episode + ".npy")
        ep = load_episode(npy)
        vdf = np.asarray(ep["video_decode_frame"]).astype(np.int64)
        n = len(vdf)
        check_shape(npy, "extrinsics", np.asarray(ep["extrinsics"]), (n, 4, 4))
        check_shape(npy, "intrinsics", np.asarray(ep["intrinsics"]), (3, 3))
        for side in sk.SIDES:
            check_shape(npy, f"{side}/joints_camspace", np.asarray(ep[side]["joints_camspace"]),
                        (n, sk.NUM_JOINTS, 3))
            check_shape(npy, f"{side}/kept_frames", np.asarray(ep[side]["kept_frames"]), (n,))
        if n == 0 or (np.diff(vdf) <= 0).any():
            raise DataError(npy, "bad video_decode_frame", "empty or not strictly increasing")
        check_finite(npy, "intrinsics", np.asarray(ep["intrinsics"], np.float64))
        return npy, ep, vdf

    def num_samples(self, episode: str) -> int:
        npy, ep, vdf = self._episode(episode)
        path, _ = self._video(ep, int(vdf[0]))
        if not os.path.exists(path):
            raise DataError(path, "missing video")
        info = video_lib.probe_video(path)
        span = int(vdf[-1] - vdf[0] + 1)
        if self.video_part_len is None and vdf[-1] >= info.num_frames:
            raise DataError(path, "truncated video",
                            f"annotations reach frame {vdf[-1]}, video has {info.num_frames}")
        return clips_lib.resampled_length(span, info.fps, self.cfg.fps)

    def load(self, ref: ClipRef) -> Sample:
        cfg = self.cfg
        npy, ep, vdf = self._episode(ref.episode)
        path0, _ = self._video(ep, int(vdf[0]))
        info = video_lib.probe_video(path0)
        raw = vdf[0] + clips_lib.resample_indices(ref.start, cfg.num_frames, info.fps, cfg.fps)
        row = np.searchsorted(vdf, raw)
        has_row = (row < len(vdf)) & (vdf[np.minimum(row, len(vdf) - 1)] == raw)
        row = np.minimum(row, len(vdf) - 1)
        joints = np.stack([np.asarray(ep[s]["joints_camspace"], np.float64)[row] for s in sk.SIDES], 1)
        kept = np.stack([np.asarray(ep[s]["kept_frames"]).astype(bool)[row] for s in sk.SIDES], 1)
        kept &= has_row[:, None]
        valid = np.concatenate([np.repeat(kept[..., None], sk.NUM_JOINTS, -1),
                                np.zeros(kept.shape + (1,), bool)], -1)  # no elbows in VITRA
        g = video_lib.crop_geometry(info.width, info.height, cfg.width, cfg.height)
        K_out = video_lib.crop_intrinsics(np.asarray(ep["intrinsics"], np.float64),
                                          info.width, info.height, g)
        skel = sk.finish_skeleton(npy, joints, np.full((cfg.num_frames, 2, 3), np.nan), valid,
                                  K_out, cfg.min_valid_fraction)
        frames = self._frames(ep, raw)
        return {"video": frames, **skel, **empty_actions(cfg.num_frames),
                "frame_index": raw.astype(np.int64),
                "text": clips_lib.text_array(caption(ep, int(row[0])))}

    def _frames(self, ep: dict, raw: np.ndarray) -> np.ndarray:
        cfg = self.cfg
        by_file: dict[str, list[tuple[int, int]]] = {}
        for i, r in enumerate(raw):
            path, local = self._video(ep, int(r))
            by_file.setdefault(path, []).append((i, local))
        out = np.zeros((len(raw), cfg.height, cfg.width, 3), np.uint8)
        for path, items in by_file.items():
            out[[i for i, _ in items]] = video_lib.read_frames(path, [f for _, f in items],
                                                               cfg.width, cfg.height)
        return out
