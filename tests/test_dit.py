"""DiT parity against diffusers' WanTransformer3DModel, weights passed through our converter."""

from __future__ import annotations

import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rynn_jax.models import dit
from rynn_jax.models.dit import WanDiTConfig, abstract_dit, dit_from_params, init_dit
from rynn_jax.models.dit_weights import dit_config_from_json, dit_params_from_state_dict, load_dit
from rynn_jax.text import pad_context
from rynn_jax.weights import ConversionError, flatten_params



def rel_l2(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))


# (layers, heads, head_dim, ffn, channels, text_dim, freq_dim, batch, frames, H, W, text_len)
CONFIGS = {
    "one_layer": (1, 2, 16, 64, 4, 12, 32, 1, 3, 4, 6, 9),
    "odd_grid_batch2": (3, 4, 12, 40, 6, 20, 16, 2, 2, 6, 10, 16),
    "deep_many_frames": (4, 3, 24, 48, 5, 16, 64, 2, 5, 2, 4, 5),
}


def _reference(name: str):
    torch = pytest.importorskip("torch")  # only the parity tests need torch and diffusers
    diffusers = pytest.importorskip("diffusers")
    layers, heads, hd, ffn, ch, text_dim, freq, *_ = CONFIGS[name]
    torch.manual_seed(sum(map(ord, name)))
    ref = diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=heads, attention_head_dim=hd, in_channels=ch,
        out_channels=ch, text_dim=text_dim, freq_dim=freq, ffn_dim=ffn, num_layers=layers,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
    ).eval()
    with torch.no_grad():  # move every parameter off its init so a mis-mapped one shows
        for pname, p in ref.named_parameters():
            base = 1.0 if re.search(r"norm.*weight", pname) else 0.0
            p.copy_(base + 0.2 * torch.randn_like(p))
    cfg = WanDiTConfig(dim=heads * hd, num_layers=layers, num_heads=heads, ffn_dim=ffn, freq_dim=freq,
                       in_channels=ch, out_channels=ch, text_dim=text_dim, text_len=16)
    sd = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    return ref, cfg, sd


def _inputs(name: str, cfg: WanDiTConfig):
    *_, batch, frames, h, w, text_len = CONFIGS[name]
    rng = np.random.default_rng(0)
    z = rng.standard_normal((batch, frames, h, w, cfg.in_channels)).astype(np.float32)
    # TI2V: frame 0 is the clean image latent at t=0; the others share the current timestep.
    t = np.stack([np.r_[0.0, np.full(frames - 1, tb)] for tb in (937.0, 624.0)[:batch]]).astype(np.float32)
    ctx = rng.standard_normal((batch, text_len, cfg.text_dim)).astype(np.float32)
    return z, t, np.stack([pad_context(c, cfg.text_len) for c in ctx])


def _reference_out(ref, z, t_bf, ctx):
    import torch

    b, f, h, w, _ = z.shape
    t_tokens = np.repeat(t_bf, (h // 2) * (w // 2), axis=1)  # diffusers takes per-token timesteps
    with torch.no_grad():
        out = ref(torch.from_numpy(z.transpose(0, 4, 1, 2, 3).copy()), torch.from_numpy(t_tokens),
                  torch.from_numpy(np.array(ctx)), return_dict=False)[0]
    return out.numpy().transpose(0, 2, 3, 4, 1)


@pytest.fixture(scope="module", params=list(CONFIGS))
def case(request):
    ref, cfg, sd = _reference(request.param)
    z, t, ctx = _inputs(request.param, cfg)
    return cfg, sd, (z, t, ctx), _reference_out(ref, z, t, ctx)


def _forward(cfg: WanDiTConfig, params: dict, inputs) -> np.ndarray:
    model = dit_from_params(cfg, params)
    graphdef, state = nnx.split(model)

    @jax.jit
    def fwd(state, z, t, ctx):
        return nnx.merge(graphdef, state)(z, t, ctx)

    return np.asarray(fwd(state, *map(jnp.asarray, inputs)))


def test_fp32_parity(case):
    # Seen: 2.6e-7, 3.1e-7, 8.1e-6. The last is the reference's own float32 noise: torch's expf
    # rounds one entry of its timestep-frequency table 1 ulp away from the correctly rounded value
    # we use, and t≈900 amplifies that to 3e-5 rad; with torch's table ours is 4e-7 off.
    cfg, sd, inputs, ref_out = case
    out = _forward(cfg, dit_params_from_state_dict(sd, cfg), inputs)
    assert out.shape == ref_out.shape
    assert rel_l2(out, ref_out) <= 1e-5


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_bf16_compute_close_to_fp32_reference(case, param_dtype):
    cfg, sd, inputs, ref_out = case
    cfg = WanDiTConfig(**{**cfg.__dict__, "dtype": "bfloat16", "param_dtype": param_dtype})
    params = dit_params_from_state_dict(sd, cfg)
    assert all(v.dtype == jnp.dtype(param_dtype) for v in flatten_params(params).values())
    assert rel_l2(_forward(cfg, params, inputs), ref_out) <= 2e-2


def test_remat_does_not_change_values(case):
    cfg, sd, inputs, ref_out = case
    cfg = WanDiTConfig(**{**cfg.__dict__, "remat": "full"})
    assert rel_l2(_forward(cfg, dit_params_from_state_dict(sd, cfg), inputs), ref_out) <= 1e-5


@pytest.mark.parametrize("remat", ["full", "save_dots", "save_dots_attn"])
def test_remat_policies_keep_gradients(remat):
    """Remat only trades memory for recompute: gradients equal the un-rematerialised ones."""
    base = WanDiTConfig.tiny(num_layers=2)
    rng = np.random.default_rng(0)
    z = jnp.asarray(rng.standard_normal((1, 2, 4, 4, base.in_channels)), jnp.float32)
    t = jnp.asarray([[0.0, 500.0]])
    ctx = jnp.asarray(rng.standard_normal((1, base.text_len, base.text_dim)), jnp.float32)

    def grads(cfg):
        graphdef, state = nnx.split(init_dit(cfg, 0))
        loss = lambda s: jnp.sum(nnx.merge(graphdef, s)(z, t, ctx) ** 2)  # noqa: E731
        return flatten_params(nnx.to_pure_dict(jax.grad(loss)(state)))

    ref, got = grads(base), grads(WanDiTConfig.tiny(num_layers=2, remat=remat))
    assert ref.keys() == got.keys()
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_save_dots_attn_policy_names_jax_cudnn_attention():
    """The policy keys on JAX's cuDNN attention primitive names: fail loudly if JAX renames them."""
    from jax._src.cudnn import fused_attention_stablehlo as fa

    names = {fa._dot_product_attention_fwd_p_wrapper.name, fa._dot_product_attention_fwd_p.name}
    assert names == set(dit.ATTENTION_FWD_PRIMITIVES)
    x = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    assert dit.save_dots_and_attention(fa._dot_product_attention_fwd_p_wrapper, x)
    assert not dit.save_dots_and_attention(jax.lax.exp_p, x)
    dot_params = dict(dimension_numbers=(((1,), (0,)), ((), ())), precision=None, preferred_element_type=None)
    assert dit.save_dots_and_attention(jax.lax.dot_general_p, x, x, **dot_params)
    batched = dict(dot_params, dimension_numbers=(((2,), (1,)), ((0,), (0,))))
    x3 = jax.ShapeDtypeStruct((2, 8, 8), jnp.float32)
    assert not dit.save_dots_and_attention(jax.lax.dot_general_p, x3, x3, **batched)


def test_token_padding_keeps_diffusers_parity(case):
    """Tail-padding the tokens (token_multiple) changes nothing: pads are masked out of the keys."""
    cfg, sd, inputs, ref_out = case
    cfg = WanDiTConfig(**{**cfg.__dict__, "token_multiple": 16})
    tokens = np.prod(inputs[0].shape[1:4]) // 4
    assert tokens % 16, "the case must need padding for this test to mean anything"
    assert rel_l2(_forward(cfg, dit_params_from_state_dict(sd, cfg), inputs), ref_out) <= 1e-5


def test_token_padding_keeps_gradients_and_pads_every_block():
    base = WanDiTConfig.tiny(num_layers=2, remat="save_dots")
    rng = np.random.default_rng(1)
    z = jnp.asarray(rng.standard_normal((2, 3, 6, 10, base.in_channels)), jnp.float32)  # 45 tokens
    t = jnp.asarray([[0.0, 500.0, 500.0], [10.0, 900.0, 300.0]])
    ctx = jnp.asarray(rng.standard_normal((2, base.text_len, base.text_dim)), jnp.float32)

    def loss_and_grads(cfg):
        graphdef, state = nnx.split(init_dit(cfg, 0))
        loss = lambda s: jnp.sum(nnx.merge(graphdef, s)(z, t, ctx) ** 2)  # noqa: E731
        return loss, state, jax.grad(loss)(state)

    ref_loss, ref_state, ref_g = loss_and_grads(base)
    cfg = WanDiTConfig.tiny(num_layers=2, remat="save_dots", token_multiple=32)
    loss, state, g = loss_and_grads(cfg)
    ref_g, g = flatten_params(nnx.to_pure_dict(ref_g)), flatten_params(nnx.to_pure_dict(g))
    for k in ref_g:  # float32 sums over 45 vs 64 rows differ in order: tolerance scaled to each gradient
        np.testing.assert_allclose(g[k], ref_g[k], rtol=1e-5, atol=1e-5 * float(np.abs(ref_g[k]).max()), err_msg=k)
    # the blocks really run on 64 tokens (45 + 19 pads), the head on 45
    jaxpr = str(jax.make_jaxpr(loss)(state))
    assert f"f32[2,64,{cfg.dim}]" in jaxpr and f"f32[2,45,{cfg.dim}]" in jaxpr
    assert f"f32[2,64,{cfg.dim}]" not in str(jax.make_jaxpr(ref_loss)(ref_state))
    with pytest.raises(ValueError, match="token_multiple"):
        WanDiTConfig.tiny(token_multiple=0)


def test_unrolled_serving_layout_has_per_layer_weights():
    """dit.unrolled: one module per layer (no stacked weights for XLA to slice and copy), same outputs."""
    cfg = WanDiTConfig.tiny(num_layers=3)
    model = init_dit(cfg, 0)
    served = dit.unrolled(model)
    assert isinstance(served.blocks, nnx.List) and len(served.blocks) == 3 and served.cfg.scan_unroll == 3
    for i, block in enumerate(served.blocks):
        np.testing.assert_array_equal(block.ffn_up.kernel[...], model.blocks.ffn_up.kernel[...][i])
        qkv = [getattr(model.blocks.self_attn, n).kernel[...][i] for n in "qkv"]  # fused for serving
        np.testing.assert_array_equal(block.self_attn.qkv.kernel[...], np.concatenate(qkv, axis=1))
        assert block.self_attn.q is None and block.cross_attn.q.kernel[...].shape == (cfg.dim, cfg.dim)
        assert block.cross_attn.k is None and block.cross_attn.v is None  # in model.fused_text_kv
    text_kv = [getattr(model.blocks.cross_attn, n).kernel[...][i] for i in range(3) for n in "kv"]
    np.testing.assert_array_equal(served.fused_text_kv.kernel[...], np.concatenate(text_kv, axis=1))
    with pytest.raises(ValueError, match="fused"):
        served.blocks[0].cross_attn.key_value(jnp.zeros((1, 2, cfg.dim)))
    assert dit.unrolled(served) is served
    rng = np.random.default_rng(3)
    z = jnp.asarray(rng.standard_normal((1, 2, 4, 6, cfg.in_channels)), jnp.float32)
    t, ctx = jnp.asarray([[0.0, 700.0]]), jnp.asarray(rng.standard_normal((1, cfg.text_len, cfg.text_dim)), jnp.float32)
    run = lambda m: jax.jit(lambda s: nnx.merge(nnx.graphdef(m), s)(z, t, ctx))(nnx.state(m))  # noqa: E731
    np.testing.assert_allclose(run(served), run(model), rtol=1e-5, atol=1e-6)
    # All layers' text K/V from the one fused GEMM == each block's own k/v projections.
    ctx_bsd = model.embed_text(ctx)
    for a, b in zip(served.text_kv(ctx_bsd), model.text_kv(ctx_bsd)):
        assert a.shape == (3, 1, cfg.text_len, cfg.num_heads, cfg.head_dim)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    split = dit.unrolled(model, fuse_text_kv=False)
    assert split.fused_text_kv is None
    np.testing.assert_array_equal(split.blocks[2].cross_attn.k.kernel[...], model.blocks.cross_attn.k.kernel[...][2])


@pytest.mark.parametrize("remat, forwards", [("save_dots", 2), ("save_dots_attn", 1)])
def test_save_dots_attn_skips_the_attention_recompute(remat, forwards, monkeypatch):
    """Traced (not run: no cuDNN here) gradient of a rematerialised cuDNN attention: "save_dots" runs
    the attention forward twice (forward + recompute in the backward), "save_dots_attn" once."""
    from jax._src.cudnn import fused_attention_stablehlo as fa

    monkeypatch.setattr(fa, "check_cudnn_version", lambda: 91000)  # tracing only: pretend an H100/H200
    monkeypatch.setattr(fa, "check_compute_capability", lambda *_: True)
    q = jnp.ones((1, 16, 2, 64), jnp.bfloat16)
    attend = jax.checkpoint(lambda q: jax.nn.dot_product_attention(q, q, q, implementation="cudnn"),
                            policy=dit._REMAT_POLICIES[remat])
    jaxpr = str(jax.make_jaxpr(jax.grad(lambda q: jnp.sum(attend(q).astype(jnp.float32))))(q))
    assert jaxpr.count("dot_product_attention_fwd_wrapper") == forwards
    assert jaxpr.count("dot_product_attention_bwd") == 1


# Original Wan names, written here independently of the library's table (regex on diffusers keys).
_TO_WAN = [
    (r"^condition_embedder\.text_embedder\.linear_1\.", "text_embedding.0."),
    (r"^condition_embedder\.text_embedder\.linear_2\.", "text_embedding.2."),
    (r"^condition_embedder\.time_embedder\.linear_1\.", "time_embedding.0."),
    (r"^condition_embedder\.time_embedder\.linear_2\.", "time_embedding.2."),
    (r"^condition_embedder\.time_proj\.", "time_projection.1."),
    (r"^proj_out\.", "head.head."),
    (r"^scale_shift_table$", "head.modulation"),
    (r"\.attn1\.", ".self_attn."),
    (r"\.attn2\.", ".cross_attn."),
    (r"\.to_out\.0\.", ".o."),
    (r"\.to_([qkv])\.", r".\1."),
    (r"\.norm2\.", ".norm3."),
    (r"\.ffn\.net\.0\.proj\.", ".ffn.0."),
    (r"\.ffn\.net\.2\.", ".ffn.2."),
    (r"\.scale_shift_table$", ".modulation"),
]


def to_wan_names(sd: dict) -> dict:
    out = {}
    for k, v in sd.items():
        for pat, rep in _TO_WAN:
            k = re.sub(pat, rep, k)
        out[k] = v
    return out


def test_wan_layout_gives_identical_params(case):
    cfg, sd, inputs, ref_out = case
    from_diffusers = flatten_params(dit_params_from_state_dict(sd, cfg))
    wan_sd = to_wan_names(sd)
    assert "head.head.weight" in wan_sd and "blocks.0.self_attn.q.weight" in wan_sd
    from_wan = flatten_params(dit_params_from_state_dict(wan_sd, cfg))
    # also accept the single-file wrapper prefix some repackaged checkpoints carry
    prefixed = flatten_params(dit_params_from_state_dict(
        {f"model.diffusion_model.{k}": v for k, v in wan_sd.items()}, cfg))
    assert from_wan.keys() == from_diffusers.keys() == prefixed.keys()
    for k in from_wan:
        np.testing.assert_array_equal(from_wan[k], from_diffusers[k])
        np.testing.assert_array_equal(prefixed[k], from_diffusers[k])


def test_converter_errors_name_the_key(case):
    cfg, sd, *_ = case
    missing = dict(sd)
    del missing["blocks.0.attn2.to_k.bias"]
    with pytest.raises(ConversionError, match=r"missing key 'blocks\.0\.attn2\.to_k\.bias'"):
        dit_params_from_state_dict(missing, cfg)
    extra = {**sd, "blocks.0.attn1.lora_A.weight": np.zeros(3, np.float32)}
    with pytest.raises(ConversionError, match=r"unexpected key 'blocks\.0\.attn1\.lora_A\.weight'"):
        dit_params_from_state_dict(extra, cfg)
    bad = {**sd, "proj_out.weight": np.zeros((3, 3), np.float32)}
    with pytest.raises(ConversionError, match=r"'proj_out\.weight' has shape \(3, 3\)"):
        dit_params_from_state_dict(bad, cfg)


def test_timesteps_must_be_per_frame():
    from rynn_jax.models.dit import init_dit

    cfg = WanDiTConfig.tiny()
    model = init_dit(cfg)
    z = jnp.zeros((1, 3, 4, 4, cfg.in_channels))
    with pytest.raises(ValueError, match="per latent frame"):
        model(z, jnp.zeros((1, 2)), jnp.zeros((1, cfg.text_len, cfg.text_dim)))
    with pytest.raises(ValueError, match="not divisible by patch size"):
        model(jnp.zeros((1, 3, 5, 4, cfg.in_channels)), jnp.zeros((1, 3)),
              jnp.zeros((1, cfg.text_len, cfg.text_dim)))


def test_full_5b_shapes_without_allocating():
    model = abstract_dit(WanDiTConfig.ti2v_5b())
    flat = flatten_params(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    assert all(isinstance(v, jax.ShapeDtypeStruct) for v in flat.values())
    assert sum(int(np.prod(v.shape)) for v in flat.values()) == 4_999_787_712
    shapes = {"/".join(k): tuple(v.shape) for k, v in flat.items()}
    assert shapes["patch_embed"] == (1, 2, 2, 48, 3072)
    assert shapes["blocks/self_attn/q/kernel"] == (30, 3072, 3072)
    assert shapes["blocks/self_attn/norm_q"] == (30, 3072)
    assert shapes["blocks/ffn_up/kernel"] == (30, 3072, 14336)
    assert shapes["blocks/modulation"] == (30, 6, 3072)
    assert shapes["text_embed_1/kernel"] == (4096, 3072)
    assert shapes["time_proj/kernel"] == (3072, 18432)
    assert shapes["head/kernel"] == (3072, 192)


def test_every_param_has_logical_axes():
    model = abstract_dit(WanDiTConfig.ti2v_5b())
    specs = nnx.get_partition_spec(nnx.state(model, nnx.Param))
    shapes = flatten_params(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    for path, spec in flatten_params(nnx.to_pure_dict(specs)).items():
        assert spec is not None and len(spec) == len(shapes[path].shape), path  # every axis named
    assert tuple(nnx.to_pure_dict(specs)["blocks"]["ffn_up"]["kernel"]) == ("layers", "embed", "mlp")


# --------------------------------------------------------------------------------------------------
# A checkpoint's own config.json
# --------------------------------------------------------------------------------------------------

# The keys the released Wan2.2-TI2V-5B files carry: diffusers' transformer/config.json and the
# original repo's config.json (WanModel leaves patch_size and text_dim out of its file).
DIFFUSERS_5B = {"_class_name": "WanTransformer3DModel", "_diffusers_version": "0.35.0.dev0",
                "added_kv_proj_dim": None, "attention_head_dim": 128, "cross_attn_norm": True, "eps": 1e-06,
                "ffn_dim": 14336, "freq_dim": 256, "image_dim": None, "in_channels": 48, "num_attention_heads": 24,
                "num_layers": 30, "out_channels": 48, "patch_size": [1, 2, 2], "pos_embed_seq_len": None,
                "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 1024, "text_dim": 4096}
WAN_5B = {"_class_name": "WanModel", "_diffusers_version": "0.33.0", "dim": 3072, "eps": 1e-06, "ffn_dim": 14336,
          "freq_dim": 256, "in_dim": 48, "model_type": "ti2v", "num_heads": 24, "num_layers": 30, "out_dim": 48,
          "text_len": 512}


def test_released_config_json_files_give_the_5b_preset():
    assert dit_config_from_json(DIFFUSERS_5B) == WanDiTConfig.ti2v_5b() == dit_config_from_json(WAN_5B)
    # what the file does not say comes from the base config
    assert dit_config_from_json(WAN_5B, WanDiTConfig.tiny()).text_dim == WanDiTConfig.tiny().text_dim
    # parts we do not implement, and keys we do not know, are refused by name
    for raw, message in (({**DIFFUSERS_5B, "image_dim": 1280}, "image_dim=1280 is not supported"),
                         ({**WAN_5B, "model_type": "i2v"}, "model_type='i2v' is not supported"),
                         ({**WAN_5B, "vace_layers": [0, 2]}, "key 'vace_layers' is not one rynn-jax knows")):
        with pytest.raises(ConversionError, match=re.escape(message)):
            dit_config_from_json(raw, source="ckpt/config.json")


@pytest.mark.usefixtures("fast_compile")
def test_loads_an_odd_architecture_from_its_config_json(tmp_path):
    """A tiny architecture unlike any preset (in ≠ out channels, 3 heads, eps 1e-5), saved by
    diffusers (save_pretrained: config.json + safetensors), loads without being told the
    architecture and gives diffusers' outputs; the same weights in the original Wan layout with the
    original repo's config.json keys give the same parameters; the converter CLI reads the file
    too, and a given config that disagrees with it is refused."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    from diffusers import WanTransformer3DModel
    from safetensors.numpy import save_file

    from rynn_jax import converted_weights
    from rynn_jax.convert import main as convert_cli

    torch.manual_seed(3)
    ref = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=3, attention_head_dim=12, in_channels=5,
                                out_channels=7, text_dim=20, freq_dim=16, ffn_dim=40, num_layers=3, eps=1e-5,
                                rope_max_seq_len=64).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            p.copy_((1.0 if re.search(r"norm.*weight", name) else 0.0) + 0.2 * torch.randn_like(p))
    ref.save_pretrained(tmp_path / "pipeline" / "transformer")
    model = load_dit(tmp_path / "pipeline")
    assert model.cfg == WanDiTConfig(dim=36, num_layers=3, num_heads=3, ffn_dim=40, freq_dim=16, in_channels=5,
                                     out_channels=7, text_dim=20, eps=1e-5, rope_max_len=64)
    rng = np.random.default_rng(0)
    z = rng.standard_normal((1, 3, 4, 6, 5)).astype(np.float32)
    t = np.asarray([[0.0, 700.0, 700.0]], np.float32)
    ctx = pad_context(rng.standard_normal((9, 20)).astype(np.float32), model.cfg.text_len)[None]
    graphdef, state = nnx.split(model)
    got = jax.jit(lambda s, *a: nnx.merge(graphdef, s)(*a))(state, z, t, ctx)
    assert got.shape == (1, 3, 4, 6, 7)
    assert rel_l2(got, _reference_out(ref, z, t, ctx)) < 1e-5

    wan = tmp_path / "wan"
    wan.mkdir()
    sd = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    save_file(to_wan_names(sd), str(wan / "diffusion_pytorch_model.safetensors"))
    (wan / "config.json").write_text(json.dumps({
        "_class_name": "WanModel", "dim": 36, "eps": 1e-05, "ffn_dim": 40, "freq_dim": 16, "in_dim": 5,
        "model_type": "t2v", "num_heads": 3, "num_layers": 3, "out_dim": 7, "text_dim": 20, "text_len": 9}))
    from_wan = load_dit(wan)
    assert from_wan.cfg == dataclasses.replace(model.cfg, text_len=9, rope_max_len=1024)
    want = flatten_params(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    for path, value in flatten_params(nnx.to_pure_dict(nnx.state(from_wan, nnx.Param))).items():
        np.testing.assert_array_equal(np.asarray(value), np.asarray(want[path]))

    convert_cli(["dit", str(tmp_path / "pipeline"), str(tmp_path / "converted")])
    assert converted_weights.load_config(tmp_path / "converted", WanDiTConfig) == model.cfg
    with pytest.raises(ConversionError, match=r"num_layers=3 there, 2 given"):
        load_dit(tmp_path / "pipeline", WanDiTConfig.tiny())
    with pytest.raises(ConversionError, match=r"in_channels=5 there, 8 given"):
        convert_cli(["dit", str(wan), str(tmp_path / "refused"), "--config", "tiny"])
    assert not (tmp_path / "refused").exists()
