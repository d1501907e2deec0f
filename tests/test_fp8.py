"""FP8 serving path (models/fp8.py): weight/activation quantization, the scaled FP8 matmul, and a
tiny DiT quantized with `quantize_dit` against its float original."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from rynn_jax.models import dit
from rynn_jax.models import fp8_linear
from rynn_jax.models.dit import WanDiTConfig, abstract_dit, init_dit
from rynn_jax.models.fp8 import calibrate, fp8_matmul, quantize_dit, quantize_weight
from rynn_jax.weights import flatten_params

E4M3 = ml_dtypes.float8_e4m3fn
# Compiling-bound tests (tiny models, eager ops): XLA's cheapest compile (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("fast_compile")


def rel_l2(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))


def _weights(rng, shape):
    """Channels with very different magnitudes, an all-zero channel and a lone outlier."""
    w = rng.standard_normal(shape) * np.exp(rng.uniform(-4, 2, shape[-1]))
    w[..., 3] = 0.0
    w[..., 0, 5] = 50.0
    return w.astype(np.float32)


def test_quantize_weight_rounding_bound_and_scales():
    w = _weights(np.random.default_rng(0), (3, 64, 40))  # stacked like the 'layers' axis
    w8, scale = quantize_weight(jnp.asarray(w))
    assert w8.dtype == jnp.float8_e4m3fn and w8.shape == w.shape
    assert scale.dtype == jnp.float32 and scale.shape == (3, 40)
    w8, scale = np.asarray(w8), np.asarray(scale)
    assert np.all(np.isfinite(scale)) and np.all(scale > 0)

    amax = np.abs(w).max(axis=-2)  # (3, 40)
    deq = w8.astype(np.float32) * scale[:, None, :]
    err = np.abs(deq.astype(np.float64) - w)
    # e4m3 keeps 3 mantissa bits: rounding moves a value by at most 2**-4 of itself (normals) or
    # 2**-10 of the scale (subnormals), so by at most 2**-4 of the channel's amax.
    assert (err.max(axis=-2) <= 2.0 ** -4 * amax + 1e-30).all(), (err.max(axis=-2) / np.maximum(amax, 1e-30)).max()
    assert (err <= 2.0 ** -4 * np.abs(w) + 2.0 ** -10 * scale[:, None, :] * (1 + 1e-6)).all()
    # amax lands on the largest e4m3 value: the full range is used
    w8_abs_max = np.abs(w8.astype(np.float32)).max(axis=-2)
    nonzero = amax > 0
    assert np.array_equal(w8_abs_max[nonzero], np.full(nonzero.sum(), 448.0, np.float32))
    # the zero channel: zero FP8 values, a positive finite scale, dequantizes to exactly zero
    assert not nonzero[:, 3].any() and (deq[..., 3] == 0).all()
    # the scale is amax / 448 (as amax · float32(1/448))
    np.testing.assert_array_equal(scale[nonzero], (amax * np.float32(1 / 448))[nonzero])


def _quantize_np(a: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Independent float32 numpy quantization: scale = amax/448 along `axis` (1 where amax is 0)."""
    amax = np.abs(a).max(axis=axis, keepdims=True)
    scale = np.where(amax > 0, amax * np.float32(1 / 448), np.float32(1)).astype(np.float32)
    return np.clip(a / scale, -448, 448).astype(E4M3), scale


def test_fp8_matmul_error_and_exact_scale_algebra():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((2, 7, 96)) * np.exp(rng.uniform(-3, 3, (2, 7, 1)))).astype(np.float32)
    x[:, :, 10] *= 20.0  # an outlier feature, as LayerNorm'd activations have
    x[1, 4] = 0.0  # an all-zero token
    w = _weights(rng, (96, 40))
    w8, w_scale = quantize_weight(jnp.asarray(w))

    out = np.asarray(jax.jit(fp8_matmul, static_argnums=3)(jnp.asarray(x), w8.T, w_scale, jnp.float32))
    assert out.dtype == np.float32 and out.shape == (2, 7, 40)
    ref = x.astype(np.float64) @ w.astype(np.float64)
    err = rel_l2(out, ref)
    assert err <= 4e-2, f"fp8 matmul rel L2 {err:.3e} vs float64"
    assert (out[1, 4] == 0).all()

    # Same numbers as dequantize-then-matmul: checks the scale algebra, not just closeness.
    x8, x_scale = _quantize_np(x, axis=-1)
    w8_np, w_scale_np = _quantize_np(w, axis=0)
    np.testing.assert_array_equal(np.asarray(w8).view(np.uint8), w8_np.view(np.uint8))
    np.testing.assert_array_equal(np.asarray(w_scale), w_scale_np[0])
    deq = (x8.astype(np.float32) * x_scale).astype(np.float64) @ (w8_np.astype(np.float32) * w_scale_np)
    assert rel_l2(out, deq) <= 1e-6, rel_l2(out, deq)
    np.testing.assert_allclose(out, deq, rtol=1e-5, atol=1e-6 * np.abs(deq).max())

    out_bf16 = fp8_matmul(jnp.asarray(x, jnp.bfloat16), w8.T, w_scale, jnp.bfloat16)
    assert out_bf16.dtype == jnp.bfloat16
    assert rel_l2(out_bf16, ref) <= 4e-2


def test_fp8_matmul_static_scale_matches_dequantized_and_saturates():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 5, 64)).astype(np.float32)
    x[0, 1, 7] = 40.0  # beyond the static range below: saturates at 448 · scale
    w = _weights(rng, (64, 24))
    w8, w_scale = quantize_weight(jnp.asarray(w))
    x_scale = np.float32(5.0 / 448)
    out = np.asarray(jax.jit(fp8_matmul, static_argnums=3)(jnp.asarray(x), w8.T, w_scale, jnp.float32,
                                                            jnp.asarray([x_scale])))
    x8 = np.clip(x / x_scale, -448, 448).astype(E4M3)  # independent numpy quantization
    assert x8[0, 1, 7].astype(np.float32) == 448.0
    w8_np, w_scale_np = _quantize_np(w, axis=0)
    deq = (x8.astype(np.float32) * x_scale).astype(np.float64) @ (w8_np.astype(np.float32) * w_scale_np)
    np.testing.assert_allclose(out, deq, rtol=1e-5, atol=1e-6 * np.abs(deq).max())
    # inside the calibrated range the error is that of FP8 rounding (≤ 2**-4 per operand); the
    # saturated token is far off
    ref = x.astype(np.float64) @ w.astype(np.float64)
    inside = np.ones(x.shape[:2], bool)
    inside[0, 1] = False
    assert rel_l2(out[inside], ref[inside]) <= 2 * 2.0 ** -4
    assert rel_l2(out[0, 1], ref[0, 1]) > 0.2


# --------------------------------------------------------------------------------------------------
# Tiny DiT
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    """A tiny float32 DiT with every parameter moved off its init (so biases and norms matter)."""
    cfg = WanDiTConfig.tiny(num_layers=3)
    model = init_dit(cfg, 0)
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(0)
    state = jax.tree.map(lambda a: jnp.asarray(a + 0.05 * rng.standard_normal(a.shape), a.dtype), state)
    model = nnx.merge(graphdef, state)
    z = jnp.asarray(rng.standard_normal((2, 3, 4, 6, cfg.in_channels)), jnp.float32)
    t = jnp.asarray([[0.0, 937.0, 937.0], [0.0, 624.0, 624.0]], jnp.float32)
    ctx = jnp.asarray(rng.standard_normal((2, cfg.text_len, cfg.text_dim)), jnp.float32)
    return model, (z, t, ctx)


def _run(model, inputs) -> np.ndarray:
    graphdef, state = nnx.split(model)
    return np.asarray(jax.jit(lambda s, *a: nnx.merge(graphdef, s)(*a))(state, *inputs))


def _fp8_linear_paths(model) -> set[tuple[str, ...]]:
    flat = flatten_params(nnx.to_pure_dict(nnx.state(model)))
    return {p[:-1] for p in flat if p[-1] == "kernel_scale"}


def test_quantized_tiny_dit_close_to_float(tiny):
    model, inputs = tiny
    q = quantize_dit(model)
    assert q.cfg.fp8 and not model.cfg.fp8
    linears = _fp8_linear_paths(q)
    assert linears == {("blocks", a, n) for a in ("self_attn", "cross_attn") for n in "qkvo"} \
        | {("blocks", "ffn_up"), ("blocks", "ffn_down")}

    src = flatten_params(nnx.to_pure_dict(nnx.state(model)))
    dst = flatten_params(nnx.to_pure_dict(nnx.state(q)))
    assert set(dst) == set(src) | {p + ("kernel_scale",) for p in linears}
    for path, value in dst.items():
        if path[:-1] in linears and path[-1] in ("kernel", "kernel_scale"):
            continue
        assert value.dtype == src[path].dtype and np.array_equal(np.asarray(value), np.asarray(src[path])), path
    for lin in linears:
        kernel, scale = dst[lin + ("kernel",)], dst[lin + ("kernel_scale",)]
        assert kernel.dtype == jnp.float8_e4m3fn and scale.dtype == jnp.float32
        n_in, n_out = src[lin + ("kernel",)].shape[-2:]
        assert kernel.shape == (3, n_out, n_in) and scale.shape == (3, n_out)  # stored (out, in)
        # stacked quantization = per-layer quantization
        w8_0, s_0 = quantize_weight(src[lin + ("kernel",)][0])
        assert np.array_equal(np.asarray(kernel[0]).view(np.uint8), np.asarray(w8_0.T).view(np.uint8)), lin
        assert np.array_equal(np.asarray(scale[0]), np.asarray(s_0)), lin

    ref = _run(model, inputs)
    out = _run(q, inputs)
    assert np.isfinite(out).all()
    err = rel_l2(out, ref)
    assert err <= 1e-1, f"fp8 tiny DiT rel L2 {err:.3e} vs float32"
    assert err > 0, "the fp8 model computed exactly the float result: the FP8 path is not in use"
    out_unrolled = _run(dit.unrolled(q), inputs)
    assert dit.unrolled(q).cfg.scan_unroll == 3 and dit.unrolled(q).cfg.fp8
    assert rel_l2(out_unrolled, out) <= 1e-6, rel_l2(out_unrolled, out)


def _calibration_batches(inputs):
    z, t, ctx = inputs
    return [(z, t, ctx), (-0.5 * z, jnp.flip(t, 0), ctx)]  # two batches, different timesteps


def test_calibrate_sets_static_scales_from_observed_amax(tiny, monkeypatch):
    model, inputs = tiny
    q = quantize_dit(model)
    batches = _calibration_batches(inputs)
    static = calibrate(q, lambda m, b: m(*b), batches, progress=False)
    assert static.cfg.fp8_activations == "static" and q.cfg.fp8_activations == "per_token"
    flat_q = flatten_params(nnx.to_pure_dict(nnx.state(q)))
    flat_s = flatten_params(nnx.to_pure_dict(nnx.state(static)))
    linears = _fp8_linear_paths(q)
    assert set(flat_s) == set(flat_q) | {p + ("input_scale",) for p in linears}
    for path, value in flat_q.items():  # the weights are the same arrays
        assert np.array_equal(np.asarray(value).view(np.uint8), np.asarray(flat_s[path]).view(np.uint8)), path

    # Oracle: the largest |input| each linear sees, recorded eagerly through fp8_matmul itself
    # (per-token model, per-layer modules) and matched to its layer by the kernel's values.
    seen: list[tuple[np.ndarray, float]] = []
    real = fp8_linear.fp8_matmul

    def recording(x, w, w_scale, out_dtype, x_scale=None):
        seen.append((np.asarray(w), float(jnp.max(jnp.abs(x.astype(jnp.float32))))))
        return real(x, w, w_scale, out_dtype, x_scale)

    monkeypatch.setattr(fp8_linear, "fp8_matmul", recording)  # what Fp8Linear calls
    per_layer = dit.unrolled(q, fuse_self_qkv=False, fuse_text_kv=False)
    for b in batches:
        per_layer(*b)
    monkeypatch.undo()
    for lin in linears:
        kernels = np.asarray(flat_q[lin + ("kernel",)])
        for i in range(3):
            amax = max(a for w, a in seen if np.array_equal(w.view(np.uint8), kernels[i].view(np.uint8)))
            got = float(flat_s[lin + ("input_scale",)][i, 0])
            np.testing.assert_allclose(got, amax * np.float32(1 / 448), rtol=1e-5, err_msg=str((lin, i)))

    ref = _run(model, inputs)
    out = _run(static, inputs)
    err, err_per_token = rel_l2(out, ref), rel_l2(_run(q, inputs), ref)
    assert 0 < err <= 1e-1 and err <= 1.5 * err_per_token, (err, err_per_token)
    served = dit.unrolled(static)  # fused q/k/v, fused text k/v: their (equal) scales become one
    assert served.blocks[0].self_attn.qkv.input_scale[...].shape == (1,)
    text_scales = np.asarray([static.blocks.cross_attn.k.input_scale[...], static.blocks.cross_attn.v.input_scale[...]])
    np.testing.assert_array_equal(served.fused_text_kv.input_scale[...], text_scales.max(keepdims=True)[0, 0])
    assert rel_l2(_run(served, inputs), out) <= 1e-6
    # a checkpoint of the static model restores it
    again = dit.dit_from_params(static.cfg, nnx.to_pure_dict(nnx.state(static)))
    assert np.array_equal(_run(again, inputs), out)
    # margin scales the scales
    wide = calibrate(q, lambda m, b: m(*b), batches, margin=2.0, progress=False)
    np.testing.assert_allclose(np.asarray(wide.blocks.ffn_down.input_scale[...]),
                               2 * np.asarray(static.blocks.ffn_down.input_scale[...]), rtol=1e-6)


def test_calibrate_errors(tiny):
    model, inputs = tiny
    q = quantize_dit(model)
    run = lambda m, b: m(*b)  # noqa: E731
    with pytest.raises(ValueError, match="per-token activation scales"):
        calibrate(model, run, [inputs], progress=False)
    with pytest.raises(ValueError, match="stacked-layer model"):
        calibrate(dit.unrolled(q), run, [inputs], progress=False)
    with pytest.raises(ValueError, match="no calibration batches"):
        calibrate(q, run, [], progress=False)
    with pytest.raises(ValueError, match=r"saw no input .*blocks\.cross_attn\.k\[layer 0\].*in all"):
        calibrate(q, lambda m, b: m.embed_text(b[2]), [inputs], progress=False)
    zero_ctx = (inputs[0], inputs[1], jnp.zeros_like(inputs[2]))
    with pytest.warns(UserWarning, match=r"only zero inputs, their input_scale is 1: \['blocks\.cross_attn\.k\[layer 0\]'"):
        zeroed = dit.dit_from_params(q.cfg, jax.tree.map(  # zero text-embedding biases: zero K/V inputs
            lambda a: a, nnx.to_pure_dict(nnx.state(q))))
        zeroed.text_embed_2.bias[...] = jnp.zeros_like(zeroed.text_embed_2.bias[...])
        zeroed.text_embed_1.bias[...] = jnp.zeros_like(zeroed.text_embed_1.bias[...])
        s = calibrate(zeroed, run, [zero_ctx], progress=False)
    np.testing.assert_array_equal(np.asarray(s.blocks.cross_attn.k.input_scale[...]), 1.0)
    with pytest.raises(ValueError, match="margin"):
        calibrate(q, run, [inputs], margin=0.5, progress=False)
    with pytest.raises(ValueError, match="needs fp8=True"):
        WanDiTConfig.tiny(fp8_activations="static")


def test_fresh_fp8_init_is_quantized_float_init():
    cfg = WanDiTConfig.tiny()
    direct = flatten_params(nnx.to_pure_dict(nnx.state(init_dit(WanDiTConfig.tiny(fp8=True), 3))))
    via = flatten_params(nnx.to_pure_dict(nnx.state(quantize_dit(init_dit(cfg, 3)))))
    assert direct.keys() == via.keys()
    for path in direct:
        a, b = np.asarray(direct[path]), np.asarray(via[path])
        assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8)), path


def test_quantize_dit_errors_name_the_parameter(tiny):
    model, _ = tiny
    with pytest.raises(ValueError, match="already fp8"):
        quantize_dit(quantize_dit(model))
    graphdef, state = nnx.split(model)
    missing = nnx.merge(graphdef, state)
    del missing.head_modulation
    with pytest.raises(ValueError, match=r"'head_modulation' has no source"):
        quantize_dit(missing)
    missing = nnx.merge(graphdef, state)
    del missing.blocks.ffn_down.kernel
    with pytest.raises(ValueError, match=r"'blocks\.ffn_down\.kernel' has no source"):
        quantize_dit(missing)
    extra = nnx.merge(graphdef, state)
    extra.blocks.ffn_up.lora_a = nnx.Param(jnp.zeros((3, 48, 2)))
    with pytest.raises(ValueError, match=r"no place in the fp8 model: \['blocks\.ffn_up\.lora_a'\]"):
        quantize_dit(extra)


def test_fp8_params_have_logical_axes():
    model = abstract_dit(WanDiTConfig.ti2v_5b(fp8=True))
    specs = flatten_params(nnx.to_pure_dict(nnx.get_partition_spec(nnx.state(model, nnx.Param))))
    shapes = flatten_params(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    for path, spec in specs.items():
        assert spec is not None and len(spec) == len(shapes[path].shape), path  # every axis named
    assert tuple(specs[("blocks", "ffn_up", "kernel")]) == ("layers", "mlp", "embed")  # (out, in)
    assert tuple(specs[("blocks", "ffn_up", "kernel_scale")]) == ("layers", "mlp")
    assert tuple(specs[("blocks", "self_attn", "o", "kernel")]) == ("layers", "embed", "heads")
    assert tuple(specs[("blocks", "self_attn", "o", "kernel_scale")]) == ("layers", "embed")
    assert tuple(specs[("blocks", "cross_attn", "q", "bias")]) == ("layers", "heads")
    flat = flatten_params(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    assert flat[("blocks", "ffn_down", "kernel")].dtype == jnp.float8_e4m3fn
    assert flat[("blocks", "ffn_down", "kernel")].shape == (30, 3072, 14336)
    # everything outside the blocks' linears stays as it was
    assert flat[("time_proj", "kernel")].dtype == jnp.float32
    assert flat[("head", "kernel")].dtype == jnp.float32
    assert ("text_embed_1", "kernel_scale") not in flat
    assert ("blocks", "ffn_up", "input_scale") not in flat  # per-token activation scales: none stored
    static = abstract_dit(WanDiTConfig.ti2v_5b(fp8=True, fp8_activations="static"))
    specs = flatten_params(nnx.to_pure_dict(nnx.get_partition_spec(nnx.state(static, nnx.Param))))
    assert tuple(specs[("blocks", "ffn_up", "input_scale")]) == ("layers", None)


def test_streaming_session_serves_a_quantized_dit():
    """The FP8 model drops into the streaming session (cached causal passes, both VAEs): the same
    session with the float DiT gives close frames."""
    import dataclasses

    from rynn_jax.models import causal
    from rynn_jax.models.vae import WanVAEConfig, init_vae
    from rynn_jax.serving.block_step import StepConfig
    from rynn_jax.serving.session import StreamingSession

    cfg = WanDiTConfig.tiny(control="add-plus", in_channels=4, out_channels=4, control_channels=4)
    dit_f = init_dit(cfg, 2)
    rng = np.random.default_rng(3)  # move the zero-initialised control branch off zero
    nnx.update(dit_f, jax.tree.map(lambda a: a + 0.05 * jnp.asarray(rng.standard_normal(a.shape), a.dtype),
                                   nnx.state(dit_f, nnx.Param)))
    vae = init_vae(WanVAEConfig.tiny(), 0)
    image = rng.uniform(-1, 1, (1, 32, 64, 3)).astype(np.float32)
    ctx = rng.standard_normal((1, cfg.text_len, cfg.text_dim)).astype(np.float32)
    skeleton = rng.uniform(-1, 1, (1, 5, 32, 64, 3)).astype(np.float32)
    # the static-scale model, calibrated on block-shaped latents at the session's kind of timesteps
    lat = lambda: jnp.asarray(rng.standard_normal((1, 2, 2, 4, 4)), jnp.float32)  # noqa: E731
    batches = [(lat(), jnp.full((1, 2), t, jnp.float32), jnp.asarray(ctx), lat()) for t in (999.0, 500.0, 0.0)]
    static = calibrate(quantize_dit(dit_f), lambda m, b: m(*b), batches, progress=False)
    frames = []
    for dit_model in (dit_f, quantize_dit(dit_f), static):
        session = StreamingSession(dit_model, vae, causal.CausalConfig(frames_per_block=2, window_frames=3),
                                             StepConfig(num_steps=2), chunk_frames=4)
        session.start(image, ctx, jax.random.key(0))
        frames.append(np.asarray(session.step(skeleton)))
    assert session.dit_cfg.fp8_activations == "static" and dataclasses.is_dataclass(session.dit_cfg)
    for name, got in (("per-token", frames[1]), ("static", frames[2])):
        assert got.shape == (1, 5, 32, 64, 3) and np.isfinite(got).all()
        err = rel_l2(got, frames[0])
        assert 0 < err <= 1e-1, f"fp8 ({name} activation scales) vs float streaming frames rel L2 {err:.3e}"


def test_fp8_programs_compile_for_cublaslt_on_gpu(monkeypatch):
    """Serving programs of an FP8 DiT get FP8_COMPILER_OPTIONS on GPU only (Triton GEMM autotuning
    per FP8 layer made the 5B compile take minutes); the options are real XLA options."""
    from rynn_jax.models import fp8

    cfg8 = WanDiTConfig.tiny(num_layers=3, fp8=True)
    assert fp8.compiler_options(cfg8) is None  # CPU here
    monkeypatch.setattr(fp8.jax, "default_backend", lambda: "gpu")
    assert fp8.compiler_options(cfg8) == fp8.FP8_COMPILER_OPTIONS
    assert fp8.compiler_options(WanDiTConfig.tiny(num_layers=3)) is None  # float model: XLA's defaults
    # XLA accepts the option (an unknown name would raise at compile).
    x = jnp.ones((4, 4))
    assert float(jax.jit(lambda a: a @ a).lower(x).compile(fp8.FP8_COMPILER_OPTIONS)(x)[0, 0]) == 4.0
    with pytest.raises(Exception, match="no_such_option"):
        jax.jit(lambda a: a @ a).lower(x).compile({"xla_no_such_option": True})
