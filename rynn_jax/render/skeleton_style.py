"""How a hand skeleton is drawn: its points and bones (MediaPipe 21 joints + elbow) and the
per-hand depth colormaps.

Point layout per hand, used everywhere in `rynn_jax.render`: indices 0..20 are the MediaPipe
hand landmarks (0 wrist; thumb 1-4 = CMC, MCP, IP, tip; index 5-8, middle 9-12, ring 13-16,
pinky 17-20 = MCP, PIP, DIP, tip) and index 21 (`ELBOW`) is the forearm's elbow point. Hand 0 is
the left hand, hand 1 the right hand.

Colormaps are piecewise-linear in OKLab (a perceptual space: equal steps look equally different)
through a few sRGB stops, near → far. With stops of increasing OKLab lightness, lightness is
strictly increasing with depth, so near joints are dark and saturated and far ones fade towards
the off-white background while staying inside their hue family (left blue, right red).
"""

from __future__ import annotations

import functools

import numpy as np

NUM_HAND_JOINTS = 21
ELBOW = 21  # index of the elbow point in a hand's (22, ·) point array
NUM_POINTS = 22  # per hand: 21 joints + elbow
LEFT, RIGHT = 0, 1

# Bones as (parent, child) point indices: wrist → each finger base, along each finger, then the
# forearm (elbow → wrist). 21 bones per hand.
FINGERS = ((1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11, 12), (13, 14, 15, 16), (17, 18, 19, 20))
HAND_BONES = tuple(
    bone for chain in FINGERS for bone in zip((0,) + chain[:-1], chain)
)
FOREARM_BONE = (ELBOW, 0)
BONES = HAND_BONES + (FOREARM_BONE,)
# Points drawn as joint discs: the 21 hand joints (the elbow only ends the forearm capsule).
DISC_POINTS = tuple(range(NUM_HAND_JOINTS))

# Default colormap stops (sRGB 0-255), near → far; OKLab lightness increases along each list.
LEFT_STOPS_RGB = ((18, 38, 135), (38, 105, 220), (135, 175, 238))  # navy → azure → pale sky
RIGHT_STOPS_RGB = ((125, 12, 22), (220, 52, 40), (240, 155, 140))  # maroon → red → salmon


def _srgb_to_linear(c: np.ndarray) -> np.ndarray:
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def _linear_to_srgb(c: np.ndarray) -> np.ndarray:
    c = np.clip(c, 0.0, 1.0)
    return np.where(c <= 0.0031308, 12.92 * c, 1.055 * c ** (1 / 2.4) - 0.055)


_M1 = np.array([[0.4122214708, 0.5363325363, 0.0514459929],
                [0.2119034982, 0.6806995451, 0.1073969566],
                [0.0883024619, 0.2817188376, 0.6299787005]])
_M2 = np.array([[0.2104542553, 0.7936177850, -0.0040720468],
                [1.9779984951, -2.4285922050, 0.4505937099],
                [0.0259040371, 0.7827717662, -0.8086757660]])


def srgb_to_oklab(rgb: np.ndarray) -> np.ndarray:
    """sRGB in [0, 1], shape [..., 3] → OKLab (L, a, b) (Björn Ottosson's transform)."""
    lms = _srgb_to_linear(np.asarray(rgb, np.float64)) @ _M1.T
    return np.cbrt(lms) @ _M2.T


def oklab_to_srgb(lab: np.ndarray) -> np.ndarray:
    """OKLab [..., 3] → sRGB in [0, 1] (clipped to the gamut)."""
    lms = (np.asarray(lab, np.float64) @ np.linalg.inv(_M2).T) ** 3
    return np.clip(_linear_to_srgb(lms @ np.linalg.inv(_M1).T), 0.0, 1.0)


@functools.lru_cache(maxsize=16)
def depth_colormap(stops_rgb: tuple[tuple[int, int, int], ...], size: int = 256) -> np.ndarray:
    """A (size, 3) float32 sRGB [0, 1] lookup table, entry 0 = nearest, entry size-1 = farthest.

    Piecewise-linear in OKLab between equally spaced stops.
    """
    if len(stops_rgb) < 2 or size < 2:
        raise ValueError(f"need >= 2 colormap stops and size >= 2, got {len(stops_rgb)}, {size}")
    lab_s3 = srgb_to_oklab(np.asarray(stops_rgb, np.float64) / 255.0)
    pos = np.linspace(0.0, 1.0, size)
    knots = np.linspace(0.0, 1.0, len(stops_rgb))
    lab_n3 = np.stack([np.interp(pos, knots, lab_s3[:, c]) for c in range(3)], axis=-1)
    return oklab_to_srgb(lab_n3).astype(np.float32)
