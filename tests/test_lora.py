"""LoRA by module surgery: zero-init identity, merge == unmerged, what trains, base-weight loading."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rynn_jax import converted_weights, sharding
from rynn_jax import data as data_lib
from rynn_jax.models.dit import WanDiTConfig, abstract_dit, init_dit
from rynn_jax.training import config as config_lib
from rynn_jax.training import input as input_lib
from rynn_jax.training import optim
from rynn_jax.training import state as state_lib
from rynn_jax.training import step as step_lib
from rynn_jax.training.lora import LoraConfig, LoRALinear, apply_lora, merge_lora

CFG = WanDiTConfig.tiny(control="add-plus")
LORA = LoraConfig(rank=4, alpha=8.0)


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    z = jnp.asarray(rng.standard_normal((2, 3, 4, 4, CFG.in_channels)), jnp.float32)
    c = jnp.asarray(rng.standard_normal((2, 3, 4, 4, CFG.control_channels)), jnp.float32)
    t = jnp.array([[0.0, 700.0, 700.0], [0.0, 200.0, 200.0]])
    ctx = jnp.asarray(rng.standard_normal((2, CFG.text_len, CFG.text_dim)), jnp.float32)
    return z, t, ctx, c


@pytest.fixture(scope="module")
def base():
    return init_dit(CFG, seed=0)


def _adapted(base: nnx.Module, seed: int = 1):
    model = nnx.clone(base)
    with nnx.use_eager_sharding(False):
        apply_lora(model, LORA, nnx.Rngs(seed))
    return model


def test_zero_init_is_identity_and_targets_all_projections(base):
    model = _adapted(base)
    np.testing.assert_allclose(model(*_inputs()), base(*_inputs()), atol=1e-6)
    adapted = {".".join(map(str, p)) for p, m in nnx.iter_modules(model) if isinstance(m, LoRALinear)}
    assert adapted == set(LORA.targets) and len(adapted) == 10
    assert model.blocks.self_attn.q.lora_a.shape == (CFG.num_layers, CFG.dim, 4)  # stacked like the block


def test_merge_equals_unmerged(base):
    model = _adapted(base)
    for _, m in nnx.iter_modules(model):  # non-zero B so the adapters change the output
        if isinstance(m, LoRALinear):
            m.lora_b[...] = 0.05 * jax.random.normal(jax.random.key(7), m.lora_b.shape)
    x = _inputs()
    unmerged = model(*x)
    assert float(jnp.abs(unmerged - base(*x)).max()) > 1e-2
    merge_lora(model)
    assert not any(isinstance(m, LoRALinear) for _, m in nnx.iter_modules(model))
    np.testing.assert_allclose(model(*x), unmerged, atol=2e-5, rtol=1e-5)  # fp32; only sum order differs
    # the merged model has exactly the plain model's parameters: it saves/loads as a base checkpoint
    want = jax.tree.map(lambda a: a.shape, nnx.to_pure_dict(nnx.state(abstract_dit(CFG), nnx.Param)))
    assert jax.tree.map(lambda a: a.shape, nnx.to_pure_dict(nnx.state(model, nnx.Param))) == want


def _tiny_lora_cfg(**overrides) -> config_lib.TrainConfig:
    cfg = config_lib.load_config("configs/tiny.py")
    cfg = config_lib.apply_overrides(cfg, ["lora.rank=4", "lora.alpha=8.0", "optim.warmup_steps=0",
                                           "optim.lr=1e-3", "optim.weight_decay=0.0"])
    return dataclasses.replace(cfg, **overrides)


def test_lora_trains_adapters_control_and_patch_embeddings_only():
    cfg = _tiny_lora_cfg()
    mesh = sharding.make_mesh(cfg.mesh, jax.devices()[:1])
    tx = optim.make_optimizer(cfg.optim, cfg.total_steps)
    _, sh = state_lib.state_shardings(cfg, tx, mesh)
    graphdef, state = state_lib.create_train_state(cfg, tx, mesh)
    trained = {".".join(map(str, k)) for k, _ in nnx.to_flat_state(state.params)}
    assert trained == ({f"{t}.lora_{ab}" for t in cfg.lora.targets for ab in "ab"}
                       | {"patch_embed", "patch_embed_bias", "control.embed", "control.embed_bias", "control.gate"})
    before = jax.tree.map(np.asarray, (nnx.to_pure_dict(state.params), nnx.to_pure_dict(state.frozen)))
    step = step_lib.jit_step(cfg, graphdef, tx, mesh, sh, dict.fromkeys(input_lib.TRAIN_KEYS))
    it = input_lib.make_iterator(cfg)
    for _ in range(2):  # B moves in step 1; A (zero gradient while B = 0) from step 2
        state, _ = step(state, data_lib.to_device(next(it), data_lib.batch_sharding(mesh)))
    after = jax.tree.map(np.asarray, (nnx.to_pure_dict(state.params), nnx.to_pure_dict(state.frozen)))
    moved = jax.tree.map(lambda a, b: not np.array_equal(a, b), after[0], before[0])
    assert all(jax.tree.leaves(moved)), moved  # every trained leaf got a gradient
    assert jax.tree.all(jax.tree.map(np.array_equal, after[1], before[1]))  # base untouched


def test_load_base_weights_into_lora_state(tmp_path):
    plain_cfg = WanDiTConfig.tiny()
    plain = init_dit(plain_cfg, seed=5)
    base_params = nnx.to_pure_dict(nnx.state(plain, nnx.Param))
    converted_weights.save_params(tmp_path / "base", base_params, plain_cfg)
    cfg = _tiny_lora_cfg()
    mesh = sharding.make_mesh(cfg.mesh, jax.devices()[:1])
    tx = optim.make_optimizer(cfg.optim, cfg.total_steps)
    _, sh = state_lib.state_shardings(cfg, tx, mesh)
    _, state = state_lib.create_train_state(cfg, tx, mesh)
    state = state_lib.load_base_weights(state, str(tmp_path / "base"), sh)
    np.testing.assert_array_equal(state.frozen["blocks"]["ffn_up"]["kernel"][...],
                                  base_params["blocks"]["ffn_up"]["kernel"])
    np.testing.assert_array_equal(state.params["patch_embed"][...], base_params["patch_embed"])
    np.testing.assert_array_equal(state.ema["patch_embed"][...], base_params["patch_embed"])
    assert float(jnp.abs(state.params["control"]["gate"][...] - 0.1)) < 1e-7  # kept its init
    assert int(state.stats["control"]["control_stats"]["count"][...]) == 0  # none in a plain model
    # A trained add-plus model (the next stage's start) brings its running statistics along.
    ctrl = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype),
                        nnx.to_pure_dict(nnx.state(abstract_dit(cfg.model), nnx.Param)))
    converted_weights.save_params(tmp_path / "stage1", ctrl, cfg.model)
    stats = {"control": {"mean": [0.5] * 8, "std": [2.0] * 8, "count": 7, "momentum": 0.01}}
    (tmp_path / "stage1" / "control_stats.json").write_text(json.dumps(stats))
    state = state_lib.load_base_weights(state, str(tmp_path / "stage1"), sh)
    got = state.stats["control"]
    np.testing.assert_array_equal(got["control_stats"]["std"][...], 2.0)
    assert int(got["control_stats"]["count"][...]) == 7 and int(got["video_stats"]["count"][...]) == 0
    wide_cfg = dataclasses.replace(plain_cfg, ffn_dim=64)
    wide = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype),
                        nnx.to_pure_dict(nnx.state(abstract_dit(wide_cfg), nnx.Param)))
    converted_weights.save_params(tmp_path / "wide", wide, wide_cfg)
    with pytest.raises(ValueError, match="shaped unlike"):
        state_lib.load_base_weights(state, str(tmp_path / "wide"), sh)
