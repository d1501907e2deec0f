"""Saves rendered skeleton frames as PNG / MP4, and a CLI that previews synthetic hand motion.

    python -m rynn_jax.render.preview --out skeleton.mp4 --frames 81 --seed 0
    python -m rynn_jax.render.preview --out skeleton.png --frame 40

An output ending in .png gets one frame (`--frame`); any other extension (.mp4, .gif, ...) gets
the whole clip at the config's fps (MP4 through PyAV, other formats through `imageio`).
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from rynn_jax.render.rasterize import RenderConfig, default_intrinsics, render_video
from rynn_jax.render.synthetic import synthetic_hand_motion


def save_png(path: str | os.PathLike[str], frame_hw3) -> None:
    """Writes one uint8 (H, W, 3) frame as PNG."""
    import imageio.v3 as iio

    iio.imwrite(path, _as_uint8(frame_hw3))


def read_png(path: str | os.PathLike[str]) -> np.ndarray:
    """One RGB(A) picture → uint8 (H, W, 3); anything else is refused, naming the file."""
    import imageio.v3 as iio

    img = np.asarray(iio.imread(path))
    if img.ndim != 3 or img.shape[-1] not in (3, 4):
        raise ValueError(f"{path}: expected an RGB image, got shape {img.shape}")
    return img[..., :3]


def save_video(path: str | os.PathLike[str], frames_thw3, fps: int = 16) -> None:
    """Writes uint8 (T, H, W, 3) frames as a video: .mp4 as H.264 in-process through PyAV (the data
    pipeline's writer, `data.video.write_video`; an odd height or width gets its last row or column
    repeated, since yuv420p needs even sizes), any other extension (.gif, ...) through imageio."""
    frames = _as_uint8(frames_thw3)
    path = os.fspath(path)
    if path.lower().endswith(".mp4"):
        from rynn_jax.data.video import write_video

        h, w = frames.shape[1:3]
        if h % 2 or w % 2:
            frames = np.pad(frames, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)), mode="edge")
        write_video(path, frames, fps)
        return
    import imageio.v2 as imageio

    with imageio.get_writer(path, fps=fps) as writer:
        for frame in frames:
            writer.append_data(frame)


def _as_uint8(x) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.uint8:
        raise ValueError(f"expected uint8 frames, got {x.dtype}")
    return x


def render_synthetic(cfg: RenderConfig, frames: int, seed: int) -> np.ndarray:
    """`synthetic_hand_motion(frames, seed)` rendered with the default intrinsics → uint8
    (T, H, W, 3)."""
    joints, elbows = synthetic_hand_motion(frames, seed, fps=cfg.fps)
    return np.asarray(render_video(cfg, joints, elbows, default_intrinsics(cfg)))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True, help="output path: .png (one frame) or .mp4/.gif")
    p.add_argument("--frames", type=int, default=81, help="clip length T (default 81)")
    p.add_argument("--frame", type=int, default=None, help="frame index for .png (default T//2)")
    p.add_argument("--seed", type=int, default=0, help="synthetic motion seed")
    p.add_argument("--width", type=int, default=RenderConfig.width)
    p.add_argument("--height", type=int, default=RenderConfig.height)
    args = p.parse_args(argv)
    cfg = RenderConfig(width=args.width, height=args.height)
    if args.out.lower().endswith(".png"):
        idx = args.frames // 2 if args.frame is None else args.frame
        if not 0 <= idx < args.frames:
            p.error(f"--frame {idx} outside [0, {args.frames})")
        save_png(args.out, render_synthetic(cfg, idx + 1, args.seed)[idx])
    else:
        save_video(args.out, render_synthetic(cfg, args.frames, args.seed), fps=cfg.fps)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
