"""Test helper shared by the sharded-vs-unsharded checks."""

from __future__ import annotations

import numpy as np


def sorted_leaves(tree) -> list[np.ndarray]:
    """Leaves of a nested dict (as JSON round-trips it) in sorted-key order, as numpy arrays."""
    if isinstance(tree, dict):
        return [x for k in sorted(tree) for x in sorted_leaves(tree[k])]
    return [np.asarray(tree)]
