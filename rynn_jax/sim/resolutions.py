"""The synthetic world's render sizes: named ones and "HxW" (read by the sim and policy CLIs before
MuJoCo or JAX is imported)."""

from __future__ import annotations

import re

RESOLUTIONS = {"tiny": (64, 112), "small": (240, 416), "full": (480, 832)}   # (height, width)


def parse_resolution(text: str) -> str | tuple[int, int]:
    """A named resolution ("tiny", "small", "full") or "HxW" in pixels, e.g. "128x224"."""
    if text in RESOLUTIONS:
        return text
    m = re.fullmatch(r"(\d+)x(\d+)", text)
    if not m or min(int(m[1]), int(m[2])) < 16:
        raise ValueError(f"resolution {text!r}: use one of {sorted(RESOLUTIONS)} or HxW in pixels (≥ 16), e.g. 128x224")
    return int(m[1]), int(m[2])
