"""Recorded operator streams: file format, reader/writer, resampling to output clocks.

File format `rynn-teleop-stream/1`: one `.npz` (numpy archive) holding

| key              | shape / dtype        | meaning                                                        |
|------------------|----------------------|----------------------------------------------------------------|
| `format`         | str                  | "rynn-teleop-stream/1"                                          |
| `tracker_names`  | [5] str              | `tracker.TRACKERS` order: chest, left/right upper arm & wrist  |
| `tracker_t`      | [N] float64          | seconds, strictly increasing (trackers run at 100–120 Hz)      |
| `tracker_pose`   | [N, 5, 7] float      | [x, y, z, qw, qx, qy, qz], tracking-world frame, metres        |
| `tracker_valid`  | [N, 5] bool          | False for lost frames (their pose values are ignored)          |
| `hand_t`         | [M] float64          | seconds, strictly increasing (glove / hand-tracking clock)     |
| `hand_keypoints` | [M, 2, 21, 3] float  | [left, right] MediaPipe-21 points in each wrist frame, metres  |
| `hand_valid`     | [M, 2] bool          | False for lost frames                                           |
| `meta`           | str (JSON, optional) | free-form: operator, device, calibration notes                  |

A sample that is non-finite or has a degenerate quaternion counts as lost even if its valid
flag is set. Resampling interpolates between valid neighbours (lerp positions and keypoints,
slerp rotations) and holds the last valid sample across gaps longer than `max_gap`, after the
last sample, and before the first one (there the output stays NaN/invalid: nothing to hold,
and the retarget step then holds the robot).

Implausible samples count as lost too: a tracker farther than `MAX_TRACKER_RANGE_M` from the
tracking origin, a hand keypoint farther than `MAX_HAND_REACH_M` from its wrist. `check` reports
the resampled per-frame validity masks: a warning with the counts when frames are lost, and an
`InputError` when more than `MAX_INVALID_FRACTION` of the frames have a tracker lost or both hands
lost — a stream that would drive a blank skeleton and a frozen robot is refused, not rendered.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import zipfile
from pathlib import Path

import numpy as np

from rynn_jax import errors
from rynn_jax.kinematics import tracker

FORMAT = "rynn-teleop-stream/1"
VIDEO_FPS = 16.0        # world-model video clock (paper: skeleton video at 16 fps)
CONTROL_HZ = 50.0       # policy rate (paper: policy at 50 Hz; arm servo at 200 Hz)
MAX_TRACKER_RANGE_M = 5.0   # a tracker this far from the tracking origin is a glitch, not a body
MAX_HAND_REACH_M = 0.3      # an adult hand spans ~0.2 m from the wrist
MAX_INVALID_FRACTION = 0.5  # `check` refuses a stream with more of its frames lost than this

log = logging.getLogger("rynn_jax.kinematics")


@dataclasses.dataclass(frozen=True)
class Stream:
    tracker_t: np.ndarray        # [N]
    tracker_pose: np.ndarray     # [N, 5, 7]
    tracker_valid: np.ndarray    # [N, 5]
    hand_t: np.ndarray           # [M]
    hand_keypoints: np.ndarray   # [M, 2, 21, 3]
    hand_valid: np.ndarray       # [M, 2]
    meta: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        n, m = len(self.tracker_t), len(self.hand_t)
        checks = [
            (self.tracker_pose.shape == (n, 5, 7), f"tracker_pose must be [{n},5,7], got {self.tracker_pose.shape}"),
            (self.tracker_valid.shape == (n, 5), f"tracker_valid must be [{n},5], got {self.tracker_valid.shape}"),
            (self.hand_keypoints.shape == (m, 2, 21, 3), f"hand_keypoints must be [{m},2,21,3], got {self.hand_keypoints.shape}"),
            (self.hand_valid.shape == (m, 2), f"hand_valid must be [{m},2], got {self.hand_valid.shape}"),
            (n == 0 or np.all(np.diff(self.tracker_t) > 0), "tracker_t must be strictly increasing"),
            (m == 0 or np.all(np.diff(self.hand_t) > 0), "hand_t must be strictly increasing"),
        ]
        for ok, msg in checks:
            if not ok:
                raise errors.InputError(f"invalid stream: {msg}")

    @property
    def span(self) -> tuple[float, float]:
        """Time interval covered by both clocks."""
        return (max(self.tracker_t[0], self.hand_t[0]), min(self.tracker_t[-1], self.hand_t[-1]))


def write(path: str | Path, s: Stream) -> None:
    np.savez_compressed(
        path, format=np.asarray(FORMAT), tracker_names=np.asarray(tracker.TRACKERS),
        tracker_t=s.tracker_t, tracker_pose=s.tracker_pose, tracker_valid=s.tracker_valid,
        hand_t=s.hand_t, hand_keypoints=s.hand_keypoints, hand_valid=s.hand_valid,
        meta=np.asarray(json.dumps(s.meta)))


def read(path: str | Path) -> Stream:
    """The stream in `path`; an `InputError` naming the file when it is missing, cut, empty, not
    a `.npz`, or lacks a key or shape of the format."""
    if not Path(path).is_file():
        raise errors.MissingFileError(f"{path}: no such operator stream file")
    try:
        with np.load(path, allow_pickle=False) as z:
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise ValueError("a bare .npy array, not an .npz archive")
            fmt = str(z["format"]) if "format" in z else "<missing>"
            if fmt != FORMAT:
                raise ValueError(f"expected format {FORMAT!r}, found {fmt!r}")
            names = tuple(str(x) for x in z["tracker_names"])
            if names != tracker.TRACKERS:
                raise ValueError(f"tracker order {names} != {tracker.TRACKERS}")
            return Stream(z["tracker_t"], z["tracker_pose"], z["tracker_valid"].astype(bool),
                          z["hand_t"], z["hand_keypoints"], z["hand_valid"].astype(bool),
                          json.loads(str(z["meta"])) if "meta" in z else {})
    except (OSError, EOFError, zipfile.BadZipFile, KeyError, ValueError) as e:
        reason = "empty file" if isinstance(e, EOFError) else "truncated or not a zip archive" if isinstance(
            e, zipfile.BadZipFile) else f"missing key {e}" if isinstance(e, KeyError) else str(e)
        raise errors.InputError(f"{path}: not a readable {FORMAT} file ({reason})",
                                fix="re-record or re-export the stream") from None


def clock(t0: float, t1: float, hz: float) -> np.ndarray:
    """Sample times of a fixed-rate clock covering [t0, t1]."""
    return t0 + np.arange(int(np.floor((t1 - t0) * hz + 1e-9)) + 1) / hz


def _usable_trackers(s: Stream) -> np.ndarray:
    p = s.tracker_pose
    qn = np.linalg.norm(np.nan_to_num(p[..., 3:]), axis=-1)
    near = np.linalg.norm(np.nan_to_num(p[..., :3], nan=np.inf), axis=-1) <= MAX_TRACKER_RANGE_M
    return s.tracker_valid & np.all(np.isfinite(p), axis=-1) & (qn > 0.5) & (qn < 2.0) & near


def _usable_hands(s: Stream) -> np.ndarray:
    kp = s.hand_keypoints
    reach = np.linalg.norm(np.nan_to_num(kp - kp[:, :, :1], nan=np.inf), axis=-1).max(-1)
    return s.hand_valid & np.all(np.isfinite(kp), axis=(-1, -2)) & (reach <= MAX_HAND_REACH_M)


def check(s: Stream, where: str, rs: dict[str, np.ndarray] | None = None, hz: float = VIDEO_FPS
          ) -> dict[str, int]:
    """Per-frame validity of `s` resampled at `hz` (or of `rs`, `resample`'s output): logs a
    warning with the counts when frames are lost, raises `InputError` naming `where` when more
    than MAX_INVALID_FRACTION of the frames lack a tracker or both hands. Returns the counts."""
    if rs is None:
        t0, t1 = s.span
        if not t1 > t0:
            raise errors.InputError(f"{where}: tracker and hand clocks do not overlap")
        rs = resample(s, clock(t0, t1, hz))
    frames = len(rs["t"])
    counts = {"frames": frames,
              "tracker_frames_lost": int((~rs["trackers_fresh"].all(axis=1)).sum()),
              "hand_frames_lost": int((~rs["hands_fresh"].any(axis=1)).sum()),
              "tracker_samples_unusable": int((~_usable_trackers(s)).sum()),
              "hand_samples_unusable": int((~_usable_hands(s)).sum())}
    if counts["tracker_frames_lost"] or counts["hand_frames_lost"]:
        log.warning("%s: %d of %d frames with a tracker lost, %d with both hands lost (%d tracker and %d hand "
                    "samples NaN, flagged invalid or implausible); lost frames hold the last pose", where,
                    counts["tracker_frames_lost"], frames, counts["hand_frames_lost"],
                    counts["tracker_samples_unusable"], counts["hand_samples_unusable"])
    for what in ("tracker", "hand"):
        lost = counts[f"{what}_frames_lost"]
        if lost > MAX_INVALID_FRACTION * frames:
            raise errors.InputError(
                f"{where}: {lost} of {frames} frames have no valid {what} pose (NaN, flagged invalid or "
                f"implausible), more than the {MAX_INVALID_FRACTION:.0%} allowed", fix="re-record the stream")
    return counts


def _slerp(q0: np.ndarray, q1: np.ndarray, u: np.ndarray) -> np.ndarray:
    q0 = q0 / np.linalg.norm(q0, axis=-1, keepdims=True)
    q1 = q1 / np.linalg.norm(q1, axis=-1, keepdims=True)
    dot = np.sum(q0 * q1, -1, keepdims=True)
    q1 = np.where(dot < 0, -q1, q1)                      # shortest arc
    dot = np.clip(np.abs(dot), -1.0, 1.0)
    theta = np.arccos(dot)
    sin = np.sin(theta)
    small = sin < 1e-6
    w0 = np.where(small, 1.0 - u, np.sin((1.0 - u) * theta) / np.where(small, 1.0, sin))
    w1 = np.where(small, u, np.sin(u * theta) / np.where(small, 1.0, sin))
    q = w0 * q0 + w1 * q1
    return q / np.linalg.norm(q, axis=-1, keepdims=True)


def _resample_channel(t_src: np.ndarray, x_src: np.ndarray, ok_src: np.ndarray, t_out: np.ndarray,
                      max_gap: float, quat: slice | None) -> tuple[np.ndarray, np.ndarray]:
    """One channel (samples [N, ...], validity [N]) → ([T, ...], fresh [T]). `fresh` is False
    where the value is held (gap, after the end) or missing (NaN, before the first sample)."""
    out = np.full((len(t_out),) + x_src.shape[1:], np.nan)
    fresh = np.zeros(len(t_out), bool)
    idx = np.flatnonzero(ok_src)
    if len(idx) == 0:
        return out, fresh
    tv, xv = t_src[idx], x_src[idx].astype(np.float64)
    j = np.searchsorted(tv, t_out, side="right") - 1      # last valid sample at or before t
    before = j < 0
    j0 = np.clip(j, 0, len(tv) - 1)
    j1 = np.clip(j + 1, 0, len(tv) - 1)
    gap = tv[j1] - tv[j0]
    interp = (~before) & (j1 > j0) & (gap <= max_gap)
    exact = (~before) & (np.abs(t_out - tv[j0]) < 1e-9)
    u = np.where(interp, (t_out - tv[j0]) / np.where(gap > 0, gap, 1.0), 0.0)
    ue = u.reshape((-1,) + (1,) * (x_src.ndim - 1))
    val = (1.0 - ue) * xv[j0] + ue * xv[j1]
    if quat is not None:
        val[..., quat] = _slerp(xv[j0][..., quat], xv[j1][..., quat], ue)
    out[~before] = val[~before]
    fresh[:] = interp | exact
    return out, fresh


def resample(s: Stream, t_out: np.ndarray, max_gap: float = 0.1) -> dict[str, np.ndarray]:
    """Resample both clocks to `t_out`: trackers [T,5,7], hands [T,2,21,3], and `*_fresh`
    masks (False = held or missing)."""
    ok_t = _usable_trackers(s)
    ok_h = _usable_hands(s)
    trk = np.full((len(t_out), 5, 7), np.nan)
    trk_fresh = np.zeros((len(t_out), 5), bool)
    for k in range(5):
        trk[:, k], trk_fresh[:, k] = _resample_channel(
            s.tracker_t, s.tracker_pose[:, k], ok_t[:, k], t_out, max_gap, quat=slice(3, 7))
    hands = np.full((len(t_out), 2, 21, 3), np.nan)
    hand_fresh = np.zeros((len(t_out), 2), bool)
    for k in range(2):
        hands[:, k], hand_fresh[:, k] = _resample_channel(
            s.hand_t, s.hand_keypoints[:, k], ok_h[:, k], t_out, max_gap, quat=None)
    return {"t": t_out, "trackers": trk, "trackers_fresh": trk_fresh,
            "hands": hands, "hands_fresh": hand_fresh}
