"""A live sim session's skeleton poses are the sim episode's hand skeleton (`hand_skeleton.npz`).

The operator is the one the page plays: `/sim/<task>.json`'s frames (at `sim_start.STREAM_HZ`),
parsed as the server parses them, through the server's `Operator` with the sim task's cameras. The
oracle is `episode.generate`'s `joints_cam` for the same task and seed, projected with the episode's
intrinsics. The rigid tracking-world picture (`hands_in_camera` through the stream's approximate
`T_world_camera`) puts the wrists in the right place but the camera 1/s as far away: hands s = 1.5
times too large, which is what the live skeleton showed before it went through the chain.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from rynn_jax.kinematics import streams
from rynn_jax.live import protocol, sim_start
from rynn_jax.live.operator import Kinematics, Operator, TickQueue, stream_of
from rynn_jax.sim import episode
from rynn_jax.teleop.camera_hands import hands_in_camera

TASK, SEED = "dual_pick", 3
H, W = 64, 96
SECONDS = 2.5  # the hands are in view from ≈ 1 s


def _pixels(joints: np.ndarray, k33: np.ndarray) -> np.ndarray:
    uvw = joints.astype(np.float64) @ k33.T
    return uvw[..., :2] / uvw[..., 2:]


@pytest.fixture(scope="module")
def live_ticks():
    sim = sim_start.build(TASK, SEED, H, W)
    served = json.loads(sim.stream_json)["frames"]
    frames = [protocol.parse_text(json.dumps(f)) for f in served[:int(SECONDS * sim_start.STREAM_HZ) + 1]]
    op = Operator(Kinematics.build(), sim.camera, TickQueue(1000), sim.robot_camera)
    ticks = [tick for f in frames for tick in op.add(f)[1]]
    return sim, frames, ticks


def test_the_live_sim_skeleton_is_the_episode_s_hand_skeleton(live_ticks):
    sim, frames, ticks = live_ticks
    ep = episode.generate(TASK, SEED, resolution=(H, W), render=False)
    k = np.rint(np.asarray([tick.t for tick in ticks]) * streams.VIDEO_FPS).astype(int)
    np.testing.assert_array_equal(k, np.arange(len(ticks)))  # one tick per video frame, from t = 0
    joints = np.stack([tick.joints for tick in ticks])
    np.testing.assert_array_equal(np.stack([tick.valid for tick in ticks]), ep.skeleton_valid[k])
    np.testing.assert_allclose(sim.intrinsics, ep.intrinsics)
    got, want = _pixels(joints, sim.intrinsics), _pixels(ep.joints_cam[k], ep.intrinsics)
    inside = (want >= 0).all(-1) & (want[..., 0] < W) & (want[..., 1] < H)
    assert inside.sum() > 200  # hands in view
    assert np.abs(got - want).max() < 0.02, np.abs(got - want).max()
    np.testing.assert_allclose(np.stack([tick.elbows for tick in ticks]), ep.elbows_cam[k], atol=1e-5)
    # The rigid picture: the same wrists, the camera at 1/s of the distance, so hands s times larger.
    rigid = hands_in_camera(stream_of(frames, sim.camera), k / streams.VIDEO_FPS)[0]
    rigid_uv = _pixels(rigid, ep.intrinsics)
    assert np.abs(rigid_uv[..., 0, :] - want[..., 0, :])[inside[..., 0]].max() < 1.0
    assert np.median(rigid[..., 0, 2] / ep.joints_cam[k][..., 0, 2]) == pytest.approx(1 / 1.5, rel=0.02)
    spread = lambda uv: np.linalg.norm(uv - uv.mean(-2, keepdims=True), axis=-1).mean(-1)  # noqa: E731
    assert np.median(spread(rigid_uv) / spread(want)) > 1.3
