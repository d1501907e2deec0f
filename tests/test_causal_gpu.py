"""GPU only: phase A's teacher-forced block-causal forward through cuDNN flash attention.

On GPU `block_causal_forward` computes the block-causal attention block by block, one unmasked
cuDNN call per query block (`causal.blockwise_attention`), instead of one call with a dense
(2L)² mask. These checks compare that path with XLA attention under the dense mask (the path CPU
tests pin) and show that the compiled program holds only plain cuDNN flash kernels (no bias):

    JAX_PLATFORMS=cuda python -m pytest -q -s tests/test_causal_gpu.py   # tests/conftest.py defaults to CPU
"""

from __future__ import annotations

import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rynn_jax.distill import warmup
from rynn_jax.models import causal
from rynn_jax.models.dit import WanDiTConfig, init_dit

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU (cuDNN attention)")]


def rel_err(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def _model(cfg: WanDiTConfig, seed: int = 0):
    """A DiT with every parameter moved off its init (the control branch starts at 0), the same
    values for every `cfg` that differs only in attention or compute dtype."""
    model = init_dit(cfg, seed=seed)
    rng = np.random.default_rng(seed)
    nnx.update(model, jax.tree.map(lambda a: a + 0.05 * jnp.asarray(rng.standard_normal(a.shape), a.dtype),
                                   nnx.state(model, nnx.Param)))
    return model


def _batch(cfg: WanDiTConfig, b: int, f: int, hw: tuple[int, int], text_len: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    normal = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)  # noqa: E731
    return {"video_latents": normal(b, f, *hw, cfg.in_channels), "img_latent": normal(b, 1, *hw, cfg.in_channels),
            "control_video_latents": normal(b, f, *hw, cfg.control_channels),
            "text_embedding": normal(b, text_len, cfg.text_dim)}


def _loss_and_grad(model, batch: dict, fpb: int, blockwise: bool | None):
    """Phase A's loss (warmup.warmup_loss with the attention path pinned; None: the default path)
    and its parameter gradient."""
    path = {} if blockwise is None else {"blockwise": blockwise}
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss_fn(params):
        m = nnx.merge(graphdef, params, rest)
        clean, noisy, t_bf, target = warmup.teacher_forcing_inputs(batch, jax.random.PRNGKey(0), 5.0)
        v = causal.block_causal_forward(m, clean, jnp.zeros_like(t_bf), batch["text_embedding"],
                                        batch["control_video_latents"], frames_per_block=fpb,
                                        noisy_bthwc=noisy, noisy_t_bf=t_bf, **path)
        return jnp.square(v - target)[:, 1:].mean(), v

    fn = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))
    return fn, params


def _fmha_targets(hlo: str) -> set[str]:
    """cuDNN fused-attention custom-call targets in a compiled program's HLO text."""
    return set(re.findall(r"__cudnn\$fmha\w*", hlo))


def test_blockwise_cudnn_matches_dense_xla_small():
    """head_dim 128, 6 latent frames in blocks of 2, 32 tokens per frame: the cuDNN blockwise path
    (the GPU default) is as close to an fp32 reference as bf16 XLA attention under the dense mask,
    forward and parameter gradient, and its program runs only cuDNN flash without bias."""
    small = {"dim": 256, "num_heads": 2, "ffn_dim": 512, "num_layers": 2, "control": "add-plus", "param_dtype": "float32"}
    cudnn = _model(WanDiTConfig.tiny(**small, dtype="bfloat16", attention="cudnn"))
    xla = _model(WanDiTConfig.tiny(**small, dtype="bfloat16", attention="xla"))
    ref = _model(WanDiTConfig.tiny(**small, dtype="float32", attention="xla"))
    batch = _batch(cudnn.cfg, b=2, f=6, hw=(8, 16), text_len=cudnn.cfg.text_len)

    fn, params = _loss_and_grad(cudnn, batch, 2, blockwise=True)
    (loss_c, v_c), g_c = fn(params)
    hlo = fn.lower(params).compile().as_text()
    fn_default, _ = _loss_and_grad(cudnn, batch, 2, blockwise=None)
    (_, v_default), _ = fn_default(params)
    fn_x, params_x = _loss_and_grad(xla, batch, 2, blockwise=False)
    (loss_x, v_x), g_x = fn_x(params_x)
    fn_r, params_r = _loss_and_grad(ref, batch, 2, blockwise=False)
    (loss_r, v_r), g_r = fn_r(params_r)

    targets = _fmha_targets(hlo)
    print("cuDNN custom calls:", sorted(targets))
    assert "__cudnn$fmhaSoftmax" in targets and "__cudnn$fmhaSoftmaxBackward" in targets, targets
    assert not any("Bias" in t for t in targets), targets
    np.testing.assert_array_equal(np.asarray(v_default), np.asarray(v_c))  # blockwise is the default

    flat = lambda g: np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(g)])  # noqa: E731
    err = {"v_cudnn": rel_err(v_c, v_r), "v_xla": rel_err(v_x, v_r),
           "g_cudnn": rel_err(flat(g_c), flat(g_r)), "g_xla": rel_err(flat(g_x), flat(g_r)),
           "loss_cudnn": abs(float(loss_c) / float(loss_r) - 1), "loss_xla": abs(float(loss_x) / float(loss_r) - 1)}
    print("errors vs fp32 dense reference:", err)
    for k in ("v", "g", "loss"):
        assert err[f"{k}_cudnn"] <= 2 * err[f"{k}_xla"] + 1e-3, err
    assert err["v_cudnn"] < 3e-2 and err["g_cudnn"] < 5e-2, err


def test_blockwise_cudnn_5b_layer_memory_and_match():
    """One 5B-width layer (dim 3072, 24 heads), 21 latent frames at 480×832 (390 tokens each, so
    2 × 8190 tokens), blocks of 3, phase A forward + backward: against the dense mask as a cuDNN
    bias, the blockwise path is faster and needs no more scratch memory, with the same loss and
    gradient up to bf16 rounding (measured on an H200: 65 vs 107 ms, 3.81 vs 3.77 GiB, gradient
    rel. err 1.1e-3). Prints compile memory and step time of both."""
    cfg = WanDiTConfig.ti2v_5b(dtype="bfloat16", param_dtype="float32", remat="full", control="add-plus",
                               num_layers=1, attention="cudnn")
    model = _model(cfg)
    batch = _batch(cfg, b=1, f=21, hw=(30, 52), text_len=512)
    out = {}
    for blockwise in (True, False):
        fn, params = _loss_and_grad(model, batch, 3, blockwise=blockwise)
        compiled = fn.lower(params).compile()
        mem = compiled.memory_analysis()
        (loss, _), grads = compiled(params)
        jax.block_until_ready(grads)
        t0 = time.perf_counter()
        for _ in range(3):
            (loss, _), grads = compiled(params)
        jax.block_until_ready(grads)
        out[blockwise] = {"loss": float(loss), "grads": grads, "temp_gb": mem.temp_size_in_bytes / 2 ** 30,
                          "ms": (time.perf_counter() - t0) / 3 * 1e3,
                          "fmha": sorted(_fmha_targets(compiled.as_text()))}
        print(f"blockwise={blockwise}: temp {out[blockwise]['temp_gb']:.2f} GiB, {out[blockwise]['ms']:.1f} ms "
              f"per fwd+bwd, loss {out[blockwise]['loss']:.6f}, {out[blockwise]['fmha']}")
    flat = lambda g: np.concatenate([np.asarray(x, np.float32).ravel() for x in jax.tree.leaves(g)])  # noqa: E731
    g_err = rel_err(flat(out[True]["grads"]), flat(out[False]["grads"]))
    print("gradient rel err blockwise vs dense-bias:", g_err)
    assert not any("Bias" in t for t in out[True]["fmha"]) and out[True]["fmha"]
    brief = {k: {n: v for n, v in o.items() if n != "grads"} for k, o in out.items()}
    assert out[True]["temp_gb"] <= 1.05 * out[False]["temp_gb"] and out[True]["ms"] < out[False]["ms"], brief
    assert abs(out[True]["loss"] / out[False]["loss"] - 1) < 1e-2 and g_err < 5e-2
