"""Our own autoencoder (rynn_jax/training/autoencoder.py) through `train.py` on CPU: three subprocess
runs of configs/synthetic_ae_tiny.py on toy episodes (moving shapes, both videos of an episode):
the loss falls; a run SIGKILLed mid-training resumes to the uninterrupted run's losses and
parameters bit for bit; the exported directory loads with the project's VAE loader, holds the
trained weights rounded to bfloat16, encodes/decodes like the trained module, streams like the
whole clip, and its latents_mean/std are the statistics NumPy recomputes from the posterior means."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from PIL import Image

from rynn_jax import errors
from rynn_jax.data import video as video_lib
from rynn_jax.eval import autoencoders
from rynn_jax.models import vae as vae_lib
from rynn_jax.models.vae_weights import load_vae
from rynn_jax.training import autoencoder as ae
from rynn_jax.training import config as config_lib
from tests._train_run import ROOT, logged_losses, run_train

TINY = os.path.join(ROOT, "configs", "synthetic_ae_tiny.py")
STEPS, KILL_AT = 24, 17


def _episode_video(rng: np.random.Generator, n: int, h: int, w: int, skeleton: bool) -> np.ndarray:
    """A coloured disc (RGB: on a gradient background) or a line (skeleton: on black) moving
    smoothly: something an autoencoder can learn in a few steps."""
    yy, xx = np.mgrid[:h, :w].astype(np.float32)
    c0, v = rng.uniform([0.3 * h, 0.3 * w], [0.7 * h, 0.7 * w]), rng.uniform(-1, 1, 2)
    colour = rng.uniform(60, 250, 3)
    frames = np.empty((n, h, w, 3), np.float32)
    for t in range(n):
        cy, cx = c0 + v * t
        if skeleton:
            d = np.abs((yy - cy) * 0.6 - (xx - cx) * 0.8)
            frames[t] = np.where((d < 1.5)[..., None] & (np.abs(xx - cx) < w / 4)[..., None], colour, 0)
        else:
            frames[t] = np.stack([xx / w * 120, yy / h * 120, np.full_like(xx, 60)], -1)
            frames[t][(yy - cy) ** 2 + (xx - cx) ** 2 < (h / 5) ** 2] = colour
    return np.clip(frames, 0, 255).astype(np.uint8)


def write_toy_episodes(root, videos: tuple[tuple[str, bool], ...], h: int = 32, w: int = 48) -> str:
    """3 training and 1 held-out toy episodes under `root`, each with `videos` ((file, skeleton?))."""
    rng = np.random.default_rng(0)
    for split, n in (("train", 3), ("heldout", 1)):
        for k in range(n):
            d = root / split / "task" / f"episode_{k:06d}"
            d.mkdir(parents=True)
            for name, skeleton in videos:
                video_lib.write_video(d / name, _episode_video(rng, 16, h, w, skeleton), 16.0)
    return str(root)


@pytest.fixture(scope="module")
def episodes(tmp_path_factory) -> str:
    return write_toy_episodes(tmp_path_factory.mktemp("sim"),
                              (("observation.images.head.mp4", False), ("skeleton.mp4", True)))


def _overrides(episodes: str, run_dir: str) -> list[str]:
    return [f"data.train_dirs=['{episodes}/train/*/episode_*']",
            f"data.heldout_dirs=['{episodes}/heldout/*/episode_*']",
            "data.height=32", "data.width=48", "data.num_frames=5", "data.batch_size=2",
            "data.eval_clips=2", "data.stats_clips=4", "data.read_threads=2", f"total_steps={STEPS}",
            "eval_every=0", "ckpt.every=8", "ckpt.async_save=False", f"ckpt.dir={run_dir}/ckpt",
            f"log.dir={run_dir}/logs", "log.progress=False", f"export_dir={run_dir}/vae"]


def _train(episodes: str, run_dir: str, cache_dir: str, *extra: str) -> subprocess.CompletedProcess:
    return run_train(TINY, [*_overrides(episodes, run_dir), *extra], cache_dir)


_losses = logged_losses


def _cfg(episodes: str, run_dir: str) -> ae.AutoencoderTrainConfig:
    cfg = config_lib.load_config(TINY, (ae.AutoencoderTrainConfig,))
    return config_lib.apply_overrides(cfg, _overrides(episodes, run_dir))


@pytest.fixture(scope="module")
def runs(episodes, tmp_path_factory):
    base = tmp_path_factory.mktemp("ae_runs")
    cache = str(base / "jax_cache")
    full, killed = str(base / "full"), str(base / "killed")
    a = _train(episodes, full, cache)
    assert a.returncode == 0, a.stderr[-4000:]
    b = _train(episodes, killed, cache, f"debug_kill_at_step={KILL_AT}", "export_dir=")
    assert b.returncode == -signal.SIGKILL, (b.returncode, b.stderr[-4000:])
    before = _losses(killed)
    c = _train(episodes, killed, cache, "export_dir=")
    assert c.returncode == 0, c.stderr[-4000:]
    return full, killed, before


def test_loss_decreases(runs):
    """Mean loss of the last 6 steps under 0.7 × the first 6 (measured: ≈ 0.4)."""
    losses = np.asarray([loss for _, loss in _losses(runs[0])])
    assert len(losses) == STEPS and np.isfinite(losses).all()
    assert losses[-6:].mean() < 0.7 * losses[:6].mean(), losses


def test_killed_run_resumes_bitwise(runs, episodes):
    full, killed, before = runs
    want = dict(_losses(full))
    got = _losses(killed)
    resumed = got[len(before):]
    assert before and before[-1][0] < KILL_AT and resumed[0][0] == 17 and resumed[-1][0] == STEPS
    for step, loss in got:
        assert loss == want[step], (step, loss, want[step])
    a = ae.restore(_cfg(episodes, full))
    b = ae.restore(_cfg(episodes, killed))
    assert int(a.step) == int(b.step) == STEPS
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def exported(runs, episodes):
    """(config, trained float32 params, exported model as the project's loader loads it)."""
    cfg = _cfg(episodes, runs[0])
    return cfg, ae.restore(cfg).params, load_vae(cfg.export_dir)


def test_init_from_an_export_continues_from_its_weights(exported, tmp_path):
    """ckpt.init_from starts a run from exported weights (the trained ones rounded to bf16), with a
    fresh optimizer; an export of another architecture is refused in one line."""
    cfg, params, _ = exported
    tx = optax.sgd(0.1)
    _, state = ae.init_state(dataclasses.replace(cfg, ckpt=dataclasses.replace(cfg.ckpt, init_from=cfg.export_dir)), tx)
    for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(params)):
        assert got.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want.astype(jnp.bfloat16).astype(jnp.float32)))
    assert int(state.step) == 0
    z = cfg.model.z_dim + 4
    other = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, z_dim=z, latents_mean=(0.0,) * z,
                                                               latents_std=(1.0,) * z),
                                ckpt=dataclasses.replace(cfg.ckpt, init_from=cfg.export_dir))
    with pytest.raises(errors.UsageError, match="z_dim"):
        ae.init_state(other, tx)


def test_export_stopped_during_heldout_scoring_leaves_no_folder(exported, tmp_path, monkeypatch):
    """A run stopped (Ctrl-C, `timeout --signal=INT`) while the export scores the held-out clips
    writes no folder that later stages would load as finished; the next export writes it whole."""
    cfg, params, _ = exported
    out = str(tmp_path / "vae")
    real = ae.evaluate

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ae, "evaluate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ae.export(cfg, params, out)
    assert not os.path.exists(out)
    monkeypatch.setattr(ae, "evaluate", real)
    summary = ae.export(cfg, params, out)
    assert sorted(os.listdir(tmp_path)) == ["vae"] and "heldout" in summary
    with open(os.path.join(out, "heldout.json")) as f:
        assert json.load(f)["heldout"] == summary["heldout"]
    assert list(load_vae(out).cfg.latents_mean) == summary["latents_mean"]


def _batches(cfg: ae.AutoencoderTrainConfig, dirs, n: int, stream: int):
    items = ae.video_items(ae.episode_dirs(dirs, "dirs"), cfg.data.videos)
    return list(ae.fixed_clips(cfg.data, items, n, stream))


def test_export_loads_and_matches_trained_module(exported, fast_compile):
    cfg, params, vae = exported
    assert vae.cfg.param_dtype == "bfloat16" and vae.cfg.dtype == "float32"
    assert vae.cfg.z_dim == cfg.model.z_dim and vae.cfg.temporal_stride == 4 and vae.cfg.spatial_stride == 8
    loaded = ae.Codec(*nnx.split(vae, nnx.Param))
    want, got = nnx.to_pure_dict(params), nnx.to_pure_dict(loaded.params)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.dtype == jnp.bfloat16 and w.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w.astype(jnp.bfloat16)))
    # The trained module: float32 weights (the compute dtype, float32, is the config's).
    trained = ae.Codec(loaded.graphdef, params)
    _, clip = _batches(cfg, cfg.data.train_dirs, cfg.data.batch_size, ae.STATS_STREAM)[0]
    x = ae.to_unit(jnp.asarray(clip))
    z_loaded, z_trained = loaded.encode(x), trained.encode(x)
    scale = float(jnp.max(jnp.abs(z_trained)))
    assert float(jnp.max(jnp.abs(z_loaded - z_trained))) < 0.03 * scale  # bf16 weight rounding only
    y_loaded, y_trained = loaded.decode(z_loaded), trained.decode(z_loaded)
    assert y_loaded.shape == x.shape
    assert float(jnp.max(jnp.abs(y_loaded - y_trained))) < 0.03
    # normalize=True (what pre-encoding stores) is (raw − latents_mean) / latents_std of the export
    zn = jax.jit(lambda p, x: vae_lib.encode(loaded.graphdef, p, x))(loaded.params, x)
    np.testing.assert_allclose(np.asarray(zn), (np.asarray(z_loaded) - np.asarray(vae.cfg.latents_mean))
                               / np.asarray(vae.cfg.latents_std), rtol=1e-5, atol=1e-5)


def test_latent_statistics_match_numpy(exported, fast_compile):
    cfg, _, vae = exported
    loaded = ae.Codec(*nnx.split(vae, nnx.Param))
    z = np.concatenate([np.asarray(loaded.encode(ae.to_unit(jnp.asarray(clip))), np.float64)
                        for _, clip in _batches(cfg, cfg.data.train_dirs, cfg.data.stats_clips, ae.STATS_STREAM)])
    assert z.shape[0] == cfg.data.stats_clips
    z = z.reshape(-1, z.shape[-1])
    np.testing.assert_allclose(vae.cfg.latents_mean, z.mean(0), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(vae.cfg.latents_std, z.std(0), rtol=1e-6)


def test_heldout_streaming_equals_whole_clip(exported, fast_compile):
    cfg, _, vae = exported
    with open(os.path.join(cfg.export_dir, "heldout.json")) as f:
        summary = json.load(f)
    h = summary["heldout"]
    assert h["streaming_max_abs_diff"] < 1e-5
    assert abs(h["psnr_streaming"] - h["psnr"]) < 1e-3 and h["clips"] == cfg.data.eval_clips
    assert summary["parameters"] == vae_lib.count_params(vae)
    # each clip's PSNR recomputed in NumPy on the 0..255 scale
    loaded = ae.Codec(*nnx.split(vae, nnx.Param))
    names = list(cfg.data.videos)
    for kinds, clip in _batches(cfg, cfg.data.heldout_dirs, cfg.data.eval_clips, ae.EVAL_STREAM):
        y = np.asarray(loaded.reconstruct(ae.to_unit(jnp.asarray(clip))), np.float64)
        mse = ((y + 1) * 127.5 - clip.astype(np.float64)) ** 2
        psnr = 10 * np.log10(255.0 ** 2 / mse.mean(axis=(1, 2, 3, 4)))
        assert sorted(kinds) == [0, 1]  # one clip of each video
        for k, p in zip(kinds, psnr):
            assert abs(h[f"psnr_{names[k]}"] - p) < 1e-3, (names[k], h, p)


def test_score_splits_frames_at_the_recipes_clip_length(exported, capsys, fast_compile):
    """Clips longer than the recipe trains on (TINY: 5 frames) add a table of each video's mean
    per-frame PSNR over positions 1–4 and 5–8, from the per-frame scores checked above."""
    cfg, _, _ = exported
    overrides = [f"data.heldout_dirs=['{cfg.data.heldout_dirs[0]}']", "data.height=32", "data.width=48",
                 "data.num_frames=9", "data.batch_size=2", "data.read_threads=2"]
    scores = autoencoders.main([cfg.export_dir, "--config", TINY, "--clips", "2",
                                *[a for o in overrides for a in ("--set", o)]])
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if "frames 1–4" in line)
    names = [c.split(" frames")[0] for c in lines[head].strip("| ").split(" | ")[1::2]]
    cells = lines[head + 2].strip("| ").split(" | ")
    r = scores[cfg.export_dir]
    assert cells[0] == cfg.export_dir and names and len(cells) == 1 + 2 * len(names)
    for k, name in enumerate(names):
        f = np.asarray(r[f"psnr_frames_{name}"])
        assert len(f) == 9 and lines[head].count(f"{name} frames 5–8") == 1
        assert cells[1 + 2 * k:3 + 2 * k] == [f"{f[1:5].mean():.2f}", f"{f[5:].mean():.2f}"]


def test_score_gives_each_frames_psnr(exported, tmp_path, capsys, fast_compile):
    """`python -m rynn_jax.eval.autoencoders DIR DIR`: per video and per frame on the recipe's held-out clips, each
    frame's PSNR recomputed in NumPy; the table has a row per autoencoder; bad input is one line."""
    cfg, _, vae = exported
    overrides = [f"data.heldout_dirs=['{cfg.data.heldout_dirs[0]}']", "data.height=32", "data.width=48",
                 "data.num_frames=5", "data.batch_size=2", "data.read_threads=2"]
    copy = str(tmp_path / "copy")
    shutil.copytree(cfg.export_dir, copy)
    args = [cfg.export_dir, copy, "--config", TINY, "--clips", "2", "--out", str(tmp_path / "s.json")]
    scores = autoencoders.main([*args, *[a for o in overrides for a in ("--set", o)]])
    table = capsys.readouterr().out
    assert f"| {cfg.export_dir} |" in table and f"| {copy} |" in table and "position 4 of 4" in table
    assert "frames 5–" not in table  # the recipe's own clip length: no past-the-length table
    assert json.loads((tmp_path / "s.json").read_text()) == scores and scores[copy] == scores[cfg.export_dir]
    r = scores[cfg.export_dir]
    loaded = ae.Codec(*nnx.split(vae, nnx.Param))
    names, frames = list(cfg.data.videos), {}
    for kinds, clip in _batches(cfg, cfg.data.heldout_dirs, 2, ae.EVAL_STREAM):
        y = np.asarray(loaded.reconstruct(ae.to_unit(jnp.asarray(clip))), np.float64)
        mse = ((y + 1) * 127.5 - clip.astype(np.float64)) ** 2
        for k, f in zip(kinds, 10 * np.log10(255.0 ** 2 / mse.mean(axis=(2, 3, 4)))):
            frames.setdefault(names[k], []).append(f)
    for name, f in frames.items():
        np.testing.assert_allclose(r[f"psnr_frames_{name}"], np.mean(f, axis=0), atol=1e-3)
        assert len(r[f"psnr_frames_{name}"]) == cfg.data.num_frames
    with pytest.raises(errors.MissingFileError, match="autoencoder .*no such directory"):
        autoencoders.score([cfg.export_dir, str(tmp_path / "none")], cfg.data)
    with pytest.raises(errors.UsageError, match="data.heldout_dirs is empty") as e:
        autoencoders.score([cfg.export_dir], dataclasses.replace(cfg.data, heldout_dirs=()))
    assert "\n" not in str(e.value)


def test_regions_split_the_round_trip_error_by_segmentation(exported, tmp_path, capsys, fast_compile):
    """`--regions N`: the RGB round trip's squared error per segmentation region (background, robot =
    labels 1–2, objects = the rest) and the worst pixels' share, recomputed in float64 NumPy from the
    loaded codec; the regions' error shares add up to 1; bad input is one line."""
    cfg, _, vae = exported
    src = ae.episode_dirs(cfg.data.heldout_dirs, "dirs")[0]
    ep = tmp_path / "heldout" / "task" / "episode_000000"
    shutil.copytree(src, ep)
    labels = np.zeros((16, 32, 48), np.uint8)
    labels[:, 8:20, 4:20], labels[:, 16:30, 30:44], labels[:, 2:6, 40:46] = 1, 4, 2  # robot, an object, robot
    np.savez(ep / "segmentation.npz", labels=labels, names=np.array(["background", "l", "r", "x", "obj"]))
    data = dataclasses.replace(cfg.data, heldout_dirs=(str(ep),))
    r = autoencoders.region_errors(cfg.export_dir, data, 9)
    frames = video_lib.read_frames(str(ep / "observation.images.head.mp4"), range(9), 48, 32)
    y = np.asarray(ae.Codec(*nnx.split(vae, nnx.Param)).reconstruct(ae.to_unit(jnp.asarray(frames[None]))), np.float64)
    e = (((y[0] + 1) * 127.5 - frames.astype(np.float64)) ** 2).sum(-1)  # 8-bit units
    lab = labels[:9]
    for region, m in (("background", lab == 0), ("robot", (lab == 1) | (lab == 2)), ("objects", lab == 4)):
        assert abs(r[region]["pixels"] - m.mean()) < 1e-9
        assert abs(r[region]["error"] - e[m].sum() / e.sum()) < 1e-4, (region, r[region])
        assert abs(r[region]["psnr"] - 10 * np.log10(255.0 ** 2 / (e[m].mean() / 3))) < 1e-3
    assert abs(sum(r[k]["error"] for k in autoencoders.REGIONS) - 1) < 1e-9
    assert abs(r["psnr"] - 10 * np.log10(255.0 ** 2 / (e.mean() / 3))) < 1e-3 and r["episodes"] == 1
    assert abs(r["by_task"]["task"]["psnr"] - r["psnr"]) < 1e-9 and r["by_task"]["task"]["robot"] == r["robot"]["psnr"]
    worst = np.sort(e.ravel())[::-1]
    assert abs(r["worst_5pct"] - worst[:e.size // 20].sum() / e.sum()) < 1e-4 and r["worst_1pct"] < r["worst_5pct"]
    autoencoders.main([cfg.export_dir, "--config", TINY, "--clips", "2", "--regions", "5", "--set",
                       f"data.heldout_dirs=['{ep}']", "--set", "data.height=32", "--set", "data.width=48",
                       "--set", "data.num_frames=5", "--set", "data.batch_size=2", "--error-map", str(tmp_path / "e.png")])
    assert "robot: pixels / error / PSNR" in capsys.readouterr().out
    img = np.asarray(Image.open(tmp_path / "e.png"))  # one task: truth | reconstruction | error of frame 4
    assert img.shape == (32, 3 * 48, 3)
    np.testing.assert_array_equal(img[:, :48], frames[4])
    assert np.abs(img[:, 48:96].astype(int) - np.clip(np.round((y[0, 4] + 1) * 127.5), 0, 255)).max() <= 1
    err4 = np.clip(e[4] / 255.0 ** 2 / autoencoders.ERROR_MAP_FULL, 0, 1) * 255
    assert np.abs(img[:, 96:, 0].astype(float) - err4).max() <= 1.01
    with pytest.raises(errors.UsageError, match=r"--regions 8: frames must be 1 \+ 4·k") as e_:
        autoencoders.region_errors(cfg.export_dir, data, 8)
    assert "\n" not in str(e_.value)
    with pytest.raises(errors.InputError, match="16 frames < --regions 17"):
        autoencoders.region_errors(cfg.export_dir, data, 17)
    with pytest.raises(errors.UsageError, match="no held-out episode has a segmentation.npz"):
        autoencoders.region_errors(cfg.export_dir, dataclasses.replace(cfg.data, heldout_dirs=(src,)), 9)


def test_synthetic_preset_shapes():
    """The preset (no allocation): parameter count, 128×224×17 → 16×28×5 latents and back."""
    cfg = vae_lib.WanVAEConfig.synthetic()
    graphdef, abstract = nnx.split(vae_lib.abstract_vae(cfg))
    assert vae_lib.count_params(abstract) == 4_709_420
    video = jax.ShapeDtypeStruct((1, 17, 128, 224, 3), jnp.float32)
    z = jax.eval_shape(lambda p, v: vae_lib.encode(graphdef, p, v), abstract, video)
    assert z.shape == (1, 5, 16, 28, 16)
    y = jax.eval_shape(lambda p, z: vae_lib.decode(graphdef, p, z), abstract, z)
    assert y.shape == video.shape


@pytest.mark.parametrize("override, match", [
    ("data.num_frames=16", "data.num_frames must be 1 \\+ 4·k"),
    ("data.height=60", "multiples of the VAE's spatial stride 8"),
    ("data.batch_size=0", "data.batch_size must be ≥ 1"),
    ("export_dtype=float16", "export_dtype must be"),
])
def test_config_errors_are_one_line(override, match):
    cfg = config_lib.load_config(TINY, (ae.AutoencoderTrainConfig,))
    with pytest.raises(ValueError, match=match) as e:
        config_lib.apply_overrides(cfg, [override])
    assert "\n" not in str(e.value)


def test_data_errors_are_one_line(tmp_path, episodes):
    cfg = config_lib.load_config(TINY, (ae.AutoencoderTrainConfig,))
    with pytest.raises(FileNotFoundError, match="data.train_dirs: no episode directory matches") as e:
        ae.train(config_lib.apply_overrides(cfg, [f"data.train_dirs=['{tmp_path}/none/*']"]))
    assert "\n" not in str(e.value)
    (tmp_path / "ep").mkdir()
    video_lib.write_video(tmp_path / "ep" / "observation.images.head.mp4", np.zeros((2, 16, 16, 3), np.uint8), 16.0)
    with pytest.raises(FileNotFoundError, match="skeleton.mp4: missing") as e:
        ae.video_items(ae.episode_dirs([str(tmp_path / "ep")], "data.train_dirs"), ae.SIM_VIDEOS)
    with pytest.raises(errors.UsageError, match="not TrainConfig or AutoencoderTrainConfig"):
        config_lib.load_config(os.path.join(ROOT, "configs", "distill_tiny.py"),
                               (config_lib.TrainConfig, ae.AutoencoderTrainConfig))
    # an episode a running data job is still writing is not an episode yet
    (tmp_path / "ep.tmp").mkdir()
    assert ae.episode_dirs([str(tmp_path / "ep*")], "data.train_dirs") == [str(tmp_path / "ep")]


def test_export_cli_runs_as_a_module(tmp_path):
    """`python -m …autoencoder export` checks the recipe against the importable module's config class
    (not __main__'s) and reports a run without checkpoints in one line."""
    proc = subprocess.run([sys.executable, "-m", "rynn_jax.training.autoencoder", "export", "--config", TINY,
                           "--set", f"ckpt.dir={tmp_path}/run", "--out", str(tmp_path / "vae")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert any(line.startswith("error: ckpt.dir") for line in proc.stderr.splitlines()), proc.stderr
    assert "no checkpoint to export" in proc.stderr and not (tmp_path / "vae").exists()


def test_gaussian_kl_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    mean, logvar = rng.normal(size=(3, 5)), rng.normal(size=(3, 5)) * 2
    want = torch.distributions.kl_divergence(
        torch.distributions.Normal(torch.tensor(mean), torch.tensor(np.exp(0.5 * logvar))),
        torch.distributions.Normal(0.0, 1.0)).mean().item()
    got = float(ae.gaussian_kl(jnp.asarray(mean, jnp.float32), jnp.asarray(logvar, jnp.float32)))
    assert abs(got - want) < 1e-5 * max(1.0, abs(want)), (got, want)
