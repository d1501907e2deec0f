"""Digital-teleop glue: stream → camera-frame skeleton, world-model clip generation, the demo."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from rynn_jax.kinematics import streams
from rynn_jax.models.dit import WanDiTConfig, init_dit
from rynn_jax.models.vae import WanVAEConfig, init_vae
from rynn_jax.render import synthetic_hand_motion
from rynn_jax.render.preview import save_png
from rynn_jax.teleop import demo
from rynn_jax.teleop.session import hands_in_camera, synthetic_stream
from rynn_jax.teleop.world_model import SamplingConfig, WorldModel


def test_stream_round_trip_to_camera_frame():
    stream = synthetic_stream(9, seed=0)
    joints, elbows, valid = hands_in_camera(stream, np.arange(9) / 16.0)
    want_joints, want_elbows = synthetic_hand_motion(9, seed=0, fps=16)
    assert valid.all()
    # trackers run at 120 Hz and are interpolated back onto the 16 fps clock: sub-millimetre.
    assert np.abs(joints - want_joints).max() < 5e-4
    assert np.abs(elbows - want_elbows).max() < 5e-4


def test_lost_tracker_frames_are_invalid_not_garbage():
    stream = synthetic_stream(9, seed=0)
    lost = stream.tracker_valid.copy()
    lost[(stream.tracker_t > 0.2) & (stream.tracker_t < 0.45), 2] = False  # left wrist lost ~0.25 s
    stream = streams.Stream(stream.tracker_t, stream.tracker_pose, lost, stream.hand_t,
                            stream.hand_keypoints, stream.hand_valid, stream.meta)
    _, _, valid = hands_in_camera(stream, np.arange(9) / 16.0)
    assert not valid[5, 0, :21].any() and valid[5, 1].all()  # t=0.3125: left hand held, flagged
    with pytest.raises(ValueError, match="T_world_camera"):
        hands_in_camera(streams.Stream(stream.tracker_t, stream.tracker_pose, lost, stream.hand_t,
                                       stream.hand_keypoints, stream.hand_valid, {}), np.arange(3) / 16.0)


@pytest.fixture(scope="module")
def world_model():
    vae_cfg = WanVAEConfig.tiny()
    dit_cfg = WanDiTConfig.tiny(control="add", in_channels=4, out_channels=4, control_channels=4)
    return WorldModel(init_dit(dit_cfg, 0), init_vae(vae_cfg, 0))


def test_generate_is_deterministic_and_shaped(world_model):
    rng = np.random.default_rng(0)
    ref = rng.integers(0, 255, (32, 64, 3), dtype=np.uint8)
    skel = rng.integers(0, 255, (5, 32, 64, 3), dtype=np.uint8)
    ctx = np.zeros((16, 24), np.float32)
    sampling = SamplingConfig(num_steps=2)
    a = world_model.generate(jax.random.key(0), ref, skel, ctx, sampling)
    b = world_model.generate(jax.random.key(0), ref, skel, ctx, sampling)
    c = world_model.generate(jax.random.key(1), ref, skel, ctx, sampling)
    assert a.shape == (5, 32, 64, 3) and a.dtype == np.uint8
    np.testing.assert_array_equal(a, b)
    assert np.abs(a[1:].astype(int) - c[1:].astype(int)).max() > 0
    with pytest.raises(ValueError, match="differ in size"):
        world_model.generate(jax.random.key(0), ref[:16], skel, ctx, sampling)


def test_world_model_rejects_uncontrolled_dit():
    with pytest.raises(ValueError, match="control branch"):
        WorldModel(init_dit(WanDiTConfig.tiny(in_channels=4, out_channels=4)), init_vae(WanVAEConfig.tiny()))


def test_demo_end_to_end_small(tmp_path):
    sample = tmp_path / "sample"
    sample.mkdir()
    streams.write(sample / demo.STREAM_FILE, synthetic_stream(9))
    save_png(sample / demo.IMAGE_FILE, demo.reference_scene(32, 64))
    summary = demo.run(tmp_path / "out", num_frames=5, steps=2, sample_dir=sample)
    episode = np.load(tmp_path / "out" / "episode.npz")
    assert episode["frames"].shape == (5, 32, 64, 3)
    assert episode["actions"].shape == (5, 54) and np.isfinite(episode["actions"]).all()
    assert len(episode["t"]) == len(episode["frames"])  # one action per generated frame
    assert list(episode["action_names"][:1]) == ["left_arm_joint1"] or len(episode["action_names"]) == 54
    assert summary["ik_pos_err_mm_median"] < 1.0
    assert summary["hand_tip_err_mm_median"] < 10.0  # wrist frames follow the retargeter's palm axes
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["frames"] == 5
    for name in ("skeleton.mp4", "generated.mp4", "side_by_side.mp4"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    with pytest.raises(ValueError, match="1 \\+ 4k"):
        demo.run(tmp_path / "bad", num_frames=6, sample_dir=sample)
    with pytest.raises(ValueError, match="too short"):
        demo.run(tmp_path / "bad", num_frames=81, sample_dir=sample)
