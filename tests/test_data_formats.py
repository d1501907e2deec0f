"""Round trips: a known camera-frame hand pose written in each dataset's exact on-disk format comes
back from our readers as the expected 2D skeleton, at the expected frames after 30 → 16 fps."""

from __future__ import annotations

import os

import numpy as np
import pytest

from rynn_jax.data import clips
from rynn_jax.data import fixtures as fx
from rynn_jax.data import skeleton as sk
from rynn_jax.data import video as video_lib
from rynn_jax.data.egodex import EgoDexSource
from rynn_jax.data.robot import RobotSource
from rynn_jax.data.vitra import VitraSource

SRC_W, SRC_H = 128, 72  # tiny 16:9 stand-in for 1920×1080
CFG = clips.ClipConfig(num_frames=17, height=32, width=64)
N_SRC = 100


def expected_K() -> np.ndarray:
    """Written out by hand: 128×72 → scale 0.5 → 64×36 → centre crop rows 2..33."""
    K = fx.source_intrinsics(SRC_W, SRC_H)
    return np.array([[K[0, 0] * 0.5, 0, 0.5 * (K[0, 2] + 0.5) - 0.5],
                     [0, K[1, 1] * 0.5, 0.5 * (K[1, 2] + 0.5) - 0.5 - 2],
                     [0, 0, 1]])


def expected_frames(start: int, n: int = CFG.num_frames, first: int = 0) -> np.ndarray:
    """Nearest 30 Hz frame to each 16 Hz tick: round((start + i) · 30/16)."""
    return first + np.floor((start + np.arange(n)) * 30 / 16 + 0.5).astype(int)


def check_sample(sample: dict, start: int, joints: np.ndarray, elbows: np.ndarray | None,
                 first: int = 0, valid: np.ndarray | None = None):
    idx = expected_frames(start, first=first)
    np.testing.assert_array_equal(sample["frame_index"], idx)
    assert [fx.decode_frame_code(f) for f in sample["video"]] == idx.tolist()
    assert sample["video"].shape == (CFG.num_frames, CFG.height, CFG.width, 3)
    np.testing.assert_allclose(sample["intrinsics"], expected_K(), atol=1e-4)
    K = expected_K()
    pts = joints[idx - first]
    uv = np.stack([K[0, 0] * pts[..., 0] / pts[..., 2] + K[0, 2],
                   K[1, 1] * pts[..., 1] / pts[..., 2] + K[1, 2]], -1)
    v = np.ones(uv.shape[:-1], bool) if valid is None else valid[..., :21]
    err = np.abs(sample["uv"][:, :, :21] - uv)[v]
    assert err.max() < 0.5, f"max 2D error {err.max():.3g} px"
    assert err.max() < 1e-2  # in fact exact up to float32 storage
    np.testing.assert_allclose(sample["depth"][:, :, :21][v], pts[..., 2][v], atol=1e-4)
    np.testing.assert_array_equal(sample["valid"][..., :21], v)
    if elbows is not None:
        np.testing.assert_allclose(sample["elbows_cam"], elbows[idx - first], atol=1e-4)


@pytest.mark.parametrize("convention", ["opencv", "arkit"])
def test_egodex_round_trip(tmp_path, convention):
    joints, elbows = fx.known_pose(N_SRC, seed=3)
    conf = np.ones((N_SRC, 2, 22))
    conf[40:50, 1, 5:9] = 0.2  # a low-confidence right index finger for a few frames
    fx.write_egodex_episode(str(tmp_path), "basic_pick_place", 0, joints, elbows, seed=3,
                            confidences=conf, camera_convention=convention)
    cfg = clips.ClipConfig(**{**CFG.__dict__, "camera_convention": convention})
    src = EgoDexSource(tmp_path, cfg, strict=True, min_confidence=0.5)
    refs = src.index()
    # 100 frames at 30 Hz → 54 ticks at 16 Hz → 3 back-to-back clips of 17
    assert [(r.episode, r.start) for r in refs] == [("basic_pick_place/0", s) for s in (0, 17, 34)]
    for ref in refs:
        s = src.load_or_none(ref)
        idx = expected_frames(ref.start)
        valid = conf[idx] >= 0.5
        check_sample(s, ref.start, joints, elbows, valid=valid)
        assert str(s["text"]) == "pick up the cup" and not s["has_actions"]
    assert not src.load_or_none(refs[1])["valid"][:, 1, 5:9].all()  # the dip is visible


def test_egodex_joint_names():
    names = sk.arkit_hand_joints("left")
    assert names[:5] == ("leftHand", "leftThumbKnuckle", "leftThumbIntermediateBase",
                         "leftThumbIntermediateTip", "leftThumbTip")
    assert names[5:9] == ("leftIndexFingerKnuckle", "leftIndexFingerIntermediateBase",
                          "leftIndexFingerIntermediateTip", "leftIndexFingerTip")
    assert names[17] == "leftLittleFingerKnuckle" and len(names) == 21
    assert not any("Metacarpal" in n for n in names)


def test_vitra_round_trip(tmp_path):
    joints, _ = fx.known_pose(N_SRC, seed=5)
    kept = np.ones((N_SRC, 2), int)
    kept[30:40, 0] = 0  # left hand lost for a while
    fx.write_vitra_episode(str(tmp_path), "Ego4D_abc_ep_000007", "abc", joints, kept,
                           first_frame=10, num_video_frames=120, seed=5)
    src = VitraSource(tmp_path, CFG, strict=True)
    refs = src.index()
    assert [r.start for r in refs] == [0, 17, 34]
    for ref in refs:
        s = src.load_or_none(ref)
        idx = expected_frames(ref.start, first=10)
        valid = np.repeat(kept[idx - 10][..., None].astype(bool), 22, -1)
        check_sample(s, ref.start, joints, None, first=10, valid=valid)
        assert not s["valid"][..., 21].any()  # VITRA has no elbows
    assert str(s["text"]) == "Left hand: hold the bowl. Right hand: stir the soup."


def test_vitra_split_video_parts(tmp_path):
    """VITRA's loader splits long videos into parts; frames must come from the right part."""
    joints, _ = fx.known_pose(60, seed=1)
    fx.write_vitra_episode(str(tmp_path), "Ego4D_v_ep_000000", "v", joints, seed=1)
    frames = fx.frame_coded_video(60, SRC_W, SRC_H)
    video_lib.write_video(tmp_path / "videos" / "v_part1.mp4", frames[:40], 30)
    video_lib.write_video(tmp_path / "videos" / "v_part2.mp4", frames[40:], 30)
    src = VitraSource(tmp_path, clips.ClipConfig(num_frames=25, height=32, width=64),
                      strict=True, video_part_len=40)
    s = src.load_or_none(src.index()[0])
    assert [fx.decode_frame_code(f) for f in s["video"]] == expected_frames(0, 25).tolist()


def test_robot_round_trip(tmp_path):
    joints, elbows = fx.known_pose(N_SRC, seed=9)
    fx.make_dataset("robot", str(tmp_path), 1, N_SRC, seed=9)
    actions = fx.known_actions(N_SRC, seed=9)
    src = RobotSource(tmp_path, CFG, strict=True)
    refs = src.index()
    assert [r.start for r in refs] == [0, 17, 34]
    for ref in refs:
        s = src.load_or_none(ref)
        check_sample(s, ref.start, joints, elbows)
        np.testing.assert_array_equal(s["actions"], actions[expected_frames(ref.start)])
        assert s["has_actions"] and str(s["text"]) == "lift the lid with both hands"
    norm = RobotSource(tmp_path, CFG, strict=True, action_norm="meanstd")
    s = norm.load_or_none(refs[0])
    np.testing.assert_allclose(s["actions"], (actions[expected_frames(0)] - actions.mean(0))
                               / actions.std(0), rtol=1e-4, atol=1e-4)


def test_resample_timeline():
    assert clips.resampled_length(151, 30, 16) == 81  # 81 ticks need 151 frames at 30 Hz
    assert clips.resampled_length(150, 30, 16) == 80
    assert clips.resampled_length(81, 16, 16) == 81
    np.testing.assert_array_equal(clips.resample_indices(0, 5, 30, 16), [0, 2, 4, 6, 8])
    np.testing.assert_array_equal(clips.resample_indices(3, 3, 16, 16), [3, 4, 5])
    np.testing.assert_array_equal(clips.resample_indices(0, 4, 12, 16), [0, 1, 2, 2])  # upsampling
    cfg = clips.ClipConfig(num_frames=25, stride=10, max_clips_per_episode=3)
    assert clips.clip_starts(60, cfg) == [0, 10, 20]


def test_crop_intrinsics_match_pixels():
    """A bright dot drawn at a known source pixel lands where the cropped K says."""
    src = np.zeros((1, 72, 128, 3), np.uint8)
    src[0, 30:36, 80:86] = 255  # 6×6 block centred at (u, v) = (82.5, 32.5)
    K = np.eye(3)
    K[0, 2], K[1, 2] = 82.5, 32.5  # a K whose principal point is the dot
    g = video_lib.crop_geometry(128, 72, 64, 32)
    K_out = video_lib.crop_intrinsics(K, 128, 72, g)
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "dot.mp4")
        video_lib.write_video(path, np.repeat(src, 2, 0), 30, crf=0)
        out = video_lib.read_frames(path, [0], 64, 32)[0].astype(float).mean(-1)
    ys, xs = np.mgrid[: out.shape[0], : out.shape[1]]
    w = np.clip(out - 40, 0, None)
    centre = np.array([(xs * w).sum() / w.sum(), (ys * w).sum() / w.sum()])
    np.testing.assert_allclose(centre, K_out[:2, 2], atol=0.35)


def test_egodex_wrong_camera_convention_is_caught(tmp_path):
    joints, elbows = fx.known_pose(40, seed=2)
    fx.write_egodex_episode(str(tmp_path), "t", 0, joints, elbows, camera_convention="arkit")
    cfg = clips.ClipConfig(num_frames=9, height=32, width=64)  # opencv: the wrong one here
    src = EgoDexSource(tmp_path, cfg, strict=True)
    with pytest.raises(Exception, match="hands behind camera"):
        src.load_or_none(src.index()[0])


def test_index_cache_is_reused_only_for_the_same_config(tmp_path):
    fx.make_dataset("robot", str(tmp_path / "robot"), 2, 40)
    cache = str(tmp_path / "index.json")
    cfg = clips.ClipConfig(num_frames=9, height=32, width=64)
    refs = RobotSource(tmp_path / "robot", cfg).index(cache)
    assert len(refs) == 4 and os.path.exists(cache)
    assert RobotSource(tmp_path / "nowhere", cfg).index(cache) == refs  # served from the cache
    other = clips.ClipConfig(num_frames=5, height=32, width=64)
    assert len(RobotSource(tmp_path / "robot", other).index(cache)) == 8
