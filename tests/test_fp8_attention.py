"""FP8 attention (models/fp8_attention.py): the per-tensor e4m3 quantization against its closed
form, the float32 emulation of cuDNN's FP8 flash attention against float64 attention, and on a
Hopper GPU the cuDNN kernel against the emulation and a model run with attention="cudnn_fp8"."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rynn_jax.models import fp8_attention

ON_GPU = jax.default_backend() == "gpu"


def _qkv(seed: int, l: int = 256, s: int = 320, n: int = 2, h: int = 64):
    rng = np.random.default_rng(seed)
    # RMS-normed q/k as the DiT's (unit RMS, gain ≈ 1), spread so the softmax is neither flat nor one-hot
    q = rng.standard_normal((1, l, n, h)) * 1.5
    k = rng.standard_normal((1, s, n, h)) * 1.5
    v = rng.standard_normal((1, s, n, h))
    return q, k, v


def _attention64(q, k, v):
    s = np.einsum("blnh,bsnh->bnls", q, k) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bnls,bsnh->blnh", p / p.sum(-1, keepdims=True), v)


def _rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def test_per_tensor_quantization_closed_form():
    """amax maps to 448 exactly; every element within e4m3's half-ulp (2⁻⁴ relative) of x above the
    normal range's floor; zeros stay zeros and an all-zero tensor gets a finite scale."""
    x = np.random.default_rng(0).standard_normal(4096).astype(np.float32) * 3.0
    x8, descale = fp8_attention.quantize(jnp.asarray(x))
    back = np.asarray(x8.astype(jnp.float32)) * float(descale)
    assert x8.dtype == jnp.float8_e4m3fn
    assert float(np.max(np.abs(np.asarray(x8.astype(jnp.float32))))) == 448.0
    assert float(descale) == pytest.approx(np.abs(x).max() / 448.0, rel=1e-6)
    normal = np.abs(x) / float(descale) >= 2.0 ** -6
    assert np.all(np.abs(back - x)[normal] <= 2.0 ** -4 * np.abs(x)[normal] * (1 + 1e-6))
    z8, zd = fp8_attention.quantize(jnp.zeros(8))
    assert np.isfinite(float(zd)) and not np.asarray(z8.astype(jnp.float32)).any()


def _round_trip(a):
    a8, descale = fp8_attention.quantize(jnp.asarray(a, jnp.float32))
    return np.asarray(a8.astype(jnp.float32), np.float64) * float(descale)


def test_emulation_is_close_to_float64_attention():
    """The emulated FP8 attention equals float64 attention of the e4m3-rounded q, k, v with its
    output rounded on v's scale, up to the rounding of P̃ (scaled by 448, so probabilities ≈ 1/320
    stay in e4m3's normal range), which moves some outputs across an e4m3 step: ≤ 4 % here. Against
    exact attention the error is the inputs' rounding: ≈ 8 % rel L2 for these fairly sharp scores
    (std 2.2), most of it from q and k."""
    q, k, v = _qkv(1)
    want = _attention64(q, k, v)
    got = fp8_attention.emulated_attention(*(jnp.asarray(a, jnp.float32) for a in (q, k, v)))
    _, dv = fp8_attention.quantize(jnp.asarray(v, jnp.float32))
    rounded = _attention64(_round_trip(q), _round_trip(k), _round_trip(v))
    rounded = np.asarray((jnp.asarray(rounded / float(dv), jnp.float32).astype(jnp.float8_e4m3fn)
                          ).astype(jnp.float32), np.float64) * float(dv)
    assert 1e-4 < _rel(got, rounded) < 0.04, _rel(got, rounded)
    err = _rel(got, want)
    assert 0.01 < err < 0.12, err
    # the output is what the kernel hands back: e4m3 values times v's descale
    steps = np.asarray(got, np.float64) / float(dv)
    assert np.array_equal(np.asarray(jnp.asarray(steps, jnp.float32).astype(jnp.float8_e4m3fn).astype(jnp.float32)),
                          steps.astype(np.float32))


def test_cudnn_fp8_refused_off_gpu():
    if ON_GPU:
        pytest.skip("the refusal is for machines without a GPU")
    q, k, v = (jnp.asarray(a, jnp.bfloat16) for a in _qkv(2, 16, 16))
    with pytest.raises(ValueError, match="cudnn_fp8.*needs a GPU"):
        fp8_attention.cudnn_attention(q, k, v)


@pytest.mark.skipif(not ON_GPU, reason="needs a GPU (cuDNN FP8 attention, Hopper)")
def test_cudnn_fp8_attention_matches_its_emulation():
    """The kernel's error against exact attention is the emulation's (both ≈ 8.3 % rel L2 on these
    inputs: 0.0829 on an H100 with cuDNN 9, 0.0829 emulated; bf16 inputs alone cost 0.5 %), and the
    two outputs are close to each other."""
    q, k, v = _qkv(3, l=1024, s=1024, n=4, h=128)
    want = _attention64(q, k, v)
    args = [jnp.asarray(a, jnp.bfloat16) for a in (q, k, v)]
    got = jax.jit(fp8_attention.cudnn_attention)(*args)
    emulated = fp8_attention.emulated_attention(*args)
    assert got.dtype == jnp.bfloat16 and got.shape == q.shape
    err, err_emulated = _rel(got, want), _rel(emulated, want)
    assert 0.01 < err < 0.12 and abs(err - err_emulated) < 0.01, (err, err_emulated)
    assert _rel(got, np.asarray(emulated, np.float64)) < 0.05


@pytest.mark.skipif(not ON_GPU, reason="needs a GPU (cuDNN FP8 attention, Hopper)")
def test_dit_forward_with_fp8_attention_stays_near_bf16():
    """A small bf16 WanDiT run with attention="cudnn_fp8" against the same weights on bf16 cuDNN:
    outputs within FP8 rounding (rel L2 ≤ 10 %) and not identical (the FP8 kernel ran)."""
    from flax import nnx

    from rynn_jax.models import dit

    # head_dim 64: cuDNN's FP8 attention wants a multiple of 16
    cfg = dit.WanDiTConfig.tiny(dim=128, num_heads=2, ffn_dim=256, dtype="bfloat16", attention="cudnn")
    model = dit.init_dit(cfg, seed=0)
    fp8 = dit.dit_from_params(dataclasses.replace(cfg, attention="cudnn_fp8"), nnx.to_pure_dict(nnx.state(model)))
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.standard_normal((1, 3, 16, 16, cfg.in_channels)), jnp.float32)
    t = jnp.asarray([[0.0, 500.0, 500.0]])
    ctx = jnp.asarray(rng.standard_normal((1, cfg.text_len, cfg.text_dim)), jnp.float32)
    ref, out = (np.asarray(jax.jit(lambda m: m(x, t, ctx))(m), np.float64) for m in (model, fp8))
    err = _rel(out, ref)
    assert 0 < err <= 0.10, err


def test_with_fp8_attention_switches_only_the_attention():
    """fp8.with_fp8_attention on a WanDiT4D (per-token FP8 linears): every module's config says
    cudnn_fp8, every parameter is the same array, and off a GPU its forward is refused in one line."""
    from flax import nnx

    from rynn_jax.models import fp8
    from rynn_jax.models.dit4d import WanDiT4DConfig, init_dit4d

    model = fp8.quantize_dit(init_dit4d(WanDiT4DConfig.tiny(), seed=0))
    switched = fp8.with_fp8_attention(model)
    assert switched.cfg.base.attention == "cudnn_fp8" and model.cfg.base.attention == "auto"
    assert switched.cfg.base.fp8 and switched.base.blocks.self_attn.cfg.attention == "cudnn_fp8"
    before, after = (jax.tree.leaves(nnx.state(m)) for m in (model, switched))
    assert len(before) == len(after) and all(a is b for a, b in zip(before, after))
    if not ON_GPU:
        z = [jnp.zeros((1, 2, 4, 4, model.cfg.base.in_channels))] * 3
        with pytest.raises(ValueError, match="needs a GPU"):
            switched(*z, jnp.zeros((1, 2)), jnp.zeros((1, 16, model.cfg.base.text_dim)))
