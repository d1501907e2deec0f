"""FP8 static scales calibrated on pre-encoded latent shards (`serve.py calibrate-fp8`), the scales
file, and loading it into the demo's model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rynn_jax.data import shards as shards_lib
from rynn_jax.models import fp8
from rynn_jax.models.dit import WanDiTConfig
from rynn_jax.serving.assemble import build_dit, build_modules
from rynn_jax.teleop import calibrate_fp8

ROOT = Path(__file__).resolve().parents[1]


def _record(rng, t_lat: int, cfg: WanDiTConfig, text_tokens: int) -> bytes:
    """One clip in rynn_jax.data.preencode's record format (latents channels-last)."""
    lat = lambda: rng.standard_normal((t_lat, 2, 4, cfg.in_channels)).astype(np.float32)  # noqa: E731
    return shards_lib.encode_record({
        "video_latents": lat(), "control_video_latents": lat(), "img_latent": lat()[:1],
        "text_embedding": rng.standard_normal((text_tokens, cfg.text_dim)).astype(np.float32),
        "text": np.asarray("pick up the cup", np.str_), "actions": np.zeros((4 * (t_lat - 1) + 1, 54), np.float32),
        "has_actions": np.asarray(True), "clip_id": np.asarray(0), "episode": np.asarray("e0", np.str_),
        "start": np.asarray(0, np.int64), "source": np.asarray("egodex", np.str_)})


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    cfg = build_dit(None, 0).cfg
    rng = np.random.default_rng(0)
    d = tmp_path_factory.mktemp("latents")
    for i in range(2):
        shards_lib.write_shard(d / shards_lib.shard_name("egodex", i, 2),
                               [_record(rng, 5, cfg, 7 + j) for j in range(2)])
    return d


def test_batches_are_noised_windows_of_the_clips(shard_dir):
    cfg = build_dit(None, 0).cfg
    clips = calibrate_fp8.read_clips(str(shard_dir), 3)
    assert len(clips) == 3
    batches = list(calibrate_fp8.calibration_batches(clips, cfg, frames=3, timesteps=[999.0, 500.0, 0.0], seed=1))
    assert len(batches) == 9
    for c, clip in enumerate(clips):
        x0 = clip["video_latents"]
        clean = batches[3 * c + 2]  # t = 0: exactly a window of the clip, its control latents alongside
        z, t, text, ctrl = clean
        assert z.shape == (1, 3, 2, 4, cfg.in_channels) and t.shape == (1, 3) and (t == 0).all()
        starts = [s for s in range(3) if np.array_equal(x0[s:s + 3], z[0])]
        assert len(starts) == 1
        np.testing.assert_array_equal(ctrl[0], clip["control_video_latents"][starts[0]:starts[0] + 3])
        n = clip["text_embedding"].shape[0]  # padded with zeros to text_len
        np.testing.assert_array_equal(text[0, :n], clip["text_embedding"])
        assert text.shape == (1, cfg.text_len, cfg.text_dim) and (text[0, n:] == 0).all()
        for k, sigma in ((0, 0.999), (1, 0.5)):  # x_σ = (1 − σ)·x0 + σ·ε with ε ~ N(0, 1)
            noisy = batches[3 * c + k][0][0]
            eps = (noisy - (1 - sigma) * x0[starts[0]:starts[0] + 3]) / sigma
            assert abs(eps.mean()) < 0.3 and 0.7 < eps.std() < 1.3, (k, eps.mean(), eps.std())


def test_cli_writes_scales_that_load_into_the_demo_model(shard_dir, tmp_path):
    out = tmp_path / "scales.safetensors"
    summary = calibrate_fp8.main(["--latents", str(shard_dir), "--out", str(out), "--clips", "3"])
    assert summary["clips"] == 3 and summary["batches"] == 15 and summary["timesteps"][-1] == 0.0
    for name, err in summary["rel_l2_vs_float_on_one_batch"].items():
        assert 1e-4 < err < 1e-1, (name, err)
    scales = fp8.load_scales(out)
    dit, _ = build_modules(None, None, 0, fp8=True, fp8_scales=str(out))
    assert dit.cfg.fp8_activations == "static"
    # same scales as calibrating directly on the same batches
    clips = calibrate_fp8.read_clips(str(shard_dir), 3)
    direct_batches = list(calibrate_fp8.calibration_batches(clips, dit.cfg, frames=3,
                                                            timesteps=summary["timesteps"], seed=0))
    direct = fp8.calibrate(fp8.quantize_dit(build_dit(None, 0)), lambda m, b: m(*b), direct_batches,
                           progress=False)
    want = fp8.static_scales(direct)
    assert set(scales) == set(want) == set(fp8.static_scales(dit))
    for name in want:
        np.testing.assert_allclose(scales[name], want[name], rtol=1e-6, err_msg=name)
        np.testing.assert_array_equal(fp8.static_scales(dit)[name], scales[name])


def test_scales_file_errors(tmp_path):
    q = fp8.quantize_dit(build_dit(None, 0))
    n = q.cfg.num_layers
    good = {name: np.full((n, 1), 0.01, np.float32) for name in
            [f"blocks.{a}.{p}.input_scale" for a in ("self_attn", "cross_attn") for p in "qkvo"]
            + ["blocks.ffn_up.input_scale", "blocks.ffn_down.input_scale"]}
    assert fp8.with_static_scales(q, good).cfg.fp8_activations == "static"
    with pytest.raises(ValueError, match=r"missing \['blocks\.ffn_up\.input_scale'\]"):
        fp8.with_static_scales(q, {k: v for k, v in good.items() if "ffn_up" not in k})
    with pytest.raises(ValueError, match=r"'blocks\.ffn_down\.input_scale' has shape \(1,\)"):
        fp8.with_static_scales(q, {**good, "blocks.ffn_down.input_scale": np.ones(1, np.float32)})
    with pytest.raises(ValueError, match=r"'blocks\.self_attn\.q\.input_scale' has non-finite"):
        fp8.with_static_scales(q, {**good, "blocks.self_attn.q.input_scale": np.full((n, 1), np.nan, np.float32)})
    with pytest.raises(ValueError, match="expects quantize_dit's output"):
        fp8.with_static_scales(build_dit(None, 0), good)

    from safetensors.numpy import save_file

    path = tmp_path / "s.safetensors"
    fp8.save_scales(path, fp8.with_static_scales(q, good), note="test")
    assert set(fp8.load_scales(path)) == set(good)
    data = path.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cut\.safetensors: cannot read FP8 scales"):
        fp8.load_scales(tmp_path / "cut.safetensors")
    save_file(good, str(tmp_path / "foreign.safetensors"))  # a safetensors file, but not ours
    with pytest.raises(ValueError, match=r"foreign\.safetensors: not an FP8 scales file"):
        fp8.load_scales(tmp_path / "foreign.safetensors")
    with pytest.raises(ValueError, match="--fp8-scales needs --fp8"):
        build_modules(None, None, 0, fp8_scales=str(path))


def test_calibration_input_errors(shard_dir, tmp_path):
    cfg = build_dit(None, 0).cfg
    with pytest.raises(ValueError, match="no latent shards"):
        calibrate_fp8.read_clips(str(tmp_path), 2)
    clips = calibrate_fp8.read_clips(str(shard_dir), 1)
    with pytest.raises(ValueError, match="clip 0: 5 latent frames, a block needs 6"):
        list(calibrate_fp8.calibration_batches(clips, cfg, frames=6, timesteps=[0.0]))
    with pytest.raises(ValueError, match=r"clip 0: record lacks \['control_video_latents'\]"):
        list(calibrate_fp8.calibration_batches([{k: v for k, v in clips[0].items() if k != "control_video_latents"}],
                                               cfg, frames=3, timesteps=[0.0]))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / shards_lib.shard_name("egodex", 0, 1)).write_bytes(b"not an array record")
    with pytest.raises(ValueError, match="cannot read latent shard"):
        calibrate_fp8.read_clips(str(bad), 2)


def test_serve_cli_lists_the_command():
    proc = subprocess.run([sys.executable, "serve.py", "calibrate-fp8", "-h"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "--latents" in proc.stdout and "--margin" in proc.stdout


def test_vae_cli_writes_scales_that_serve_the_decoder(tmp_path):
    """`serve.py calibrate-vae-fp8` on latent shards and a converted VAE whose decoder convs fit the
    FP8 kernel: the file holds the scales that calibrating directly on the same windows gives, it
    loads into that VAE (emulated FP8 on a CPU), and the served decoder is at FP8 distance."""
    import jax.numpy as jnp
    from flax import nnx

    from rynn_jax import converted_weights
    from rynn_jax.kernels import vae_fp8
    from rynn_jax.models import vae as V
    from rynn_jax.models.vae_weights import load_vae

    cfg = V.WanVAEConfig.tiny(decoder_base_dim=64, dim_mult=(1, 2), temporal_downsample=(True,))
    vae_dir = tmp_path / "vae"
    converted_weights.save_params(vae_dir, nnx.to_pure_dict(nnx.state(V.init_vae(cfg, 0), nnx.Param)), cfg)
    rng = np.random.default_rng(0)
    lat_dir = tmp_path / "latents"
    lat_dir.mkdir()
    recs = [shards_lib.encode_record({"video_latents": rng.standard_normal((4, 2, 4, cfg.z_dim)).astype(np.float32)})
            for _ in range(3)]
    shards_lib.write_shard(lat_dir / shards_lib.shard_name("egodex", 0, 1), recs)
    out = tmp_path / "vae_scales.safetensors"
    summary = calibrate_fp8.main_vae(["--latents", str(lat_dir), "--vae", str(vae_dir), "--out", str(out),
                                      "--clips", "3", "--frames", "2"])
    vae = load_vae(str(vae_dir))
    assert summary["clips"] == 3 and summary["convs"] == len(vae_fp8.kernel_convs(vae)) >= 8
    assert summary["conv_impl"] == vae_fp8.fp8_conv_impl()  # the FP8 numbers, measured
    assert 1e-3 < summary["rel_l2_vs_float_on_one_window"] < 0.2  # FP8 distance; a wrong scale is O(1)

    clips = calibrate_fp8.read_clips(str(lat_dir), 3)
    windows = list(calibrate_fp8.vae_calibration_batches(clips, cfg.z_dim, frames=2, seed=0))
    for w, clip in zip(windows, clips):  # each a window of its clip
        assert w.shape == (1, 2, 2, 4, cfg.z_dim)
        assert any(np.array_equal(w[0], clip["video_latents"][s:s + 2]) for s in range(3))
    direct = vae_fp8.calibrate(vae, vae_fp8.decode_clip, windows, progress=False)
    scales = vae_fp8.load_scales(str(out))
    assert set(scales) == set(direct)
    for k in direct:
        np.testing.assert_allclose(scales[k], direct[k], rtol=1e-6, err_msg=k)

    served = vae_fp8.load_static(vae, str(out))
    assert (served.cfg.conv_name, served.cfg.kernel_conv.fp8_scales) == (vae_fp8.serving_conv_impl(), "static")
    y = vae_fp8.decode_clip(served, jnp.asarray(windows[0]))
    assert y.shape == (1, 1 + cfg.temporal_stride, 8, 16, 3) and bool(jnp.isfinite(y).all())

    with pytest.raises(ValueError, match="--vae-fp8-scales needs --vae"):
        build_modules(None, None, 0, vae_fp8_scales=str(out))
    with pytest.raises(ValueError, match="fewer than --frames 5"):
        list(calibrate_fp8.vae_calibration_batches(clips, cfg.z_dim, frames=5))
    with pytest.raises(ValueError, match="do not fit a VAE with 16 latent channels"):
        list(calibrate_fp8.vae_calibration_batches(clips, 16, frames=2))
    with pytest.raises(ValueError, match="scales do not fit this VAE"):  # another VAE's scales
        vae_fp8.load_static(V.init_vae(V.WanVAEConfig.tiny(decoder_base_dim=128, dim_mult=(1, 2),
                                                           temporal_downsample=(True,)), 0), str(out))
