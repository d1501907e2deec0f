"""RynnWorld-4D (models/dit4d.py): its branches are our Wan DiT, its joint attention is the only
coupling (and respects the unidirectional mode and frame boundaries), the RGB clone init, the
released checkpoint layout, and the full-size parameter count."""

from __future__ import annotations

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rynn_jax.models import build, dit4d_weights, rope
from rynn_jax.models.dit import WanDiT, WanDiTConfig, abstract_dit
from rynn_jax.models.dit4d import JointAttention, WanDiT4DConfig, abstract_dit4d, dit4d_from_params
from rynn_jax.weights import ConversionError, flatten_params, unflatten_params

pytestmark = pytest.mark.usefixtures("fast_compile")

CFG = WanDiT4DConfig.tiny()  # 3 blocks, JA at 0 and 2
B, T, H, W = 2, 3, 4, 4


def _params(cfg: WanDiT4DConfig, seed: int, joint_out: bool) -> dict:
    """Every parameter off its init (so a mis-wired one shows); JA output projections and
    modality embeddings zero unless `joint_out`."""
    flat = flatten_params(nnx.to_pure_dict(nnx.state(abstract_dit4d(cfg), nnx.Param)), str_keys=False)
    rng = np.random.default_rng(seed)
    out = {}
    for path, leaf in flat.items():
        base = 1.0 if any("norm" in str(p) or "scale" in str(p) or "gate" in str(p) for p in path) else 0.0
        value = base + 0.3 * rng.standard_normal(leaf.shape)
        if path[0] == "joint" and not joint_out and len(path) > 2 and path[2] in ("out", "embed"):
            value = np.zeros(leaf.shape)
        out[path] = jnp.asarray(value, jnp.float32)
    return unflatten_params(out)


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    z = [jnp.asarray(rng.standard_normal((B, T, H, W, CFG.base.in_channels)), jnp.float32) for _ in range(3)]
    t = jnp.asarray([[0.0, 700.0, 700.0], [0.0, 250.0, 250.0]], jnp.float32)
    ctx = jnp.asarray(rng.standard_normal((B, CFG.base.text_len, CFG.base.text_dim)), jnp.float32)
    return z, t, ctx


@pytest.fixture(scope="module")
def apply4d():
    """One compiled forward of the tiny model, params and the RGB decay as arguments."""
    jitted = jax.jit(lambda p, z, t, ctx, decay: dit4d_from_params(CFG, p)(*z, t, ctx, rgb_decay=decay))
    return lambda p, z, t, ctx, decay=1.0: jitted(p, z, t, ctx, jnp.float32(decay))


@pytest.fixture(scope="module")
def apply_dit():
    return jax.jit(lambda p, z, t, ctx: build.model_from_params(WanDiT, CFG.base, p)(z, t, ctx))


def test_zeroed_joint_output_is_three_independent_wan_dits(apply4d, apply_dit):
    params = _params(CFG, 1, joint_out=False)
    z, t, ctx = _inputs()
    outs = apply4d(params, z, t, ctx)
    for m, zm, v in zip(("rgb", "depth", "flow"), z, outs):
        ref = apply_dit(dit4d_weights.branch_as_dit(params, m), zm, t, ctx)
        np.testing.assert_allclose(v, ref, rtol=1e-5, atol=1e-5, err_msg=m)
    # with the JA output live, every branch moves away from its independent DiT
    coupled = apply4d(_params(CFG, 1, joint_out=True), z, t, ctx)
    for m, v, ref_v in zip(("rgb", "depth", "flow"), coupled, outs):
        assert float(jnp.abs(v - ref_v).max()) > 1e-2, m


def test_unidirectional_rgb_ignores_depth_and_flow_exactly(apply4d):
    cfg = dataclasses.replace(CFG, joint_mode="unidirectional")
    params = _params(cfg, 2, joint_out=True)
    z, t, ctx = _inputs(1)
    model_out = lambda zs, i: jnp.sum(dit4d_from_params(cfg, params)(*zs, t, ctx)[i] ** 2)  # noqa: E731
    g_rgb, g_depth = jax.jit(lambda zs: (jax.grad(model_out)(zs, 0), jax.grad(model_out)(zs, 1)))(z)
    assert np.all(np.asarray(g_rgb[1]) == 0.0) and np.all(np.asarray(g_rgb[2]) == 0.0)  # exactly 0
    assert float(jnp.abs(g_rgb[0]).max()) > 0  # RGB still depends on its own input
    assert float(jnp.abs(g_depth[0]).max()) > 1e-4  # depth reads RGB
    assert np.all(np.asarray(g_depth[2]) == 0.0)  # … and never flow
    # bidirectional (same weights): RGB reads depth and flow
    bumped = [z[0], z[1] + 0.5, z[2]]
    moved = apply4d(params, bumped, t, ctx)[0] - apply4d(params, z, t, ctx)[0]
    assert float(jnp.abs(moved).max()) > 1e-3


@pytest.mark.parametrize("frame_wise", [True, False])
def test_joint_attention_never_mixes_frames(frame_wise):
    cfg = dataclasses.replace(CFG, joint_frame_wise=frame_wise)
    grid = (T, H // 2, W // 2)
    s = grid[1] * grid[2]
    graphdef, state = nnx.split(build.abstract_model(JointAttention, cfg))
    pure = nnx.to_pure_dict(state)
    rng = np.random.default_rng(3)
    nnx.replace_by_pure_dict(state, jax.tree.map(lambda a: jnp.asarray(
        1.0 + 0.3 * rng.standard_normal(a.shape), jnp.float32), pure))
    rope_cs = rope.rope_cos_sin(grid, cfg.base.head_dim)
    x = [jnp.asarray(rng.standard_normal((1, T * s, cfg.base.dim)), jnp.float32) for _ in range(3)]
    run = jax.jit(lambda st, xs: nnx.merge(graphdef, st)(*xs, rope_cs, T))
    before = run(state, x)
    x[1] = x[1].at[:, s:2 * s].add(jnp.asarray(rng.standard_normal((1, s, cfg.base.dim)), jnp.float32))  # depth, frame 1
    after = run(state, x)
    for m in (0, 2):  # rgb and flow read depth
        changed_t = np.abs(np.asarray(after[m] - before[m])).reshape(T, s, -1).max(axis=(1, 2))
        assert changed_t[1] > 1e-3
        if frame_wise:
            assert changed_t[0] == 0.0 and changed_t[2] == 0.0
        else:
            assert changed_t[0] > 1e-3 and changed_t[2] > 1e-3


def test_cloned_init_makes_depth_and_flow_compute_what_rgb_does(apply4d, apply_dit):
    fresh = _params(CFG, 4, joint_out=False)  # stands for a fresh model: JA outputs zero
    dit = _params(dataclasses.replace(CFG, joint_layers=()), 5, joint_out=False)["base"]
    params = dit4d_weights.clone_rgb(fresh, dit)
    z, t, ctx = _inputs(2)
    same = [z[0]] * 3
    v_rgb, v_depth, v_flow = apply4d(params, same, t, ctx)
    np.testing.assert_array_equal(v_depth, v_rgb)
    np.testing.assert_array_equal(v_flow, v_rgb)
    np.testing.assert_allclose(v_rgb, apply_dit(dit, z[0], t, ctx), rtol=1e-5, atol=1e-5)
    with pytest.raises(ConversionError, match="do not fit"):
        dit4d_weights.clone_rgb(fresh, {k: v for k, v in dit.items() if k != "head"})


def test_control_branch_is_shared_by_the_three_branches(apply_dit):
    """Our teleop extension: with the JA output zeroed, each branch of a 4D model with a control
    branch equals a controlled Wan DiT made of that branch (the shared control in every one); the
    skeleton moves every modality; the policy's features run without it (null control)."""
    base = dataclasses.replace(CFG.base, control="add", control_channels=CFG.base.in_channels)
    cfg = dataclasses.replace(CFG, base=base)
    params = _params(cfg, 6, joint_out=False)
    z, t, ctx = _inputs(3)
    c = jnp.asarray(np.random.default_rng(7).standard_normal(z[0].shape), jnp.float32)
    run = jax.jit(lambda p, zs, c: dit4d_from_params(cfg, p)(*zs, t, ctx, c))
    dit = jax.jit(lambda p, zm, c: build.model_from_params(WanDiT, base, p)(zm, t, ctx, c))
    outs = run(params, z, c)
    for m, zm, v in zip(("rgb", "depth", "flow"), z, outs):
        np.testing.assert_allclose(v, dit(dit4d_weights.branch_as_dit(params, m), zm, c), rtol=1e-5, atol=1e-5,
                                   err_msg=m)
        without = {k: v for k, v in dit4d_weights.branch_as_dit(params, m).items() if k != "control"}
        plain = apply_dit(without, zm, t, ctx)
        assert float(jnp.abs(v - plain).max()) > 1e-2, m  # the skeleton is read
    assert "control" in params["base"] and "control" not in params["depth"] and "control" not in params["flow"]
    model = dit4d_from_params(cfg, params)
    with pytest.raises(ValueError, match="pass the control latent"):
        model(*z, t, ctx)
    np.testing.assert_allclose(model.features(z, t, ctx, 1), jnp.concatenate(
        dit4d_from_params(CFG, {**params, "base": {k: v for k, v in params["base"].items() if k != "control"}})
        .hidden(z, t, ctx, num_layers=2)[0], axis=-1), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="concatenated control"):
        dataclasses.replace(CFG, base=dataclasses.replace(CFG.base, control="concat"))


def test_features_are_the_streams_after_the_named_block():
    params = _params(CFG, 6, joint_out=True)
    z, t, ctx = _inputs(3)
    features = jax.jit(lambda p: dit4d_from_params(CFG, p).features(z, t, ctx, layer=1))
    flat = flatten_params(params, str_keys=False)
    bump = lambda layer: unflatten_params({p: (v.at[layer].add(1.0) if p[:2] == ("depth", "blocks") else v)  # noqa: E731
                                           for p, v in flat.items()})
    f1 = features(params)
    assert f1.shape == (B, T * (H // 2) * (W // 2), 3 * CFG.base.dim)
    np.testing.assert_array_equal(features(bump(2)), f1)  # block 2 is not run
    assert float(jnp.abs(features(bump(1)) - f1).max()) > 1e-2  # block 1 is


def test_unrolled_serving_layout_computes_what_the_layer_scan_does():
    """unrolled4d (per-layer weights, fused q/k/v and text K/V, JA placed statically) = the stacked
    scan on every output and on the features of a cut model, in float32 and with static FP8 scales
    (bit for bit: same GEMMs, one scale for inputs the calibration saw as one tensor); its lowered
    program has no device loop and no conditional, the scanned one both (JA every other block)."""
    from rynn_jax.models import fp8
    from rynn_jax.models.dit4d import unrolled4d

    model = dit4d_from_params(CFG, _params(CFG, 9, joint_out=True))
    z, t, ctx = _inputs(6)
    run = lambda m, f: jax.jit(lambda s: f(nnx.merge(nnx.graphdef(m), s)))(nnx.state(m))  # noqa: E731
    full = lambda m: m(*z, t, ctx)  # noqa: E731
    feats = lambda m: m.features(z, t, ctx, layer=1)  # noqa: E731
    flat = unrolled4d(model)
    for got, want in zip(run(flat, full), run(model, full)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    cut = unrolled4d(model, num_layers=2)
    assert cut.cfg.base.num_layers == 2 and cut.cfg.joint_layers == (0,) and len(cut.depth.blocks) == 2
    np.testing.assert_allclose(run(cut, feats), run(model, feats), rtol=2e-5, atol=2e-5)
    hlo = lambda m: jax.jit(lambda s: feats(nnx.merge(nnx.graphdef(m), s))).lower(nnx.state(m)).as_text()  # noqa: E731
    assert "stablehlo.while" in hlo(model) and "stablehlo.case" in hlo(model)
    assert "stablehlo.while" not in hlo(cut) and "stablehlo.case" not in hlo(cut)
    static = fp8.calibrate(fp8.quantize_dit(model), lambda m, b: m.features(*b, layer=1),
                           [(z, t, ctx)], progress=False, layers=2)
    np.testing.assert_array_equal(run(unrolled4d(static, num_layers=2), feats), run(static, feats))
    with pytest.raises(ValueError, match="num_layers 4 outside"):
        unrolled4d(model, num_layers=4)


def test_rgb_decay_scales_only_the_rgb_injection(apply4d):
    params = _params(CFG, 7, joint_out=True)
    z, t, ctx = _inputs(4)
    independent = apply4d(_params(CFG, 7, joint_out=False), z, t, ctx)
    decayed = apply4d(params, z, t, ctx, 0.0)
    np.testing.assert_allclose(decayed[0], independent[0], rtol=1e-5, atol=1e-5)  # RGB as if alone
    assert float(jnp.abs(decayed[1] - independent[1]).max()) > 1e-2  # depth still reads RGB


# --------------------------------------------------------------------------------------------------
# Sizes and axes
# --------------------------------------------------------------------------------------------------


def test_full_size_parameter_count_by_part():
    d, f = 3072, 14336
    counts = dit4d_weights.param_count(WanDiT4DConfig.full())
    base = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(nnx.state(abstract_dit(WanDiTConfig.ti2v_5b()), nnx.Param)))
    assert counts["base"] == base
    per_block = (4 * (d * d + d) + 2 * d) + (2 * (d * d + d) + d) + 2 * d + (2 * d * f + f + d)
    assert counts["depth"] == counts["flow"] == 30 * per_block + (4 * 48 * d + d) + (d * 192 + 192)
    assert counts["joint"] == 10 * (12 * d * d + 23 * d + 3)
    assert counts["total"] == 14_820_603_486  # SPEC_4D derives ≈ 14.8B


def test_every_param_has_logical_axes():
    model = abstract_dit4d(WanDiT4DConfig.full())
    specs = flatten_params(nnx.to_pure_dict(nnx.get_partition_spec(nnx.state(model, nnx.Param))))
    shapes = flatten_params(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    for path, spec in specs.items():
        assert spec is not None and len(spec) == len(shapes[path].shape), path
    assert tuple(specs[("joint", "depth", "kv", "kernel")]) == ("layers", "embed", "heads")
    assert tuple(specs[("depth", "blocks", "ffn_up", "kernel")]) == ("layers", "embed", "mlp")


def test_config_refuses_bad_joint_layers():
    with pytest.raises(ValueError, match="joint_layers"):
        WanDiT4DConfig.tiny(joint_layers=(2, 0))
    with pytest.raises(ValueError, match="joint_layers"):
        WanDiT4DConfig.tiny(joint_layers=(3,))
    assert WanDiT4DConfig.full().every(2, 0, 20).joint_layers == tuple(range(0, 20, 2))


def test_fp8_quantized_model_moves_the_features_a_little():
    """quantize_dit on the 4D model (the policy's FP8 backbone): the three branches' block linears
    become FP8 GEMMs, the joint attention and every other tensor stay bit-identical, and the
    policy's block features move by a few percent, not zero (the FP8 path is in use)."""
    from rynn_jax.models.fp8 import quantize_dit

    model = dit4d_from_params(CFG, _params(CFG, 8, joint_out=True))
    q = quantize_dit(model)
    assert q.cfg.base.fp8 and not model.cfg.base.fp8 and q.cfg.joint_layers == CFG.joint_layers
    src = flatten_params(nnx.to_pure_dict(nnx.state(model)), str_keys=False)
    dst = flatten_params(nnx.to_pure_dict(nnx.state(q)), str_keys=False)
    linears = {p[:-1] for p in dst if p[-1] == "kernel_scale"}
    assert {p[0] for p in linears} == {"base", "depth", "flow"}
    assert {p[-1] for p in linears} >= {"q", "o", "ffn_up", "ffn_down"}
    assert not any(p[0] == "joint" for p in linears)
    for path, value in dst.items():
        if path[:-1] not in linears:
            assert np.array_equal(np.asarray(value), np.asarray(src[path])), path
    z, t, ctx = _inputs(5)

    def features(m):
        graphdef, state = nnx.split(m)
        return np.asarray(jax.jit(lambda s: nnx.merge(graphdef, s).features(z, t, ctx, layer=2))(state))

    ref, out = features(model), features(q)
    err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
    assert np.isfinite(out).all() and 0 < err <= 0.1, err


# --------------------------------------------------------------------------------------------------
# The released checkpoint layout
# --------------------------------------------------------------------------------------------------


def _released_state_dict(cfg: WanDiT4DConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random tensors under the names the released JointRynnWorld4DTransformer3DModel's state
    dict has, listed here from its module structure (diffusers' Wan names for RGB and the shared
    parts; attn1_/attn2_/norm2_/ffn_ copies per branch; joint_* at the JA blocks)."""
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    b = cfg.base
    ref = diffusers.WanTransformer3DModel(
        patch_size=b.patch_size, num_attention_heads=b.num_heads, attention_head_dim=b.head_dim,
        in_channels=b.in_channels, out_channels=b.out_channels, text_dim=b.text_dim, freq_dim=b.freq_dim,
        ffn_dim=b.ffn_dim, num_layers=b.num_layers, cross_attn_norm=True, eps=b.eps)
    shapes = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    del torch
    d = b.dim
    for m in ("depth", "flow"):
        for part in ("patch_embedding", "proj_out"):
            for p in ("weight", "bias"):
                shapes[f"{part}_{m}.{p}"] = shapes[f"{part}.{p}"]
        for i in range(b.num_layers):
            for sub in ("to_q", "to_k", "to_v", "to_out.0"):
                for p in ("weight", "bias"):
                    shapes[f"blocks.{i}.attn1_{m}.{sub}.{p}"] = (d, d) if p == "weight" else (d,)
                    shapes[f"blocks.{i}.attn2_{m}.{sub}.{p}"] = (d, d) if p == "weight" else (d,)
            for sub in ("norm_q", "norm_k"):
                shapes[f"blocks.{i}.attn1_{m}.{sub}.weight"] = (d,)
                shapes[f"blocks.{i}.attn2_{m}.{sub}.weight"] = (d,)
            shapes[f"blocks.{i}.norm2_{m}.weight"] = shapes[f"blocks.{i}.norm2_{m}.bias"] = (d,)
            shapes[f"blocks.{i}.ffn_{m}.net.0.proj.weight"] = (b.ffn_dim, d)
            shapes[f"blocks.{i}.ffn_{m}.net.0.proj.bias"] = (b.ffn_dim,)
            shapes[f"blocks.{i}.ffn_{m}.net.2.weight"] = (d, b.ffn_dim)
            shapes[f"blocks.{i}.ffn_{m}.net.2.bias"] = (d,)
    for i in cfg.joint_layers:
        for m in ("video", "depth", "flow"):
            shapes[f"blocks.{i}.joint_kv_{m}.weight"], shapes[f"blocks.{i}.joint_kv_{m}.bias"] = (2 * d, d), (2 * d,)
            for lin in ("q", "out"):
                shapes[f"blocks.{i}.joint_{lin}_{m}.weight"], shapes[f"blocks.{i}.joint_{lin}_{m}.bias"] = (d, d), (d,)
            shapes[f"blocks.{i}.joint_align_{m}.weight"] = shapes[f"blocks.{i}.joint_align_{m}.bias"] = (d,)
            shapes[f"blocks.{i}.modality_embed_{m}"] = (1, 1, d)
            shapes[f"blocks.{i}.joint_gate_{m}"] = (1,)
        shapes[f"blocks.{i}.joint_norm_q.weight"] = shapes[f"blocks.{i}.joint_norm_k.weight"] = (d,)
        shapes[f"blocks.{i}.joint_gate_video_decay"] = (1,)
    sd = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    for i in cfg.joint_layers:
        sd[f"blocks.{i}.joint_gate_video_decay"] = np.full((1,), 0.25, np.float32)
    for i in range(b.num_layers):  # torch's state_dict lists the tied text K/V under both names
        for m in ("depth", "flow"):
            for name in ("to_k.weight", "to_k.bias", "to_v.weight", "to_v.bias", "norm_k.weight"):
                sd[f"blocks.{i}.attn2_{m}.{name}"] = sd[f"blocks.{i}.attn2.{name}"]
    return sd


def test_fp8_static_calibration_of_the_three_branches(monkeypatch):
    """fp8.calibrate on the 4D model (static activation scales for the policy's FP8 backbone): each
    branch's block linears get, per layer, the largest |input| they saw / 448 — the oracle records
    it through fp8_matmul itself (a host callback per call inside the layer scan) and matches
    layers by their kernels; the features stay as close to bf16 as the per-token model's; a pass
    that never reaches a layer is an error naming it; the scales round-trip by name."""
    from rynn_jax.models import fp8, fp8_linear

    model = dit4d_from_params(CFG, _params(CFG, 8, joint_out=True))
    q = fp8.quantize_dit(model)
    batches = [_inputs(1), _inputs(2)]
    run = lambda m, b: m(*b[0], b[1], b[2])  # noqa: E731  (the full forward: every block)
    static = fp8.calibrate(q, run, batches, progress=False)
    assert static.cfg.base.fp8_activations == "static" and q.cfg.base.fp8_activations == "per_token"
    flat_q = flatten_params(nnx.to_pure_dict(nnx.state(q)), str_keys=False)
    flat_s = flatten_params(nnx.to_pure_dict(nnx.state(static)), str_keys=False)
    scales = {p for p in flat_s if p[-1] == "input_scale"}
    assert set(flat_s) == set(flat_q) | scales and {p[0] for p in scales} == {"base", "depth", "flow"}

    seen: list[tuple[np.ndarray, float]] = []
    real = fp8_linear.fp8_matmul

    def recording(x, w, w_scale, out_dtype, x_scale=None):  # inside the layer scan: a host callback
        jax.debug.callback(lambda w, a: seen.append((np.asarray(w), float(a))), w,
                           jnp.max(jnp.abs(x.astype(jnp.float32))))
        return real(x, w, w_scale, out_dtype, x_scale)

    monkeypatch.setattr(fp8_linear, "fp8_matmul", recording)
    graphdef, state = nnx.split(q)
    for b in batches:
        jax.block_until_ready(jax.jit(lambda s, b: run(nnx.merge(graphdef, s), b))(state, b))
    monkeypatch.undo()
    n_layers, off_by_one = CFG.base.num_layers, 0
    for path in scales:
        kernels = np.asarray(flat_q[path[:-1] + ("kernel",)])
        got = np.asarray(flat_s[path])[:, 0]
        for i in range(n_layers):
            want = max(a for w, a in seen if np.array_equal(w.view(np.uint8), kernels[i].view(np.uint8))) / 448
            np.testing.assert_allclose(got[i], want, rtol=1e-5, err_msg=str((path, i)))
            off_by_one += abs(got[(i + 1) % n_layers] / want - 1) > 1e-5
    assert off_by_one >= 0.8 * len(scales) * n_layers  # the tolerance tells layers apart

    z, t, ctx = _inputs(5)

    def features(m):
        graphdef, state = nnx.split(m)
        return np.asarray(jax.jit(lambda s: nnx.merge(graphdef, s).features(z, t, ctx, layer=2))(state))

    ref = features(model)
    err, err_per_token = (float(np.linalg.norm(features(m) - ref) / np.linalg.norm(ref)) for m in (static, q))
    assert 0 < err <= 1.5 * err_per_token and err <= 0.1, (err, err_per_token)
    assert not any(getattr(m, "input_amax", None) is not None for _, m in nnx.iter_graph(q))  # q untouched
    again = fp8.with_static_scales(q, fp8.static_scales(static))
    assert np.array_equal(features(again), features(static))
    with pytest.raises(ValueError, match=r"saw no input.*base\.blocks\.ffn_up\[layer 2\]"):
        fp8.calibrate(q, lambda m, b: m.features(*b, layer=1), batches, progress=False)


def test_released_deepspeed_checkpoint_loads_every_key(tmp_path, apply4d):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    sd = _released_state_dict(CFG, rng)
    # DeepSpeed's layout: the weights under "module" (some names "module."-prefixed, one PEFT
    # ".base_layer."), beside bookkeeping that holds torch.Size and set objects
    module = collections.OrderedDict()
    for k, v in sd.items():
        name = "module." + k if k.startswith("blocks.1.") else k
        name = name.replace("blocks.0.attn1.to_q.", "blocks.0.attn1.to_q.base_layer.")
        module[name] = torch.from_numpy(v)
    torch.save({"module": module, "param_shapes": [collections.OrderedDict(
        (k, v.shape) for k, v in module.items())], "sparse_tensor_module_names": set(), "global_steps": 7,
        "ds_version": "0.16.4", "ds_config": {"train_micro_batch_size_per_gpu": 1}},
        tmp_path / "mp_rank_00_model_states.pt")
    ema = {"blocks.2.joint_gate_flow": np.full((1,), 0.5, np.float32),
           "proj_out_depth.bias": rng.standard_normal(sd["proj_out_depth.bias"].shape).astype(np.float32)}
    torch.save({k: torch.from_numpy(v) for k, v in ema.items()}, tmp_path / "ema_weights.pt")
    (tmp_path / "pytorch_model").mkdir()
    (tmp_path / "mp_rank_00_model_states.pt").rename(tmp_path / "pytorch_model" / "mp_rank_00_model_states.pt")

    params, decay = dit4d_weights.load_released(tmp_path, CFG, ema=tmp_path / "ema_weights.pt")
    assert decay == 0.25
    np.testing.assert_array_equal(params["depth"]["blocks"]["self_attn"]["q"]["kernel"][1],
                                  sd["blocks.1.attn1_depth.to_q.weight"].T)
    np.testing.assert_array_equal(params["base"]["blocks"]["self_attn"]["q"]["kernel"][0],
                                  sd["blocks.0.attn1.to_q.weight"].T)
    np.testing.assert_array_equal(params["flow"]["blocks"]["cross_attn"]["o"]["bias"][2],
                                  sd["blocks.2.attn2_flow.to_out.0.bias"])
    np.testing.assert_array_equal(params["flow"]["blocks"]["ffn_up"]["kernel"][0],
                                  sd["blocks.0.ffn_flow.net.0.proj.weight"].T)
    np.testing.assert_array_equal(params["joint"]["rgb"]["kv"]["kernel"][1], sd["blocks.2.joint_kv_video.weight"].T)
    np.testing.assert_array_equal(params["joint"]["depth"]["embed"][0], sd["blocks.0.modality_embed_depth"][0, 0])
    assert float(params["joint"]["flow"]["gate"][1, 0]) == 0.5  # from the EMA file
    np.testing.assert_array_equal(params["depth"]["head"]["bias"], ema["proj_out_depth.bias"])
    z, t, ctx = _inputs(5)
    assert all(np.isfinite(np.asarray(v)).all() for v in apply4d(params, z, t, ctx, decay))

    # the tied copies may be absent (a safetensors save drops them) …
    untied = {k: v for k, v in sd.items() if not (".attn2_" in k and (".to_k." in k or ".to_v." in k or ".norm_k." in k))}
    p2, _ = dit4d_weights.dit4d_params_from_released(untied, CFG)
    np.testing.assert_array_equal(p2["joint"]["norm_k"], params["joint"]["norm_k"])
    # … but not disagree, and nothing may be left over or missing
    bad = dict(sd, **{"blocks.1.attn2_flow.to_v.bias": sd["blocks.1.attn2.to_v.bias"] + 1})
    with pytest.raises(ConversionError, match="blocks.1.attn2_flow.to_v.bias"):
        dit4d_weights.dit4d_params_from_released(bad, CFG)
    with pytest.raises(ConversionError, match="unexpected key 'blocks.1.joint_q_video.weight'"):
        dit4d_weights.dit4d_params_from_released(dict(sd, **{"blocks.1.joint_q_video.weight": sd["blocks.0.joint_q_video.weight"]}), CFG)
    with pytest.raises(ConversionError, match="missing key 'blocks.2.ffn_depth.net.2.bias'"):
        dit4d_weights.dit4d_params_from_released({k: v for k, v in sd.items() if k != "blocks.2.ffn_depth.net.2.bias"}, CFG)
    with pytest.raises(ConversionError, match="EMA weights name"):
        dit4d_weights.released_state_dict(sd, {"blocks.9.joint_gate_flow": ema["blocks.2.joint_gate_flow"]})
