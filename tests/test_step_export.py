"""Exported causal step: AOT compile with memory analysis; export (lowered for CPU, CUDA and TPU in
one artifact) → load in a fresh process (no model code) → the same bits as the jitted function."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from flax import nnx

from rynn_jax import step_export
from rynn_jax.models import causal
from rynn_jax.models.dit import WanDiTConfig, init_dit, unrolled
from rynn_jax.serving.block_step import StepConfig, make_start, make_step

CFG = WanDiTConfig.tiny(control="add-plus", num_layers=1)
CCFG = causal.CausalConfig(frames_per_block=2, window_frames=3, policy="rolling")
SCFG = StepConfig(num_steps=2)
B, HW = 2, (2, 4)


def _inputs():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((B, 1, *HW, 8)).astype(np.float32)
    ctx = rng.standard_normal((B, CFG.text_len, CFG.text_dim)).astype(np.float32)
    controls = rng.standard_normal((3, B, 2, *HW, 8)).astype(np.float32)
    keys = np.stack([np.asarray(jax.random.key_data(jax.random.key(i))) for i in range(3)])
    return ref, ctx, controls, keys


def test_aot_compile_prints_memory(capsys):
    model = init_dit(CFG, seed=0)
    graphdef, params = nnx.split(model)
    ref, ctx, controls, keys = _inputs()
    state = jax.eval_shape(make_start(graphdef, CCFG), params, ref, ctx)
    compiled = step_export.compile_aot(make_step(graphdef, CCFG, SCFG), params, state, controls[0], keys[0],
                                  donate_argnums=(1,))
    assert "[step]" in capsys.readouterr().out
    x_info, state_info = compiled.out_info  # the step's (latents block, state), as the jitted step gives
    assert x_info.shape == (*controls[0].shape[:-1], CFG.out_channels)
    assert jax.tree.map(lambda a: a.shape, state_info) == jax.tree.map(lambda a: a.shape, state)


def test_export_roundtrip_in_fresh_process(tmp_path):
    model = init_dit(CFG, seed=0)
    nnx.update(model, jax.tree.map(lambda a: a + 0.05, nnx.state(model, nnx.Param)))  # control on
    step_export.export_causal_step(model, CCFG, SCFG, tmp_path / "exp", batch=B, latent_hw=HW)
    # one artifact for CPU, CUDA and TPU (the default); run here on CPU
    assert json.loads((tmp_path / "exp" / "meta.json").read_text())["platforms"] == ["cpu", "cuda", "tpu"]
    ref, ctx, controls, keys = _inputs()
    np.savez(tmp_path / "inputs.npz", ref=ref, ctx=ctx, controls=controls, keys=keys)

    # In process: the jitted functions of the same model.
    graphdef, params = nnx.split(model)
    start = jax.jit(make_start(graphdef, CCFG))
    step = jax.jit(make_step(graphdef, CCFG, SCFG), donate_argnums=1)
    state = start(params, ref, ctx)
    ours = []
    for c, k in zip(controls, keys):
        x, state = step(params, state, c, k)
        ours.append(np.asarray(x))

    script = textwrap.dedent(f"""
        import sys
        import numpy as np
        from rynn_jax.step_export import load
        server = load({str(tmp_path / "exp")!r})
        inp = np.load({str(tmp_path / "inputs.npz")!r})
        state = server.start(inp["ref"], inp["ctx"])
        outs = []
        for c, k in zip(inp["controls"], inp["keys"]):
            x, state = server.step(state, c, k)
            outs.append(np.asarray(x))
        np.save({str(tmp_path / "out.npy")!r}, np.stack(outs))
        assert not any(m.startswith(("rynn_jax.models", "rynn_jax.teleop", "flax")) for m in sys.modules), \\
            sorted(m for m in sys.modules if m.startswith(("rynn_jax", "flax")))
    """)
    proc = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = np.load(tmp_path / "out.npy")
    assert theirs.dtype == np.float32 and theirs.shape == (3, B, 2, *HW, 8)
    np.testing.assert_array_equal(theirs, np.stack(ours))


def test_export_refuses_the_merged_clean_pass(tmp_path):
    import pytest

    with pytest.raises(ValueError, match="StreamingSession-only"):
        step_export.export_causal_step(init_dit(CFG, 0), CCFG, StepConfig(merge_clean_pass=True), tmp_path,
                                  batch=B, latent_hw=HW)
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_portable_export_refuses_cudnn_attention(tmp_path):
    import dataclasses

    import pytest

    model = init_dit(dataclasses.replace(CFG, attention="cudnn"), 0)
    with pytest.raises(ValueError, match="lowers for CUDA only"):
        step_export.export_causal_step(model, CCFG, SCFG, tmp_path, batch=B, latent_hw=HW)
    assert not any(tmp_path.iterdir())  # nothing half-written


def _export_tiny(out_dir: str) -> None:
    """The artifact of test_export_roundtrip_in_fresh_process (same model, same inputs), written
    to `out_dir` by whatever backend this process has."""
    model = init_dit(CFG, seed=0)
    nnx.update(model, jax.tree.map(lambda a: a + 0.05, nnx.state(model, nnx.Param)))
    step_export.export_causal_step(model, CCFG, SCFG, f"{out_dir}/exp", batch=B, latent_hw=HW)
    ref, ctx, controls, keys = _inputs()
    np.savez(f"{out_dir}/inputs.npz", ref=ref, ctx=ctx, controls=controls, keys=keys)


@pytest.mark.gpu  # JAX_PLATFORMS=cuda python -m pytest -q -s -m gpu tests/test_step_export.py
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
def test_artifact_exported_on_cpu_runs_on_gpu_like_the_jitted_gpu_step(tmp_path):
    """Export on a CPU-only process (a build machine), load here on the GPU: the streamed blocks
    equal what the jitted start/step give on the same GPU with the artifact's parameters."""
    import os

    env = dict(os.environ, JAX_PLATFORMS="cpu")
    code = f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import test_step_export as t; " \
           f"t._export_tiny({str(tmp_path)!r})"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]

    server = step_export.load(tmp_path / "exp")
    inp = np.load(tmp_path / "inputs.npz")
    state = server.start(inp["ref"], inp["ctx"])
    theirs = []
    for c, k in zip(inp["controls"], inp["keys"]):
        x, state = server.step(state, c, k)
        theirs.append(np.asarray(x))
    assert all(leaf.devices() == {jax.devices()[0]} for leaf in jax.tree.leaves(state))  # ran on the GPU

    # The jitted GPU path, with the artifact's parameters put back into the model's structure.
    # (the serving layout the artifact was exported in: `dit.unrolled`, fused projections)
    graphdef, params = nnx.split(unrolled(init_dit(CFG, seed=0)))
    params = jax.tree.unflatten(jax.tree.structure(params), server.params)
    start = jax.jit(make_start(graphdef, CCFG))
    step = jax.jit(make_step(graphdef, CCFG, SCFG), donate_argnums=1)
    state = start(params, inp["ref"], inp["ctx"])
    ours = []
    for c, k in zip(inp["controls"], inp["keys"]):
        x, state = step(params, state, c, k)
        ours.append(np.asarray(x))
    ours, theirs = np.stack(ours), np.stack(theirs)
    diff = float(np.abs(ours - theirs).max())
    print(f"\nartifact (exported on CPU) vs jitted, both on {jax.devices()[0].device_kind}: max |diff| {diff:.3g}, "
          f"max |x| {float(np.abs(ours).max()):.3g}, bitwise equal: {bool((ours == theirs).all())}")
    assert np.isfinite(theirs).all() and theirs.shape == (3, B, 2, *HW, 8)
    np.testing.assert_allclose(theirs, ours, rtol=0, atol=1e-5 * float(np.abs(ours).max()))
