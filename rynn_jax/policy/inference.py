"""A trained policy as one object: config, parameters, vision encoder, action statistics, and the
jitted chunk prediction (observation → 10 × 54 raw joint targets). Policy directories:

    <dir>/config.json         PolicyConfig (+ "__class__")
    <dir>/params/             orbax params of `model.Policy` (rynn_jax.converted_weights layout)
    <dir>/action_stats.json   mean / std the head's outputs are un-normalised with
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rynn_jax.policy import config as config_lib
from rynn_jax.policy import encoders, flow
from rynn_jax.policy.model import Policy, init_policy
from rynn_jax.policy.normalize import ActionNormalizer


def chunk_loss(policy: Policy, vision: jax.Array, goal: jax.Array, state: jax.Array, actions_bad: jax.Array,
               rng: jax.Array, train: bool = True) -> jax.Array:
    """Flow-matching loss of normalised action chunks (B, chunk, action_dim); dropout when `train`."""
    k_enc, k_dec, k_flow = jax.random.split(rng, 3)
    context = policy.context(vision, goal, state, k_enc if train else None)
    return flow.loss(lambda x, t: policy.head.velocity(context, x, t, k_dec if train else None), actions_bad, k_flow)


def sample_chunk(policy: Policy, vision: jax.Array, goal: jax.Array, state: jax.Array, rng: jax.Array,
                 steps: int) -> jax.Array:
    """Normalised action chunks (B, chunk, action_dim) by `steps` Euler steps (encoder run once)."""
    context = policy.context(vision, goal, state)
    h = policy.cfg.head
    return flow.sample(lambda x, t: policy.head.velocity(context, x, t), (state.shape[0], h.chunk, h.action_dim),
                       rng, steps)


@dataclasses.dataclass
class LoadedPolicy:
    cfg: config_lib.PolicyConfig
    graphdef: nnx.GraphDef
    params: nnx.State
    encoder: encoders.VisionEncoder
    normalizer: ActionNormalizer

    def __post_init__(self):
        steps, enc = self.cfg.sample_steps, self.encoder
        mean, std = jnp.asarray(self.normalizer.mean), jnp.asarray(self.normalizer.std)

        def predict(params, enc_params, rgb, depth_rgb, state, goal, rng):
            k_feat, k_noise = jax.random.split(rng)
            vision = enc.apply(enc_params, rgb, depth_rgb, goal, k_feat)
            z = sample_chunk(nnx.merge(self.graphdef, params), vision, goal, state, k_noise, steps)
            return z * std + mean

        self._predict = jax.jit(predict)

    def predict(self, rgb_bhw3: np.ndarray, depth_rgb_bhw3: np.ndarray, state_bp: np.ndarray, goal_bgk: np.ndarray,
                rng: jax.Array) -> np.ndarray:
        """Raw joint targets (B, chunk, action_dim) for uint8 observations at cfg.image_size."""
        out = self._predict(self.params, self.encoder.params, jnp.asarray(rgb_bhw3), jnp.asarray(depth_rgb_bhw3),
                            jnp.asarray(state_bp, jnp.float32), jnp.asarray(goal_bgk, jnp.float32), rng)
        return np.asarray(out)


def from_params(cfg: config_lib.PolicyConfig, params: nnx.State | None, normalizer: ActionNormalizer) -> LoadedPolicy:
    """A LoadedPolicy of `params` (None: the random init of cfg.seed)."""
    graphdef, init = nnx.split(init_policy(cfg), nnx.Param)
    return LoadedPolicy(cfg, graphdef, init if params is None else params, encoders.make_encoder(cfg), normalizer)


def save(path: str | os.PathLike[str], cfg: config_lib.PolicyConfig, params: nnx.State,
         normalizer: ActionNormalizer) -> None:
    from rynn_jax import converted_weights

    pure = jax.tree.map(np.asarray, nnx.to_pure_dict(params))
    converted_weights.save_params(path, pure, cfg)
    with open(os.path.join(path, "action_stats.json"), "w") as f:
        json.dump(normalizer.to_json(), f)


def load_config(path: str | os.PathLike[str]) -> config_lib.PolicyConfig:
    """The configuration of a policy directory written by `save`, without its weights."""
    from rynn_jax import converted_weights

    path = os.fspath(path)
    cfg_file = os.path.join(path, converted_weights.CONFIG_FILE)
    if not os.path.isfile(cfg_file):
        raise FileNotFoundError(f"--policy {path}: no {converted_weights.CONFIG_FILE} (not a policy directory)")
    with open(cfg_file) as f:
        raw = json.load(f)
    if raw.pop("__class__", "PolicyConfig") != "PolicyConfig":
        raise ValueError(f"--policy {path}: not a policy directory")
    return config_lib.from_dict(raw)


def load(path: str | os.PathLike[str]) -> LoadedPolicy:
    """A policy directory written by `save` (the trainer's export)."""
    from rynn_jax import converted_weights

    path = os.fspath(path)
    cfg = load_config(path)
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Policy(cfg, rngs=nnx.Rngs(0))), nnx.Param)
    pure = converted_weights.restore_params(path, nnx.to_pure_dict(abstract))
    nnx.replace_by_pure_dict(abstract, pure)
    return LoadedPolicy(cfg, graphdef, abstract, encoders.make_encoder(cfg), ActionNormalizer.from_file(path))
