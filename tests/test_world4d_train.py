"""RynnWorld-4D training at toy size through train.py: the stage-2 recipe moves only the joint
attention, and the RGB-injection decay follows its closed form."""

from __future__ import annotations

import jax
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
    args = ["--config", "configs/world4d_tiny.py", "--set", "loss.train=joint",
            "--set", "loss.branch_dropout=0.5", "--set", "log.progress=False",
            "--set", "optim.joint_out_lr=1e-2",  # its own optax.multi_transform group
            "--set", f"ckpt.dir={tmp_path}/ckpt", "--set", f"log.dir={tmp_path}/logs"]
    losses = train.main(args + ["--set", "total_steps=2"])
    assert len(losses) == 2 and all(np.isfinite(losses))
    assert len(train.main(args + ["--set", "total_steps=3"])) == 1  # resumed at step 2 (masked optimizer state)
    from flax import nnx

    from rynn_jax.training import config as config_lib, state as state_lib
    from rynn_jax.weights import flatten_params

    cfg = config_lib.apply_overrides(config_lib.load_config("configs/world4d_tiny.py"), ["loss.train=joint"])
    abstract = state_lib.abstract_model(cfg)
    trained = flatten_params(nnx.to_pure_dict(nnx.state(abstract, state_lib.trainable(cfg))))
    assert trained and all(path[0] == "joint" for path in trained)
    assert len(flatten_params(nnx.to_pure_dict(nnx.state(abstract, nnx.Param)))) > len(trained)
    assert (tmp_path / "ckpt" / "2").is_dir()


def test_joint_out_lr_is_its_own_adamw_group():
    """AdamW's first step moves every parameter by lr·g/(|g| + eps): the JA output projections by
    `joint_out_lr`, everything else by `lr` (closed form, no weight decay or clipping)."""
    from flax import nnx

    from rynn_jax.models.dit4d import WanDiT4DConfig, abstract_dit4d
    from rynn_jax.training import optim
    from rynn_jax.training.config import OptimConfig

    params = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32),
                          nnx.to_pure_dict(nnx.state(abstract_dit4d(WanDiT4DConfig.tiny()), nnx.Param)))
    grads = jax.tree.map(lambda p: jnp.full(p.shape, 0.5, jnp.float32), params)
    cfg = OptimConfig(lr=1e-3, joint_out_lr=4e-3, warmup_steps=0, schedule="constant", weight_decay=0.0, grad_clip=0.0)
    tx = optim.make_optimizer(cfg, 10)
    updates, _ = tx.update(grads, tx.init(params), params)
    flat = jax.tree_util.tree_flatten_with_path(updates)[0]
    out = [u for p, u in flat if optim.is_joint_out(p)]
    assert len(out) == 2 * 3 * len(WanDiT4DConfig.tiny().joint_layers) // 2  # kernel + bias per modality
    for path, u in flat:
        want = -(4e-3 if optim.is_joint_out(path) else 1e-3) * 0.5 / (0.5 + cfg.eps)
        np.testing.assert_allclose(u, want, rtol=2e-5, err_msg=jax.tree_util.keystr(path))  # float32 Adam


@pytest.mark.usefixtures("fast_compile")
def test_synthetic_chain_teacher_to_stage1_to_stage2(tmp_path):
    """configs/world4d_synthetic_tiny.py: stage 1 starts from a (control) teacher export — depth and
    flow are copies of its RGB branch, its control branch left out — and stage 2 from stage 1's
    export, whose branches it keeps while its joint attention starts fresh (lr 0: exact copies)."""
    from flax import nnx

    from configs import synthetic
    from rynn_jax.models.dit import init_dit
    from rynn_jax.models.dit4d_weights import branch_as_dit, load_dit4d
    from rynn_jax.training import config as config_lib
    from rynn_jax.training.export_weights import export_weights, write_dit_dir
    from rynn_jax.weights import flatten_params

    teacher_cfg = synthetic.teacher_model(dim=32, num_layers=2, num_heads=2, ffn_dim=64, freq_dim=32, dtype="float32")
    _, teacher_params, stats = nnx.split(init_dit(teacher_cfg, 3), nnx.Param, ...)
    teacher = flatten_params(nnx.to_pure_dict(teacher_params))
    write_dit_dir(str(tmp_path / "teacher"), nnx.to_pure_dict(teacher_params), teacher_cfg, stats)
    exports = {0: str(tmp_path / "teacher")}
    for n in (1, 2):
        flags = [f"ckpt.init_from={exports[n - 1]}", f"ckpt.dir={tmp_path}/run{n}", f"log.dir={tmp_path}/logs{n}",
                 "data.kind='synthetic'", "total_steps=1", "optim.lr=0.0", "optim.joint_out_lr=0.0",
                 "log.progress=False"]
        train.main(["--config", f"configs/world4d_synthetic_tiny.py:{n}"] + [a for f in flags for a in ("--set", f)])
        cfg = config_lib.apply_overrides(config_lib.load_config(f"configs/world4d_synthetic_tiny.py:{n}"), flags)
        exports[n] = str(tmp_path / f"stage{n}")
        export_weights(cfg, exports[n], use_ema=False)  # the raw weights: lr 0 leaves them bit for bit
    stage1, stage2 = (nnx.to_pure_dict(nnx.state(load_dit4d(exports[n]), nnx.Param)) for n in (1, 2))
    for m in ("rgb", "depth", "flow"):
        got = flatten_params(branch_as_dit(stage1, m))
        assert set(got) == {k for k in teacher if k[0] != "control"}
        for k, v in got.items():
            np.testing.assert_array_equal(v, teacher[k], err_msg=f"{m} {k}")
    assert "joint" not in stage1 and "joint" in stage2
    one, two = flatten_params(stage1), flatten_params(stage2)
    assert all(np.array_equal(v, two[k]) for k, v in one.items())
    assert all(not np.any(v) for k, v in two.items() if k[0] == "joint" and k[2:3] in (("out",), ("embed",)))  # fresh JA


@pytest.mark.usefixtures("fast_compile")
def test_synthetic_control_variant_keeps_the_teachers_control_branch(tmp_path):
    """`configs/world4d_synthetic_tiny.py:1,control`: stage 1 of the teleop extension starts with every
    branch equal to the whole teacher, its control branch included (shared, in the base), and the
    teacher's running statistics; the export writes them back beside the weights (one step at
    momentum 0.01 moves them by at most 1 % of their distance to the batch's)."""
    from flax import nnx

    from configs import synthetic
    from rynn_jax.models import control
    from rynn_jax.models.dit import init_dit
    from rynn_jax.models.dit4d_weights import branch_as_dit, load_dit4d
    from rynn_jax.training import config as config_lib
    from rynn_jax.training.export_weights import export_weights, write_dit_dir
    from rynn_jax.weights import flatten_params

    teacher_cfg = synthetic.teacher_model(dim=32, num_layers=2, num_heads=2, ffn_dim=64, freq_dim=32, dtype="float32")
    _, teacher_params, stats = nnx.split(init_dit(teacher_cfg, 3), nnx.Param, ...)
    recorded = {attr: {"mean": np.full(teacher_cfg.control_channels, 0.5, np.float32),
                       "std": np.full(teacher_cfg.control_channels, 2.0, np.float32), "count": np.int32(40)}
                for attr in ("control_stats", "video_stats")}
    stats = control.replace_stats(stats, recorded)
    write_dit_dir(str(tmp_path / "teacher"), nnx.to_pure_dict(teacher_params), teacher_cfg, stats)
    teacher = flatten_params(nnx.to_pure_dict(teacher_params))
    flags = [f"ckpt.init_from={tmp_path}/teacher", f"ckpt.dir={tmp_path}/run", f"log.dir={tmp_path}/logs",
             "data.kind='synthetic'", "total_steps=1", "optim.lr=0.0", "log.progress=False"]
    train.main(["--config", "configs/world4d_synthetic_tiny.py:1,control"] + [a for f in flags for a in ("--set", f)])
    cfg = config_lib.apply_overrides(config_lib.load_config("configs/world4d_synthetic_tiny.py:1,control"), flags)
    export_weights(cfg, str(tmp_path / "stage1"), use_ema=False)
    model = load_dit4d(str(tmp_path / "stage1"))
    stage1 = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    for m in ("rgb", "depth", "flow"):
        got = flatten_params(branch_as_dit(stage1, m))
        assert set(got) == set(teacher) and any(k[0] == "control" for k in got)
        for k, v in got.items():
            np.testing.assert_array_equal(v, teacher[k], err_msg=f"{m} {k}")
    back = control.stats_of(model)
    for attr in ("control_stats", "video_stats"):
        assert int(back[attr]["count"]) == 41
        np.testing.assert_allclose(back[attr]["mean"], 0.5, atol=0.02)
        np.testing.assert_allclose(back[attr]["std"], 2.0, atol=0.03)
