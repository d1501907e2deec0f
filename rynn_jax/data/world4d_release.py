"""Readers for the released RynnWorld-4D sample layout: its manifest, its latents, its three videos.

What the release lays out (its `utils/pre-process.py`, `inference-sft.py`, `data/`):

  manifest (`data/sample.json`; pre-processing writes `<name>_<slice>_<id>.json`): a JSON list of
      {"rgb_latents": path, "flow_depth_latents": path, "prompt": str, "video_path": path (optional)}
      paths absolute or relative to the directory the release runs in (`root` here).
  <clip>.safetensors               video_latents (C, T', h, w) = (VAE(x) − mean) / std
                                   text_embeds (1, 226, 4096), umT5, zero rows after the prompt
  <clip>_flow_depth.safetensors    depth_latents, flow_latents (C, T', h, w), the same VAE
  source videos (what pre-processing encodes), frame i of each is RGB frame i:
      RGB      <video_path>
      depth    <depth_root>/<sub>/exports/mini_npz/depth.mp4   grey ⌊d / 5 m · 255⌋, N frames
      flow     <flow_root>/<sub>/flow.mp4                      colour wheel, N − 1 frames, i → i + 1
      sub = the video path after `keyword`, without its extension (the Tianji policy sample's depth
      is `<depth_root>/<episode>/exports/mini_npz/depth.mp4`)
  generated videos (inference): `<out>/<prefix>_{rgb,depth,flow}.mp4`, 16 fps, N frames each, the
      flow video in a clip's layout: a white frame 0, frame t the flow t − 1 → t.

Into our conventions: latents channels-last under the pre-encoder's record keys
(`data/preencode.py`, what `training/loss4d.py` reads), the frame-0 conditions being latent frame 0
as the release conditions on it; videos decoded by `geometry_video` into depth in metres
(T, H, W) and flow in pixels (T − 1, H, W, 2), index t the flow t → t + 1 (`flow.npz`'s layout).

Flow magnitude: the release's flow videos are drawn by ptlflow, each frame normalised by its own
largest flow, which the video does not keep; decoded with `max_px` the radius is read as a fraction
of `max_px` (`max_px=1` gives that fraction). Videos written with our fixed radius
(`geometry_video.FLOW_MAX_PX`) decode to pixels. Every bad file is a one-line `DataError`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open

from rynn_jax.data import video as video_lib
from rynn_jax.data.errors import DataError
from rynn_jax.data.geometry_video import FLOW_MAX_PX, rgb_to_depth, rgb_to_flow

RGB_KEYS = ("video_latents", "text_embeds")
GEOMETRY_KEYS = ("depth_latents", "flow_latents")
DEPTH_SUBPATH = Path("exports/mini_npz/depth.mp4")
FLOW_NAME = "flow.mp4"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Entry:
    """One manifest entry (one clip of latents)."""
    rgb_latents: Path
    flow_depth_latents: Path | None  # absent in an RGB-only manifest
    prompt: str
    video_path: Path | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Videos:
    """The three videos of one sample."""
    rgb: Path
    depth: Path
    flow: Path


# --------------------------------------------------------------------------------------------------
# Manifest and latents
# --------------------------------------------------------------------------------------------------


def read_manifest(path: str | os.PathLike[str], root: str | os.PathLike[str] = ".") -> list[Entry]:
    """The manifest's entries, relative paths resolved against `root` (not checked for existence:
    `read_latents` names a missing file)."""
    path = Path(path)
    try:
        items = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(os.fspath(path), "unreadable manifest", _one_line(e)) from e
    if not isinstance(items, list):
        raise DataError(os.fspath(path), "bad manifest", f"a JSON list of entries expected, got {type(items).__name__}")

    def resolve(p: object, i: int, key: str) -> Path:
        if not isinstance(p, str) or not p:
            raise DataError(os.fspath(path), "bad manifest", f"entry {i}: {key!r} must be a path string")
        return Path(root) / p

    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or "rgb_latents" not in item:
            raise DataError(os.fspath(path), "bad manifest", f"entry {i}: an object with 'rgb_latents' expected")
        prompt = item.get("prompt", "")
        if not isinstance(prompt, str):
            raise DataError(os.fspath(path), "bad manifest", f"entry {i}: 'prompt' must be a string")
        fd, video = item.get("flow_depth_latents"), item.get("video_path")
        out.append(Entry(rgb_latents=resolve(item["rgb_latents"], i, "rgb_latents"),
                         flow_depth_latents=None if fd is None else resolve(fd, i, "flow_depth_latents"),
                         prompt=prompt, video_path=None if video is None else resolve(video, i, "video_path")))
    return out


def read_latents(entry: Entry) -> dict[str, np.ndarray]:
    """One entry's latents as a pre-encoded record (float32, channels-last): `video_latents`
    (T', h, w, C), `img_latent` (1, h, w, C), `text_embedding` (S, D) without the zero padding,
    `text`; with depth/flow, `depth_latents`, `flow_latents`, `depth_img_latent`, `flow_img_latent`."""
    rgb = _tensors(entry.rgb_latents, RGB_KEYS)
    video = _latents(entry.rgb_latents, "video_latents", rgb["video_latents"])
    emb = rgb["text_embeds"]
    if emb.ndim == 3 and emb.shape[0] == 1:
        emb = emb[0]
    if emb.ndim != 2:
        raise DataError(os.fspath(entry.rgb_latents), "bad latents", f"text_embeds has shape {emb.shape}, "
                                                                     "expected (1, S, D)")
    used = np.flatnonzero(np.any(emb != 0, axis=1))  # the release pads with zero rows to 226
    length = int(used[-1]) + 1 if len(used) else 1
    record = {"video_latents": video, "img_latent": video[:1], "text_embedding": emb[:length],
              "text": np.asarray(entry.prompt, np.str_)}
    if entry.flow_depth_latents is not None:
        fd = _tensors(entry.flow_depth_latents, GEOMETRY_KEYS)
        for key in GEOMETRY_KEYS:
            lat = _latents(entry.flow_depth_latents, key, fd[key])
            if lat.shape != video.shape:
                raise DataError(os.fspath(entry.flow_depth_latents), "bad latents",
                                f"{key} (T', h, w, C) = {lat.shape} but video_latents {video.shape}")
            name = key.removesuffix("_latents")
            record[key], record[f"{name}_img_latent"] = lat, lat[:1]
    return record


def _tensors(path: Path, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise DataError(os.fspath(path), "missing latents")
    try:
        with safe_open(os.fspath(path), framework="numpy") as f:
            have = list(f.keys())
            out = {k: np.asarray(f.get_tensor(k), np.float32) for k in keys if k in have}
    except (OSError, SafetensorError, ValueError) as e:
        raise DataError(os.fspath(path), "unreadable latents", _one_line(e)) from e
    if missing := [k for k in keys if k not in out]:
        raise DataError(os.fspath(path), "bad latents", f"no {', '.join(missing)} (has {', '.join(have) or 'nothing'})")
    for k, x in out.items():
        if not np.isfinite(x).all():
            raise DataError(os.fspath(path), "bad latents", f"{k} has NaN or infinite values")
    return out


def _latents(path: Path, key: str, x: np.ndarray) -> np.ndarray:
    if x.ndim == 5 and x.shape[0] == 1:
        x = x[0]
    if x.ndim != 4:
        raise DataError(os.fspath(path), "bad latents", f"{key} has shape {x.shape}, expected (C, T', h, w)")
    return np.ascontiguousarray(x.transpose(1, 2, 3, 0))


# --------------------------------------------------------------------------------------------------
# Videos
# --------------------------------------------------------------------------------------------------


def source_videos(video_path: str | os.PathLike[str], depth_root: str | os.PathLike[str],
                  flow_root: str | os.PathLike[str], keyword: str) -> Videos:
    """The videos pre-processing encodes for `video_path` (its `--depth_root`, `--flow_root`,
    `--keyword`)."""
    text = os.fspath(video_path)
    if keyword not in text:
        raise DataError(text, "bad sample path", f"the keyword {keyword!r} is not in it")
    sub = os.path.splitext(text.split(keyword)[-1].lstrip("/"))[0]
    return Videos(rgb=Path(text), depth=Path(depth_root) / sub / DEPTH_SUBPATH, flow=Path(flow_root) / sub / FLOW_NAME)


def generated_videos(output_dir: str | os.PathLike[str], prefix: str) -> Videos:
    """The three videos an inference run writes for `prefix` (`<dataset>_<index>` in `inference-sft.py`)."""
    d = Path(output_dir)
    return Videos(rgb=d / f"{prefix}_rgb.mp4", depth=d / f"{prefix}_depth.mp4", flow=d / f"{prefix}_flow.mp4")


def read_videos(videos: Videos, start: int = 0, num_frames: int | None = None, height: int | None = None,
                width: int | None = None, max_px: float = FLOW_MAX_PX) -> dict[str, np.ndarray]:
    """RGB frames [start, start + num_frames) (default: to the end) and their depth and flow.

    Returns `video` (T, H, W, 3) uint8; `depth` (T, H, W) metres and `flow` (T − 1, H, W, 2) pixels,
    index t the flow t → t + 1 (float32); `depth_video`, `flow_video` (T, H, W, 3) uint8 as the VAE
    sees a clip (flow: white frame 0, frame t the flow t − 1 → t). With `height` and `width` every
    video is resized to cover and centre-cropped as the release does (flow pixels scaled with it);
    without, the three must have one size. The flow video may have N − 1 frames (a source video)
    or N with a white frame 0 (a generated clip)."""
    info = {name: _probe(getattr(videos, name)) for name in ("rgb", "depth", "flow")}
    n = info["rgb"].num_frames
    if info["depth"].num_frames != n:
        raise DataError(os.fspath(videos.depth), "frame count mismatch",
                        f"{info['depth'].num_frames} depth frames for {n} RGB frames")
    if info["flow"].num_frames not in (n - 1, n):
        raise DataError(os.fspath(videos.flow), "frame count mismatch",
                        f"{info['flow'].num_frames} flow frames for {n} RGB frames (expected {n - 1}, or {n} "
                        "with a white frame 0)")
    clip_layout = info["flow"].num_frames == n  # flow frame t = t − 1 → t
    stop = n if num_frames is None else start + num_frames
    if not 0 <= start < stop <= n:
        raise DataError(os.fspath(videos.rgb), "clip out of range", f"frames [{start}, {stop}) of {n}")
    if height is None or width is None:
        sizes = {name: (i.height, i.width) for name, i in info.items()}
        if len(set(sizes.values())) > 1:
            raise DataError(os.fspath(videos.rgb), "size mismatch", f"{sizes} (give height and width to resize)")
        height, width = sizes["rgb"]
    frames = np.arange(start, stop)
    rgb = video_lib.read_frames(videos.rgb, frames, width, height)
    depth_video = video_lib.read_frames(videos.depth, frames, width, height)
    flow_frames = frames[1:] if clip_layout else frames[:-1]  # the colours of t → t + 1, t < stop − 1
    colours = video_lib.read_frames(videos.flow, flow_frames, width, height)
    g = video_lib.crop_geometry(info["flow"].width, info["flow"].height, width, height)
    scale = np.asarray([g.resized_w / info["flow"].width, g.resized_h / info["flow"].height], np.float32)
    white = np.full((1, height, width, 3), 255, np.uint8)
    return {"video": rgb, "depth": rgb_to_depth(depth_video), "flow": rgb_to_flow(colours, max_px) * scale,
            "depth_video": depth_video, "flow_video": np.concatenate([white, colours])}


def _probe(path: Path) -> video_lib.VideoInfo:
    if not path.is_file():
        raise DataError(os.fspath(path), "missing video")
    return video_lib.probe_video(path)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())
