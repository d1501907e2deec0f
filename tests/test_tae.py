"""Tiny autoencoder (taew2_2 layout): parity with an independent float64 torch reference in the
official state-dict format, loading from .pth and .safetensors, streaming == whole clip, errors,
and the full-size shapes without allocating."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rynn_jax.weights import ConversionError
from rynn_jax.models import tae as T
from rynn_jax.models import tae_weights as TW

torch = pytest.importorskip("torch")  # the oracle (and, for checkpoints, the writer) here
F, nn = torch.nn.functional, torch.nn

CFG = T.TAEConfig.tiny(dtype="float32")
B, FRAMES, H, W = 2, 9, 32, 32  # 9 frames → 3 latent frames of 2×2


# --------------------------------------------------------------------------------------------------
# Reference: whole clip, NTCHW, float64, parameter names as in the official checkpoints
# --------------------------------------------------------------------------------------------------


class FrameConv(nn.Conv2d):
    """Conv2d over every frame of an NTCHW clip (a Conv2d subclass: same state-dict names)."""

    def forward(self, x):
        return super().forward(x.flatten(0, 1)).unflatten(0, x.shape[:2])


def conv3(c_in, c_out, **kw):
    return FrameConv(c_in, c_out, 3, padding=1, **kw)


class Mem(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(2 * c, c, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(c, c, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(c, c, 3, padding=1))

    def forward(self, x):
        prev = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], 1)  # the frame before, 0 first
        y = self.conv(torch.cat([x, prev], 2).flatten(0, 1)).unflatten(0, x.shape[:2])
        return torch.relu(y + x)


class Pool(nn.Module):
    def __init__(self, c, s):
        super().__init__()
        self.s, self.conv = s, nn.Conv2d(c * s, c, 1, bias=False)

    def forward(self, x):
        n, t, c, h, w = x.shape
        return self.conv(x.reshape(n * t // self.s, self.s * c, h, w)).unflatten(0, (n, -1))


class Grow(nn.Module):
    def __init__(self, c, s):
        super().__init__()
        self.s, self.conv = s, nn.Conv2d(c, c * s, 1, bias=False)

    def forward(self, x):
        n, t, c, h, w = x.shape
        return self.conv(x.flatten(0, 1)).reshape(n, t * self.s, c, h, w)


class Lambda(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def upsample(x):
    return F.interpolate(x.flatten(0, 1), scale_factor=2, mode="nearest").unflatten(0, x.shape[:2])


class Reference(nn.Module):
    def __init__(self, cfg: T.TAEConfig):
        super().__init__()
        p, z, c = cfg.patch_size, cfg.z_dim, cfg.encoder_width
        self.p, self.t_down, self.t_up = p, cfg.temporal_stride, cfg.decoder_temporal_stride
        enc = [conv3(3 * p * p, c), nn.ReLU()]
        for down in cfg.encoder_time_downscale:
            enc += [Pool(c, 2 if down else 1), conv3(c, c, stride=2, bias=False)]
            enc += [Mem(c) for _ in range(3)]
        self.encoder = nn.Sequential(*enc, conv3(c, z))
        d = cfg.decoder_widths
        dec = [Lambda(lambda x: 3 * torch.tanh(x / 3)), conv3(z, d[0]), nn.ReLU()]
        for i, (up_t, up_s) in enumerate(zip(cfg.decoder_time_upscale, cfg.decoder_space_upscale)):
            dec += [Mem(d[i]) for _ in range(3)]
            dec += [Lambda(upsample if up_s else (lambda x: x)), Grow(d[i], 2 if up_t else 1),
                    conv3(d[i], d[i + 1], bias=False)]
        self.decoder = nn.Sequential(*dec, nn.ReLU(), conv3(d[-1], 3 * p * p))

    def encode_video(self, x01):
        """NTCHW in [0, 1], padded at the end with the last frame to a multiple of t_down."""
        x01 = torch.cat([x01, x01[:, -1:].expand(-1, -x01.shape[1] % self.t_down, -1, -1, -1)], 1)
        return self.encoder(F.pixel_unshuffle(x01.flatten(0, 1), self.p).unflatten(0, x01.shape[:2]))

    def decode_video(self, z):
        y = self.decoder(z)
        y = F.pixel_shuffle(y.flatten(0, 1), self.p).unflatten(0, y.shape[:2]).clamp(0, 1)
        return y[:, self.t_up - 1:]


@pytest.fixture(scope="module")
def ref():
    torch.manual_seed(0)
    model = Reference(CFG).double().eval().requires_grad_(False)
    with torch.no_grad():  # decoder output mostly inside (0, 1): few clamped values, a strong test
        model.decoder[-1].bias.add_(0.5)
        model.decoder[-1].weight.mul_(0.5)
    return model


@pytest.fixture(scope="module")
def state_dict(ref):
    return {k: v.numpy() for k, v in ref.state_dict().items()}


@pytest.fixture(scope="module")
def ours(tmp_path_factory, state_dict):
    """(graphdef, params) loaded from a torch.save'd .pth, checked equal to the .safetensors load."""
    from safetensors.numpy import save_file

    root = tmp_path_factory.mktemp("tae")
    torch.save({k: torch.from_numpy(v) for k, v in state_dict.items()}, root / "taew2_2.pth")
    save_file(state_dict, str(root / "taew2_2.safetensors"))
    from_pth = nnx.split(TW.load_tae(root / "taew2_2.pth", CFG))
    from_st = nnx.state(TW.load_tae(root / "taew2_2.safetensors", CFG), nnx.Param)
    for a, b in zip(jax.tree.leaves(from_pth[1]), jax.tree.leaves(from_st), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    return from_pth


def to_ntchw(x) -> torch.Tensor:
    return torch.from_numpy(np.asarray(x, np.float64)).permute(0, 1, 4, 2, 3)


def to_bthwc(x: torch.Tensor) -> np.ndarray:
    return x.permute(0, 1, 3, 4, 2).numpy()


def rel_l2(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))


# XLA:CPU compiles dominate the run time: one per function and static-argument set, at -O0.
FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
encode = jax.jit(T.encode, static_argnames=("normalize", "time_pad"), compiler_options=FAST)
decode = jax.jit(T.decode, static_argnames=("normalize",), compiler_options=FAST)
encode_chunk = jax.jit(T.encode_chunk, static_argnames=("normalize", "first"), compiler_options=FAST)
decode_chunk = jax.jit(T.decode_chunk, static_argnames=("normalize", "first"), compiler_options=FAST)


@pytest.fixture(scope="module")
def video():
    # numpy, not jax.random: threefry takes XLA:CPU seconds to compile
    return jnp.asarray(np.random.default_rng(1).uniform(-1, 1, (B, FRAMES, H, W, 3)), jnp.float32)


@pytest.fixture(scope="module")
def latents(ours, video):
    return encode(*ours, video)


# --------------------------------------------------------------------------------------------------
# Parity with the reference
# --------------------------------------------------------------------------------------------------


def test_encode_matches_reference(ref, ours, video, latents):
    x01 = (to_ntchw(video) + 1) / 2
    with torch.no_grad():
        front = ref.encode_video(torch.cat([x01[:, :1].expand(-1, 3, -1, -1, -1), x01], 1))
        end = ref.encode_video(x01)  # the reference's own alignment: 9 frames → 12, padded at the end
    assert latents.shape == (B, 3, H // 16, W // 16, CFG.z_dim)
    err = rel_l2(latents, to_bthwc(front))
    got_end = encode(*ours, video, time_pad="end")
    err_end = rel_l2(got_end, to_bthwc(end))
    print(f"encode rel L2 front {err:.1e} end {err_end:.1e}")
    assert err <= 1e-5 and err_end <= 1e-5


def test_decode_matches_reference(ref, ours):
    z = torch.randn(B, 3, CFG.z_dim, 2, 2, generator=torch.Generator().manual_seed(2),
                    dtype=torch.float64) * 1.5
    with torch.no_grad():
        want = ref.decode_video(z)
    clamped = float(((want <= 0) | (want >= 1)).double().mean())
    assert clamped < 0.2, f"{clamped:.0%} of the reference output is clamped: a weak test"
    got = decode(*ours, jnp.asarray(to_bthwc(z), jnp.float32))
    assert got.shape == (B, FRAMES, H, W, 3)
    err = rel_l2((np.asarray(got) + 1) / 2, to_bthwc(want))
    print(f"decode rel L2 {err:.1e} (clamped {clamped:.1%})")
    assert err <= 1e-5


def test_bfloat16_model_is_close(state_dict, ours, latents):
    """bf16 parameters and compute, float32 output."""
    graphdef, params = nnx.split(TW.tae_from_state_dict(T.TAEConfig.tiny(), state_dict))
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}
    got = decode(graphdef, params, latents)
    assert got.dtype == jnp.float32
    assert rel_l2(got, decode(*ours, latents)) < 5e-2


# --------------------------------------------------------------------------------------------------
# Streaming == whole clip
# --------------------------------------------------------------------------------------------------


def to_raw(z):
    """Normalized latents → the Wan VAE's raw space, by the config's statistics."""
    return z * np.asarray(CFG.latents_std, np.float32) + np.asarray(CFG.latents_mean, np.float32)


def test_streaming_encode_equals_whole_clip(ours, video, latents):
    """The first call reads only frames[:, -1] (here frames 0..2 are noise); then 4 frames a call,
    the case picked from the cache's step counter. Raw latents (normalize=False) to cover both
    spaces without another compile."""
    noise = jnp.asarray(np.random.default_rng(3).normal(size=(B, 3, H, W, 3)), jnp.float32)
    chunks = [jnp.concatenate([noise, video[:, :1]], axis=1), video[:, 1:5], video[:, 5:9]]
    cache = T.init_encode_cache(CFG, B, H, W)
    outs = []
    for chunk in chunks:
        z, cache = encode_chunk(*ours, cache, chunk, normalize=False)
        outs.append(z)
    assert int(cache["step"]) == 3
    err = rel_l2(jnp.concatenate(outs, axis=1), to_raw(latents))
    print(f"streaming encode rel L2 {err:.1e}")
    assert err <= 1e-6
    # A reused cache: the first call ignores what it holds.
    z0, _ = encode_chunk(*ours, {**cache, "step": jnp.zeros((), jnp.int32)}, chunks[0], normalize=False)
    np.testing.assert_allclose(z0, outs[0], atol=1e-6)
    # Two chunks in one call (the first call, told statically), then the third: the same latents.
    z01, cache2 = encode_chunk(*ours, T.init_encode_cache(CFG, B, H, W), jnp.concatenate(chunks[:2], axis=1),
                               normalize=False, first=True)
    z2, _ = encode_chunk(*ours, cache2, chunks[2], normalize=False)
    assert z01.shape[1] == 2
    np.testing.assert_allclose(jnp.concatenate([z01, z2], axis=1), jnp.concatenate(outs, axis=1), atol=1e-5)


def test_streaming_decode_equals_whole_clip(ours, latents):
    """One latent a call; the first call told statically, the later ones by the step counter; raw
    latents in (normalize=False) against the whole-clip decode of the normalized ones."""
    whole = decode(*ours, latents)
    raw = to_raw(latents)
    cache = T.init_decode_cache(CFG, B, H, W)
    outs = []
    for i in range(latents.shape[1]):
        y, cache = decode_chunk(*ours, cache, raw[:, i:i + 1], normalize=False,
                                first=True if i == 0 else None)
        assert y.shape == (B, 4, H, W, 3)
        outs.append(y)
    assert int(cache["step"]) == latents.shape[1]
    assert not np.any(np.asarray(outs[0][:, :3]))  # first call: frame 0 at index 3, zeros before
    err = rel_l2(jnp.concatenate(outs, axis=1)[:, 3:], whole)
    print(f"streaming decode rel L2 {err:.1e}")
    assert err <= 1e-5
    # Two latents in one call, then the rest: the same frames.
    y01, cache2 = decode_chunk(*ours, T.init_decode_cache(CFG, B, H, W), raw[:, :2], normalize=False)
    y2, _ = decode_chunk(*ours, cache2, raw[:, 2:], normalize=False)
    assert y01.shape[1] == 8 and not np.any(np.asarray(y01[:, :3]))
    np.testing.assert_allclose(jnp.concatenate([y01, y2], axis=1), jnp.concatenate(outs, axis=1), atol=1e-5)


# --------------------------------------------------------------------------------------------------
# Bad inputs
# --------------------------------------------------------------------------------------------------


def test_loader_errors_name_the_key(state_dict):
    key = "decoder.9.conv.2.weight"
    with pytest.raises(ValueError, match=re.escape(repr(key))):  # missing
        TW.tae_from_state_dict(CFG, {k: v for k, v in state_dict.items() if k != key})
    with pytest.raises(ValueError, match=re.escape("'decoder.23.weight'")):  # unexpected
        TW.tae_from_state_dict(CFG, {**state_dict, "decoder.23.weight": np.zeros((3, 3, 3, 3))})
    for bad in (state_dict[key][:, :-1], state_dict[key][..., 0]):  # wrong size; wrong rank
        with pytest.raises(ConversionError, match=re.escape(repr(key))):
            TW.tae_from_state_dict(CFG, {**state_dict, key: bad})
    with pytest.raises(ConversionError, match="1-D bias"):
        TW.tae_from_state_dict(CFG, {**state_dict, "encoder.0.bias": state_dict["encoder.0.bias"][None]})


def test_time_grow_keeps_last_step_channels(state_dict, ours):
    """A TGrow weight with more output channels than ours (a checkpoint trained with a time
    upscale there) loads its last time step's rows, as the reference loader does."""
    key = "decoder.7.conv.weight"  # stride 1 in the Wan2.2 layout
    w = state_dict[key]
    sd = {**state_dict, key: np.concatenate([np.full_like(w, 7.0), w], axis=0)}
    got = nnx.state(TW.tae_from_state_dict(CFG, sd), nnx.Param)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ours[1]), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bad_frame_counts_and_shapes(ours, video, latents):
    with pytest.raises(ValueError, match=r"1 \+ 4·k frames"):
        T.encode(*ours, video[:, :8])
    cache = T.init_encode_cache(CFG, B, H, W)
    for bad in (video[:, :3], video[:, :6], video[:, :0]):
        with pytest.raises(ValueError, match="positive multiple of 4 frames"):
            T.encode_chunk(*ours, cache, bad)
    with pytest.raises(ValueError, match="multiples of 16"):
        T.encode_chunk(*ours, cache, video[:, :4, :24])
    with pytest.raises(ValueError, match="at least one latent frame"):
        T.decode_chunk(*ours, T.init_decode_cache(CFG, B, H, W), latents[:, :0])
    with pytest.raises(ValueError, match="latents must be"):
        T.decode(*ours, latents[..., :3])
    with pytest.raises(ValueError, match="time_pad"):
        T.encode(*ours, video, time_pad="middle")


# --------------------------------------------------------------------------------------------------
# Full size, without allocating
# --------------------------------------------------------------------------------------------------


def test_full_size_matches_official_layout():
    cfg = T.TAEConfig.wan22()
    with torch.device("meta"):
        ref = Reference(cfg)
    shapes = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    leaves = jax.tree.leaves(TW.abstract_params(cfg))  # ShapeDtypeStructs from nnx.eval_shape
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    assert sum(x.size for x in leaves) == sum(map(np.prod, shapes.values())) == 11_418_108
    assert sorted(k for r in TW.tae_rules(cfg) for k in r.sources) == sorted(shapes)
    assert shapes["encoder.0.weight"] == (64, 12, 3, 3)
    assert shapes["encoder.2.conv.weight"] == (64, 128, 1, 1)
    assert shapes["encoder.12.conv.weight"] == (64, 64, 1, 1)
    assert shapes["encoder.17.weight"] == (48, 64, 3, 3)
    assert shapes["decoder.1.weight"] == (256, 48, 3, 3)
    assert shapes["decoder.3.conv.0.weight"] == (256, 512, 3, 3)
    assert shapes["decoder.7.conv.weight"] == (256, 256, 1, 1)
    assert shapes["decoder.13.conv.weight"] == (256, 128, 1, 1)
    assert shapes["decoder.22.weight"] == (12, 64, 3, 3)
    assert (cfg.temporal_stride, cfg.decoder_temporal_stride, cfg.spatial_stride) == (4, 4, 16)
    assert TW.abstract_params(cfg)["decoder"]["conv_in"]["kernel"].dtype == jnp.bfloat16
