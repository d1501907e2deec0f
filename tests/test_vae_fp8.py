"""Static FP8 activation scales for the VAE's kernel convs (kernels/vae_fp8.py).

A VAE small enough for a CPU whose decoder convs fit the FP8 kernel (128- and 64-channel convs);
the kernel itself runs in Mosaic GPU's interpret mode where it has to run at all.
"""

from __future__ import annotations

import functools
import logging
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rynn_jax.kernels import conv_kernel as ck
from rynn_jax.kernels import vae_conv, vae_fp8
from rynn_jax.models import fp8 as fp8_lib
from rynn_jax.models import vae as V

CFG = V.WanVAEConfig.tiny(decoder_base_dim=64, dim_mult=(1, 2), temporal_downsample=(True,))


_decode = vae_fp8.decode_clip


@pytest.fixture(scope="module")
def model():
    return V.init_vae(CFG, 0)


def _latents(seed: int, scale: float = 1.0) -> jax.Array:
    return scale * jax.random.normal(jax.random.key(seed), (1, 2, 4, 4, CFG.z_dim))


def test_calibrated_scales_are_the_largest_inputs_seen(model, monkeypatch):
    """calibrate's jitted observers against an eager oracle: every kernel conv's input max|x| over
    the same batches, recorded by wrapping the conv modules' __call__."""
    batches = [_latents(1), _latents(2, 3.0)]
    scales = vae_fp8.calibrate(model, _decode, batches, progress=False)
    names = [name for name, _ in vae_fp8.kernel_convs(model)]
    # the decoder's 128/64-channel 3×3 convs (and the stride-1 upsampler conv); no encoder conv fits
    assert len(names) >= 8 and all(n.startswith("decoder.") for n in names)
    assert any(n.endswith("upsampler.resample") for n in names)
    assert sorted(scales) == sorted(f"{n}.input_scale" for n in names)
    assert not any(hasattr(m, "input_amax") for _, m in vae_fp8.kernel_convs(model))  # the model is left as it was
    # a running max over batches: never below one batch's, above it where the 3× batch reaches
    # (convs right after a norm see about the same range either way)
    first = vae_fp8.calibrate(model, _decode, batches[:1], progress=False)
    assert all(first[k][0] <= scales[k][0] for k in scales) and any(first[k][0] < scales[k][0] for k in scales)
    double = vae_fp8.calibrate(model, _decode, batches, margin=2.0, progress=False)
    np.testing.assert_allclose(double[names[0] + ".input_scale"], 2 * scales[names[0] + ".input_scale"], rtol=1e-6)

    seen: dict[int, float] = {}
    for cls in (V.CausalConv3d, V.Conv2d):
        orig = cls.__call__

        def spy(self, x, *args, _orig=orig, **kw):
            seen[id(self)] = max(seen.get(id(self), 0.0), float(jnp.max(jnp.abs(x.astype(jnp.float32)))))
            return _orig(self, x, *args, **kw)

        monkeypatch.setattr(cls, "__call__", spy)
    for z in batches:
        _decode(model, z)
    for name, m in vae_fp8.kernel_convs(model):
        want = seen[id(m)] / fp8_lib.FP8_MAX
        np.testing.assert_allclose(scales[f"{name}.input_scale"], [want], rtol=1e-5, err_msg=name)


def test_static_model_and_scales_file(model, tmp_path, monkeypatch, caplog):
    scales = vae_fp8.calibrate(model, _decode, [_latents(1)], progress=False)
    served = vae_fp8.with_static_scales(model, scales)
    assert (served.cfg.conv_name, served.cfg.kernel_conv.fp8_scales) == ("kernel_fp8", "static")
    assert V.count_params(served) == V.count_params(model)  # scales are not parameters
    name, conv = vae_fp8.kernel_convs(served)[0]
    np.testing.assert_array_equal(np.asarray(conv.input_scale[...]), scales[f"{name}.input_scale"])
    # weights are the model's, unchanged
    np.testing.assert_array_equal(np.asarray(served.decoder.conv_out.kernel[...]),
                                  np.asarray(model.decoder.conv_out.kernel[...]))
    assert served.decoder.conv_out.input_scale is None  # 12 output channels: not a kernel conv
    # every kernel conv carries its weights quantized once from the model's own kernel
    model_modules = dict(vae_fp8.kernel_convs(model))
    for name, conv in vae_fp8.kernel_convs(served):
        kernel = model_modules[name].kernel[...]
        w_f8, w_scale = ck.quantize_kernel(kernel if kernel.ndim == 5 else kernel[None])
        np.testing.assert_array_equal(np.asarray(conv.kernel_fp8[...], np.float32), np.asarray(w_f8, np.float32))
        np.testing.assert_array_equal(np.asarray(conv.kernel_scale[...]), np.asarray(w_scale))
    assert served.decoder.conv_out.kernel_fp8 is None

    path = tmp_path / "vae_scales.safetensors"
    vae_fp8.save_scales(str(path), scales, source="test")
    loaded = vae_fp8.load_scales(str(path))
    assert sorted(loaded) == sorted(scales) and all(np.array_equal(loaded[k], scales[k]) for k in scales)
    # Where the FP8 kernel cannot run (a GPU of compute capability < 9) the float decoder is served
    # with XLA's convs, and the log says so; a CPU keeps the emulated FP8 numbers (checks, tests).
    assert vae_fp8.serving_conv_impl() == vae_fp8.fp8_conv_impl() == "emulate_fp8"
    monkeypatch.setattr(jax, "devices", lambda *_: [types.SimpleNamespace(platform="gpu", compute_capability="8.0")])
    assert (vae_fp8.serving_conv_impl(), vae_fp8.fp8_conv_impl()) == ("fold2d", "emulate_fp8")
    with caplog.at_level(logging.WARNING, logger="rynn_jax.kernels.vae_fp8"):
        assert vae_fp8.load_static(model, str(path)) is model
    assert "unused: the FP8 conv kernel needs a Hopper GPU" in caplog.text
    monkeypatch.setattr(jax, "devices", lambda *_: [types.SimpleNamespace(platform="gpu", compute_capability="9.0")])
    assert vae_fp8.serving_conv_impl() == vae_fp8.fp8_conv_impl() == "kernel_fp8"
    monkeypatch.undo()
    with pytest.raises(ValueError, match="not an FP8 scales file"):
        fp8_lib.load_scales(str(path))  # a VAE scales file is not the DiT's
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(ValueError, match="cannot read FP8 scales"):
        vae_fp8.load_scales(str(path))

    k0 = sorted(scales)[0]
    with pytest.raises(ValueError, match=rf"missing \['{k0}'\]"):
        vae_fp8.with_static_scales(model, {k: v for k, v in scales.items() if k != k0})
    with pytest.raises(ValueError, match="unexpected"):
        vae_fp8.with_static_scales(model, {**scales, "decoder.conv_in.input_scale": np.ones(1, np.float32)})
    for bad in (np.zeros(1, np.float32), np.full(1, np.nan, np.float32), np.ones(2, np.float32)):
        with pytest.raises(ValueError, match=k0):
            vae_fp8.with_static_scales(model, {**scales, k0: bad})
    with pytest.raises(ValueError, match="already has static scales"):
        vae_fp8.calibrate(served, _decode, [_latents(1)], progress=False)
    with pytest.raises(ValueError, match="no calibration batches"):
        vae_fp8.calibrate(model, _decode, [], progress=False)
    with pytest.raises(ValueError, match="no conv of this VAE fits"):
        vae_fp8.calibrate(V.init_vae(V.WanVAEConfig.tiny(), 0), _decode, [_latents(1)], progress=False)
    with pytest.raises(ValueError, match="needs impl in"):
        vae_conv.configure(V.WanVAEConfig.tiny(), "kernel_bf16", fp8_scales="static")


def test_static_scale_reaches_the_kernel(monkeypatch):
    """A static-scale conv equals the per-call one when its scale is that call's max|x| / 448, and
    differs when it is not — run through the kernel in interpret mode (weights kept (K, N), which
    the interpreter can read)."""
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

    monkeypatch.setattr(ck, "causal_conv", functools.partial(ck.causal_conv, interpret=InterpretGPUParams()))
    bf16 = V.WanVAEConfig.tiny(dtype="bfloat16", param_dtype="bfloat16")
    with nnx.use_eager_sharding(False):
        per_call = V.CausalConv3d(128, 64, (3, 3, 3), vae_conv.configure(bf16, "kernel_fp8"), rngs=nnx.Rngs(0))
        static = V.CausalConv3d(128, 64, (3, 3, 3), vae_conv.configure(bf16, "kernel_fp8", fp8_scales="static"),
                                rngs=nnx.Rngs(0))
    assert per_call.input_scale is None and static.input_scale[...].tolist() == [1.0]  # calibration fills it
    k = jax.random.split(jax.random.key(3), 2)
    x = jax.random.normal(k[0], (1, 2, 6, 10, 128), jnp.bfloat16)
    cache = 3 * jax.random.normal(k[1], (1, 2, 6, 10, 128), jnp.bfloat16)  # the larger part: in the max
    want, _ = per_call(x, cache)
    static.input_scale[...] = fp8_lib.amax_scale(jnp.max(jnp.abs(jnp.concatenate([cache, x], 1).astype(jnp.float32))))[None]
    got, _ = static(x, cache)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    # another scale puts the inputs on another FP8 grid (not a power of 2: e4m3's grid is the same
    # across binades, so ×2^k would only move the few subnormal values)
    static.input_scale[...] = static.input_scale[...] * 1.5
    other, _ = static(x, cache)
    diff = np.asarray(other, np.float32) - np.asarray(want, np.float32)
    assert np.linalg.norm(diff) / np.linalg.norm(np.asarray(want, np.float32)) > 5e-3


def test_only_the_decoder_takes_the_kernel():
    """The encoder keeps fold2d under a kernel conv_impl (measured slower with the kernel), even
    where its channels would fit; the decoder's convs are the kernel convs, and a calibration that
    never decodes is refused, naming them."""
    cfg = vae_conv.configure(V.WanVAEConfig.tiny(base_dim=64, decoder_base_dim=64, dim_mult=(1, 2, 2),
                                                 temporal_downsample=(False, True)), "kernel_fp8")
    model = V.init_vae(cfg, 0)
    enc_convs = [m for _, m in nnx.iter_graph(model.encoder) if isinstance(m, (V.CausalConv3d, V.Conv2d))]
    assert any(m.kernel.shape[-2] == 128 for m in enc_convs)  # channels that would fit the kernel
    assert all(m.cfg.conv_name == "fold2d" for m in enc_convs)
    dec_convs = [m for _, m in nnx.iter_graph(model.decoder) if isinstance(m, (V.CausalConv3d, V.Conv2d))]
    assert all(m.cfg.conv_name == "kernel_fp8" for m in dec_convs)
    names = [n for n, _ in vae_fp8.kernel_convs(model)]
    assert names and all(n.startswith("decoder.") for n in names)

    video = jnp.clip(jax.random.normal(jax.random.key(4), (1, 5, 32, 32, 3)), -1, 1)
    fold = V.init_vae(V.WanVAEConfig.tiny(base_dim=64, decoder_base_dim=64, dim_mult=(1, 2, 2),
                                          temporal_downsample=(False, True)), 0)
    with pytest.raises(ValueError, match=r"decoder\.mid_block\.resnets\.0\.conv1.*does `run` decode"):
        vae_fp8.calibrate(fold, lambda m, v: m.encode_frames(v, None, True, True), [video], progress=False)
    # the encoder runs fold2d on a CPU although the model asks for the (GPU-only) kernel
    mu = jax.jit(lambda v: model.encode_frames(v, None, True, True)[0])(video)
    want = jax.jit(lambda v: fold.encode_frames(v, None, True, True)[0])(video)
    np.testing.assert_array_equal(np.asarray(mu), np.asarray(want))


def test_emulated_fp8_decoder_end_to_end(model):
    """conv_impl="emulate_fp8" (the kernel's FP8 numerics by XLA, any backend), per-call and static:
    both decoders sit at FP8 distance from float32 — neither a broken decoder (O(1)) nor a silent
    float path (≈ 0). (Not bit-equal to each other even with scales calibrated on the same clip: the
    two programs round floats differently and FP8's coarse grid amplifies that, ≈ 4e-2 here.)"""
    z = _latents(5)
    per_call = V.vae_from_params(vae_conv.configure(CFG, "emulate_fp8"), nnx.to_pure_dict(nnx.state(model)))
    static = vae_fp8.with_static_scales(model, vae_fp8.calibrate(model, _decode, [z, _latents(6)], progress=False),
                                        conv_impl="emulate_fp8")
    assert static.cfg.conv_name == "emulate_fp8" and "emulate_fp8" not in vae_conv.conv_impls_for("cpu")
    assert [n for n, _ in vae_fp8.kernel_convs(static)] == [n for n, _ in vae_fp8.kernel_convs(model)]
    dec = lambda m: np.asarray(jax.jit(lambda z: _decode(m, z))(z))  # noqa: E731
    ref = dec(model)
    for m in (per_call, static):
        err = np.linalg.norm(dec(m) - ref) / np.linalg.norm(ref)
        assert 1e-3 < err < 0.2, err
    with pytest.raises(ValueError, match="conv_impl must be one of"):
        vae_fp8.with_static_scales(model, {}, conv_impl="fold2d")


def test_fidelity_bench_runs_on_a_cpu(tmp_path):
    """bench/fidelity_vae_fp8.py end to end on its small VAE: both FP8 decoders finite, at FP8
    distance from float32, streaming close to whole-clip."""
    import json
    import subprocess
    import sys

    out = tmp_path / "fid.json"
    subprocess.run([sys.executable, "bench/fidelity_vae_fp8.py", "--tiny", "--height", "32", "--width", "32",
                    "--out", str(out)], check=True, capture_output=True, text=True)
    res = json.loads(out.read_text())
    assert res["kernel_convs"] > 0 and all(c["ok"] for c in res["checks"])
    assert {r["decoder"] for r in res["rows"]} == {"fp8, per-call scales", "fp8, static scales"}
    for r in res["rows"]:
        assert 1e-3 < r["rel_l2"] < 0.3 and 20 < r["psnr_db"] < 70 and r["stream_vs_whole"] < 0.25


def test_config_json_of_an_older_version_loads(tmp_path):
    """A converted VAE's config.json written before the kernel conv was injected (with its
    conv_fp8_scales field at the old default) loads; a kernel config cannot be stored as JSON."""
    import json

    from rynn_jax import converted_weights

    raw = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(CFG).items() if k != "kernel_conv"}
    (tmp_path / converted_weights.CONFIG_FILE).write_text(json.dumps({**raw, "conv_fp8_scales": "per_call"}))
    assert converted_weights.load_config(tmp_path, V.WanVAEConfig) == CFG
    (tmp_path / converted_weights.CONFIG_FILE).write_text(json.dumps({**raw, "conv_fp8_scales": "static"}))
    with pytest.raises(ValueError, match="does not know"):
        converted_weights.load_config(tmp_path, V.WanVAEConfig)
    with pytest.raises(ValueError, match="kernel_conv must be an injected conv"):
        V.WanVAEConfig.tiny(kernel_conv={"impl": "kernel_fp8"})
