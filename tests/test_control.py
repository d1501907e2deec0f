"""Control branch (paper Eq. 3, released code's behaviour): statistics against a float64 NumPy
reference written from the formulas, the modes and the null condition, released-layout loading."""

from __future__ import annotations

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import save_file

from rynn_jax.convert import main as convert_main
from rynn_jax.models import control
from rynn_jax.models.dit import WanDiTConfig, init_dit
from rynn_jax.models.dit_weights import dit_params_from_state_dict, load_dit

BASE = WanDiTConfig.tiny(num_layers=1)  # control_channels = in_channels = 8
C = BASE.in_channels
M = BASE.control_stats_momentum
SHAPE = (2, 3, 4, 6, C)


# --------------------------------------------------------------------------------------------------
# The float64 reference (the released RynnWorld training code): per-channel statistics pooled over (B, T, H, W), unbiased σ + 1e-8;
# running values start at the first batch, then running ← running + 0.01·(batch − running).
# --------------------------------------------------------------------------------------------------


def ref_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, np.float64).reshape(-1, x.shape[-1])
    n = x.shape[0]
    mean = x.sum(0) / n
    return mean, np.sqrt(((x - mean) ** 2).sum(0) / (n - 1)) + 1e-8


def ref_running(batches: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    run = None
    for b in batches:
        s = ref_stats(b)
        run = s if run is None else tuple(r + 0.01 * (v - r) for r, v in zip(run, s))
    return run


def ref_align(c, mean_c, std_c, mean_z, std_z) -> np.ndarray:
    return (np.asarray(c, np.float64) - mean_c) / std_c * std_z + mean_z


def ref_patch_tokens(x_bthwc: np.ndarray, w_pqrcd: np.ndarray, b_d: np.ndarray) -> np.ndarray:
    """Conv3d with kernel = stride = patch, as tokens (B, L, D) in (t, h, w) order, float64."""
    b, t, h, w, c = x_bthwc.shape
    pt, ph, pw = BASE.patch_size
    x = np.asarray(x_bthwc, np.float64).reshape(b, t // pt, pt, h // ph, ph, w // pw, pw, c)
    x = x.transpose(0, 1, 3, 5, 2, 4, 6, 7).reshape(b, -1, pt * ph * pw * c)
    return x @ np.asarray(w_pqrcd, np.float64).reshape(-1, w_pqrcd.shape[-1]) + np.asarray(b_d, np.float64)


def _batch(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(control, clean video latent) with per-sample offsets, so batch pooling ≠ per-sample pooling."""
    rng = np.random.default_rng(seed)
    off = rng.normal(0, 2, (2, 1, 1, 1, C))
    c = 2.0 + off + 3.0 * rng.standard_normal(SHAPE)
    z = -0.5 - off + 0.7 * rng.standard_normal(SHAPE) * np.linspace(0.5, 1.5, C)
    return c.astype(np.float32), z.astype(np.float32)


def _close(got, want) -> None:
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-6, atol=1e-6)


def _branch(cfg: WanDiTConfig = dataclasses.replace(BASE, control="add-plus")) -> control.ControlBranch:
    with nnx.use_eager_sharding(False):
        return control.ControlBranch(cfg, rngs=nnx.Rngs(0))


def _stats(branch) -> dict:
    return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(branch, control.ControlStats)))


def test_batch_stats_are_pooled_and_unbiased():
    c, _ = _batch(0)
    mean, std = control.batch_stats(jnp.asarray(c))
    want_mean, want_std = ref_stats(c)
    _close(mean, want_mean)
    _close(std, want_std)
    # The checks can tell the estimators apart: per-sample pooling and the biased σ are far off.
    assert np.abs(c.std(axis=(0, 1, 2, 3)) - want_std).max() > 1e-3
    assert np.abs(c[:1].mean(axis=(0, 1, 2, 3)) - want_mean).max() > 1e-2


def test_running_stats_first_batch_momentum_and_eval_against_reference():
    """A jitted train call per batch (as the train step does it: split, merge, return the state)
    then eval calls, each against the float64 reference."""
    branch = _branch()
    graphdef, state = nnx.split(branch)

    @jax.jit
    def train_call(state, c, z):
        b = nnx.merge(graphdef, state)
        e = b.align(c, z, train=True)
        return e, nnx.state(b)

    batches = [_batch(s) for s in range(4)]
    for i, (c, z) in enumerate(batches):
        e, state = train_call(state, jnp.asarray(c), jnp.asarray(z))
        run_c = ref_running([b[0] for b in batches[:i + 1]])
        run_z = ref_running([b[1] for b in batches[:i + 1]])
        st = jax.tree.map(np.asarray, nnx.to_pure_dict(state))
        if i == 0:  # the first batch is the start, exactly
            _close(st["control_stats"]["mean"], ref_stats(c)[0])
        for name, want in (("control_stats", run_c), ("video_stats", run_z)):
            _close(st[name]["mean"], want[0])
            _close(st[name]["std"], want[1])
            assert int(st[name]["count"]) == i + 1
        # Training aligns with the updated running μ_c, σ_c and this batch's clean-latent μ_z, σ_z.
        _close(e, ref_align(c, *run_c, *ref_stats(z)))

    # Eval: no update; μ_z, σ_z are the recorded clean-video statistics (no ground truth).
    branch = nnx.merge(graphdef, state)
    before = _stats(branch)
    c_new, z_new = _batch(9)
    e = branch.align(jnp.asarray(c_new), None, train=False)
    _close(e, ref_align(c_new, *run_c, *run_z))
    e_gt = branch.align(jnp.asarray(c_new), jnp.asarray(z_new), train=False)  # ground truth given: used
    _close(e_gt, ref_align(c_new, *run_c, *ref_stats(z_new)))
    jax.tree.map(np.testing.assert_array_equal, _stats(branch), before)

    # The fixed prior only when asked for.
    prior = dataclasses.replace(branch.cfg, control_video_stats="prior")
    branch.cfg = prior
    _close(branch.align(jnp.asarray(c_new), None, train=False), ref_align(c_new, *run_c, 0.0, 0.8))


def test_fallbacks_without_recorded_statistics():
    c, _ = _batch(1)
    branch = _branch()  # nothing recorded: μ_c, σ_c = 0, 1 and μ_z, σ_z := μ_c, σ_c → e_c = c exactly
    np.testing.assert_array_equal(branch.align(jnp.asarray(c), None, train=False), c)
    branch.control_stats.mean[...] = jnp.arange(C, dtype=jnp.float32)
    branch.control_stats.std[...] = jnp.full((C,), 2.0)
    branch.control_stats.count[...] = jnp.asarray(5, jnp.int32)
    # control statistics recorded, video statistics never: the control's own are used for μ_z, σ_z
    _close(branch.align(jnp.asarray(c), None, train=False), np.asarray(c, np.float64))
    branch.video_stats.mean[...] = jnp.full((C,), 0.25)
    branch.video_stats.std[...] = jnp.full((C,), 0.5)
    branch.video_stats.count[...] = jnp.asarray(1, jnp.int32)
    _close(branch.align(jnp.asarray(c), None, train=False), ref_align(c, np.arange(C), 2.0, 0.25, 0.5))
    with pytest.raises(ValueError, match="needs the clean video latent"):
        branch.align(jnp.asarray(c), None, train=True)


# --------------------------------------------------------------------------------------------------
# Modes and the null condition, through the whole model
# --------------------------------------------------------------------------------------------------


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    z = jnp.asarray(rng.standard_normal(SHAPE), jnp.float32)
    c, gt = (jnp.asarray(a) for a in _batch(seed + 1))
    t = jnp.array([[0.0, 800.0, 800.0], [0.0, 300.0, 300.0]])
    ctx = jnp.asarray(rng.standard_normal((2, BASE.text_len, BASE.text_dim)), jnp.float32)
    return z, c, gt, t, ctx


@functools.partial(jax.jit, static_argnums=0, static_argnames=("null_control",))
def _forward(graphdef, state, z, t, ctx, c, null_control=False):
    return nnx.merge(graphdef, state)(z, t, ctx, c, null_control=null_control)


@functools.partial(jax.jit, static_argnums=0)
def _train_forward(graphdef, state, z, t, ctx, c, gt):
    model = nnx.merge(graphdef, state)
    return model(z, t, ctx, c, gt_latent_bthwc=gt, train=True), nnx.state(model)


def run(model, z, t, ctx, c=None, *, gt=None, train=False, null_control=False) -> np.ndarray:
    """The model's forward, jitted (as training and serving call it); a train call updates `model`."""
    graphdef, state = nnx.split(model)
    if not train:
        return np.asarray(_forward(graphdef, state, z, t, ctx, c, null_control=null_control))
    out, new = _train_forward(graphdef, state, z, t, ctx, c, gt)
    nnx.update(model, new)
    return np.asarray(out)


@pytest.fixture(scope="module")
def base_model():
    return init_dit(BASE, seed=3)


def _controlled(base, mode: str, random_branch: bool = False):
    """A controlled model sharing every base parameter with `base`; optionally a non-zero branch."""
    ctrl = init_dit(dataclasses.replace(BASE, control=mode), seed=3)
    nnx.update(ctrl, nnx.state(base, nnx.Param))
    if random_branch:
        rng = np.random.default_rng(7)
        ctrl.control.embed[...] = jnp.asarray(0.1 * rng.standard_normal(ctrl.control.embed.shape), jnp.float32)
        ctrl.control.embed_bias[...] = jnp.asarray(0.1 * rng.standard_normal(BASE.dim), jnp.float32)
    return ctrl


@pytest.mark.parametrize("mode", ["add", "add-plus", "concat"])
def test_zero_init_and_null_condition_give_the_base_output(base_model, mode):
    z, c, gt, t, ctx = _inputs()
    want = run(base_model, z, t, ctx)
    ctrl = _controlled(base_model, mode)
    np.testing.assert_array_equal(run(ctrl, z, t, ctx, c), want)  # zero-initialised branch
    if mode == "add-plus":  # the only mode with training-time behaviour (its statistics)
        np.testing.assert_array_equal(run(ctrl, z, t, ctx, c, gt=gt, train=True), want)
    if mode != "concat":
        assert float(ctrl.control.gate[...]) == pytest.approx(0.1)
    trained = _controlled(base_model, mode, random_branch=True)
    assert np.abs(run(trained, z, t, ctx, c) - want).max() > 1e-4  # the branch acts
    # The null condition, with or without a control latent at hand.
    np.testing.assert_array_equal(run(trained, z, t, ctx, c if mode == "add" else None, null_control=True), want)


@pytest.mark.parametrize("mode", ["add", "add-plus", "concat"])
def test_mode_tokens_match_the_formulas(base_model, mode):
    _, c, gt, _, _ = _inputs()
    br = _controlled(base_model, mode, random_branch=True).control
    w, b = np.asarray(br.embed[...]), np.asarray(br.embed_bias[...])
    if mode == "add":  # patch_c(c) · α, no statistics at all
        assert not nnx.state(br, control.ControlStats)
        want = 0.1 * ref_patch_tokens(np.asarray(c), w, b)
    elif mode == "add-plus":  # one training call records the statistics, then eval
        br(c, gt, train=True)
        want = 0.1 * ref_patch_tokens(ref_align(c, *ref_stats(np.asarray(c)), *ref_stats(np.asarray(gt))), w, b)
    else:
        want = ref_patch_tokens(np.asarray(c), w, b)
    np.testing.assert_allclose(np.asarray(br(c), np.float64), want, rtol=1e-5, atol=1e-5)


def test_training_forward_updates_statistics_eval_does_not(base_model):
    z, c, gt, t, ctx = _inputs()
    ctrl = _controlled(base_model, "add-plus")
    run(ctrl, z, t, ctx, c)
    assert int(ctrl.control.control_stats.count[...]) == 0
    run(ctrl, z, t, ctx, c, gt=gt, train=True)
    _close(ctrl.control.control_stats.std[...], ref_stats(np.asarray(c))[1])
    _close(ctrl.control.video_stats.mean[...], ref_stats(np.asarray(gt))[0])


def test_gradients_reach_the_control_branch(base_model):
    ctrl = _controlled(base_model, "add-plus")
    z, c, gt, t, ctx = _inputs()
    graphdef, params, rest = nnx.split(ctrl, nnx.Param, ...)

    @jax.jit
    def loss(params):
        model = nnx.merge(graphdef, params, rest)
        return jnp.mean(jnp.square(model(z, t, ctx, c, gt_latent_bthwc=gt)))

    g_embed = np.asarray(nnx.to_pure_dict(jax.grad(loss)(params))["control"]["embed"])
    assert np.abs(g_embed).max() > 1e-6  # zero weights, but α ≠ 0: the branch learns
    # Central finite difference of the largest control-weight gradient.
    idx = np.unravel_index(np.argmax(np.abs(g_embed)), g_embed.shape)
    eps = 1e-2

    def bumped(sign):
        p = jax.tree.map(lambda x: x, params)
        p["control"]["embed"][...] = p["control"]["embed"][...].at[idx].add(sign * eps)
        return float(loss(p))

    assert (bumped(+1) - bumped(-1)) / (2 * eps) == pytest.approx(float(g_embed[idx]), rel=2e-2)


def test_bad_control_inputs(base_model):
    ctrl = _controlled(base_model, "add-plus")
    z, c, _, t, ctx = _inputs()
    with pytest.raises(ValueError, match="pass the control latent"):
        run(ctrl, z, t, ctx)
    with pytest.raises(ValueError, match="does not align"):
        run(ctrl, z, t, ctx, c[:, :2])
    with pytest.raises(ValueError, match="channels, expected 8"):
        run(ctrl, z, t, ctx, c[..., :5])
    with pytest.raises(ValueError, match="cfg.control is 'none'"):
        run(base_model, z, t, ctx, c)
    with pytest.raises(ValueError, match="control must be one of"):
        WanDiTConfig.tiny(control="additive")
    with pytest.raises(ValueError, match="must equal in_channels"):
        _branch(dataclasses.replace(BASE, control="add-plus", control_channels=6))
    for mode in ("add", "concat"):  # no alignment: any channel count
        assert _branch(dataclasses.replace(BASE, control=mode, control_channels=6)).embed.shape[3] == 6


# --------------------------------------------------------------------------------------------------
# Released checkpoints: weights alone, statistics in a separate record
# --------------------------------------------------------------------------------------------------


def _released_files(tmp_path, cfg: WanDiTConfig = BASE):
    """A released-layout safetensors file (release names, no statistics) and a statistics record,
    written by hand in the documented JSON layout."""
    from tests.test_convert import _tiny_diffusers_state_dict

    sd, _ = _tiny_diffusers_state_dict(cfg, seed=1)
    rng = np.random.default_rng(0)
    extra = {"control_patch_embedding.weight": rng.standard_normal((cfg.dim, C, 1, 2, 2)).astype(np.float32),
             "control_patch_embedding.bias": rng.standard_normal(cfg.dim).astype(np.float32),
             "control_scale": np.array([0.37], np.float32)}
    save_file({**sd, **extra}, str(tmp_path / "model.safetensors"))
    record = {"control": {"mean": np.linspace(-1, 1, C).tolist(), "std": np.linspace(0.5, 2, C).tolist(),
                          "count": 1200, "momentum": 0.01},
              "video": {"mean": [0.1] * C, "std": [0.9] * C, "count": 1200, "momentum": 0.01}}
    (tmp_path / "stats.json").write_text(json.dumps(record))
    return sd, extra, record


def test_released_layout_loads_with_separate_statistics(tmp_path):
    sd, extra, record = _released_files(tmp_path)
    cfg = dataclasses.replace(BASE, control="add-plus")
    model = load_dit(tmp_path / "model.safetensors", cfg, stats=tmp_path / "stats.json")
    np.testing.assert_array_equal(model.control.embed[...],
                                  extra["control_patch_embedding.weight"].transpose(2, 3, 4, 1, 0))
    np.testing.assert_array_equal(model.control.embed_bias[...], extra["control_patch_embedding.bias"])
    assert float(model.control.gate[...]) == np.float32(0.37)
    for name, attr in (("control", "control_stats"), ("video", "video_stats")):
        rs = getattr(model.control, attr)
        np.testing.assert_array_equal(rs.mean[...], np.float32(record[name]["mean"]))
        np.testing.assert_array_equal(rs.std[...], np.float32(record[name]["std"]))
        assert int(rs.count[...]) == 1200
    # Every key of the file is consumed: one key more is refused, one less is missing.
    with pytest.raises(Exception, match="unexpected key 'control_running_mean'"):
        dit_params_from_state_dict({**sd, **extra, "control_running_mean": np.zeros(C, np.float32)}, cfg)
    with pytest.raises(Exception, match="missing key 'control_scale'"):
        dit_params_from_state_dict({**sd, **{k: v for k, v in extra.items() if k != "control_scale"}}, cfg)
    # Without a record: nothing recorded (control.py's default, e_c = c); "add" ignores statistics.
    bare = load_dit(tmp_path / "model.safetensors", cfg)
    assert int(bare.control.control_stats.count[...]) == 0 and int(bare.control.video_stats.count[...]) == 0
    plain = load_dit(tmp_path / "model.safetensors", dataclasses.replace(BASE, control="add"))
    assert float(plain.control.gate[...]) == np.float32(0.37)
    with pytest.raises(ValueError, match="only used by control='add-plus'"):
        load_dit(tmp_path / "model.safetensors", dataclasses.replace(BASE, control="add"),
                 stats=tmp_path / "stats.json")


def test_statistics_record_roundtrip_and_errors(tmp_path):
    cfg = dataclasses.replace(BASE, control="add-plus")
    _, _, record = _released_files(tmp_path)
    values = control.read_stats(tmp_path / "stats.json", cfg)
    control.write_stats(tmp_path / "again.json", values, cfg)
    again = json.loads((tmp_path / "again.json").read_text())
    for name in ("control", "video"):
        np.testing.assert_array_equal(np.float32(again[name]["mean"]), np.float32(record[name]["mean"]))
        assert again[name]["count"] == 1200 and again[name]["momentum"] == 0.01
    del record["video"]  # video statistics never recorded: allowed
    (tmp_path / "no_video.json").write_text(json.dumps(record))
    assert int(control.read_stats(tmp_path / "no_video.json", cfg)["video_stats"]["count"]) == 0
    for bad, msg in (({"control": {"mean": [0.0] * 3, "std": [1.0] * 3, "count": 1}}, "channels"),
                     ({"video": record["control"]}, "keys 'control'"),
                     ({"control": {"mean": [0.0] * C, "std": [0.0] * C, "count": 1}}, "positive stds"),
                     ({"control": {"mean": [0.0] * C}}, "needs mean, std")):
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=msg):
            control.read_stats(tmp_path / "bad.json", cfg)


def test_convert_cli_keeps_the_statistics_beside_the_weights(tmp_path):
    cli_cfg = WanDiTConfig.tiny(control="add-plus")  # the CLI's "tiny" preset
    _released_files(tmp_path, cli_cfg)
    out = tmp_path / "converted"
    with pytest.raises(ValueError, match="--control-stats"):  # a bad record is refused before anything is written
        (tmp_path / "bad.json").write_text("{}")
        convert_main(["dit", str(tmp_path / "model.safetensors"), str(out), "--config", "tiny",
                      "--control", "add-plus", "--control-stats", str(tmp_path / "bad.json")])
    assert not out.exists()
    convert_main(["dit", str(tmp_path / "model.safetensors"), str(out), "--config", "tiny",
                  "--control", "add-plus", "--control-stats", str(tmp_path / "stats.json")])
    want = load_dit(tmp_path / "model.safetensors", cli_cfg, stats=tmp_path / "stats.json")
    got = load_dit(out)
    assert got.cfg.control == "add-plus"
    jax.tree.map(np.testing.assert_array_equal, nnx.to_pure_dict(nnx.state(got)), nnx.to_pure_dict(nnx.state(want)))
