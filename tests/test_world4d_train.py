"""RynnWorld-4D training at toy size through train.py: the stage-2 recipe moves only the joint
attention, and the RGB-injection decay follows its closed form."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import train
from rynn_jax.training.loss4d import rgb_decay


def test_rgb_decay_is_the_released_cosine():
    assert float(rgb_decay(jnp.int32(0), 700)) == 1.0
    assert float(rgb_decay(jnp.int32(350), 700)) == pytest.approx(0.5, abs=1e-6)
    assert float(rgb_decay(jnp.int32(175), 700)) == pytest.approx(0.5 * (1 + np.cos(np.pi / 4)), abs=1e-6)
    assert float(rgb_decay(jnp.int32(5000), 700)) == 0.0
    assert float(rgb_decay(jnp.int32(5000), 0)) == 1.0


@pytest.mark.usefixtures("fast_compile")
def test_stage2_recipe_trains_only_the_joint_attention(tmp_path):
    losses = train.main(["--config", "configs/world4d_tiny.py", "--set", "total_steps=2", "--set", "loss.train=joint",
                         "--set", "loss.branch_dropout=0.5", "--set", "log.progress=False",
                         "--set", f"ckpt.dir={tmp_path}/ckpt", "--set", f"log.dir={tmp_path}/logs"])
    assert len(losses) == 2 and all(np.isfinite(losses))
    from flax import nnx

    from rynn_jax.training import config as config_lib, state as state_lib
    from rynn_jax.weights import flatten_params

    cfg = config_lib.apply_overrides(config_lib.load_config("configs/world4d_tiny.py"), ["loss.train=joint"])
    abstract = state_lib.abstract_model(cfg)
    trained = flatten_params(nnx.to_pure_dict(nnx.state(abstract, state_lib.trainable(cfg))))
    assert trained and all(path[0] == "joint" for path in trained)
    assert len(flatten_params(nnx.to_pure_dict(nnx.state(abstract, nnx.Param)))) > len(trained)
    assert (tmp_path / "ckpt" / "2").is_dir()
