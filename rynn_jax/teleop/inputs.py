"""The demo's and `serve.py generate`'s inputs: a stream directory holds `operator_stream.npz` (a
recorded `rynn-teleop-stream/1` file) and `reference.png` (the robot's head-camera view the episode
starts from); the bundled sample (`data/sample/`) is one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rynn_jax import errors
from rynn_jax.render.preview import read_png

SAMPLE_DIR = Path(__file__).resolve().parents[2] / "data" / "sample"
STREAM_FILE, IMAGE_FILE = "operator_stream.npz", "reference.png"


def read_reference(path: Path) -> np.ndarray:
    """A reference picture as (H, W, 3) uint8; an InputError naming the file otherwise."""
    errors.existing(path, "reference image", kind="file")
    try:
        image = read_png(path)
    except Exception as e:  # imageio raises many types for a file that is not a picture
        raise errors.InputError(f"{path}: not a readable image ({type(e).__name__})") from None
    if image.ndim != 3 or image.shape[-1] != 3:
        raise errors.InputError(f"{path}: an RGB picture is needed, got shape {image.shape}")
    return image
