"""The autoencoder's clips of depth.npz / flow.npz: the 4D model's depth and flow videos of a window."""

from __future__ import annotations

import numpy as np
import pytest

from rynn_jax.data import geometry_video as gv
from rynn_jax.data.errors import DataError
from rynn_jax.training import autoencoder as ae

T_EP, H, W = 12, 16, 24


@pytest.fixture(scope="module")
def episode(tmp_path_factory):
    d = tmp_path_factory.mktemp("geo") / "episode_000000"
    d.mkdir()
    rng = np.random.default_rng(0)
    depth_mm = rng.integers(300, 6000, (T_EP, H, W)).astype(np.uint16)
    flow = (rng.standard_normal((T_EP - 1, H, W, 2)) * 6).astype(np.float16)
    np.savez(d / "depth.npz", depth_mm=depth_mm)
    np.savez(d / "flow.npz", flow=flow)
    return d, depth_mm, flow


def _load(path, t: int, max_px: float = gv.FLOW_MAX_PX, h: int = H, w: int = W, seed: int = 3):
    data = ae.AutoencoderDataConfig(num_frames=t, height=h, width=w, flow_max_px=max_px)
    clip = ae.LoadClip(data)((1, str(path)), np.random.default_rng(seed))
    start = int(np.random.default_rng(seed).integers(0, T_EP - t + 1))  # what LoadClip draws
    return clip["video"], start


def test_depth_window_is_the_grey_depth_video(episode):
    d, depth_mm, _ = episode
    video, start = _load(d / "depth.npz", 5)
    assert start > 0 and video.shape == (5, H, W, 3) and video.dtype == np.uint8
    np.testing.assert_array_equal(video, gv.depth_to_rgb(depth_mm[start:start + 5].astype(np.float32) / 1000.0))


@pytest.mark.parametrize("max_px", [32.0, 8.0])
def test_flow_window_is_white_then_the_flows_into_each_frame(episode, max_px):
    d, _, flow = episode
    video, start = _load(d / "flow.npz", 5, max_px)
    assert (video[0] == 255).all()
    np.testing.assert_array_equal(video[1:], gv.flow_to_rgb(flow[start:start + 4].astype(np.float32), max_px))
    back = gv.rgb_to_flow(video[1:], max_px)  # decodes to the window's flows (where not saturated)
    f = flow[start:start + 4].astype(np.float32)
    inside = np.hypot(f[..., 0], f[..., 1]) < max_px
    assert np.abs(back - f)[inside].max() < 3 * max_px / 255 + 1e-3


def test_whole_episode_window_and_resize(episode):
    d, depth_mm, flow = episode
    assert (gv.render_frames(True, gv.read_render(d / "flow.npz"))
            == gv.render_frames(False, gv.read_render(d / "depth.npz")) == T_EP)
    video, start = _load(d / "flow.npz", T_EP, h=8, w=12)
    assert start == 0 and video.shape == (T_EP, 8, 12, 3)


def test_bad_geometry_files_are_data_errors(episode, tmp_path):
    d, _, _ = episode
    with pytest.raises(DataError, match="too short"):
        _load(d / "depth.npz", T_EP + 4)
    bad = tmp_path / "flow.npz"
    bad.write_bytes(b"not an npz")
    with pytest.raises(DataError, match="unreadable depth/flow render"):
        gv.read_render(bad)
    with pytest.raises(DataError, match="unreadable depth/flow render"):
        _load(bad, 2)
    with pytest.raises(DataError, match="window past the end"):
        gv.render_window(False, gv.read_render(d / "depth.npz"), T_EP - 1, 2, H, W)
