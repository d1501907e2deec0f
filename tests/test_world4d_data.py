"""RynnWorld-4D data: a sim episode's exact depth and flow, encoded as the release encodes them and
through the same VAE as the RGB, land in the latent shards (pre-encoder), and train.py's 4D mode
trains on them (and refuses RGB-only shards in one line)."""

from __future__ import annotations

import numpy as np
import pytest

import train
from rynn_jax import errors
from rynn_jax.data import clips, shards
from rynn_jax.data import geometry_video as gv
from rynn_jax.data import preencode as pe
from rynn_jax.data.robot import RobotSource

H, W, FRAMES, CLIP = 64, 96, 21, 9


@pytest.fixture(scope="module")
def sim_root(tmp_path_factory):
    from rynn_jax.sim import episode, robot_shards

    root = tmp_path_factory.mktemp("sim")
    ep = episode.generate("push_block", 1, resolution=(H, W), num_frames=FRAMES)
    robot_shards.write_episode(ep, robot_shards.episode_dir(root, "push_block", 1))
    robot_shards.write_action_stats(root)
    return root


class PoolVAE:
    """Stride (4, 16, 16) average pooling, 3 channels: the VAE's shapes, an exact oracle."""

    def __call__(self, video):
        b, t, h, w, _ = video.shape
        return video[:, ::4].reshape(b, (t - 1) // 4 + 1, h // 16, 16, w // 16, 16, 3).mean((3, 5))


def test_shards_hold_depth_and_flow_encoded_as_the_release_does(sim_root, tmp_path):
    source = RobotSource(sim_root, clips.ClipConfig(num_frames=CLIP, height=H, width=W))
    summary = pe.preencode(source, str(tmp_path / "lat"), encode_video=PoolVAE(),
                           render_control=lambda s: np.full_like(s["video"], 255),
                           embed_text=lambda t: np.zeros((2, 8), np.float32),
                           render_geometry=pe.geometry_renderer(H, W))
    assert summary["num_clips"] == 2 and summary["skipped_clips"] == 0
    recs = shards.read_shard(shards.list_shards(tmp_path / "lat", "robot")[0])
    with np.load(sim_root / "push_block/episode_000001/depth.npz") as z:
        depth_m = z["depth_mm"] / 1000.0
    with np.load(sim_root / "push_block/episode_000001/flow.npz") as z:
        flow = z["flow"].astype(np.float64)
    assert np.abs(flow).max() > 0.5  # something moves
    pool = lambda v: PoolVAE()(np.asarray(v, np.float64)[None] / 127.5 - 1.0)[0]  # noqa: E731
    for rec, start in zip(recs, (0, CLIP)):
        # closed forms: grey = ⌊clip(d, 0, 5)/5·255⌋; flow frame 0 white, frame i the flow i−1 → i
        grey = np.floor(np.clip(depth_m[start:start + CLIP], 0, 5) / 5 * 255)
        np.testing.assert_allclose(rec["depth_latents"], pool(np.repeat(grey[..., None], 3, -1)), atol=2e-3)
        np.testing.assert_allclose(rec["depth_img_latent"], pool(np.repeat(grey[:1, ..., None], 3, -1)), atol=2e-3)
        np.testing.assert_allclose(rec["flow_img_latent"], 1.0)  # the white frame
        want_flow = np.concatenate([np.full((1, H, W, 3), 255.0), gv.flow_to_rgb(flow[start:start + CLIP - 1])])
        np.testing.assert_allclose(rec["flow_latents"], pool(want_flow), atol=2e-3)
        assert rec["flow_latents"].dtype == np.float16 and rec["depth_latents"].shape == rec["video_latents"].shape
    # the decoded flow colours give back the simulator's flow in pixels (the invertible normalisation)
    back = gv.rgb_to_flow(gv.clip_videos(sim_root / "push_block/episode_000001", np.arange(1, 6), H, W)["flow"][1:])
    small = np.hypot(*flow[1:5].transpose(3, 0, 1, 2)) < gv.FLOW_MAX_PX
    assert np.hypot(*(back - flow[1:5]).transpose(3, 0, 1, 2))[small].max() < 3 * gv.FLOW_MAX_PX / 255


def test_clip_videos_bad_inputs(sim_root, tmp_path):
    ep = sim_root / "push_block/episode_000001"
    with pytest.raises(errors.InputError, match="non-consecutive"):
        gv.clip_videos(ep, np.array([0, 2, 4]), H, W)
    with pytest.raises(errors.InputError, match="truncated depth/flow"):
        gv.clip_videos(ep, np.arange(FRAMES - 2, FRAMES + 1), H, W)
    with pytest.raises(errors.InputError, match="unreadable depth/flow"):
        gv.clip_videos(tmp_path, np.arange(3), H, W)
    resized = gv.clip_videos(ep, np.arange(5), 32, 64)  # resized + cropped like the RGB frames
    assert resized["depth"].shape == resized["flow"].shape == (5, 32, 64, 3)


def test_train_4d_on_preencoded_shards(sim_root, tmp_path, fast_compile):
    out = tmp_path / "lat"
    text_dim = 24  # WanDiTConfig.tiny's
    common = ["--source", "robot", "--root", str(sim_root), "--vae", "tiny", "--allow-missing-text",
              "--frames", str(CLIP), "--height", str(H), "--width", str(W), "--text-dim", str(text_dim)]
    assert pe.main([*common, "--out", str(out), "--geometry"])["written"] == 1
    with pytest.raises(errors.InputError, match="different clip index"):  # RGB-only records in the same directory
        pe.main([*common, "--out", str(out)])
    pe.main([*common, "--out", str(tmp_path / "rgb_only")])
    with pytest.raises(errors.UsageError, match="--geometry with --source egodex"):
        pe.main(["--source", "egodex", "--root", str(sim_root), "--out", str(tmp_path / "x"), "--geometry",
                 "--allow-missing-text"])
    flags = ["--config", "configs/world4d_tiny.py", "--set", "model.base.in_channels=4",
             "--set", "model.base.out_channels=4", "--set", "data.kind=latents", "--set", "total_steps=2",
             "--set", "log.progress=False", "--set", f"ckpt.dir={tmp_path}/ckpt"]
    with pytest.raises(errors.InputError, match="lack depth_latents.*--geometry"):
        train.main([*flags, "--set", f"data.sources={{'robot': '{tmp_path}/rgb_only/*.array_record'}}"])
    losses = train.main([*flags, "--set", f"data.sources={{'robot': '{out}/*.array_record'}}"])
    assert len(losses) == 2 and np.isfinite(losses).all()
