"""Distillation on the tiny config (CPU): gradients reach earlier blocks through the KV cache;
`distill.py` end to end — phase A lowers the causal loss and writes sample videos (skeleton |
student | truth, as train.py), phase B (from the phase-A student) runs with finite non-zero DMD
gradients and moves the student's samples towards the teacher's, and a run SIGKILLed mid-phase-B
resumes bit-exactly (student, critic, optimisers, EMA, data position)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys

import imageio.v3 as iio
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rynn_jax import sharding
from rynn_jax.distill import config as config_lib
from rynn_jax.distill import evaluate
from rynn_jax.distill import rollout as rollout_lib
from rynn_jax.distill import state as state_lib
from rynn_jax.distill.config import DMDConfig
from rynn_jax.models import vae as vae_lib
from rynn_jax.models.causal import CausalConfig
from rynn_jax.models.dit import WanDiTConfig, init_dit
from rynn_jax.serving.block_step import StepConfig
from rynn_jax.training import input as input_lib
from rynn_jax.training import samples as samples_lib
from rynn_jax.training.config import TrainConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "distill_tiny.py")
FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
FAST_FLAGS = " ".join(f"--{k}={str(v).lower()}" for k, v in FAST.items())


# --------------------------------------------------------------------------------------------------
# Gradient through the cache
# --------------------------------------------------------------------------------------------------


def test_gradient_reaches_earlier_blocks_through_the_cache():
    """A loss on the *last* block only. Block 1 sees block 0 — the reference latent (frame 0) and
    block 0's sample — only through the cached K/V (the mask is causal and every denoising step
    before the exit step is gradient-free), so a non-zero gradient with respect to the reference
    latent is gradient that crossed the cache. Parameter gradients are finite and non-zero too. With
    `cache_grad=False`, or `grad_blocks=1` (block 0 rolled out without gradient), it is exactly 0."""
    cfg = WanDiTConfig.tiny(control="add-plus")
    model = init_dit(cfg, seed=1)
    rng = np.random.default_rng(0)
    nnx.update(model, jax.tree.map(lambda a: a + 0.1 * jnp.asarray(rng.standard_normal(a.shape), a.dtype),
                                   nnx.state(model, nnx.Param)))  # the control branch starts at 0: move it
    graphdef, params, stats = nnx.split(model, nnx.Param, ...)
    b, t, hw = 2, 4, (4, 4)
    ref = jnp.asarray(rng.standard_normal((b, 1, *hw, 8)), jnp.float32)
    ctx = jnp.asarray(rng.standard_normal((b, cfg.text_len, cfg.text_dim)), jnp.float32)
    control = jnp.asarray(rng.standard_normal((b, t, *hw, 8)), jnp.float32)
    ccfg, scfg = CausalConfig(frames_per_block=2, window_frames=3), StepConfig()

    def grads(dcfg: DMDConfig):
        def last_block_loss(p, ref):
            # random exit step (the gradient-free loop is traced as well), remat per block
            x0 = rollout_lib.rollout(graphdef, p, stats, ref, ctx, control, jax.random.PRNGKey(3), num_frames=t,
                                     ccfg=ccfg, scfg=scfg, dcfg=dcfg, grad=True)
            return jnp.sum(jnp.square(x0[:, 2:]))

        grad_fn = jax.jit(jax.grad(last_block_loss, argnums=(0, 1)))
        return grad_fn.lower(params, ref).compile(compiler_options=FAST)(params, ref)

    g_params, g_ref = grads(DMDConfig())
    leaves = jax.tree.leaves(g_params)
    assert all(bool(jnp.isfinite(x).all()) for x in leaves) and bool(jnp.isfinite(g_ref).all())
    assert float(jnp.abs(g_ref).max()) > 1e-4, float(jnp.abs(g_ref).max())  # crossed the cache
    assert max(float(jnp.abs(x).max()) for x in leaves) > 0
    # the self-attention K/V projections get gradient (they build the cache the last block reads)
    assert float(jnp.abs(g_params["blocks"]["self_attn"]["k"]["kernel"][...]).max()) > 0
    # with the cache cut, or block 0 outside the differentiated suffix, nothing crosses
    for dcfg in (DMDConfig(cache_grad=False), DMDConfig(grad_blocks=1)):
        assert float(jnp.abs(grads(dcfg)[1]).max()) == 0.0, dcfg


# --------------------------------------------------------------------------------------------------
# distill.py end to end: phase A → phase B, kill, resume
# --------------------------------------------------------------------------------------------------


def _run(run_dir: str, cache_dir: str, *sets: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": FAST_FLAGS,
           "JAX_COMPILATION_CACHE_DIR": cache_dir, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    args = ["--config", TINY, "--set", f"ckpt.dir={run_dir}/ckpt", "--set", f"log.dir={run_dir}/logs",
            "--set", "log.progress=False"]
    for s in sets:
        args += ["--set", s]
    return subprocess.run([sys.executable, os.path.join(ROOT, "distill.py"), *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=400, check=False)


def _records(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "logs", "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


DMD_SETS = ("phase=dmd", "total_steps=40", "ckpt.every=10", "ckpt.keep=2", "eval_every=10")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("distill")
    cache = str(base / "jax_cache")
    warm, full, killed = str(base / "warm"), str(base / "full"), str(base / "killed")
    a = _run(warm, cache, "phase=warmup", "total_steps=30", "ckpt.every=30", "log.sample_every=30",
             "log.sample_vae=tiny")
    assert a.returncode == 0, a.stderr[-4000:]
    sets = DMD_SETS + (f"student_from={warm}/ckpt",)
    b = _run(full, cache, *sets)
    assert b.returncode == 0, b.stderr[-4000:]
    c = _run(killed, cache, *sets, "debug_kill_at_step=27")
    assert c.returncode == -signal.SIGKILL, (c.returncode, c.stderr[-4000:])
    d = _run(killed, cache, *sets)
    assert d.returncode == 0, d.stderr[-4000:]
    return warm, full, killed, d.stderr


def test_warmup_lowers_causal_loss(runs):
    losses = np.array([r["loss"] for r in _records(runs[0])])
    assert len(losses) == 30 and np.isfinite(losses).all()
    assert losses[-5:].mean() < 0.8 * losses[:5].mean(), losses


def test_warmup_writes_sample_videos(runs):
    """One MP4 at step 30: skeleton | EMA student's causal rollout | truth, each panel the VAE
    decode of its latents. Compared on 4×4-pixel means: H.264 at this tiny size loses ~25/255 per
    pixel on the random VAE's texture, but block means survive (measured: 1.7 matched, ≥ 8.5
    between different panels)."""
    warm = runs[0]
    files = sorted(os.listdir(os.path.join(warm, "logs", "samples")))
    assert files == ["sample_0000030.mp4"]
    video = iio.imread(os.path.join(warm, "logs", "samples", files[0]))
    cfg = dataclasses.replace(config_lib.load_config(TINY), phase="dmd", student_from=f"{warm}/ckpt")
    vae = samples_lib.load_sample_vae("tiny", cfg.model.in_channels)
    lat_t, lat_h, lat_w = cfg.data.synthetic_shape
    s = vae.cfg.spatial_stride
    assert video.shape == (1 + vae.cfg.temporal_stride * (lat_t - 1), lat_h * s, 3 * lat_w * s, 3)

    # The phase-A EMA at step 30, as phase B loads it, rolled out with the hook's fixed noise.
    mesh = sharding.make_mesh(cfg.mesh, jax.devices()[:1])
    tx_s, tx_c = state_lib.make_optimizers(cfg)
    graphdef, _, state = state_lib.create(cfg, tx_s, tx_c, mesh)
    state = state_lib.load_student(cfg, state, tx_s, tx_c, mesh)
    clip = samples_lib.first_clip(next(input_lib.make_iterator(TrainConfig(model=cfg.model, data=cfg.data))))
    student = jax.jit(lambda p, st: evaluate.student_samples(cfg, graphdef, p, st, clip, jax.random.PRNGKey(cfg.seed))
                      )(state.student, state.stats)
    decode = jax.jit(lambda x: vae_lib.decode(*nnx.split(vae), x))
    panels = [samples_lib._to_uint8(decode(x))[0] for x in (clip["control_video_latents"], student, clip["video_latents"])]

    def pool(x):  # (T, H, W, 3) → 4×4-pixel block means
        t, h, w, c = x.shape
        return x.astype(np.float64).reshape(t, h // 4, 4, w // 4, 4, c).mean((2, 4))

    w = video.shape[2] // 3
    err = np.array([[np.abs(pool(video[:, :, i * w:(i + 1) * w]) - pool(p)).mean() for p in panels] for i in range(3)])
    assert err.diagonal().max() < 3.0, err
    assert (err + np.eye(3) * 1e9).min() > 3 * err.diagonal().max(), err


def test_dmd_moves_student_towards_teacher(runs):
    records = _records(runs[1])
    gen = [r for r in records if "gen_grad_norm" in r]
    assert len(gen) == 8  # iterations 1, 6, ..., 36: one generator update per 5 critic updates
    # the critic starts equal to the teacher (zero DMD gradient), then the fake score separates
    assert all(np.isfinite(r["gen_grad_norm"]) for r in gen) and all(r["gen_grad_norm"] > 0 for r in gen[1:])
    dist = [r["sample_distance"] for r in records if "sample_distance" in r]
    assert len(dist) == 4
    assert dist[-1] < 0.97 * dist[0] and all(np.diff(dist) < 0), dist


def test_dmd_killed_run_resumes_exactly(runs):
    _, full, killed, resume_log = runs
    want = {r["step"]: r for r in _records(full)}
    got = _records(killed)
    assert [r["step"] for r in got] == list(range(1, 41))  # each step once (eval on the step's line)
    # after the checkpoint of step 10 or 20 (async save)
    assert re.search(r"resumed from step (10|20)\b", resume_log), resume_log[-2000:]
    for r in got:
        for k, v in r.items():
            assert v == want[r["step"]][k], (r["step"], k, v, want[r["step"]][k])  # bit-exact on CPU


def test_regression_objective_lowers_its_loss_without_a_critic(runs, tmp_path):
    """Phase B with `dmd.objective=regression` (from the phase-A student): one update per iteration,
    the rollout's error against the clip's latents falls, and no critic is trained or saved."""
    cache = os.path.join(os.path.dirname(runs[0]), "jax_cache")
    out = str(tmp_path / "regression")
    r = _run(out, cache, "phase=dmd", "dmd.objective=regression", "total_steps=24", "ckpt.every=24",
             "optim.lr=1e-3", f"student_from={runs[0]}/ckpt")
    assert r.returncode == 0, r.stderr[-4000:]
    recs = _records(out)
    losses = np.array([x["loss"] for x in recs])
    assert [x["step"] for x in recs] == list(range(1, 25)) and np.isfinite(losses).all()
    assert not any(k.startswith(("gen_", "dmd_")) for x in recs for k in x), recs[0]
    assert losses[-6:].mean() < 0.9 * losses[:6].mean(), losses


def test_regression_loss_is_the_rollouts_error_against_the_clip():
    """The regression objective's loss is the mean squared error, frames 1.., between the student's
    rollout and the clip's latents: held to a float64 NumPy computation on a gradient-free rollout
    with the same key (the differentiable rollout computes the same samples)."""
    from rynn_jax.distill import dmd
    from rynn_jax.distill import step as step_lib

    cfg = WanDiTConfig.tiny(control="add-plus")
    model = init_dit(cfg, seed=2)
    graphdef, params, stats = nnx.split(model, nnx.Param, ...)
    rng = np.random.default_rng(1)
    b, t, hw = 2, 4, (4, 4)
    batch = {"video_latents": rng.standard_normal((b, t, *hw, 8)), "img_latent": rng.standard_normal((b, 1, *hw, 8)),
             "control_video_latents": rng.standard_normal((b, t, *hw, 8)),
             "text_embedding": rng.standard_normal((b, cfg.text_len, cfg.text_dim))}
    batch = {k: jnp.asarray(v, jnp.float32) for k, v in batch.items()}
    dcfg = config_lib.DistillConfig(phase="dmd", model=cfg, causal=CausalConfig(frames_per_block=2, window_frames=3),
                                    dmd=DMDConfig(objective="regression", cache_grad=False))
    key = jax.random.PRNGKey(4)

    def loss(p):
        return dmd.regression_loss(step_lib.student_rollout(dcfg, graphdef, p, stats, batch, key, grad=True),
                                   batch["video_latents"])

    value, grads = jax.jit(jax.value_and_grad(loss))(params)
    x0 = np.asarray(jax.jit(lambda p: step_lib.student_rollout(dcfg, graphdef, p, stats, batch, key, grad=False))(params),
                    np.float64)
    expected = np.mean(np.square(x0[:, 1:] - np.asarray(batch["video_latents"], np.float64)[:, 1:]))
    np.testing.assert_allclose(float(value), expected, rtol=1e-5)
    assert all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(grads))
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads)) > 0
    assert not state_lib.uses_critic(dcfg) and state_lib.uses_critic(dataclasses.replace(dcfg, dmd=DMDConfig()))
