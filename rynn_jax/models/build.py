"""Building NNX models three ways: randomly initialised, abstract (shapes only), from a param dict."""

from __future__ import annotations

from typing import Any, TypeVar

import jax
import jax.numpy as jnp
from flax import nnx

M = TypeVar("M", bound=nnx.Module)


def abstract_model(cls: type[M], cfg: Any) -> M:
    """The model with ShapeDtypeStruct leaves: shapes and counts without allocating anything."""
    with nnx.use_eager_sharding(False):
        return nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0)))


def init_model(cls: type[M], cfg: Any, seed: int = 0) -> M:
    """Randomly initialised model (tests, demos, training from scratch; real use loads weights).

    Init runs as one jitted function keyed by an "rbg" PRNG key: eager init compiles once per
    parameter shape, and threefry makes XLA:CPU compiles of many random tensors take minutes."""
    graphdef, _ = nnx.split(abstract_model(cls, cfg))

    def make_state():
        with nnx.use_eager_sharding(False):
            return nnx.state(cls(cfg, rngs=nnx.Rngs(params=jax.random.key(seed, impl="rbg"))))

    return nnx.merge(graphdef, jax.jit(make_state)())


def model_from_params(cls: type[M], cfg: Any, params: dict) -> M:
    """A model whose variables are the given pure dict (from the converter or a checkpoint)."""
    graphdef, state = nnx.split(abstract_model(cls, cfg))
    nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))
    return nnx.merge(graphdef, state)
