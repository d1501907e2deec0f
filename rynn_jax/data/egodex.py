"""EgoDex reader: `<task>/<N>.hdf5` + `<task>/<N>.mp4` episodes (1080p, 30 Hz) → 16 fps clips.

HDF5 layout (facts from apple/ml-egodex): `/camera/intrinsic` (3, 3); `/transforms/<joint>`
(N, 4, 4) poses in the ARKit world frame, `/transforms/camera` the camera pose (camera → world);
`/confidences/<joint>` (N,) optional; file attributes `llm_description` (and, for
`llm_type == "reversible"`, `llm_description2` chosen by `which_llm_description` "1"/"2").

Joints are moved into each frame's camera frame, p_c = inv(T_camera) p_w. The public EgoDex tools
project that directly with the intrinsics (OpenCV axes), which is our default; ClipConfig
`camera_convention="arkit"` flips y and z for data whose camera frame is ARKit's (y up, z back).
"""

from __future__ import annotations

import glob
import os

import h5py
import numpy as np

from rynn_jax.data import clips as clips_lib
from rynn_jax.data import skeleton as sk
from rynn_jax.data import video as video_lib
from rynn_jax.data.clips import ClipConfig, ClipRef
from rynn_jax.data.errors import DataError
from rynn_jax.data.source import ClipSource, Sample, check_finite, check_shape, empty_actions

ALL_JOINTS = tuple(j for side in sk.SIDES for j in sk.arkit_hand_joints(side) + (sk.arkit_elbow(side),))


def _attr_text(value) -> str:
    return value.decode("utf-8") if isinstance(value, (bytes, np.bytes_)) else str(value)


def episode_text(f: h5py.File) -> str:
    attrs = f.attrs
    if "llm_description" not in attrs:
        return ""
    if _attr_text(attrs.get("llm_type", "")) == "reversible" and \
            _attr_text(attrs.get("which_llm_description", "1")) == "2" and "llm_description2" in attrs:
        return _attr_text(attrs["llm_description2"])
    return _attr_text(attrs["llm_description"])


class EgoDexSource(ClipSource):
    name = "egodex"

    def __init__(self, root, cfg: ClipConfig = ClipConfig(num_frames=81), *, strict: bool = False,
                 min_confidence: float = 0.0):
        super().__init__(root, cfg, strict=strict)
        self.min_confidence = min_confidence  # joints with confidence below this are untracked

    def episodes(self) -> list[str]:
        found = glob.glob(os.path.join(self.root, "**", "*.hdf5"), recursive=True)
        return sorted(os.path.relpath(p, self.root)[: -len(".hdf5")] for p in found)

    def _files(self, episode: str) -> tuple[str, str]:
        return self.path(episode + ".hdf5"), self.path(episode + ".mp4")

    def num_samples(self, episode: str) -> int:
        h5_path, mp4_path = self._files(episode)
        if not os.path.exists(mp4_path):
            raise DataError(mp4_path, "missing video")
        info = video_lib.probe_video(mp4_path)
        try:
            with h5py.File(h5_path, "r") as f:
                if "transforms/camera" not in f or "camera/intrinsic" not in f:
                    raise DataError(h5_path, "missing camera")
                missing = [j for j in ALL_JOINTS if f"transforms/{j}" not in f]
                if missing:
                    raise DataError(h5_path, "missing joint", ", ".join(missing[:4]))
                n = f["transforms/camera"].shape[0]
                short = [j for j in ALL_JOINTS if f[f"transforms/{j}"].shape[0] < n]
                if short:
                    raise DataError(h5_path, "truncated hdf5", f"{short[0]} shorter than camera")
                K = check_shape(h5_path, "intrinsic", f["camera/intrinsic"][()], (3, 3))
                check_finite(h5_path, "intrinsics", K)
        except OSError as e:
            raise DataError(h5_path, "unreadable hdf5", str(e)) from e
        return clips_lib.resampled_length(min(n, info.num_frames), info.fps, self.cfg.fps)

    def prompt(self, ref: ClipRef) -> str | None:
        with h5py.File(self._files(ref.episode)[0], "r") as f:
            return episode_text(f)

    def load(self, ref: ClipRef) -> Sample:
        cfg = self.cfg
        h5_path, mp4_path = self._files(ref.episode)
        info = video_lib.probe_video(mp4_path)
        idx = clips_lib.resample_indices(ref.start, cfg.num_frames, info.fps, cfg.fps)
        uniq, inverse = np.unique(idx, return_inverse=True)  # h5py wants increasing indices
        try:
            with h5py.File(h5_path, "r") as f:
                cam = f["transforms/camera"][uniq][inverse].astype(np.float64)  # (T, 4, 4)
                K = f["camera/intrinsic"][()].astype(np.float64)
                pts, conf = [], []
                for j in ALL_JOINTS:
                    pts.append(f[f"transforms/{j}"][uniq][inverse][:, :3, 3])
                    c = f.get(f"confidences/{j}")
                    conf.append(np.ones(len(idx)) if c is None else c[uniq][inverse])
                text = episode_text(f)
        except OSError as e:
            raise DataError(h5_path, "unreadable hdf5", str(e)) from e
        check_finite(h5_path, "camera pose", cam)
        pts_w = np.stack(pts, 1).astype(np.float64)  # (T, 44, 3): per side 21 joints + elbow
        conf = np.nan_to_num(np.stack(conf, 1).astype(np.float64), nan=-1.0)
        p_c = sk.to_camera(pts_w, cam)
        if cfg.camera_convention == "arkit":
            p_c = p_c @ sk.ARKIT_TO_OPENCV.T
        p_c = p_c.reshape(len(idx), 2, sk.NUM_POINTS, 3)
        valid = (conf >= self.min_confidence).reshape(len(idx), 2, sk.NUM_POINTS)
        z = p_c[..., 2][valid & np.isfinite(p_c[..., 2])]
        if z.size and (z > 0).mean() < 0.5:  # egocentric hands sit in front of the camera
            raise DataError(h5_path, "hands behind camera",
                            f"{(z <= 0).mean():.0%} of tracked joints have z <= 0; "
                            f"is ClipConfig.camera_convention ({cfg.camera_convention!r}) right?")
        g = video_lib.crop_geometry(info.width, info.height, cfg.width, cfg.height)
        K_out = video_lib.crop_intrinsics(K, info.width, info.height, g)
        skel = sk.finish_skeleton(h5_path, p_c[:, :, :sk.NUM_JOINTS], p_c[:, :, sk.ELBOW], valid,
                                  K_out, cfg.min_valid_fraction)
        frames = video_lib.read_frames(mp4_path, idx, cfg.width, cfg.height)
        return {"video": frames, **skel, **empty_actions(cfg.num_frames),
                "frame_index": idx, "text": clips_lib.text_array(text)}
