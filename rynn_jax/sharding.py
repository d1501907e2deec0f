"""Logical axis names → mesh axes: the one rules table of the project.

Parameters and key activations carry *logical* names ("embed", "heads", "act_len", ...). Which mesh
axis each lands on is decided here alone, so a sharding experiment is an edit of this table (or a
config override of it), never of model code. Mesh axes: data (pure data parallel), fsdp (parameter
+ data sharding), tensor (Megatron-style heads/mlp), context (sequence parallel).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
from flax import linen as nn

MESH_AXES: tuple[str, ...] = ("data", "fsdp", "tensor", "context")

# (logical name, mesh axis or axes or None). First match wins; unknown names are replicated.
LOGICAL_AXIS_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    # activations
    ("act_batch", ("data", "fsdp")),
    ("act_len", "context"),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv_len", None),
    ("act_mlp", "tensor"),
    # parameters
    ("layers", None),
    ("embed", "fsdp"),
    ("heads", "tensor"),  # q/k/v output dim = heads × head_dim, flattened
    ("mlp", "tensor"),
    ("text_embed", None),
    ("time_freq", None),
    ("modulation", None),
    ("patch", None),
    ("in_channels", None),
    ("out_channels", None),
    ("conv_out", None),
)


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """Sharding constraint by logical names; a no-op outside a mesh + rules context."""
    return nn.with_logical_constraint(x, tuple(names))
