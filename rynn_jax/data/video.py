"""Video I/O with PyAV: probe, decode selected frames resized + centre-cropped, write (fixtures).

Geometry: frames are resized so the output H×W is covered (scale = max(W/w, H/h)), then the
centre is cropped. The resized size is rounded to whole pixels, so x and y scales differ very
slightly; `crop_intrinsics` uses the exact per-axis scales so projected skeletons stay aligned
with the pixels (OpenCV convention: pixel centres at integers, so u' = sx·(u + ½) − ½ − x0).

Frame numbering: frame i is the i-th frame in presentation order, found from its timestamp
(i = round((pts − start) · time_base · fps)), so seeking does not shift indices.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from fractions import Fraction

import av
import numpy as np

from rynn_jax.data.errors import DataError


@dataclasses.dataclass(frozen=True)
class VideoInfo:
    num_frames: int
    fps: float
    width: int
    height: int


@dataclasses.dataclass(frozen=True)
class CropGeometry:
    resized_w: int
    resized_h: int
    x0: int  # crop offset in the resized frame
    y0: int
    out_w: int
    out_h: int


def probe_video(path: str | os.PathLike[str]) -> VideoInfo:
    """Container metadata only (fast). Raises DataError if the file cannot be opened."""
    try:
        with av.open(os.fspath(path)) as c:
            if not c.streams.video:
                raise DataError(path, "no video stream")
            s = c.streams.video[0]
            fps = float(s.average_rate or s.guessed_rate or 0)
            n = s.frames
            if not n and s.duration is not None and s.time_base is not None:
                n = int(round(float(s.duration * s.time_base) * fps))
            if not n or fps <= 0:
                raise DataError(path, "video has no frame count or rate")
            return VideoInfo(int(n), fps, s.codec_context.width, s.codec_context.height)
    except DataError:
        raise
    except (av.FFmpegError, OSError, ValueError) as e:
        raise DataError(path, "unreadable video", str(e)) from e


def crop_geometry(src_w: int, src_h: int, out_w: int, out_h: int) -> CropGeometry:
    scale = max(out_w / src_w, out_h / src_h)
    rw, rh = max(out_w, int(round(src_w * scale))), max(out_h, int(round(src_h * scale)))
    return CropGeometry(rw, rh, (rw - out_w) // 2, (rh - out_h) // 2, out_w, out_h)


def crop_intrinsics(K_33: np.ndarray, src_w: int, src_h: int, g: CropGeometry) -> np.ndarray:
    """Intrinsics of the resized + cropped frames."""
    sx, sy = g.resized_w / src_w, g.resized_h / src_h
    K = np.asarray(K_33, np.float64).copy()
    K[0, 0] *= sx
    K[0, 1] *= sx
    K[1, 1] *= sy
    K[0, 2] = sx * (K[0, 2] + 0.5) - 0.5 - g.x0
    K[1, 2] = sy * (K[1, 2] + 0.5) - 0.5 - g.y0
    return K.astype(np.float32)


def read_frames(path: str | os.PathLike[str], indices: Sequence[int], out_w: int, out_h: int,
                ) -> np.ndarray:
    """Decode frames `indices` (any order, repeats allowed) → uint8 (len, out_h, out_w, 3).

    Raises DataError when the file is unreadable or ends before the last requested frame
    (a truncated download decodes fine up to the cut, so this is checked, not assumed).
    """
    path = os.fspath(path)
    wanted = sorted(set(int(i) for i in indices))
    if not wanted:
        return np.zeros((0, out_h, out_w, 3), np.uint8)
    got: dict[int, np.ndarray] = {}
    try:
        with av.open(path) as c:
            s = c.streams.video[0]
            s.thread_type = "AUTO"
            fps = float(s.average_rate or s.guessed_rate)
            tb = s.time_base
            start = s.start_time or 0
            g = crop_geometry(s.codec_context.width, s.codec_context.height, out_w, out_h)
            if wanted[0] > 0:  # seek to the keyframe before the first wanted frame
                c.seek(start + int(Fraction(wanted[0]) / Fraction(fps) / tb), stream=s,
                       backward=True, any_frame=False)
            remaining = set(wanted)
            for frame in c.decode(s):
                if frame.pts is None:
                    continue
                i = int(round(float((frame.pts - start) * tb) * fps))
                if i in remaining:
                    got[i] = _resize_crop_frame(frame, g)
                    remaining.discard(i)
                if not remaining or i > wanted[-1]:
                    break
    except (av.FFmpegError, OSError, ValueError, IndexError) as e:
        raise DataError(path, "unreadable video", str(e)) from e
    missing = [i for i in wanted if i not in got]
    if missing:
        raise DataError(path, "truncated video",
                        f"{len(missing)} of {len(wanted)} frames missing, first {missing[0]}")
    return np.stack([got[int(i)] for i in indices])


def _resize_crop_frame(frame: av.VideoFrame, g: CropGeometry) -> np.ndarray:
    img = frame.reformat(width=g.resized_w, height=g.resized_h, format="rgb24", interpolation="AREA").to_ndarray()
    return img[g.y0:g.y0 + g.out_h, g.x0:g.x0 + g.out_w]


def resize_crop(frames_thw3: np.ndarray, out_w: int, out_h: int) -> np.ndarray:
    """Decoded RGB frames (T, h, w, 3) → (T, out_h, out_w, 3), resized and cropped as `read_frames` does."""
    frames_thw3 = np.asarray(frames_thw3, np.uint8)
    g = crop_geometry(frames_thw3.shape[2], frames_thw3.shape[1], out_w, out_h)
    return np.stack([_resize_crop_frame(av.VideoFrame.from_ndarray(f, format="rgb24"), g) for f in frames_thw3])


class VideoWriter:
    """Frames appended in any number of calls to one video stream (timestamps k / fps), so
    several episodes can go back to back into one file. Even sizes are required by yuv420p."""

    def __init__(self, path: str | os.PathLike[str], fps: float, width: int, height: int,
                 codec: str = "libx264", crf: int = 12, gop: int = 16):
        self.container = av.open(os.fspath(path), "w")
        self.stream = self.container.add_stream(codec, rate=Fraction(fps).limit_denominator(1001))
        self.stream.width, self.stream.height = width, height
        self.stream.pix_fmt = "yuv420p"
        if codec == "libx264":
            self.stream.options = {"crf": str(crf), "preset": "ultrafast", "g": str(gop)}
        elif codec == "libsvtav1":
            self.stream.options = {"crf": str(crf), "g": str(gop), "preset": "12"}

    def write(self, frames_thw3: np.ndarray) -> None:
        for img in np.asarray(frames_thw3, np.uint8):
            self.container.mux(self.stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")))

    def close(self) -> None:
        self.container.mux(self.stream.encode(None))
        self.container.close()

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()
        else:
            self.container.close()


def write_video(path: str | os.PathLike[str], frames_thw3: np.ndarray, fps: float,
                codec: str = "libx264", crf: int = 12) -> None:
    """Write uint8 RGB frames (fixtures, debugging). Even sizes are required by yuv420p."""
    frames_thw3 = np.asarray(frames_thw3, np.uint8)
    with VideoWriter(path, fps, frames_thw3.shape[2], frames_thw3.shape[1], codec, crf) as w:
        w.write(frames_thw3)
