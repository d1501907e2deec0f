"""Depth-aware skeleton renderer: hand poses in camera space → RGB pose frames (the paper, Sec. 3.2)."""

from rynn_jax.render.rasterize import (
    RenderConfig,
    default_intrinsics,
    project_points,
    render_frame,
    render_frame_unchecked,
    render_projected,
    render_video,
    render_video_unchecked,
)
from rynn_jax.render.synthetic import synthetic_hand_motion

__all__ = [
    "RenderConfig",
    "default_intrinsics",
    "project_points",
    "render_frame",
    "render_frame_unchecked",
    "render_projected",
    "render_video",
    "render_video_unchecked",
    "synthetic_hand_motion",
]
