"""The synthetic world's distillation recipe end to end at toy size (configs/synthetic_distill_tiny.py,
the real recipe's causal layout and schedules with tiny widths): an exported teacher → phase A on
pre-encoded latent shards → phase B from phase A's checkpoint → `rynn_jax.distill.export` →
the serving loader (the bundled-weights lookup of `streaming_session`) streams the same
frames as the student held in memory at the end of training."""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

import distill as distill_cli
from configs import synthetic
from rynn_jax import converted_weights
from rynn_jax.data import shards as shards_lib
from rynn_jax.distill import config as config_lib
from rynn_jax.distill import export as export_lib
from rynn_jax.distill import state as state_lib
from rynn_jax.errors import UserError
from rynn_jax.models import control
from rynn_jax.models.dit import init_dit, unrolled
from rynn_jax.models.vae import WanVAEConfig, init_vae
from rynn_jax.serving.assemble import choose_weights, streaming_session
from rynn_jax.serving.student import SPEC_FILE, WEIGHTS_ENV, read_spec
from rynn_jax.teleop import demo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "synthetic_distill_tiny.py")
T_LAT, H_LAT, W_LAT = 6, 2, 4  # 2 blocks of 3 latent frames; 1×2 tokens per frame at patch 2
C = synthetic.LATENT_CHANNELS


def _records(n: int, text_dim: int) -> list[bytes]:
    """Clips in rynn_jax.data.preencode's record format: one prototype clip plus a little noise
    (something phase A can learn within a few steps), its control a fixed function of it."""
    rng = np.random.default_rng(0)
    proto = rng.standard_normal((T_LAT, H_LAT, W_LAT, C)).astype(np.float32)
    out = []
    for i in range(n):
        video = proto + 0.1 * rng.standard_normal(proto.shape).astype(np.float32)
        out.append(shards_lib.encode_record({
            "video_latents": video, "control_video_latents": np.tanh(video), "img_latent": video[:1],
            "text_embedding": rng.standard_normal((3, text_dim)).astype(np.float32),
            "text": np.asarray("pick", np.str_), "actions": np.zeros((4 * (T_LAT - 1) + 1, 54), np.float32),
            "has_actions": np.asarray(True), "clip_id": np.asarray(i), "episode": np.asarray(f"e{i}", np.str_),
            "start": np.asarray(0, np.int64), "source": np.asarray("robot", np.str_)}))
    return out


def _tiny(phase: str, work, **changes) -> config_lib.DistillConfig:
    cfg = config_lib.load_config(f"{TINY}:{phase}")
    run = work / f"distill_{phase}"
    return dataclasses.replace(
        cfg, data=dataclasses.replace(cfg.data, sources={"robot": str(work / "latents" / "robot-*.array_record")}),
        ckpt=dataclasses.replace(cfg.ckpt, dir=str(run / "ckpt"), init_from=str(work / "teacher")),
        log=dataclasses.replace(cfg.log, dir=str(run / "logs"), progress=False), **changes)


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)  # many small programs: compile time dominates
    try:
        work = tmp_path_factory.mktemp("synthetic")
        cfg_a = _tiny("warmup", work)
        (work / "latents").mkdir()
        recs = _records(8, cfg_a.model.text_dim)
        for i in range(2):
            shards_lib.write_shard(work / "latents" / shards_lib.shard_name("robot", i, 2), recs[4 * i:4 * i + 4])
        # The exported teacher (training.export_weights' layout): weights + control statistics.
        teacher = init_dit(cfg_a.model, seed=3)
        pure = nnx.to_pure_dict(nnx.state(teacher, nnx.Param))
        model_cfg = dataclasses.replace(cfg_a.model, param_dtype="float32")
        converted_weights.save_params(work / "teacher", pure, model_cfg)
        control.write_stats(work / "teacher" / control.STATS_FILE, control.stats_of(teacher), model_cfg)

        rec_a = distill_cli.distill(cfg_a)
        cfg_b = _tiny("dmd", work, student_from=str(work / "distill_warmup" / "ckpt"))
        cfg_b = dataclasses.replace(cfg_b, log=dataclasses.replace(cfg_b.log, sample_every=cfg_b.total_steps))
        final = {}
        rec_b = distill_cli.distill(cfg_b, hooks=[lambda step, st: final.update(
            step=step, ema=jax.device_get(st.ema), stats=jax.device_get(st.stats))])
        # serving weights: the student (float32: bit-equal to the in-memory one) and an autoencoder
        weights = work / "weights"
        step = export_lib.export_student(cfg_b, str(weights / "student"), resolution=(32, 64))
        vae = init_vae(WanVAEConfig.tiny(z_dim=C, latents_mean=(0.0,) * C, latents_std=(1.0,) * C), seed=1)
        converted_weights.save_params(weights / "autoencoder", nnx.to_pure_dict(nnx.state(vae, nnx.Param)), vae.cfg)
        yield dict(work=work, cfg_a=cfg_a, cfg_b=cfg_b, rec_a=rec_a, rec_b=rec_b, final=final, step=step,
                   weights=weights, vae=vae, teacher=pure)
    finally:
        jax.config.update("jax_disable_most_optimizations", before)


def test_recipe_is_the_serving_layout():
    """Both phases train the student StreamingSession serves by default, on the teacher's data."""
    from rynn_jax.models.causal import CausalConfig
    from rynn_jax.serving.block_step import SERVING_STEPS

    for phase in ("warmup", "dmd"):
        cfg = config_lib.load_config(os.path.join(ROOT, "configs", f"synthetic_distill.py:{phase}"))
        assert cfg.model == synthetic.teacher_model()
        assert cfg.causal == CausalConfig() and cfg.causal.cache_frames == 21  # 1 sink + 20, blocks of 3
        assert (cfg.student_steps.num_steps, cfg.student_steps.shift) == (SERVING_STEPS.num_steps, SERVING_STEPS.shift)
        assert cfg.data.sources == {"robot": synthetic.LATENTS} and cfg.ckpt.init_from == synthetic.TEACHER
        assert 21 % cfg.causal.frames_per_block == 0  # the 81-frame clips are whole blocks


def test_phase_a_lowers_the_causal_loss(recipe):
    losses = np.array([r["loss"] for r in recipe["rec_a"]])
    assert len(losses) == recipe["cfg_a"].total_steps and np.isfinite(losses).all()
    assert losses[-2:].mean() < 0.95 * losses[:2].mean() and losses[-1] < losses[0], losses


def test_phase_b_trains_generator_and_critic(recipe):
    rec = recipe["rec_b"]
    assert [r["step"] for r in rec] == list(range(1, recipe["cfg_b"].total_steps + 1))
    gen = [r for r in rec if "gen_grad_norm" in r]
    assert len(gen) == 2  # iterations 1 and 6: one generator update per 5 critic updates
    assert all(np.isfinite(r["gen_loss"]) for r in gen) and gen[1]["gen_grad_norm"] > 0  # critic has moved
    assert all(np.isfinite(r["loss"]) and r["grad_norm"] > 0 for r in rec)  # every critic update


def test_export_is_the_trained_ema_student(recipe):
    saved = converted_weights.restore_params(recipe["weights"] / "student",
                                       jax.tree.map(lambda a: a, recipe["teacher"]))
    ema = nnx.to_pure_dict(recipe["final"]["ema"])
    assert recipe["step"] == recipe["final"]["step"] == recipe["cfg_b"].total_steps
    for a, b in zip(jax.tree.leaves(saved), jax.tree.leaves(ema)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    moved = max(float(np.abs(np.asarray(a) - np.asarray(t)).max())
                for a, t in zip(jax.tree.leaves(saved), jax.tree.leaves(recipe["teacher"])))
    assert moved > 1e-3, moved  # distillation changed the teacher's weights
    spec = read_spec(recipe["weights"] / "student")
    assert spec == export_lib.spec_of(recipe["cfg_b"], (32, 64)) and spec.chunk_frames == 21
    assert json.loads((recipe["weights"] / "student" / SPEC_FILE).read_text())["resolution"] == [32, 64]


def test_bundled_student_streams_as_the_in_memory_one(recipe, monkeypatch, capsys):
    """The served student (found as the bundled weights) streams two blocks exactly as the
    student of the last training step, held in memory, does: the session's layout is the recipe's,
    and its executables given the in-memory weights (`dit_params`, as a session of that model
    holds them) give the same frames."""
    monkeypatch.setenv(WEIGHTS_ENV, str(recipe["weights"]))
    chosen = choose_weights(None, None)
    assert chosen.label == "bundled student" and chosen.resolution((96, 160)) == (32, 64)
    served = streaming_session(None, None, 0)
    assert capsys.readouterr().err == ""  # no "no bundled weights" line
    cfg = recipe["cfg_b"]
    assert (served.ccfg, served.chunk_frames, served.merge_clean_pass) == (cfg.causal, 21, True)
    model = nnx.merge(state_lib.graphdef_of(cfg.model), recipe["final"]["ema"], recipe["final"]["stats"])
    memory = nnx.split(unrolled(model))[1]

    rng = np.random.default_rng(5)
    image = rng.uniform(-1, 1, (1, 32, 64, 3)).astype(np.float32)
    ctx = rng.standard_normal((1, cfg.model.text_len, cfg.model.text_dim)).astype(np.float32)
    skeleton = rng.uniform(-1, 1, (1, 21, 32, 64, 3)).astype(np.float32)
    frames = []
    for params in (served.dit_params, memory):
        served.dit_params = params
        served.start(image, ctx, jax.random.key(7))
        out, used = [], 0
        for _ in range(2):
            n = served.frames_needed
            out.append(np.asarray(served.step(skeleton[:, used:used + n])))
            used += n
        frames.append(np.concatenate(out, axis=1))
    assert frames[0].shape == (1, 21, 32, 64, 3)  # 9 + 12 frames
    np.testing.assert_allclose(frames[0], frames[1], atol=1e-5)
    assert float(np.abs(frames[0][:, 1:] - frames[0][:, :1]).max()) > 1e-2  # not a still copy of frame 0


def test_missing_bundled_weights_say_so_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(WEIGHTS_ENV, str(tmp_path))
    chosen = choose_weights(None, None)
    err = capsys.readouterr().err.strip().splitlines()
    assert chosen.dit is None and chosen.spec is None and chosen.resolution((96, 160)) == (96, 160)
    assert len(err) == 1 and "no bundled weights" in err[0] and "tiny random" in err[0] and str(tmp_path) in err[0]
    assert choose_weights(None, None, random_weights=True).label == "tiny random (--random-weights)"
    assert capsys.readouterr().err == ""  # asked for: no message
    with pytest.raises(UserError, match="--random-weights"):
        choose_weights("a", "b", random_weights=True)


def test_export_errors_are_one_line(tmp_path):
    cfg = _tiny("dmd", tmp_path)
    with pytest.raises(UserError, match="ckpt.dir"):
        export_lib.export_student(cfg, str(tmp_path / "out"))


def test_demos_default_to_the_bundled_student(recipe, tmp_path, monkeypatch):
    """`serve.py demo --world sim` and the bundled-sample demo, given no weights, stream the bundled
    student at its training size; the sim summary's PSNR is scikit-image's on the written frames."""
    from skimage.metrics import peak_signal_noise_ratio

    monkeypatch.setenv(WEIGHTS_ENV, str(recipe["weights"]))
    s = demo.run_sim(tmp_path / "sim", task="push_block", num_frames=21, episode_frames=21)
    assert s["weights"] == "bundled student" and s["resolution"] == [32, 64] and s["frames"] == 21
    with np.load(tmp_path / "sim" / "episode.npz") as z:
        video, truth = z["frames"], z["ground_truth"]
    for key, pred in (("psnr_vs_truth_db", video), ("copy_first_frame_psnr_db", np.repeat(truth[:1], len(truth), 0))):
        oracle = np.mean([peak_signal_noise_ratio(truth[i], pred[i], data_range=255) for i in range(1, len(truth))])
        assert s[key] == pytest.approx(oracle, abs=2e-3), key
    sample = demo.run(tmp_path / "sample", num_frames=9)
    assert sample["weights"] == "bundled student" and sample["resolution"] == [32, 64] and sample["frames"] == 9
    assert sample["sampling"]["student"]["chunk_frames"] == 21


def test_steps_flag_streams_the_student_with_fewer_passes(recipe, tmp_path, monkeypatch):
    """`serve.py demo --steps 3`: the student streams 3 denoising passes per block on the schedule
    recomputed at its shift, reported in the summary; other weights and no flag are left alone."""
    from rynn_jax.serving.assemble import Weights
    from rynn_jax.serving.block_step import step_schedule

    monkeypatch.setenv(WEIGHTS_ENV, str(recipe["weights"]))
    w = choose_weights(None, None)
    three = w.with_student_steps(3)
    assert three.spec.steps.num_steps == 3 and w.spec.steps.num_steps == 4
    assert dataclasses.replace(three.spec.steps, num_steps=4) == w.spec.steps and three.spec.causal == w.spec.causal
    assert w.with_student_steps(None) is w and Weights(None, None, None, "tiny").with_student_steps(3).spec is None
    with pytest.raises(UserError, match="--steps must be ≥ 1"):
        w.with_student_steps(0)
    timesteps, sigmas = step_schedule(three.spec.steps)
    k = three.spec.steps.shift  # σ' = kσ / (1 + (k − 1)σ) at σ = 1, 2/3, 1/3, then 0
    np.testing.assert_allclose(sigmas, [1.0] + [k * u / (1 + (k - 1) * u) for u in (2 / 3, 1 / 3)] + [0.0],
                               rtol=5e-4)  # on the 1000-step timestep grid (σ₀ = 0.9998)
    runs = {n: demo.run(tmp_path / str(n), num_frames=9, steps=n) for n in (None, 3)}
    assert runs[None]["sampling"]["student"]["steps"]["num_steps"] == 4
    assert runs[3]["sampling"]["student"]["steps"]["num_steps"] == 3
    with np.load(tmp_path / "None" / "episode.npz") as a, np.load(tmp_path / "3" / "episode.npz") as b:
        assert a["frames"].shape == b["frames"].shape and np.abs(a["frames"].astype(int) - b["frames"]).max() > 0
