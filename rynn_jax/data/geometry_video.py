"""Depth and optical flow as RGB videos, the way RynnWorld-4D feeds them to the shared VAE, with
exact inverses so generated depth and flow can be scored in metres and pixels.

Depth (the released pipeline's encoding):
    metres → clip to [0, DEPTH_MAX_M] → ⌊d / DEPTH_MAX_M · 255⌋ → the grey value in all three
    channels. Decoded as grey / 255 · DEPTH_MAX_M (the release's decode): the error is in
    [0, DEPTH_MAX_M/255) ≈ [0, 2 cm). 0 stays 0 (the simulator's "nothing hit").

Clips (`clip_videos`, what the pre-encoder feeds the shared autoencoder): the depth and flow
videos of a clip's frames, frame 0 of the flow video white (the release's per-clip white frame),
resized and centre-cropped to the clip size as the RGB frames are (area interpolation of the
colour videos, as the release resizes its depth/flow MP4s).

Flow (Middlebury colour wheel, as ptlflow's `flow_to_rgb` draws it — hue = direction, saturation
= magnitude, zero flow = white):
    r = min(|f| / max_px, 1),  colour = 1 − r · (1 − wheel(direction)),  wheel = the 55-entry
    Baker et al. table, linearly interpolated.
The release normalises each frame by its own largest radius, which cannot be undone without that
number. We normalise by one fixed `max_px` (default FLOW_MAX_PX, in the episode's own pixels), so
the encoding is invertible: every wheel colour has a channel at 1 and one at 0, hence
    r = max_c(1 − colour_c),   wheel(direction) = 1 − (1 − colour) / r,
and the direction is the point on the wheel's polyline nearest that colour. Flows longer than
max_px saturate (`clipped_fraction` counts them). A flow video has a white frame 0 and at frame t
the flow from frame t − 1 to t (the simulator's flow.npz holds t → t + 1 at index t).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from rynn_jax.data.errors import DataError
from rynn_jax.data.robot import DEPTH_FILE, FLOW_FILE

DEPTH_MAX_M = 5.0  # the released clip range of metric depth
FLOW_MAX_PX = 32.0  # our fixed flow normalisation (episode pixels): |f| ≥ this is full saturation


# --------------------------------------------------------------------------------------------------
# Depth
# --------------------------------------------------------------------------------------------------


def depth_to_rgb(depth_m: np.ndarray) -> np.ndarray:
    """Depth (..., H, W) in metres → uint8 grey RGB (..., H, W, 3)."""
    d = np.clip(np.asarray(depth_m, np.float64), 0.0, DEPTH_MAX_M)
    grey = np.floor(d / DEPTH_MAX_M * 255.0).astype(np.uint8)
    return np.repeat(grey[..., None], 3, axis=-1)


def rgb_to_depth(rgb: np.ndarray) -> np.ndarray:
    """Grey RGB (..., H, W, 3), uint8 or float in [0, 255] (e.g. a decoded generation, channels
    averaged) → metres (..., H, W), float32."""
    return (np.asarray(rgb, np.float32).mean(-1) / 255.0 * DEPTH_MAX_M).astype(np.float32)


# --------------------------------------------------------------------------------------------------
# Flow
# --------------------------------------------------------------------------------------------------


def _wheel() -> np.ndarray:
    """The Middlebury colour wheel (55, 3) in [0, 1]: red → yellow → green → cyan → blue → magenta."""
    ry, yg, gc, cb, bm, mr = 15, 6, 4, 11, 13, 6
    ramp = lambda n: np.floor(255.0 * np.arange(n) / n)  # noqa: E731
    segments = []
    for n, (fixed, up, down) in ((ry, (0, 1, None)), (yg, (1, None, 0)), (gc, (1, 2, None)),
                                 (cb, (2, None, 1)), (bm, (2, 0, None)), (mr, (0, None, 2))):
        seg = np.zeros((n, 3))
        seg[:, fixed] = 255.0
        if up is not None:
            seg[:, up] = ramp(n)
        if down is not None:
            seg[:, down] = 255.0 - ramp(n)
        segments.append(seg)
    return np.concatenate(segments) / 255.0


WHEEL = _wheel()


def flow_to_rgb(flow: np.ndarray, max_px: float = FLOW_MAX_PX) -> np.ndarray:
    """Flow (..., H, W, 2) in pixels (dx, dy) → uint8 RGB (..., H, W, 3)."""
    f = np.asarray(flow, np.float64)
    u, v = f[..., 0], f[..., 1]
    r = np.minimum(np.hypot(u, v) / max_px, 1.0)
    n = len(WHEEL)
    fk = (np.arctan2(-v, -u) / np.pi + 1.0) / 2.0 * (n - 1)  # the wheel position, as ptlflow places it
    k0 = np.floor(fk).astype(np.int64)
    frac = (fk - k0)[..., None]
    k1 = (k0 + 1) % n
    colour = (1.0 - frac) * WHEEL[k0 % n] + frac * WHEEL[k1]
    rgb = 1.0 - r[..., None] * (1.0 - colour)
    return np.floor(rgb * 255.0).astype(np.uint8)  # floor, as the Middlebury code quantises


def rgb_to_flow(rgb: np.ndarray, max_px: float = FLOW_MAX_PX, chunk: int = 1 << 15) -> np.ndarray:
    """The inverse of `flow_to_rgb`: RGB (..., H, W, 3), uint8 or float in [0, 255] → flow in
    pixels (..., H, W, 2), float32. Exact for unquantised colours on the wheel; a generated colour
    off the wheel maps to its nearest wheel colour."""
    c = np.clip(np.asarray(rgb, np.float64) / 255.0, 0.0, 1.0)
    shape = c.shape[:-1]
    c = c.reshape(-1, 3)
    r = (1.0 - c).max(-1)
    on_wheel = 1.0 - (1.0 - c) / np.maximum(r, 1e-12)[:, None]
    # nearest point on each wheel segment k → k+1 (the last one closing the loop at position n − 1):
    # with p the colour, a_k the segment's start and d_k = a_{k+1} − a_k, the projection is
    # t_k = clip((p·d_k − a_k·d_k) / |d_k|²) and the squared distance |p − a_k|² − 2 t_k (p − a_k)·d_k
    # + t_k² |d_k|²: two (pixels, 3) × (3, segments) products instead of a (pixels, segments, 3)
    # array, in chunks, so a 33-frame video is a fraction of a second rather than tens
    n = len(WHEEL)
    a, d = WHEEL[:-1], WHEEL[1:] - WHEEL[:-1]
    dd, ad, aa = (d * d).sum(-1), (a * d).sum(-1), (a * a).sum(-1)
    fk = np.empty(len(c))
    for i in range(0, len(c), chunk):
        p = on_wheel[i:i + chunk]
        pd, pa = p @ d.T, p @ a.T
        t = np.clip((pd - ad) / dd, 0.0, 1.0)
        dist = (p * p).sum(-1)[:, None] - 2.0 * pa + aa - 2.0 * t * (pd - ad) + t * t * dd
        k = dist.argmin(-1)
        fk[i:i + chunk] = k + t[np.arange(len(k)), k]
    angle = (fk / (n - 1) * 2.0 - 1.0) * np.pi  # = atan2(−v, −u)
    mag = r * max_px
    flow = np.stack([-mag * np.cos(angle), -mag * np.sin(angle)], -1)
    return flow.reshape(*shape, 2).astype(np.float32)


def clipped_fraction(flow: np.ndarray, max_px: float = FLOW_MAX_PX) -> float:
    """Share of pixels whose flow saturates the colour wheel (|f| > max_px)."""
    return float((np.hypot(flow[..., 0], flow[..., 1]) > max_px).mean())


# --------------------------------------------------------------------------------------------------
# Synthetic episodes (the robot layout's exact depth / flow files, data/robot.py)
# --------------------------------------------------------------------------------------------------


def episode_depth_video(episode_dir: str | os.PathLike[str]) -> np.ndarray:
    """The episode's exact depth as the RGB video the 4D model learns: (T, H, W, 3) uint8."""
    path = Path(episode_dir) / DEPTH_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no depth render in this episode (rynn_jax.sim writes {DEPTH_FILE})")
    with np.load(path) as z:
        return depth_to_rgb(z["depth_mm"].astype(np.float32) / 1000.0)


def episode_flow_video(episode_dir: str | os.PathLike[str], max_px: float = FLOW_MAX_PX) -> np.ndarray:
    """The episode's exact forward flow as the RGB video the 4D model learns: (T, H, W, 3) uint8,
    frame 0 white, frame t the flow t − 1 → t."""
    path = Path(episode_dir) / FLOW_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no flow render in this episode (rynn_jax.sim writes {FLOW_FILE})")
    with np.load(path) as z:
        flow = z["flow"].astype(np.float32)  # (T − 1, H, W, 2): t → t + 1
    white = np.full((1, *flow.shape[1:3], 3), 255, np.uint8)
    return np.concatenate([white, flow_to_rgb(flow, max_px)])


def clip_videos(episode_dir: str | os.PathLike[str], frame_index: np.ndarray, height: int, width: int,
                max_px: float = FLOW_MAX_PX) -> dict[str, np.ndarray]:
    """Depth and flow videos (T, height, width, 3) uint8 of the clip whose RGB frames are the
    episode's frames `frame_index` (consecutive: flow is only defined between neighbouring frames).
    Flow frame 0 is white, flow frame i the flow frame_index[i − 1] → frame_index[i]."""
    d = Path(episode_dir)
    idx = np.asarray(frame_index, np.int64)
    if idx.ndim != 1 or len(idx) < 1 or np.any(np.diff(idx) != 1):
        raise DataError(os.fspath(d), "non-consecutive geometry frames",
                        "depth/flow clips need the episode's own frame rate (16 fps)")
    depth_mm, flow = read_render(d / DEPTH_FILE), read_render(d / FLOW_FILE)
    if idx[-1] >= len(depth_mm) or (len(idx) > 1 and idx[-2] >= len(flow)):
        raise DataError(os.fspath(d), "truncated depth/flow render",
                        f"{len(depth_mm)} depth / {len(flow)} flow frames, clip ends at frame {idx[-1]}")
    return {name: render_window(name == "flow", arr, int(idx[0]), len(idx), height, width, max_px)
            for name, arr in (("depth", depth_mm), ("flow", flow))}


def read_render(path: str | os.PathLike[str]) -> np.ndarray:
    """An episode's exact depth (depth.npz: depth_mm, (T, H, W)) or flow (flow.npz: flow, (T − 1,
    H, W, 2)); an unreadable file is a one-line DataError."""
    path = Path(path)
    if path.name not in (DEPTH_FILE, FLOW_FILE):
        raise ValueError(f"{path}: not a {DEPTH_FILE} or {FLOW_FILE}")
    try:
        with np.load(path) as z:
            return z["depth_mm"] if path.name == DEPTH_FILE else z["flow"]
    except (OSError, KeyError, ValueError, EOFError) as e:
        raise DataError(os.fspath(path), "unreadable depth/flow render", str(e)) from e


def render_frames(is_flow: bool, render: np.ndarray) -> int:
    """Video frames of a render (`read_render`): its depth frames, or its flows + 1."""
    return len(render) + is_flow


def render_window(is_flow: bool, render: np.ndarray, start: int, num_frames: int, height: int, width: int,
                  max_px: float = FLOW_MAX_PX) -> np.ndarray:
    """`num_frames` consecutive frames from `start` of a render (`read_render`) as the video the
    autoencoder and the 4D model see: (T, height, width, 3) uint8, resized and cropped like the RGB
    frames. Flow: frame 0 of the window is white, frame i the flow start+i−1 → start+i."""
    from rynn_jax.data import video as video_lib  # PyAV, only when clips are cut

    n = render_frames(is_flow, render)
    if start < 0 or start + num_frames > n:
        raise DataError("depth/flow render", "window past the end", f"frames {start}..{start + num_frames - 1} of {n}")
    if is_flow:
        white = np.full((1, *render.shape[1:3], 3), 255, np.uint8)
        video = np.concatenate([white, flow_to_rgb(render[start:start + num_frames - 1].astype(np.float32), max_px)])
    else:
        video = depth_to_rgb(render[start:start + num_frames].astype(np.float32) / 1000.0)
    return video if video.shape[1:3] == (height, width) else video_lib.resize_crop(video, width, height)
