"""Offline pre-encoding into ArrayRecord latent shards: content, resumability, worker split, and the
latent pipeline that training reads."""

from __future__ import annotations

import os

import numpy as np
import pytest

from rynn_jax.data import clips, shards
from rynn_jax.data import fixtures as fx
from rynn_jax.data import pipeline as pl
from rynn_jax.data import preencode as pe
from rynn_jax.data.egodex import EgoDexSource

CFG = clips.ClipConfig(num_frames=9, height=32, width=64)


class StandInVAE:
    """Stride (4, 16, 16) average pooling with 4 channels: the VAE's shapes, none of its cost.
    Counts the clips it sees, to check what a resumed run re-encodes."""

    def __init__(self):
        self.calls = 0

    def __call__(self, video):
        self.calls += 1
        b, t, h, w, _ = video.shape
        x = video[:, ::4].reshape(b, (t - 1) // 4 + 1, h // 16, 16, w // 16, 16, 3).mean((3, 5))
        return np.concatenate([x, x[..., :1]], -1)


def render_white(sample):
    return np.full_like(sample["video"], 255)


def embed(text):
    return np.full((len(text.split()), 8), len(text), np.float32)


@pytest.fixture()
def egodex(tmp_path):
    fx.make_dataset("egodex", str(tmp_path / "egodex"), 3, 40)  # 3 episodes × 2 clips
    return EgoDexSource(tmp_path / "egodex", CFG)


def run(src, out, vae, **cfg):
    return pe.preencode(src, str(out), encode_video=vae, render_control=render_white, embed_text=embed,
                        cfg=pe.PreencodeConfig(records_per_shard=4, **cfg))


def test_shard_contents_match_the_pixel_path(egodex, tmp_path):
    vae = StandInVAE()
    summary = run(egodex, tmp_path / "lat", vae)
    assert summary["num_clips"] == 6 and summary["num_shards"] == 2 and summary["written"] == 2
    paths = shards.list_shards(tmp_path / "lat", "egodex")
    assert [os.path.basename(p) for p in paths] == ["egodex-00000-of-00002.array_record",
                                                    "egodex-00001-of-00002.array_record"]
    recs = [r for p in paths for r in shards.read_shard(p)]
    assert [int(r["clip_id"]) for r in recs] == list(range(6))
    for r in recs:
        sample = egodex.load_or_none(egodex.index()[int(r["clip_id"])])
        video = pe.to_unit_range(sample["video"])[None]
        assert r["video_latents"].shape == (3, 2, 4, 4) and r["video_latents"].dtype == np.float16
        np.testing.assert_allclose(r["video_latents"], StandInVAE()(video)[0], atol=2e-3)
        np.testing.assert_allclose(r["control_video_latents"], 1.0, atol=1e-3)  # white skeleton video
        np.testing.assert_allclose(r["img_latent"], StandInVAE()(video[:, :1])[0], atol=2e-3)
        assert r["text_embedding"].shape == (4, 8) and str(r["text"]) == "pick up the cup"
        assert r["actions"].shape == (9, 54) and not r["has_actions"]


def test_rerun_skips_finished_shards(egodex, tmp_path):
    out = tmp_path / "lat"
    run(egodex, out, StandInVAE())
    first, second = shards.list_shards(out, "egodex")
    mtime = os.stat(first).st_mtime_ns
    os.remove(second)
    open(second + ".tmp", "wb").write(b"half-written by a killed run")
    vae = StandInVAE()
    summary = run(egodex, out, vae)
    assert summary["written"] == 1 and summary["already_done"] == 1
    assert vae.calls == 2 * 2  # the 2 clips of the missing shard (video+control, image) only
    assert os.stat(first).st_mtime_ns == mtime and not os.path.exists(second + ".tmp")
    assert shards.num_records(second) == 2
    assert run(egodex, out, StandInVAE())["written"] == 0
    fx.write_egodex_episode(str(tmp_path / "egodex"), "task9", 9, *fx.known_pose(40, 9))
    with pytest.raises(ValueError, match="different clip index"):
        run(EgoDexSource(tmp_path / "egodex", CFG), out, StandInVAE())


def test_workers_split_shards(egodex, tmp_path):
    a = run(egodex, tmp_path / "lat", StandInVAE(), worker=0, num_workers=2)
    b = run(egodex, tmp_path / "lat", StandInVAE(), worker=1, num_workers=2)
    assert a["written"] == b["written"] == 1
    assert len(shards.list_shards(tmp_path / "lat", "egodex")) == 2


def test_latent_pipeline_sharded_and_resumable(egodex, tmp_path):
    run(egodex, tmp_path / "lat", StandInVAE())
    paths = shards.list_shards(tmp_path / "lat", "egodex")
    cfg = pl.LoaderConfig(batch_size=1, num_epochs=1, drop_remainder=False, text_len=16)
    got = [[int(b["clip_id"][0]) for b in pl.latent_dataset(paths, cfg, process_index=i, process_count=2)]
           for i in range(2)]
    assert set(got[0]).isdisjoint(got[1]) and sorted(got[0] + got[1]) == list(range(6))
    ds = pl.latent_dataset(paths, pl.LoaderConfig(batch_size=2, seed=1, text_len=16))
    it = iter(ds)
    b = next(it)
    assert b["text_embedding"].shape == (2, 16, 8) and (b["text_embedding"][:, 4:] == 0).all()
    assert b["video_latents"].shape == (2, 3, 2, 4, 4)
    state = pl.save_state(it)
    want = next(it)
    np.testing.assert_array_equal(next(pl.restore_state(iter(ds), state))["clip_id"], want["clip_id"])


def test_cli_with_tiny_vae_and_real_renderer(tmp_path):
    fx.make_dataset("robot", str(tmp_path / "robot"), 1, 20)  # 1 clip of 9 frames
    summary = pe.main(["--source", "robot", "--root", str(tmp_path / "robot"), "--out",
                       str(tmp_path / "lat"), "--vae", "tiny", "--allow-missing-text",
                       "--frames", "9", "--height", "32", "--width", "64"])
    assert summary["written"] == 1
    (rec,) = shards.read_shard(shards.list_shards(tmp_path / "lat", "robot")[0])
    assert rec["video_latents"].shape == (3, 2, 4, 4) and rec["img_latent"].shape == (1, 2, 4, 4)
    assert not np.array_equal(rec["video_latents"], rec["control_video_latents"])
    assert rec["text_embedding"].shape == (0, 4096) and rec["has_actions"]


def test_text_embedding_store(tmp_path):
    import hashlib

    from safetensors.numpy import save_file

    emb = np.zeros((512, 4096), np.float32)
    emb[:5] = np.arange(1, 6)[:, None]
    name = hashlib.sha256(b"pick up the cup").hexdigest()
    save_file({"prompt_embedding": emb}, str(tmp_path / f"{name}.safetensors"))
    store = pe.TextEmbeddingStore(str(tmp_path))
    np.testing.assert_array_equal(store("pick up the cup"), emb[:5])  # trimmed to its length
    with pytest.raises(FileNotFoundError, match="open the lid"):
        store("open the lid")
    assert pe.TextEmbeddingStore(str(tmp_path), missing="empty")("open the lid").shape == (0, 4096)
