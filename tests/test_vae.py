"""Wan2.2 VAE: parity with diffusers' AutoencoderKLWan (2.2 variant), streaming == whole clip,
both checkpoint namings, converter errors, and the full-size parameter count without allocating."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rynn_jax.weights import ConversionError, convert_state_dict, flatten_params
from rynn_jax.models import vae as V
from rynn_jax.models import vae_weights as W

torch = pytest.importorskip("torch")  # the oracle (and, for checkpoints, the writer) here

CFG = V.WanVAEConfig.tiny()
B, T, H, WD = 2, 13, 32, 48  # 13 frames → 4 latent frames of 2×3


def diffusers_kwargs(cfg: V.WanVAEConfig) -> dict:
    return dict(
        base_dim=cfg.base_dim, decoder_base_dim=cfg.decoder_base_dim, z_dim=cfg.z_dim,
        dim_mult=list(cfg.dim_mult), num_res_blocks=cfg.num_res_blocks,
        temperal_downsample=list(cfg.temporal_downsample), is_residual=True,
        in_channels=cfg.patch_channels, out_channels=cfg.patch_channels, patch_size=cfg.patch_size,
        scale_factor_temporal=cfg.temporal_stride, scale_factor_spatial=cfg.spatial_stride,
        latents_mean=list(cfg.latents_mean), latents_std=list(cfg.latents_std))


def rel_l2(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))


@pytest.fixture(scope="module")
def ref():
    """Tiny random diffusers VAE with norms and biases pushed away from their init values."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    vae = AutoencoderKLWan(**diffusers_kwargs(CFG)).eval().requires_grad_(False)
    for name, p in vae.named_parameters():
        if name.endswith("gamma"):
            p.copy_(1.0 + 0.3 * torch.randn_like(p))
        elif name.endswith("bias"):
            p.copy_(0.1 * torch.randn_like(p))
    return vae


@pytest.fixture(scope="module")
def state_dict(ref):
    return {k: v.numpy() for k, v in ref.state_dict().items()}


def split_from_diffusers(state_dict: dict, cfg: V.WanVAEConfig) -> tuple:
    """(graphdef, params) of our VAE with `cfg`, filled from a diffusers state dict."""
    params = convert_state_dict(state_dict, W.vae_rules(cfg, "diffusers"), W.abstract_params(cfg))
    return nnx.split(V.vae_from_params(cfg, params))


@pytest.fixture(scope="module")
def ours(state_dict):
    return split_from_diffusers(state_dict, CFG)


@pytest.fixture(scope="module")
def video():
    return torch.rand(B, 3, T, H, WD, generator=torch.Generator().manual_seed(1)) * 2 - 1


def to_bthwc(x: torch.Tensor) -> jax.Array:
    return jnp.asarray(x.permute(0, 2, 3, 4, 1).numpy())


def from_bthwc(x) -> np.ndarray:
    return np.asarray(x).transpose(0, 4, 1, 2, 3)


# Each function is compiled once, for normalized latents (the default): XLA:CPU compiles dominate
# the run time. Normalization is checked against diffusers' raw mean with the same statistics.
encode = jax.jit(V.encode)
decode = jax.jit(V.decode)
encode_chunk = jax.jit(V.encode_chunk, static_argnames=("normalize", "first"))
decode_chunk = jax.jit(V.decode_chunk, static_argnames=("normalize", "first"))
MEAN = np.asarray(CFG.latents_mean, np.float32)
STD = np.asarray(CFG.latents_std, np.float32)


@pytest.fixture(scope="module")
def latents(ours, video):
    graphdef, params = ours
    return encode(graphdef, params, to_bthwc(video))


# --------------------------------------------------------------------------------------------------
# Parity with diffusers
# --------------------------------------------------------------------------------------------------


def test_encode_matches_diffusers(ref, latents, video):
    with torch.no_grad():
        mu = ref.encode(video).latent_dist.mean.numpy()
    assert latents.shape == (B, 4, H // 16, WD // 16, CFG.z_dim)
    want = (mu.transpose(0, 2, 3, 4, 1) - MEAN) / STD  # what the DiT consumes
    err = rel_l2(latents, want)
    print(f"encode rel L2 {err:.2e}")
    assert err <= 1e-5


def test_decode_matches_diffusers(ref, ours):
    graphdef, params = ours
    z = torch.randn(B, CFG.z_dim, 4, 2, 3, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = ref.decode(z).sample.numpy()
    clamped = np.mean(np.abs(want) >= 1.0)
    assert clamped < 0.5, f"{clamped:.0%} of the reference output is clamped: a weak test"
    got = decode(graphdef, params, (to_bthwc(z) - MEAN) / STD)
    assert got.shape == (B, T, H, WD, 3)
    err = rel_l2(from_bthwc(got), want)
    print(f"decode rel L2 {err:.2e} (clamped {clamped:.1%})")
    assert err <= 1e-5


@pytest.mark.parametrize("impl", ["3d", "sum2d"])
def test_conv_impls_match_diffusers(ref, state_dict, video, impl):
    """Every conv formulation (the default is fold2d, a GPU speed choice) computes the same
    encoder and decoder."""
    cfg = dataclasses.replace(CFG, conv_impl=impl)
    graphdef, params = split_from_diffusers(state_dict, cfg)
    z = torch.randn(B, CFG.z_dim, 4, 2, 3, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want_video = ref.decode(z).sample.numpy()
        want_mu = ref.encode(video).latent_dist.mean.numpy()
    got_video = decode(graphdef, params, (to_bthwc(z) - MEAN) / STD)
    got_mu = encode(graphdef, params, to_bthwc(video))
    assert rel_l2(from_bthwc(got_video), want_video) <= 1e-5
    assert rel_l2(got_mu, (want_mu.transpose(0, 2, 3, 4, 1) - MEAN) / STD) <= 1e-5


def test_single_image_encode_matches_diffusers_with_a_third_of_the_conv_work(ref, ours, video):
    """An image (T = 1) skips the causal padding's zero taps: same latents as diffusers, and XLA's
    FLOP count well under the zero-cache program's (which runs every tap)."""
    graphdef, params = ours
    image = video[:, :, :1]
    with torch.no_grad():
        want = ref.encode(image).latent_dist.mean.numpy()
    got = encode(graphdef, params, to_bthwc(image))
    assert rel_l2(got, (want.transpose(0, 2, 3, 4, 1) - MEAN) / STD) <= 1e-5
    x = to_bthwc(image)
    cache = V.init_encode_cache(CFG, B, H, WD)
    chunk = jnp.repeat(x, 4, axis=1)

    def flops(fn, *args) -> float:
        c = jax.jit(fn).lower(*args).compile().cost_analysis()
        return (c[0] if isinstance(c, list) else c)["flops"]

    # every tap run: the frame through the zero cache explicitly
    every_tap = flops(lambda p, c, v: nnx.merge(graphdef, p).encode_frames(v, c, True, True),
                      params, cache["layers"], x)
    lone = flops(lambda p, v: encode(graphdef, p, v), params, x)
    first_chunk = flops(lambda p, c, v: encode_chunk(graphdef, p, c, v, first=True), params, cache, chunk)
    assert lone < 0.5 * every_tap and first_chunk < 0.5 * every_tap, (lone, first_chunk, every_tap)
    streamed, _ = encode_chunk(graphdef, params, cache, chunk, first=True)
    assert rel_l2(got, streamed) <= 1e-5


# --------------------------------------------------------------------------------------------------
# Streaming == whole clip
# --------------------------------------------------------------------------------------------------


def test_streaming_encode_equals_whole_clip(ours, video, latents):
    graphdef, params = ours
    x = to_bthwc(video)
    cache = V.init_encode_cache(CFG, B, H, WD)
    chunks = [jnp.repeat(x[:, :1], 4, axis=1)] + [x[:, 1 + 4 * i: 5 + 4 * i] for i in range(3)]
    outs = []
    for chunk in chunks:
        z, cache = encode_chunk(graphdef, params, cache, chunk)
        outs.append(z)
    assert int(cache["step"]) == 4
    err = rel_l2(jnp.concatenate(outs, axis=1), latents)
    print(f"streaming encode rel L2 {err:.2e}")
    assert err <= 1e-5


def test_streaming_decode_equals_whole_clip(ours, latents):
    graphdef, params = ours
    whole = decode(graphdef, params, latents)
    cache = V.init_decode_cache(CFG, B, H, WD)
    outs = []
    for i in range(latents.shape[1]):
        y, cache = decode_chunk(graphdef, params, cache, latents[:, i:i + 1])
        assert y.shape == (B, 4, H, WD, 3)
        outs.append(y)
    assert not np.any(np.asarray(outs[0][:, :3]))  # first call: one frame, at index 3
    err = rel_l2(jnp.concatenate(outs, axis=1)[:, 3:], whole)
    print(f"streaming decode rel L2 {err:.2e}")
    assert err <= 1e-5


@pytest.mark.parametrize("impl", ["3d", "sum2d", "fold2d"])
def test_streaming_every_conv_impl_and_static_branch(ours, state_dict, video, latents, impl):
    """Streaming (causal caches as `past` of each conv) agrees with the whole clip for every conv
    formulation, with the first/later branch picked on the device (cond) or statically."""
    cfg = dataclasses.replace(CFG, conv_impl=impl)
    graphdef, params = split_from_diffusers(state_dict, cfg)
    whole = decode(*ours, latents)
    x = to_bthwc(video)
    enc = V.init_encode_cache(cfg, B, H, WD)
    dec = V.init_decode_cache(cfg, B, H, WD)
    chunks = [jnp.repeat(x[:, :1], 4, axis=1)] + [x[:, 1 + 4 * i: 5 + 4 * i] for i in range(3)]
    zs, ys = [], []
    for i, chunk in enumerate(chunks):
        z, enc = encode_chunk(graphdef, params, enc, chunk, first=i == 0)
        zs.append(z)
    for i in range(latents.shape[1]):
        y, dec = decode_chunk(graphdef, params, dec, latents[:, i:i + 1], first=(i == 0) if i % 2 else None)
        ys.append(y)
    assert int(enc["step"]) == 4 and int(dec["step"]) == latents.shape[1]
    assert rel_l2(jnp.concatenate(zs, axis=1), latents) <= 1e-5
    assert rel_l2(jnp.concatenate(ys, axis=1)[:, 3:], whole) <= 1e-5


# --------------------------------------------------------------------------------------------------
# Checkpoints: both namings, loading, errors
# --------------------------------------------------------------------------------------------------


def to_wan_names(sd: dict, r: int) -> dict:
    """Diffusers → original Wan2.2 names, written independently of `vae_weights.wan_key`."""
    out = {}
    for k, v in sd.items():
        for a, b in ((".norm1.", ".residual.0."), (".conv1.", ".residual.2."),
                     (".norm2.", ".residual.3."), (".conv2.", ".residual.6."),
                     (".conv_shortcut.", ".shortcut.")):
            k = k.replace(a, b)  # residual-block internals (only resnets use these names)
        k = re.sub(r"^quant_conv\.", "conv1.", k)
        k = re.sub(r"^post_quant_conv\.", "conv2.", k)
        k = k.replace(".conv_in.", ".conv1.").replace(".norm_out.", ".head.0.")
        k = k.replace(".conv_out.", ".head.2.")
        k = k.replace(".mid_block.resnets.0.", ".middle.0.")
        k = k.replace(".mid_block.resnets.1.", ".middle.2.")
        k = k.replace(".mid_block.attentions.0.", ".middle.1.")
        k = re.sub(r"down_blocks\.(\d+)\.resnets\.", r"downsamples.\1.downsamples.", k)
        k = re.sub(r"down_blocks\.(\d+)\.downsampler\.", rf"downsamples.\1.downsamples.{r}.", k)
        k = re.sub(r"up_blocks\.(\d+)\.resnets\.", r"upsamples.\1.upsamples.", k)
        k = re.sub(r"up_blocks\.(\d+)\.upsampler\.", rf"upsamples.\1.upsamples.{r + 1}.", k)
        out[k] = v
    return out


def test_wan_naming_gives_identical_params(state_dict, ours):
    wan_sd = to_wan_names(state_dict, CFG.num_res_blocks)
    for key in ("conv1.weight", "conv2.bias", "encoder.conv1.weight", "encoder.head.0.gamma",
                "decoder.head.2.weight", "encoder.middle.1.to_qkv.weight",
                "decoder.middle.2.residual.6.weight",
                "encoder.downsamples.1.downsamples.0.shortcut.weight",
                "encoder.downsamples.1.downsamples.1.time_conv.weight",
                "decoder.upsamples.0.upsamples.2.resample.1.weight"):
        assert key in wan_sd, key
    assert W.detect_vae_layout(wan_sd) == "wan" and W.detect_vae_layout(state_dict) == "diffusers"
    params = convert_state_dict(wan_sd, W.vae_rules(CFG, "wan"), W.abstract_params(CFG))
    want = flatten_params(nnx.to_pure_dict(ours[1]))
    got = flatten_params(params)
    assert {tuple(map(str, k)) for k in want} == set(got)
    for path, value in want.items():
        np.testing.assert_array_equal(got[tuple(map(str, path))], np.asarray(value))


def test_load_vae_from_files(tmp_path, ref, state_dict, ours):
    from safetensors.numpy import save_file

    save_file(state_dict, tmp_path / "vae.safetensors")
    wan_sd = to_wan_names(state_dict, CFG.num_res_blocks)
    torch.save({k: torch.from_numpy(v) for k, v in wan_sd.items()}, tmp_path / "Wan2.2_VAE.pth")
    want = jax.tree.leaves(nnx.to_pure_dict(ours[1]))
    from rynn_jax.convert import main as convert_cli

    convert_cli(["vae", str(tmp_path / "Wan2.2_VAE.pth"), str(tmp_path / "converted"), "--config", "tiny"])
    for name in ("vae.safetensors", "Wan2.2_VAE.pth", "converted"):
        model = W.load_vae(tmp_path / name, CFG if name != "converted" else None)
        got = jax.tree.leaves(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
        assert len(got) == len(want)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("layout", ["diffusers", "wan"])
def test_converter_errors_name_the_key(state_dict, layout):
    sd = state_dict if layout == "diffusers" else to_wan_names(state_dict, CFG.num_res_blocks)
    rules, abstract = W.vae_rules(CFG, layout), W.abstract_params(CFG)
    key = ("encoder.down_blocks.2.resnets.0.conv1.weight" if layout == "diffusers"
           else "encoder.downsamples.2.downsamples.0.residual.2.weight")

    missing = {k: v for k, v in sd.items() if k != key}
    with pytest.raises(ConversionError, match=re.escape(repr(key))):
        convert_state_dict(missing, rules, abstract)

    extra = {**sd, "decoder.extra.weight": np.zeros(3, np.float32)}
    with pytest.raises(ConversionError, match=re.escape("'decoder.extra.weight'")):
        convert_state_dict(extra, rules, abstract)

    for bad in (sd[key][:, :-1], sd[key][..., 0]):  # wrong size; wrong rank
        with pytest.raises(ConversionError, match=re.escape(repr(key))):
            convert_state_dict({**sd, key: bad}, rules, abstract)


# --------------------------------------------------------------------------------------------------
# Full size, without allocating
# --------------------------------------------------------------------------------------------------


def test_full_param_count_matches_diffusers():
    from diffusers import AutoencoderKLWan

    cfg = V.WanVAEConfig.wan22()
    with torch.device("meta"):
        ref = AutoencoderKLWan(**diffusers_kwargs(cfg))
    ref_count = sum(p.numel() for p in ref.parameters())
    abstract = W.abstract_params(cfg)  # from nnx.eval_shape: ShapeDtypeStructs, nothing allocated
    leaves = jax.tree.leaves(abstract)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    assert sum(x.size for x in leaves) == ref_count == 704_688_668
    # Every diffusers tensor is named by exactly one rule.
    rules = W.vae_rules(cfg, "diffusers")
    assert sorted(k for r in rules for k in r.sources) == sorted(ref.state_dict())
    assert cfg.temporal_stride == 4 and cfg.spatial_stride == 16


# --------------------------------------------------------------------------------------------------
# A checkpoint's own config.json
# --------------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("fast_compile")
def test_loads_an_odd_architecture_from_its_config_json(tmp_path):
    """A tiny VAE unlike any preset (3 levels with other widths, time halved at the first down
    step only, decoder width from the encoder's), saved by diffusers (save_pretrained), loads from
    its pipeline directory without being told the architecture and decodes as diffusers does; the
    released Wan2.2 file's keys give our preset; parts we do not implement are refused by name."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(4)
    kwargs = dict(base_dim=6, decoder_base_dim=None, z_dim=3, dim_mult=[1, 2, 2], num_res_blocks=1,
                  temperal_downsample=[True, False], is_residual=True, in_channels=12, out_channels=12,
                  patch_size=2, scale_factor_temporal=2, scale_factor_spatial=8,
                  latents_mean=[0.2, -0.1, 0.4], latents_std=[0.7, 1.3, 0.9])
    ref = AutoencoderKLWan(**kwargs).eval().requires_grad_(False)
    for name, p in ref.named_parameters():
        if name.endswith(("gamma", "bias")):
            p.copy_((1.0 if name.endswith("gamma") else 0.0) + 0.3 * torch.randn_like(p))
    ref.save_pretrained(tmp_path / "pipeline" / "vae")
    model = W.load_vae(tmp_path / "pipeline")
    assert model.cfg == V.WanVAEConfig(base_dim=6, decoder_base_dim=6, z_dim=3, dim_mult=(1, 2, 2), num_res_blocks=1,
                                       temporal_downsample=(True, False), latents_mean=(0.2, -0.1, 0.4),
                                       latents_std=(0.7, 1.3, 0.9))
    z = torch.randn(1, 3, 1, 2, 3, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = ref.decode(z).sample.numpy()
    mean, std = np.asarray(kwargs["latents_mean"], np.float32), np.asarray(kwargs["latents_std"], np.float32)
    got = jax.jit(V.decode)(*nnx.split(model), (to_bthwc(z) - mean) / std)
    assert got.shape == (1, 1, 16, 24, 3) and rel_l2(from_bthwc(got), want) <= 1e-5

    released = {"_class_name": "AutoencoderKLWan", "_diffusers_version": "0.35.0.dev0", "attn_scales": [],
                "base_dim": 160, "decoder_base_dim": 256, "dim_mult": [1, 2, 4, 4], "dropout": 0.0,
                "in_channels": 12, "is_residual": True, "latents_mean": list(V.WAN22_LATENTS_MEAN),
                "latents_std": list(V.WAN22_LATENTS_STD), "num_res_blocks": 2, "out_channels": 12,
                "patch_size": 2, "scale_factor_spatial": 16, "scale_factor_temporal": 4,
                "temperal_downsample": [False, True, True], "z_dim": 48}
    assert W.vae_config_from_json(released) == V.WanVAEConfig.wan22()
    for change, message in (({"is_residual": False}, "is_residual=False is not supported"),
                            ({"attn_scales": [0.5]}, "attn_scales=(0.5,) is not supported"),
                            ({"scale_factor_spatial": 8}, "scale_factor_spatial=8 does not match"),
                            ({"attn_heads": 4}, "key 'attn_heads' is not one rynn-jax knows")):
        with pytest.raises(ConversionError, match=re.escape(message)):
            W.vae_config_from_json({**released, **change})
    with pytest.raises(ConversionError, match=r"z_dim=3 there, 4 given"):
        W.load_vae(tmp_path / "pipeline", CFG)
