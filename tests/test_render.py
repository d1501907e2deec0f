"""Depth-aware skeleton renderer: projection, depth coding, hands, missing joints, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rynn_jax.render import skeleton_style as sk
from rynn_jax.render.rasterize import (
    RenderConfig,
    default_intrinsics,
    project_points,
    radius_px,
    render_frame,
    render_video,
)
from rynn_jax.render.synthetic import synthetic_hand_motion

# Small images keep the tests fast; big joint discs make areas and centroids precise.
CFG = RenderConfig(width=160, height=96, joint_radius_m=0.02)
K = default_intrinsics(CFG)
BG = np.asarray(CFG.background_rgb, np.float64) / 255.0


def _single_joints(points):
    """Frames that each show one joint disc: points = [(hand, x, y, z), ...] → video inputs."""
    T = len(points)
    joints = np.zeros((T, 2, 21, 3), np.float32)
    joints[..., 2] = 0.5
    elbows = np.tile(np.float32([0.0, 0.0, 0.5]), (T, 2, 1))
    valid = np.zeros((T, 2, 22), bool)
    for t, (h, x, y, z) in enumerate(points):
        joints[t, h, 8] = (x, y, z)
        valid[t, h, 8] = True
    return joints, elbows, valid


def _coverage(img):
    """Per-pixel ink amount in [0, 1]-ish: distance from the background color."""
    return np.linalg.norm(np.asarray(img, np.float64) - BG, axis=-1)


def test_projection_matches_numpy_reference():
    rng = np.random.default_rng(0)
    pts = rng.uniform([-0.3, -0.2, 0.25], [0.3, 0.2, 1.5], size=(50, 3))
    k = np.array([[510.3, 0.0, 400.7], [0.0, 498.1, 230.2], [0.0, 0.0, 1.0]])
    uv, z = project_points(jnp.asarray(k, jnp.float32), jnp.asarray(pts, jnp.float32))
    ref = np.stack([k[0, 0] * pts[:, 0] / pts[:, 2] + k[0, 2],
                    k[1, 1] * pts[:, 1] / pts[:, 2] + k[1, 2]], axis=-1)
    np.testing.assert_allclose(np.asarray(uv), ref, atol=2e-3)
    np.testing.assert_allclose(np.asarray(z), pts[:, 2], rtol=1e-6)


def test_rendered_disc_is_centred_on_the_projection():
    points = [(0, 0.031, -0.017, 0.45), (1, -0.052, 0.023, 0.7)]
    joints, elbows, valid = _single_joints(points)
    vid = np.asarray(render_video(CFG, joints, elbows, K, valid, as_uint8=False))
    v, u = np.mgrid[:CFG.height, :CFG.width]
    for (h, x, y, z), img in zip(points, vid):
        w = _coverage(img)
        centroid = np.array([(w * u).sum(), (w * v).sum()]) / w.sum()
        ref = np.array([K[0, 0] * x / z + K[0, 2], K[1, 1] * y / z + K[1, 2]])
        np.testing.assert_allclose(centroid, ref, atol=0.05)


def test_radius_and_color_are_monotonic_in_depth():
    zs = np.array([0.3, 0.4, 0.55, 0.75, 1.0])
    r = np.asarray(radius_px(CFG, CFG.joint_radius_m, K[0, 0], jnp.asarray(zs)))
    assert np.all(np.diff(r) < 0), r  # nearer = larger (all inside the clip range here)
    points = [(h, 0.0, 0.0, z) for h in (0, 1) for z in zs]
    joints, elbows, valid = _single_joints(points)
    vid = np.asarray(render_video(CFG, joints, elbows, K, valid, as_uint8=False))
    cov = np.clip(_coverage(vid), 0, None)
    centre = vid[:, int(K[1, 2] + 0.5), int(K[0, 2] + 0.5)]
    for h in (0, 1):
        sl = slice(h * len(zs), (h + 1) * len(zs))
        # Ink area = π r²: the disc's coverage mass over its own (opaque) centre contrast.
        area = cov[sl].sum((1, 2)) / np.linalg.norm(centre[sl] - BG, axis=-1)
        np.testing.assert_allclose(area, np.pi * r ** 2, rtol=0.03)
        lightness = sk.srgb_to_oklab(centre[sl])[:, 0]
        assert np.all(np.diff(lightness) > 0.01), lightness  # nearer = darker, more saturated


def test_colormaps_monotonic_and_in_separate_hue_families():
    left = sk.depth_colormap(CFG.left_stops_rgb, CFG.colormap_size)
    right = sk.depth_colormap(CFG.right_stops_rgb, CFG.colormap_size)
    for lut in (left, right):
        assert np.all(np.diff(sk.srgb_to_oklab(lut)[:, 0]) > 0)
    assert np.all(left[:, 2] - left[:, 0] > 0.3)  # blue family at every depth
    assert np.all(right[:, 0] - right[:, 2] > 0.3)  # red family at every depth


def test_left_and_right_hands_are_separable():
    joints, elbows = synthetic_hand_motion(1, seed=3)
    valid = np.zeros((2, 2, 22), bool)
    valid[0, 0] = valid[1, 1] = True  # frame 0: left hand only, frame 1: right hand only
    vid = np.asarray(render_video(CFG, np.repeat(joints, 2, 0), np.repeat(elbows, 2, 0), K,
                                  valid, as_uint8=False))
    u = np.arange(CFG.width)
    for img, family in zip(vid, ("blue", "red")):
        ink = _coverage(img) > 0.02
        d = img[ink] - BG  # = coverage * (color - background), also on anti-aliased edges
        assert len(d) > 100
        margin = 0.2 * np.linalg.norm(d, axis=-1)
        if family == "blue":
            assert np.all(d[:, 2] - d[:, 0] > margin), "left hand must be blue-family"
            assert u[ink.any(0)].mean() < CFG.width / 2  # and on the left of the image
        else:
            assert np.all(d[:, 0] - d[:, 2] > margin), "right hand must be red-family"
            assert u[ink.any(0)].mean() > CFG.width / 2


def test_nearer_primitive_is_drawn_on_top():
    # Left (blue) and right (red) joint on the same ray; the nearer one wins, whatever the hand.
    for z_left, z_right, winner in ((0.4, 0.8, "blue"), (0.8, 0.4, "red")):
        joints, elbows, valid = _single_joints([(0, 0.0, 0.0, z_left)])
        joints[0, 1, 8] = (0.0, 0.0, z_right)
        valid[0, 1, 8] = True
        img = np.asarray(render_frame(CFG, joints[0], elbows[0], K, valid[0], as_uint8=False))
        c = img[int(K[1, 2] + 0.5), int(K[0, 2] + 0.5)]
        assert (c[2] > c[0]) == (winner == "blue"), (z_left, z_right, c)


def test_missing_joints_are_skipped_per_the_rule():
    joints, elbows = synthetic_hand_motion(1, seed=1)
    joints, elbows = joints[0], elbows[0]
    full = np.asarray(render_frame(CFG, joints, elbows, K))
    masked_valid = np.ones((2, 22), bool)
    masked_valid[0, 8] = False
    masked = np.asarray(render_frame(CFG, joints, elbows, K, masked_valid))
    assert np.any(masked != full)
    nan_j = joints.copy()
    nan_j[0, 8, 1] = np.nan  # a lost joint, still marked valid
    behind = joints.copy()
    behind[0, 8, 2] = -0.3  # behind the camera
    conf = np.ones((2, 22), np.float32)
    conf[0, 8] = 0.2  # below min_confidence
    np.testing.assert_array_equal(np.asarray(render_frame(CFG, nan_j, elbows, K)), masked)
    np.testing.assert_array_equal(np.asarray(render_frame(CFG, behind, elbows, K)), masked)
    np.testing.assert_array_equal(np.asarray(render_frame(CFG, joints, elbows, K, conf)), masked)
    # Everything lost → plain background, no NaN anywhere.
    lost = np.asarray(render_frame(CFG, np.full_like(joints, np.nan), elbows * np.nan, K,
                                   as_uint8=False))
    assert np.all(np.isfinite(lost))
    np.testing.assert_allclose(lost, np.broadcast_to(BG, lost.shape), atol=1e-6)


def test_video_is_vmapped_frames_deterministic_and_jittable():
    joints, elbows = synthetic_hand_motion(3, seed=2)
    vid = np.asarray(render_video(CFG, joints, elbows, K))
    assert vid.shape == (3, CFG.height, CFG.width, 3) and vid.dtype == np.uint8
    np.testing.assert_array_equal(vid, np.asarray(render_video(CFG, joints, elbows, K)))
    frame = np.asarray(render_frame(CFG, joints[1], elbows[1], K, as_uint8=False))
    vid_f = np.asarray(render_video(CFG, joints, elbows, K, as_uint8=False))
    np.testing.assert_allclose(vid_f[1], frame, atol=1e-5)
    # The public wrapper traces inside a user's jit (value checks are skipped for tracers).
    jitted = jax.jit(lambda j, e: render_frame(CFG, j, e, K, as_uint8=False))
    np.testing.assert_allclose(np.asarray(jitted(joints[1], elbows[1])), frame, atol=1e-5)


@pytest.mark.parametrize("change, match", [
    (dict(joints=np.zeros((2, 20, 3))), r"joints_cam must have shape \(2, 21, 3\)"),
    (dict(joints=np.zeros((21, 3))), r"joints_cam must have shape"),
    (dict(elbows=np.zeros(3)), r"elbows_cam must have shape \(2, 3\)"),
    (dict(valid=np.ones((2, 21), bool)), r"valid must have shape \(2, 22\)"),
    (dict(K=np.eye(3)[:2]), r"K must have shape"),
    (dict(K=np.diag([0.0, 100.0, 1.0])), r"focal lengths must be > 0"),
    (dict(K=np.array([[100.0, 0, 80], [0, -5.0, 48], [0, 0, 1]])), r"focal lengths must be > 0"),
    (dict(K=np.array([[100.0, 0, 170], [0, 100, 48], [0, 0, 1]])), r"principal point"),
    (dict(K=np.array([[100.0, 0, 80], [0, 100, -1], [0, 0, 1]])), r"principal point"),
    (dict(K=np.array([[np.nan, 0, 80], [0, 100, 48], [0, 0, 1]])), r"non-finite"),
    (dict(K=np.array([[100.0, 0, 80], [0, 100, 48], [0, 0, 2]])), r"last row"),
    (dict(on_nan="raise", nan=True), r"non-finite joint coordinates at .*\(0, 8\)"),
    (dict(on_nan="maybe"), r"on_nan must be"),
])
def test_bad_input_raises_clear_errors(change, match):
    joints, elbows = synthetic_hand_motion(1, seed=0)
    args = dict(joints=joints[0], elbows=elbows[0], K=K, valid=None, on_nan="skip")
    if change.pop("nan", False):
        args["joints"] = joints[0].copy()
        args["joints"][0, 8, 0] = np.nan
    args.update(change)
    with pytest.raises(ValueError, match=match):
        render_frame(CFG, args["joints"], args["elbows"], args["K"], args["valid"],
                     on_nan=args["on_nan"])


def test_bad_video_input_and_config_raise():
    joints, elbows = synthetic_hand_motion(2, seed=0)
    with pytest.raises(ValueError, match=r"shape \(T, 2, 21, 3\)"):
        render_video(CFG, joints[0], elbows[0], K)
    with pytest.raises(ValueError, match=r"elbows_cam must have shape \(2, 2, 3\)"):
        render_video(CFG, joints, elbows[:1], K)
    with pytest.raises(ValueError, match=r"K must have shape \(3, 3\) or \(2, 3, 3\)"):
        render_video(CFG, joints, elbows, np.stack([K] * 3))
    with pytest.raises(ValueError, match="depth_near_m < depth_far_m"):
        RenderConfig(depth_near_m=1.0, depth_far_m=0.5)


def test_synthetic_motion_is_plausible_and_deterministic():
    joints, elbows = synthetic_hand_motion(40, seed=7)
    assert joints.shape == (40, 2, 21, 3) and elbows.shape == (40, 2, 3)
    assert joints.dtype == np.float32 and np.all(np.isfinite(joints))
    j2, e2 = synthetic_hand_motion(40, seed=7)
    np.testing.assert_array_equal(joints, j2)
    np.testing.assert_array_equal(elbows, e2)
    np.testing.assert_array_equal(synthetic_hand_motion(10, seed=7)[0], joints[:10])
    assert not np.array_equal(synthetic_hand_motion(40, seed=8)[0], joints)
    assert 0.38 < joints[..., 2].min() and joints[..., 2].max() < 0.8
    assert np.all(joints[:, 0, 0, 0] < 0) and np.all(joints[:, 1, 0, 0] > 0)  # left | right
    pts = np.concatenate([joints, elbows[:, :, None]], axis=2)
    a, b = np.array(sk.BONES).T
    lengths = np.linalg.norm(pts[:, :, a] - pts[:, :, b], axis=-1)
    np.testing.assert_allclose(lengths, np.broadcast_to(lengths[0], lengths.shape), atol=1e-5)
    tip_to_wrist = np.linalg.norm(joints[:, :, 12] - joints[:, :, 0], axis=-1)
    assert tip_to_wrist.max() - tip_to_wrist.min() > 0.04  # fingers curl over time


def test_preview_writes_png_and_mp4(tmp_path):
    iio = pytest.importorskip("imageio.v3")
    from rynn_jax.render import preview

    frames = preview.render_synthetic(CFG, frames=4, seed=0)
    preview.save_png(str(tmp_path / "f.png"), frames[2])
    np.testing.assert_array_equal(iio.imread(tmp_path / "f.png"), frames[2])
    preview.save_video(str(tmp_path / "v.mp4"), frames, fps=CFG.fps)
    video = iio.imread(tmp_path / "v.mp4")
    assert video.shape == frames.shape
    assert np.abs(video.astype(float) - frames).mean() < 6  # lossy, but the same picture
