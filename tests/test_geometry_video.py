"""Depth and flow as RGB videos (rynn_jax.data.geometry_video): the released depth encoding, the
Middlebury colour wheel against flow_vis, and both inverses within quantisation."""

from __future__ import annotations

import numpy as np
import pytest

from rynn_jax.data import geometry_video as gv


def test_depth_encoding_is_the_released_one_and_inverts_within_a_grey_level():
    rng = np.random.default_rng(0)
    d = rng.uniform(0.0, 6.0, (3, 8, 9))
    rgb = gv.depth_to_rgb(d)
    assert rgb.dtype == np.uint8 and rgb.shape == (3, 8, 9, 3)
    assert np.all(rgb[..., 0] == rgb[..., 1]) and np.all(rgb[..., 1] == rgb[..., 2])
    np.testing.assert_array_equal(rgb[..., 0], np.floor(np.minimum(d, 5.0) / 5.0 * 255.0))  # ⌊d/5·255⌋
    back = gv.rgb_to_depth(rgb)
    err = np.minimum(d, 5.0) - back
    assert err.min() >= -1e-6 and err.max() < 5.0 / 255.0  # floor: the decode is ≤ the truth by < 1 level
    assert gv.rgb_to_depth(gv.depth_to_rgb(np.zeros((1, 2, 2)))).max() == 0.0


def test_flow_colours_are_the_middlebury_wheel():
    flow_vis = pytest.importorskip("flow_vis")
    rng = np.random.default_rng(1)
    flow = rng.uniform(-1.0, 1.0, (16, 24, 2)) * gv.FLOW_MAX_PX / np.sqrt(2)  # |f| ≤ max_px
    ours = gv.flow_to_rgb(flow)
    ref = flow_vis.flow_uv_to_colors(flow[..., 0] / gv.FLOW_MAX_PX, flow[..., 1] / gv.FLOW_MAX_PX)
    np.testing.assert_array_equal(ours, ref)
    np.testing.assert_array_equal(gv.flow_to_rgb(np.zeros((2, 2, 2))), 255)  # zero flow is white


def test_flow_encoding_inverts_within_quantisation():
    rng = np.random.default_rng(2)
    mag = rng.uniform(0.0, 1.0, 4000) * gv.FLOW_MAX_PX
    ang = rng.uniform(-np.pi, np.pi, 4000)
    flow = np.stack([mag * np.cos(ang), mag * np.sin(ang)], -1).reshape(40, 100, 2)
    back = gv.rgb_to_flow(gv.flow_to_rgb(flow))
    epe = np.hypot(*(back - flow).transpose(2, 0, 1))
    # one 8-bit level of colour moves the radius by max_px/255 and the angle by about as much
    assert epe.max() < 3.0 * gv.FLOW_MAX_PX / 255.0 and epe.mean() < gv.FLOW_MAX_PX / 255.0
    # longer flows saturate (and are counted)
    long = np.full((1, 1, 2), 3.0 * gv.FLOW_MAX_PX)
    np.testing.assert_allclose(np.hypot(*gv.rgb_to_flow(gv.flow_to_rgb(long))[0, 0]), gv.FLOW_MAX_PX, rtol=0.01)
    assert gv.clipped_fraction(np.concatenate([flow, long.repeat(100, 1)])) == pytest.approx(100 / 4100)


def _rgb_to_flow_brute_force(rgb: np.ndarray, max_px: float) -> np.ndarray:
    """The nearest point of the colour wheel by projecting onto every segment, (pixels, segments, 3)."""
    c = np.clip(rgb.reshape(-1, 3) / 255.0, 0.0, 1.0)
    r = (1.0 - c).max(-1)
    p = 1.0 - (1.0 - c) / np.maximum(r, 1e-12)[:, None]
    a, b = gv.WHEEL[:-1], gv.WHEEL[1:]
    t = np.clip(((p[:, None] - a) * (b - a)).sum(-1) / ((b - a) ** 2).sum(-1), 0.0, 1.0)
    k = np.square(a + t[..., None] * (b - a) - p[:, None]).sum(-1).argmin(-1)
    angle = ((k + t[np.arange(len(k)), k]) / (len(gv.WHEEL) - 1) * 2.0 - 1.0) * np.pi
    return np.stack([-r * max_px * np.cos(angle), -r * max_px * np.sin(angle)], -1).reshape(*rgb.shape[:-1], 2)


def test_flow_decoding_is_the_nearest_wheel_colour_for_any_colour():
    """Generated colours are off the wheel: every pixel decodes to the projection onto the nearest
    segment, as the brute-force search over all segments finds it (chunk boundaries included)."""
    rng = np.random.default_rng(4)
    rgb = rng.integers(0, 256, (3, 37, 41, 3)).astype(np.uint8)
    got = gv.rgb_to_flow(rgb, 7.0, chunk=1000).reshape(-1, 2).astype(np.float64)
    want = _rgb_to_flow_brute_force(rgb.astype(np.float64), 7.0).reshape(-1, 2)
    np.testing.assert_allclose(np.hypot(*got.T), np.hypot(*want.T), atol=1e-4)  # saturation: exact
    same = np.all(np.abs(got - want) < 1e-4, -1)
    assert same.mean() > 0.99
    # elsewhere two wheel points are equally near (grey pixels: every hue): check the distances tie

    def wheel(f):  # the unquantised full-saturation wheel colour of the flow's direction
        n = len(gv.WHEEL)
        fk = (np.arctan2(-f[:, 1], -f[:, 0]) / np.pi + 1.0) / 2.0 * (n - 1)
        k0 = np.floor(fk).astype(int)
        return (1 - (fk - k0))[:, None] * gv.WHEEL[k0 % n] + (fk - k0)[:, None] * gv.WHEEL[(k0 + 1) % n]

    c = rgb.reshape(-1, 3)[~same] / 255.0
    r = (1.0 - c).max(-1)
    p = 1.0 - (1.0 - c) / np.maximum(r, 1e-12)[:, None]
    d_got = np.square(wheel(got[~same]) - p).sum(-1)
    d_want = np.square(wheel(want[~same]) - p).sum(-1)
    np.testing.assert_allclose(d_got, d_want, atol=1e-9)


def test_episode_videos_from_the_simulators_exact_renders(tmp_path):
    rng = np.random.default_rng(3)
    depth_mm = rng.integers(0, 7000, (4, 6, 8)).astype(np.uint16)
    flow = rng.uniform(-10, 10, (3, 6, 8, 2)).astype(np.float16)
    np.savez_compressed(tmp_path / "depth.npz", depth_mm=depth_mm)
    np.savez_compressed(tmp_path / "flow.npz", flow=flow)
    dv = gv.episode_depth_video(tmp_path)
    assert dv.shape == (4, 6, 8, 3)
    np.testing.assert_array_equal(dv, gv.depth_to_rgb(depth_mm / 1000.0))
    fv = gv.episode_flow_video(tmp_path)
    assert fv.shape == (4, 6, 8, 3) and np.all(fv[0] == 255)  # white frame 0
    np.testing.assert_array_equal(fv[2], gv.flow_to_rgb(flow[1].astype(np.float32)))  # frame t: flow t−1 → t
    with pytest.raises(FileNotFoundError, match="flow.npz"):
        gv.episode_flow_video(tmp_path / "missing")
