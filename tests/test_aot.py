"""Ahead-of-time TPU compiles on a CPU host (libtpu's compiler): the real training step of a small
recipe on a v5e:2x4 slice, the collectives count on a program whose traffic is known in closed
form, an oversize model refused by the compiler, multislice meshes.

Skipped when libtpu is not installed (`pip install 'jax[tpu]==<our jax>'`; `setup.sh --test`
installs it)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from rynn_jax import errors, sharding
from rynn_jax.aot import analysis, programs, report, topology
from rynn_jax.training import config as config_lib

REASON = topology.available()
pytestmark = pytest.mark.skipif(bool(REASON), reason=f"TPU AOT compile needs libtpu: {REASON}")

# configs/tiny.py widened so that the embed-sharded matrices dominate the state: TPU tiles pad a
# sharded 1-D vector to 128+ elements, which at tiny's width 48 would swamp the 8× cut
WIDE = ["model.dim=512", "model.ffn_dim=1024", "model.num_heads=8", "model.num_layers=1"]


def _recipe(overrides):
    return config_lib.apply_overrides(config_lib.load_config("configs/tiny.py"), overrides)


@pytest.fixture(scope="module")
def rows():
    cfg = _recipe(WIDE)
    out = report.sweep(cfg, [topology.parse("v5e:2x4")], ["fsdp=-1", "data=-1"], ["train"],
                       report.Plan(batch=8, thw=cfg.data.synthetic_shape))
    return {r["mesh_spec"]: r for r in out}


def test_train_step_fits_with_positive_memory(rows):
    for r in rows.values():
        assert r["status"] == "fits", r
        assert r["chips"] == 8 and r["mesh"]["fsdp" if r["mesh_spec"] == "fsdp=-1" else "data"] == 8
        mem = r["memory"]
        assert mem["argument"] > 0 and mem["output"] > 0 and mem["temp"] > 0 and r["xla_flops"] > 0
        # the compiler's argument bytes are the shards the state shardings give (TPU tiling may pad)
        assert r["argument_bytes_computed"] <= mem["argument"] <= 1.25 * r["argument_bytes_computed"]


def test_fsdp_over_8_chips_cuts_parameter_bytes_8x(rows):
    cfg = _recipe(WIDE)
    m = cfg.model
    t, h, w = cfg.data.synthetic_shape  # one clip per chip on both meshes: video, control, image, text
    clip = 4 * (t * h * w * (m.in_channels + m.control_channels) + h * w * m.in_channels + m.text_len * m.text_dim)
    state = {k: r["memory"]["argument"] - clip for k, r in rows.items()}
    assert 7.5 <= state["data=-1"] / state["fsdp=-1"] <= 8.0


def test_collectives_follow_the_strategy(rows):
    fsdp, data = rows["fsdp=-1"]["collectives"], rows["data=-1"]["collectives"]
    assert fsdp["all-gather"]["runs"] > 0  # FSDP gathers each weight before use
    assert "all-gather" not in data  # replicated weights: nothing to gather
    # data parallel all-reduces the float32 gradient: at least the parameters' bytes per step
    params = rows["data=-1"]["argument_bytes_computed"] / 4  # params, Adam μ and ν, EMA: 4 copies
    assert params * 0.9 <= data["all-reduce"]["bytes"]


def test_collectives_count_loop_trips():
    """psum of a known array inside a 5-trip loop: 5 all-reduces of its bytes per step."""
    mesh = jax.make_mesh((8,), ("x",), devices=topology.devices(topology.parse("v5e:2x4")))

    def f(a):
        def body(i, acc):
            return acc + jax.lax.psum(acc * i, "x")
        return jax.lax.fori_loop(0, 5, body, a)

    g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=PartitionSpec("x"), out_specs=PartitionSpec("x")))
    arg = jax.ShapeDtypeStruct((8 * 128, 256), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec("x")))
    coll = analysis.collectives(g.lower(arg).compile().as_text())
    assert coll["all-reduce"]["runs"] == 5 * coll["all-reduce"]["ops"]
    assert coll["all-reduce"]["bytes"] == 5 * coll["all-reduce"]["ops"] * 128 * 256 * 4


def test_oversize_model_does_not_fit():
    cfg = _recipe(["model.dim=4096", "model.ffn_dim=16384", "model.num_layers=8", "model.num_heads=32"])
    (row,) = report.sweep(cfg, [topology.parse("v5e:1x1")], ["fsdp=1"], ["train"],
                          report.Plan(thw=cfg.data.synthetic_shape))
    assert row["status"] == "does not fit"
    assert "RESOURCE_EXHAUSTED" in row["reason"] and "HBM" in row["reason"]


def test_multislice_puts_data_across_slices():
    tpu = topology.parse("v5e:2x4", slices=2)
    mesh = topology.make_mesh(tpu, sharding.MeshConfig(data=2, fsdp=-1))
    assert dict(mesh.shape) == {"data": 2, "fsdp": 8, "tensor": 1, "context": 1}
    slice_of = np.vectorize(lambda d: d.slice_index)(mesh.devices)
    assert (slice_of[0] == 0).all() and (slice_of[1] == 1).all()  # fsdp stays inside a slice
    with pytest.raises(ValueError, match="multiple of the slice count"):
        topology.make_mesh(tpu, sharding.MeshConfig(data=1, fsdp=-1))


def test_world4d_train_step_compiles_with_its_depth_and_flow_batch():
    """RynnWorld-4D's training step (configs/world4d_tiny.py) compiles for v5e:2x4 under FSDP, on
    the batch its loss reads: the RGB, depth and flow latents with their first frames, each of the
    clip's shape, split over the 8 chips."""
    from rynn_jax.training import loss4d

    cfg = config_lib.load_config("configs/world4d_tiny.py")
    thw = cfg.data.synthetic_shape
    (r,) = report.sweep(cfg, [topology.parse("v5e:2x4")], ["fsdp=-1"], ["train"], report.Plan(batch=8, thw=thw))
    assert r["status"] == "fits" and r["memory"]["argument"] > 0 and r["memory"]["temp"] > 0, r
    mesh = sharding.make_mesh(sharding.MeshConfig(fsdp=-1), topology.devices(topology.parse("v5e:2x4")))
    (p,) = programs.train(cfg, mesh, 8, thw)
    batch = p.args[1]
    assert set(batch) == set(loss4d.TRAIN_KEYS) and {"depth_latents", "flow_img_latent"} <= set(batch)
    c = cfg.model.base.in_channels
    for k in ("video_latents", "depth_latents", "flow_latents"):
        assert batch[k].shape == (8, *thw, c) and batch[k].sharding.shard_shape(batch[k].shape)[0] == 1, k
    for k in ("img_latent", "depth_img_latent", "flow_img_latent"):
        assert batch[k].shape == (8, 1, *thw[1:], c), k


def test_serve_program_shards_params_by_the_rules():
    cfg = _recipe([])
    mesh = sharding.make_mesh(sharding.MeshConfig(fsdp=1, tensor=2), topology.devices(topology.parse("v5e:2x4"))[:2])
    (p,) = programs.serve(cfg.model, *report._serving_defaults(), mesh, cfg.mesh.rules, 1, (4, 4))
    leaves = p.args[0]
    assert all(x.dtype == jnp.dtype(cfg.model.dtype) for x in leaves if jnp.issubdtype(x.dtype, jnp.floating))
    assert any("tensor" in str(x.sharding.spec) for x in leaves)  # heads / mlp split over the two chips


def test_cli_errors_name_the_flag():
    from rynn_jax.aot.__main__ import main

    with pytest.raises(errors.UsageError, match="--topology 'v9:2x4'"):
        main(["--config", "configs/tiny.py", "--topology", "v9:2x4"])
    with pytest.raises(errors.UsageError, match="--mesh"):
        main(["--config", "configs/tiny.py", "--topology", "v5e:2x4", "--mesh", "fsdp=two"])
    with pytest.raises(errors.UsageError, match="training recipe"):
        main(["--config", "configs/tiny.py", "--topology", "v5e:2x4", "--programs", "distill"])


def test_topology_parse_rejects_wrong_dims():
    with pytest.raises(ValueError, match="3-D"):
        topology.parse("v5p:2x4")
    assert dataclasses.astuple(topology.parse("v6e:16x16")) == ("v6e", (16, 16), 1)
