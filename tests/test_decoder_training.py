"""Decoders trained on a frozen autoencoder's latents (rynn_jax/training/decoder.py), at toy size on
CPU: a random tiny autoencoder exported as the project exports one, toy episodes (a moving disc).

tae flavour, through `train.py` in subprocesses: the trained tiny decoder's reconstruction MSE is
well under the untrained one's on held-out clips; a run SIGKILLed mid-training resumes to the
uninterrupted run's losses and parameters bit for bit; the export loads with `load_tae` (the
trained weights rounded to bfloat16, the autoencoder's latent statistics) and decodes like the
trained module; streamed through the serving codec (one latent, then a 3-latent block per call) it
equals the whole-clip decode. vae flavour, in process: the MSE falls from the exported decoder's,
the encoder's parameters stay bit-identical through training and export, the exported autoencoder
loads with `load_vae` and encodes exactly as before. Bad inputs are one-line errors."""

from __future__ import annotations

import dataclasses
import json
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rynn_jax import converted_weights, errors
from rynn_jax.models import tae as tae_lib
from rynn_jax.models import vae as vae_lib
from rynn_jax.models.tae import TAEConfig
from rynn_jax.models.tae_weights import load_tae, save_tae
from rynn_jax.models.vae_weights import load_vae
from rynn_jax.serving import codecs
from rynn_jax.training import autoencoder as ae
from rynn_jax.training import config as config_lib
from rynn_jax.training import decoder as dec
from rynn_jax.training import optim
from tests._train_run import ROOT, logged_losses, run_train
from tests.test_autoencoder import write_toy_episodes

TINY = os.path.join(ROOT, "configs", "synthetic_decoder_tiny.py")
STEPS, KILL_AT = 24, 17
H, W, Z = 32, 48, 32


@pytest.fixture(scope="module")
def episodes(tmp_path_factory) -> str:
    return write_toy_episodes(tmp_path_factory.mktemp("sim"), (("observation.images.head.mp4", False),), H, W)


@pytest.fixture(scope="module")
def autoencoder(episodes, tmp_path_factory) -> str:
    """A random tiny autoencoder of the synthetic layout (stride 4×8×8, 32 channels), exported as
    training/autoencoder.py exports: bf16 parameters and its measured latent statistics."""
    path = str(tmp_path_factory.mktemp("ae") / "autoencoder")
    cfg = vae_lib.WanVAEConfig.synthetic(base_dim=8, decoder_base_dim=8, z_dim=Z)
    model = vae_lib.init_vae(cfg, 1)
    data = ae.AutoencoderDataConfig(height=H, width=W, num_frames=5, batch_size=2, stats_clips=4,
                                    videos={"rgb": ae.SIM_VIDEOS["rgb"]})
    items = ae.video_items(ae.episode_dirs([f"{episodes}/train/*/episode_*"], "train"), data.videos)
    mean, std = ae.latent_statistics(ae.Codec(*nnx.split(model, nnx.Param)), data, items)
    cfg = dataclasses.replace(cfg, param_dtype="bfloat16", latents_mean=tuple(map(float, mean)),
                              latents_std=tuple(map(float, std)))
    params = jax.tree.map(lambda p: np.asarray(p.astype(jnp.bfloat16)), nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    converted_weights.save_params(path, params, cfg)
    return path


def _overrides(episodes: str, autoencoder: str, run_dir: str) -> list[str]:
    return [f"data.train_dirs=['{episodes}/train/*/episode_*']",
            f"data.heldout_dirs=['{episodes}/heldout/*/episode_*']",
            f"data.height={H}", f"data.width={W}", "data.num_frames=5", "data.batch_size=2", "data.eval_clips=2",
            "data.read_threads=2", f"total_steps={STEPS}", "eval_every=0", "ckpt.every=8", "ckpt.async_save=False",
            f"ckpt.dir={run_dir}/ckpt", f"ckpt.init_from={autoencoder}", f"log.dir={run_dir}/logs",
            "log.progress=False", f"export_dir={run_dir}/export"]


def _cfg(flavour: str, *overrides: str) -> dec.DecoderTrainConfig:
    return config_lib.apply_overrides(config_lib.load_config(f"{TINY}:{flavour}", (dec.DecoderTrainConfig,)),
                                      list(overrides))


@pytest.fixture(scope="module")
def tae_runs(episodes, autoencoder, tmp_path_factory):
    base = tmp_path_factory.mktemp("tae_runs")
    cache = str(base / "jax_cache")
    full, killed = str(base / "full"), str(base / "killed")
    config = f"{TINY}:tae"
    a = run_train(config, _overrides(episodes, autoencoder, full), cache)
    assert a.returncode == 0, a.stderr[-4000:]
    b = run_train(config, [*_overrides(episodes, autoencoder, killed), f"debug_kill_at_step={KILL_AT}", "export_dir="],
                  cache)
    assert b.returncode == -signal.SIGKILL, (b.returncode, b.stderr[-4000:])
    before = logged_losses(killed)
    c = run_train(config, [*_overrides(episodes, autoencoder, killed), "export_dir="], cache)
    assert c.returncode == 0, c.stderr[-4000:]
    return full, killed, before


def _heldout(cfg: dec.DecoderTrainConfig) -> jax.Array:
    items = ae.video_items(ae.episode_dirs(cfg.data.heldout_dirs, "heldout"), cfg.data.videos)
    return jnp.concatenate([ae.to_unit(jnp.asarray(v)) for _, v in ae.fixed_clips(cfg.data, items, 4, ae.EVAL_STREAM)])


def _mse(parts: dec.Parts, params, frozen, x) -> float:
    decode = jax.jit(lambda p, f, x: parts.decode(p, f, parts.latents(f, x)))
    return float(jnp.mean(jnp.square(decode(params, frozen, x) - x)))


def test_tae_training_lowers_mse_and_resumes_bitwise(tae_runs, episodes, autoencoder, fast_compile):
    full, killed, before = tae_runs
    want, got = dict(logged_losses(full)), logged_losses(killed)
    assert len(want) == STEPS and np.isfinite(list(want.values())).all()
    resumed = got[len(before):]
    assert before and before[-1][0] < KILL_AT and resumed[0][0] == 17 and resumed[-1][0] == STEPS
    for step, loss in got:
        assert loss == want[step], (step, loss, want[step])
    parts, a, _ = dec.restore(_cfg("tae", *_overrides(episodes, autoencoder, full)))
    _, b, _ = dec.restore(_cfg("tae", *_overrides(episodes, autoencoder, killed)))
    assert int(a.step) == int(b.step) == STEPS
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # held-out clips: trained vs the same seed's untrained decoder (measured 0.38×)
    cfg = _cfg("tae", *_overrides(episodes, autoencoder, full))
    _, fresh, _ = dec.init_state(cfg, optim.make_optimizer(cfg.optim, cfg.total_steps))
    x = _heldout(cfg)
    trained, untrained = _mse(parts, a.params, a.frozen, x), _mse(parts, fresh.params, fresh.frozen, x)
    print(f"held-out MSE trained {trained:.4f} untrained {untrained:.4f}")
    assert trained < 0.6 * untrained, (trained, untrained)


@pytest.fixture(scope="module")
def tae_export(tae_runs, episodes, autoencoder):
    cfg = _cfg("tae", *_overrides(episodes, autoencoder, tae_runs[0]))
    parts, state, vae = dec.restore(cfg)
    return cfg, parts, state, vae, load_tae(cfg.export_dir)


def test_tae_export_loads_and_decodes_like_the_trained_module(tae_export, fast_compile):
    cfg, parts, state, vae, loaded = tae_export
    assert loaded.cfg.decoder_only and loaded.cfg.dtype == "bfloat16" and loaded.encoder is None
    assert loaded.cfg.latents_mean == vae.cfg.latents_mean and loaded.cfg.latents_std == vae.cfg.latents_std
    assert dataclasses.replace(loaded.cfg, dtype="float32") == parts.tae_cfg
    got, want = nnx.to_pure_dict(nnx.state(loaded, nnx.Param)), nnx.to_pure_dict(state.params)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w.astype(jnp.bfloat16)))
    x = _heldout(cfg)
    z = parts.latents(state.frozen, x)
    y_loaded, y_trained = dec.decode_whole(loaded, z), parts.decode(state.params, state.frozen, z)
    assert y_loaded.shape == x.shape
    assert float(jnp.max(jnp.abs(y_loaded - y_trained))) < 0.05  # bf16 weights and compute
    # normalize=False reads the autoencoder's raw posterior mean
    raw = z * jnp.asarray(vae.cfg.latents_std) + jnp.asarray(vae.cfg.latents_mean)
    graphdef, params = nnx.split(loaded)
    y_raw = jax.jit(lambda p, r: tae_lib.decode(graphdef, p, r, normalize=False))(params, raw)
    np.testing.assert_allclose(np.asarray(y_raw), np.asarray(y_loaded), atol=2e-2)
    with open(os.path.join(cfg.export_dir, "heldout.json")) as f:
        h = json.load(f)["heldout"]
    assert h["streaming_max_abs_diff"] < 1e-5 and set(h) >= {"psnr", "psnr_rgb", "psnr_autoencoder", "psnr_streaming"}
    assert abs(h["psnr_streaming"] - h["psnr"]) < 1e-3


def test_tiny_decoder_streams_like_the_whole_clip(tae_export, fast_compile):
    """The serving codec (StreamingCodec.decode_block): the first latent alone (fresh cache), then
    3-latent blocks (the student's) and one more, against tae.decode of the whole clip."""
    _, parts, state, _, loaded = tae_export
    z = jnp.asarray(np.random.default_rng(2).normal(size=(2, 8, H // 8, W // 8, Z)), jnp.float32)
    whole = dec.decode_whole(loaded, z)
    codec, params = codecs.split(loaded)
    block = jax.jit(lambda c, z, first: codecs.decode_block(codec, params, c, z, first=first), static_argnums=2)
    cache, outs = codec.init_decode_cache(2, H, W), []
    for i, j in ((0, 1), (1, 4), (4, 7), (7, 8)):
        y, cache = block(cache, z[:, i:j], i == 0)
        outs.append(y)
    streamed = jnp.concatenate(outs, axis=1)
    assert streamed.shape == (2, 32, H, W, 3) and not np.any(np.asarray(streamed[:, :3]))
    np.testing.assert_allclose(np.asarray(streamed[:, 3:]), np.asarray(whole), atol=1e-5)
    np.testing.assert_allclose(np.asarray(dec.decode_streaming(loaded, z, H, W)), np.asarray(whole), atol=1e-5)


def test_save_and_load_tae_round_trip(tmp_path):
    cfg = TAEConfig.synthetic(decoder_widths=(16, 8, 8, 8), blocks_per_stage=1, dtype="float32")
    model = tae_lib.init_tae(cfg, 3)
    save_tae(tmp_path / "d", model)
    loaded = load_tae(tmp_path / "d")
    assert loaded.cfg == cfg
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(loaded)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="another config"):
        load_tae(tmp_path / "d", dataclasses.replace(cfg, blocks_per_stage=2))
    with pytest.raises(ValueError, match="cannot encode"):
        tae_lib.encode(*nnx.split(loaded), jnp.zeros((1, 5, 16, 16, 3)))


def test_vae_flavour_fine_tunes_with_the_encoder_frozen(episodes, autoencoder, tmp_path, fast_compile):
    cfg = _cfg("vae", *_overrides(episodes, autoencoder, str(tmp_path)), "total_steps=12", "ckpt.dir=",
               "optim.lr=3e-3")
    losses = dec.train(cfg)
    assert len(losses) == 12 and np.isfinite(losses).all()
    original, exported = load_vae(autoencoder), load_vae(cfg.export_dir)
    assert exported.cfg == original.cfg  # same architecture, latent statistics, dtypes
    side = lambda m: nnx.split(m, dec._encoder_side, ...)[1:]  # noqa: E731
    (enc_a, dec_a), (enc_b, dec_b) = side(original), side(exported)
    for a, b in zip(jax.tree.leaves(enc_a), jax.tree.leaves(enc_b), strict=True):
        assert a.dtype == b.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert any(not np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(jax.tree.leaves(dec_a), jax.tree.leaves(dec_b), strict=True))
    x = _heldout(cfg)
    graphdef_a, params_a = nnx.split(original)
    graphdef_b, params_b = nnx.split(exported)
    z_a = jax.jit(lambda p, x: vae_lib.encode(graphdef_a, p, x))(params_a, x)
    z_b = jax.jit(lambda p, x: vae_lib.encode(graphdef_b, p, x))(params_b, x)
    np.testing.assert_array_equal(np.asarray(z_a), np.asarray(z_b))
    mse = lambda m: float(jnp.mean(jnp.square(dec.decode_whole(m, z_a) - x)))  # noqa: E731
    print(f"held-out MSE fine-tuned {mse(exported):.4f} exported {mse(original):.4f}")
    assert mse(exported) < 0.8 * mse(original), (mse(exported), mse(original))  # measured 0.35×
    with open(os.path.join(cfg.export_dir, "heldout.json")) as f:
        h = json.load(f)["heldout"]
    assert h["psnr"] > h["psnr_autoencoder"] and h["streaming_max_abs_diff"] < 1e-4


def test_vae_wide_trains_a_wider_decoder_behind_the_same_encoder(episodes, autoencoder, tmp_path, fast_compile):
    """vae_wide: a fresh decoder of another width (12 here, the toy autoencoder's is 8); the export
    says so in its config, its encoder half and latents are the autoencoder's bit for bit, and the
    loss falls from the random decoder's."""
    cfg = _cfg("vae_wide", *_overrides(episodes, autoencoder, str(tmp_path)), "total_steps=12", "ckpt.dir=",
               "optim.lr=3e-3", "optim.warmup_steps=2")
    assert cfg.decoder == "vae" and cfg.vae_decoder_width == 12
    losses = dec.train(cfg)
    assert np.mean(losses[-3:]) < 0.9 * np.mean(losses[:3]), losses
    original, exported = load_vae(autoencoder), load_vae(cfg.export_dir)
    assert exported.cfg == dataclasses.replace(original.cfg, decoder_base_dim=12)
    side = lambda m: nnx.split(m, dec._encoder_side, ...)[1]  # noqa: E731
    for a, b in zip(jax.tree.leaves(side(original)), jax.tree.leaves(side(exported)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    x = _heldout(cfg)
    z = [jax.jit(lambda p, x, g=g: vae_lib.encode(g, p, x))(p, x) for g, p in map(nnx.split, (original, exported))]
    np.testing.assert_array_equal(np.asarray(z[0]), np.asarray(z[1]))
    # configs/synthetic_ae.py:wide: the autoencoder trainer continues from this export (encoder and the
    # wide decoder), and its recipe at the old width is refused by name
    ae_cfg = ae.AutoencoderTrainConfig(model=exported.cfg, data=cfg.data, ckpt=config_lib.CheckpointConfig(
        dir=str(tmp_path / "ae_ckpt"), init_from=cfg.export_dir))
    tx = optim.make_optimizer(ae_cfg.optim, 10)
    _, state = ae.init_state(ae_cfg, tx)
    for a, b in zip(jax.tree.leaves(nnx.split(exported, nnx.Param)[1]), jax.tree.leaves(state.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b))
    with pytest.raises(errors.UsageError, match="decoder_base_dim differ"):
        ae.init_state(dataclasses.replace(ae_cfg, model=original.cfg), tx)
    with pytest.raises(ValueError, match="vae_decoder_width"):
        dec.DecoderTrainConfig(decoder="tae", vae_decoder_width=64)


def test_vae_flat_decoder_has_the_widths_it_states(episodes, autoencoder, tmp_path, fast_compile):
    """vae_flat: decoder_dim_mult (1, 1, 1) gives every decoder level the same width (12 here), the
    encoder's widths unchanged; the export says so, loads, and streams like the whole clip."""
    cfg = _cfg("vae_flat", *_overrides(episodes, autoencoder, str(tmp_path)), "total_steps=4", "ckpt.dir=")
    assert (cfg.vae_decoder_width, cfg.vae_decoder_dim_mult) == (12, (1, 1, 1))
    dec.train(cfg)
    exported, original = load_vae(cfg.export_dir), load_vae(autoencoder)
    assert exported.cfg == dataclasses.replace(original.cfg, decoder_base_dim=12, decoder_dim_mult=(1, 1, 1))
    d = exported.decoder
    widths = [d.conv_in.kernel.shape[-1], *(b.resnets[-1].conv2.kernel.shape[-1] for b in d.up_blocks)]
    assert widths == [12] * 4, widths
    assert exported.encoder.conv_in.kernel.shape == original.encoder.conv_in.kernel.shape
    with open(os.path.join(cfg.export_dir, "heldout.json")) as f:
        assert json.load(f)["heldout"]["streaming_max_abs_diff"] < 1e-4
    with pytest.raises(ValueError, match="decoder_dim_mult needs one multiplier per level"):
        dataclasses.replace(original.cfg, decoder_dim_mult=(1, 1))
    with pytest.raises(ValueError, match="set vae_decoder_width too"):
        dataclasses.replace(cfg, vae_decoder_width=0)


def test_bad_inputs_are_one_line(episodes, autoencoder, tmp_path):
    base = _overrides(episodes, autoencoder, str(tmp_path))
    cases = [
        (["ckpt.init_from="], errors.UsageError, "ckpt.init_from: set it"),
        ([f"ckpt.init_from={tmp_path}/none"], errors.MissingFileError, "ckpt.init_from .*no such directory"),
        ([f"ckpt.init_from={episodes}"], errors.InputError, "not an exported autoencoder"),
        (["data.num_frames=6"], errors.UsageError, "data.num_frames must be 1 \\+ 4·k"),
        (["data.height=36"], errors.UsageError, "spatial stride 8"),
        (["tae.decoder_space_upscale=(True, True, True)"], errors.UsageError, "strides 4×16"),
    ]
    for extra, kind, match in cases:
        with pytest.raises(kind, match=match) as e:
            dec.train(_cfg("tae", *base, *extra))
        assert "\n" not in str(e.value)
    other = TAEConfig.synthetic(z_dim=16, decoder_widths=(16, 8, 8, 8), blocks_per_stage=1)
    with pytest.raises(errors.UsageError, match="tae.z_dim 16: the autoencoder at .* has 32 latent channels") as e:
        dec.train(dataclasses.replace(_cfg("tae", *base), tae=other))
    assert "\n" not in str(e.value)
    for override, match in (("mse_weight=0", "not both 0"), ("tae.decoder_only=False", "decoder stage upscales"),
                            ("data.batch_size=0", "data.batch_size must be ≥ 1")):
        with pytest.raises(errors.UsageError, match=match) as e:
            _cfg("tae", override)
        assert "\n" not in str(e.value)


def test_decoder_flag_picks_the_bundled_tiny_decoder(tmp_path, monkeypatch):
    """`--decoder tiny` (serve.py demo / generate): the trained tiny decoder beside the bundled
    student and autoencoder; `--tae` as given; conflicts and a missing decoder in one line."""
    from rynn_jax.models.causal import CausalConfig
    from rynn_jax.serving import assemble, student
    from rynn_jax.serving.block_step import SERVING_STEPS

    monkeypatch.setenv(student.WEIGHTS_ENV, str(tmp_path))
    for name in ("student", "autoencoder"):
        (tmp_path / name / converted_weights.PARAMS_DIR).mkdir(parents=True)
        (tmp_path / name / converted_weights.CONFIG_FILE).write_text("{}")
    student.write_spec(tmp_path / "student", student.StudentSpec(causal=CausalConfig(), steps=SERVING_STEPS,
                                                                 chunk_frames=21))
    assert assemble.decoder_checkpoint("vae", None) is None
    assert assemble.decoder_checkpoint("vae", "taew2_2.pth") == "taew2_2.pth"
    with pytest.raises(errors.MissingFileError, match="no bundled student with a trained tiny decoder") as e:
        assemble.decoder_checkpoint("tiny", None)
    assert "\n" not in str(e.value) and "synthetic_decoder.py:tae" in str(e.value)
    save_tae(tmp_path / student.TINY_DECODER, tae_lib.init_tae(TAEConfig.synthetic(decoder_widths=(8, 8, 8, 8)), 0))
    assert assemble.decoder_checkpoint("tiny", None) == str(tmp_path / student.TINY_DECODER)
    assert load_tae(assemble.decoder_checkpoint("tiny", None)).cfg.z_dim == Z
    for kwargs, match in (({"tae": "x.pth"}, "give one"), ({"dit": "d", "vae": "v"}, "not with --dit"),
                          ({"random_weights": True}, "not with --dit")):
        tae = kwargs.pop("tae", None)
        with pytest.raises(errors.UsageError, match=match):
            assemble.decoder_checkpoint("tiny", tae, **kwargs)
