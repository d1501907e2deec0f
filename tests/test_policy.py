"""The RynnWorld-4D policy (rynn_jax/policy): flow-matching head on a known distribution,
deterministic sampling, action normalisation, SPEC-size parameter count, closed loop in the sim."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rynn_jax.data.errors import DataError
from rynn_jax.policy import config as config_lib
from rynn_jax.policy import flow, inference, model
from rynn_jax.policy.normalize import ActionNormalizer

TOY_HEAD = config_lib.HeadConfig(dim=32, heads=2, encoder_layers=1, decoder_layers=2, goal_dim=4, goal_len=1,
                                 proprio_dim=1, action_dim=1, chunk=1, attn_dropout=0.0, resid_dropout=0.0,
                                 mlp_dropout=0.0)
MODES, MODE_STD = (-1.5, 1.5), 0.15
WEIGHT_HI = {+1.0: 0.75, -1.0: 0.25}  # P(upper mode) given the proprioceptive input


def _mixture(rng: np.random.Generator, cond: np.ndarray) -> np.ndarray:
    upper = rng.random(len(cond)) < np.vectorize(WEIGHT_HI.get)(cond)
    return np.where(upper, MODES[1], MODES[0]) + MODE_STD * rng.standard_normal(len(cond))


@pytest.fixture(scope="module")
def trained_toy_head():
    """The action head trained by flow matching on a 1-D two-mode mixture whose weights depend on
    the proprioceptive token (so the samples must read the encoder's context)."""
    head = model.ActionHead(TOY_HEAD, vision_dim=4, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(head, nnx.Param)
    tx = optax.adam(3e-3)

    def ctx(h, cond):
        b = cond.shape[0]
        return h.encode(jnp.zeros((b, 1, 4)), jnp.zeros((b, 1, 4)), cond[:, None])

    @jax.jit
    def step(params, opt, cond, a, key):
        def loss_fn(p):
            h = nnx.merge(graphdef, p)
            c = ctx(h, cond)
            return flow.loss(lambda x, t: h.velocity(c, x, t), a[:, None, None], key)
        loss, g = jax.value_and_grad(loss_fn)(params)
        upd, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, upd), opt, loss

    rng = np.random.default_rng(0)
    opt = tx.init(params)
    for i in range(700):
        cond = rng.choice([-1.0, 1.0], 256)
        params, opt, _ = step(params, opt, jnp.asarray(cond, jnp.float32), jnp.asarray(_mixture(rng, cond), jnp.float32),
                              jax.random.key(i))

    @jax.jit
    def sample(params, cond, key):
        h = nnx.merge(graphdef, params)
        c = ctx(h, cond)
        return flow.sample(lambda x, t: h.velocity(c, x, t), (cond.shape[0], 1, 1), key, steps=4)[:, 0, 0]

    return lambda cond, key: np.asarray(sample(params, jnp.asarray(cond, jnp.float32), key))


@pytest.mark.parametrize("cond", [-1.0, 1.0])
def test_flow_head_learns_two_mode_mixture(trained_toy_head, cond):
    x = trained_toy_head(np.full(4000, cond), jax.random.key(7))
    upper = x > 0
    assert abs(upper.mean() - WEIGHT_HI[cond]) < 0.06, upper.mean()
    assert abs(x[upper].mean() - MODES[1]) < 0.2 and abs(x[~upper].mean() - MODES[0]) < 0.2
    assert np.mean(np.abs(x) < 0.5) < 0.05  # little mass between the modes


def test_sampling_is_deterministic_given_the_key(trained_toy_head):
    cond = np.ones(64)
    a, b = trained_toy_head(cond, jax.random.key(3)), trained_toy_head(cond, jax.random.key(3))
    c = trained_toy_head(cond, jax.random.key(4))
    assert np.array_equal(a, b) and not np.allclose(a, c)


def test_euler_sampler_integrates_a_known_field():
    """v = a − x (the optimal field toward a fixed chunk a): n Euler steps from ε leave
    x = a + (ε − a)·(1 − 1/n)^n exactly."""
    a = jnp.asarray([[2.0, -1.0, 0.5]])
    x = flow.sample(lambda x, t: a - x, a.shape, jax.random.key(0), steps=4)
    eps = jax.random.normal(jax.random.key(0), a.shape)
    np.testing.assert_allclose(x, a + (eps - a) * (1 - 1 / 4) ** 4, rtol=1e-6)


def test_normalisation_round_trips(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.normal(0.3, 0.8, (500, 54)).astype(np.float32)
    a[:, 5] = 0.7  # a joint that never moves: std 0
    stats = {"mean": a.mean(0, dtype=np.float64).tolist(), "std": a.std(0, dtype=np.float64).tolist()}
    (tmp_path / "action_stats.json").write_text(json.dumps(stats))
    norm = ActionNormalizer.from_file(tmp_path)
    z = norm.normalize(a)
    expect = (a.astype(np.float64) - a.mean(0, dtype=np.float64)) / np.maximum(a.std(0, dtype=np.float64), 1e-6)
    np.testing.assert_allclose(z, expect, atol=1e-4)
    np.testing.assert_allclose(norm.denormalize(z), a, atol=1e-5)
    (tmp_path / "action_stats.json").write_text(json.dumps({"mean": [0.0] * 3}))
    with pytest.raises(DataError, match="action_stats.json"):
        ActionNormalizer.from_file(tmp_path)


def _compressor_params(c: config_lib.CompressorConfig) -> int:
    d, inner = c.dim, c.heads * c.head_dim
    per_layer = (4 * d + 3 * d * inner + inner * d) + (2 * d + 3 * (d * d + d) + d * d + d) + (2 * d + 2 * c.ff_mult * d * d)
    return (c.in_dim * c.hidden_dim + c.hidden_dim + c.hidden_dim * d + d + c.num_frames * d
            + c.num_tokens * d + c.layers * per_layer + 2 * d)


def _head_params(h: config_lib.HeadConfig, vision_dim: int) -> int:
    d = h.dim
    mlp = lambda i: i * 2 * d + 2 * d + 2 * d * d + d  # noqa: E731
    attn = lambda out_bias: 2 * d + 3 * (d * d + d) + d * d + (d if out_bias else 0)  # noqa: E731
    enc = attn(False) + 2 * d + 8 * d * d
    dec = d * 6 * d + 6 * d + 2 * attn(False) + 8 * d * d
    return (mlp(h.goal_dim) + vision_dim * d + d + mlp(h.proprio_dim) + h.encoder_layers * enc + 2 * d
            + mlp(d) + h.action_dim * d + d + h.decoder_layers * dec + 2 * d + d * h.action_dim + h.action_dim)


def test_spec_size_parameter_count():
    """jax.eval_shape of the SPEC-size policy (nothing allocated) against the count written out
    from SPEC_4D §4's dimensions: Flow Former 9216 → 768 → 384, 21 × 16 queries, 6 layers of
    Perceiver (8 × 64) + temporal attention + FFN ×4; head 384-d, 4 + 4 layers, 32 goal tokens."""
    cfg = config_lib.PolicyConfig.full("world4d")
    c = cfg.compressor
    assert (c.in_dim, c.hidden_dim, c.dim, c.num_tokens, c.layers) == (9216, 768, 384, 336, 6)
    assert model.count_params(cfg) == _compressor_params(c) + _head_params(cfg.head, c.dim) == 47_525_814


@pytest.fixture(scope="module")
def closed_loop():
    from rynn_jax.policy import rollout

    untrained = inference.from_params(config_lib.PolicyConfig.tiny("cnn"), None,
                                      ActionNormalizer(np.zeros(54, np.float32), np.full(54, 0.05, np.float32)))
    scripted = rollout.run_trial(rollout.ScriptedActor(), "push_block", 100_000, resolution=(64, 112), time_limit_s=8.0)
    policy = rollout.run_trial(rollout.PolicyActor(untrained, "untrained"), "push_block", 100_000,
                               resolution=(64, 112), time_limit_s=1.25)
    return scripted, policy


def test_closed_loop_scripted_reference_succeeds(closed_loop):
    from rynn_jax.sim.episode import goal_reached

    r = closed_loop[0]
    scene, d, robot = r["sim"]
    assert r["success"] and goal_reached(scene, d)[0] and all(v is None for v in robot.attached.values())
    assert r["frames"] % 10 == 0 and r["video"].shape == (r["frames"] + 1, 64, 112, 3)
    assert not r["unstable"] and 0 < r["max_object_speed_mps"] <= 3.0  # the pushed block moved, gently


def test_a_flung_object_is_no_success(closed_loop):
    """The goal reached after an object flew faster than the data generator allows (an unstable
    contact, e.g. an arm slammed into the block) is a failure, flagged `unstable`."""
    from rynn_jax.policy.rollout import succeeded
    from rynn_jax.sim.episode import MAX_OBJECT_SPEED

    scene, d, robot = closed_loop[0]["sim"]
    speed = robot.max_speed
    try:
        robot.max_speed = 1.01 * MAX_OBJECT_SPEED
        ok, verdict = succeeded(scene, d, robot)
        assert not ok and verdict["unstable"] and verdict["goal_reached"]
        robot.max_speed = 0.99 * MAX_OBJECT_SPEED
        ok, verdict = succeeded(scene, d, robot)
        assert ok and not verdict["unstable"]
    finally:
        robot.max_speed = speed


def test_closed_loop_policy_flag_is_the_sims_check(closed_loop):
    from rynn_jax.sim.episode import goal_reached

    r = closed_loop[1]
    scene, d, robot = r["sim"]
    ok = goal_reached(scene, d)[0] and all(v is None for v in robot.attached.values())
    assert r["success"] == ok
    assert r["frames"] == 20 and r["video"].shape == (21, 64, 112, 3)  # 1.25 s = 20 frames: two chunks
    home = closed_loop[0]["sim"][2].q  # the scripted run's last joints differ from the untrained policy's
    assert not np.allclose(robot.q, home)


def test_policy_cli_rejects_bad_flags(capsys):
    import serve

    from rynn_jax import errors

    assert errors.run(serve.main, ["policy", "--task", "juggle", "--scripted"]) == 2
    assert "--task juggle" in capsys.readouterr().err
    assert errors.run(serve.main, ["policy", "--task", "push_block"]) == 2  # neither --policy nor --scripted
    assert errors.run(serve.main, ["policy", "--task", "push_block", "--scripted", "--execute", "11"]) == 2
    assert "--execute 11: need 1 … 10" in capsys.readouterr().err  # the scripted actor's 10-action chunk


def test_policy_config_round_trips_and_checks():
    cfg = config_lib.PolicyConfig.full("world4d_rgb")
    assert config_lib.from_dict(json.loads(json.dumps(config_lib.to_dict(cfg)))) == cfg
    with pytest.raises(ValueError, match="num_frames"):
        config_lib.PolicyConfig(encoder="cnn")  # 21 frames for a one-frame encoder
    assert math.prod(cfg.backbone.image_size) == 480 * 640


def test_synthetic_recipe_rows_differ_only_in_the_vision_encoder():
    """configs/policy_world4d_synthetic.py: rows (a) world4d, (b) world4d_rgb and (c) cnn share the
    head, optimiser, data, step budget, image size and number of vision tokens; only where the vision
    tokens come from differs (feature width, frames). The 4D rows' sizes follow the 4D recipe."""
    import dataclasses

    from configs import world4d_synthetic
    from rynn_jax.policy.train import PolicyTrainConfig
    from rynn_jax.training.config import run_recipe

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "policy_world4d_synthetic.py")
    rows = {a: run_recipe(path, PolicyTrainConfig, a) for a in ("world4d", "world4d_rgb", "cnn")}
    dim = world4d_synthetic.model().base.dim
    assert [rows[a].policy.compressor.in_dim for a in rows] == [3 * dim, dim, rows["cnn"].policy.cnn.channels[-1]]
    assert rows["cnn"].policy.compressor.num_frames == 1
    shared = lambda c: (c.policy.head, c.optim, c.data, c.total_steps, c.policy.image_size,  # noqa: E731
                        c.policy.compressor.num_tokens, dataclasses.replace(
                            c.policy.compressor, in_dim=0, num_frames=1, queries_per_frame=1))
    assert shared(rows["world4d"]) == shared(rows["world4d_rgb"]) == shared(rows["cnn"])
    with pytest.raises(ValueError, match="encoder must be"):
        run_recipe(path, PolicyTrainConfig, "resnet")


def test_fp8_backbone_with_calibrated_static_scales(tmp_path):
    """backbone.fp8_scales: the per-token FP8 backbone calibrated on observations as the control step
    builds them (World4DFeatures.calibrate_fp8; the toy backbone's third block is past the feature
    layer, so it is not required), saved, and loaded by a policy config: its features are the
    calibrated model's and stay near the float backbone's; fp8_scales without fp8 is refused."""
    import dataclasses

    from rynn_jax.models import fp8
    from rynn_jax.policy.encoders import World4DFeatures

    base = config_lib.PolicyConfig.tiny("world4d")
    with_fp8 = lambda **kw: dataclasses.replace(base, backbone=dataclasses.replace(base.backbone, **kw))  # noqa: E731
    rng = np.random.default_rng(3)
    h, w = base.backbone.image_size

    def obs():
        image = lambda: rng.integers(0, 256, (1, h, w, 3), dtype=np.uint8)  # noqa: E731
        return image(), image(), rng.standard_normal((1, base.head.goal_len, base.head.goal_dim)).astype(np.float32)

    per_token = World4DFeatures(with_fp8(fp8=True))
    static = per_token.calibrate_fp8([(*obs(), jax.random.key(k)) for k in range(2)])
    assert static.cfg.base.fp8_activations == "static"
    fp8.save_scales(tmp_path / "scales.safetensors", static)
    loaded = World4DFeatures(with_fp8(fp8=True, fp8_scales=str(tmp_path / "scales.safetensors")))
    rgb, depth, goal = obs()
    key = jax.random.key(7)
    feats = {name: np.asarray(jax.jit(enc.apply)(enc.params, rgb, depth, goal, key))
             for name, enc in (("float", World4DFeatures(base)), ("per_token", per_token), ("static", loaded))}
    stacked = World4DFeatures(with_fp8(fp8=True, fp8_scales=str(tmp_path / "scales.safetensors"), unrolled=False))
    want, got = fp8.static_scales(static), fp8.static_scales(nnx.merge(stacked._dit_def, stacked.params["dit"]))
    assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)
    z, t_bf = loaded.latents(loaded.params, rgb, depth, key)
    np.testing.assert_allclose(feats["static"], np.asarray(jax.jit(
        lambda: loaded.features(None, z, t_bf, goal, dit=static))()), rtol=1e-5, atol=1e-5)
    err = {k: float(np.linalg.norm(feats[k] - feats["float"]) / np.linalg.norm(feats["float"]))
           for k in ("per_token", "static")}
    assert 0 < err["static"] <= max(0.1, 1.5 * err["per_token"]), err
    # the same scales swapped into the built per-token backbone (what the policy bench times) = the file's
    swapped = per_token.with_static_scales(want)
    assert swapped.cfg.backbone.fp8_scales and not per_token.cfg.backbone.fp8_scales
    np.testing.assert_array_equal(np.asarray(jax.jit(swapped.apply)(swapped.params, rgb, depth, goal, key)),
                                  feats["static"])
    with pytest.raises(ValueError, match="per-token scales"):
        loaded.with_static_scales(want)
    with pytest.raises(ValueError, match="fp8_scales needs backbone.fp8"):
        config_lib.BackboneConfig(dit="tiny", vae="tiny", fp8_scales="x.safetensors")


def test_world4d_latents_are_the_vae_of_rgb_depth_and_white():
    """The backbone's frame 0 per branch is the VAE latent of the RGB image, the depth image and an
    all-white image (zero flow), the last encoded once at build time; frames after it are the noise
    of the given key; frame 0 is clean. Oracle: the VAE's own encode of the three images."""
    from rynn_jax.models import vae as vae_lib
    from rynn_jax.policy.encoders import World4DFeatures, to_unit

    cfg = config_lib.PolicyConfig.tiny("world4d")
    enc = World4DFeatures(cfg)
    h, w = cfg.backbone.image_size
    rng = np.random.default_rng(5)
    rgb, depth = (rng.integers(0, 256, (2, h, w, 3), dtype=np.uint8) for _ in range(2))
    z, t_bf = jax.jit(enc.latents)(enc.params, rgb, depth, jax.random.key(1))
    images = [to_unit(jnp.asarray(rgb)), to_unit(jnp.asarray(depth)), jnp.ones((2, h, w, 3))]
    for branch, image in zip(z, images):
        want = vae_lib.encode(enc._vae_def, enc.params["vae"], image[:, None])[:, 0]
        np.testing.assert_allclose(np.asarray(branch[:, 0]), np.asarray(want), rtol=1e-5, atol=1e-5)
    assert not np.allclose(np.asarray(z[0][:, 0]), np.asarray(z[2][:, 0]), atol=1e-3)  # distinct images
    assert z[0].shape == (2, cfg.backbone.latent_frames, *z[0].shape[2:])
    assert np.all(np.asarray(t_bf[:, 0]) == 0) and np.all(np.asarray(t_bf[:, 1:]) == cfg.backbone.timestep)


def test_policy_inference_imports_no_data_readers():
    """The control step (and bench/bench_policy.py) imports neither grain, PyAV nor MuJoCo, so it runs
    where only jax/flax are installed; the action statistics' reader loads when they are read."""
    code = ("import sys, rynn_jax.policy.inference, rynn_jax.policy.encoders, rynn_jax.policy.model, "
            "rynn_jax.policy.normalize; print(sorted(m for m in ('grain', 'av', 'mujoco') if m in sys.modules))")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_parallel_trials_equal_sequential(tmp_path):
    """`--workers 2` (spawned processes, one actor each) writes the same trial records and table."""
    from rynn_jax.policy import rollout

    spec = rollout.ActorSpec(policy="tiny-cnn", name="untrained")
    kw = dict(resolution=(64, 112), time_limit_s=1.25, videos=False, seed=100_000)
    t1 = rollout.evaluate(spec, ["push_block"], 3, tmp_path / "one", **kw)
    t2 = rollout.evaluate(spec, ["push_block"], 3, tmp_path / "two", workers=2, **kw)
    assert t1 == t2

    def records(d):
        rows = [json.loads(x) for x in (d / "untrained" / "push_block" / "trials.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k not in ("wall_s", "act_s_per_chunk")} for r in rows]  # timings differ

    one, two = records(tmp_path / "one"), records(tmp_path / "two")
    assert [r["seed"] for r in two] == [100_000, 100_001, 100_002]
    assert one == two
    assert t1["untrained"]["push_block"]["unstable"] == sum(r["unstable"] for r in one)


def test_receding_horizon_observes_every_execute_frames():
    """`execute=K` runs K actions of each chunk, then observes again: the actor is asked at frames
    0, K, 2K, …; the scripted actor (its actions fixed in advance) still succeeds."""
    from rynn_jax.policy import rollout

    class Recording(rollout.ScriptedActor):
        def act(self, rgb_hw3, depth_hw, state, frame):
            self.asked.append(frame)
            return super().act(rgb_hw3, depth_hw, state, frame)

    actor = Recording()
    actor.asked = []
    r = rollout.run_trial(actor, "push_block", 100_000, resolution=(64, 112), time_limit_s=8.0, execute=4)
    assert r["success"] and r["frames"] % 4 == 0
    assert actor.asked == list(range(0, r["frames"], 4))
    with pytest.raises(ValueError, match="execute 11"):
        rollout.run_trial(actor, "push_block", 100_000, resolution=(64, 112), time_limit_s=1.0, execute=11)
