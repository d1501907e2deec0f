"""MuJoCo replay of a 54-D action trajectory, and the retarget CLI writing it."""

import numpy as np
import pytest

from rynn_jax.kinematics import cli, layout, mjcf_model, replay, streams
from rynn_jax.teleop.camera_hands import synthetic_stream


def test_replay_follows_the_actions():
    model = mjcf_model.load_model()
    adr = replay.joint_qpos_addresses(model)
    assert len(set(adr.tolist())) == layout.ACTION_DIM
    q = np.zeros((2, layout.ACTION_DIM))
    q[1, layout.LEFT_ARM] = [0.8, -0.6, 0.4, -1.2, 0.3, 0.2, 0.1]  # move only the left arm
    frames = replay.render_replay(q, 48, 80)
    assert frames.shape == (2, 48, 80, 3) and frames.dtype == np.uint8
    changed = np.abs(frames[0].astype(int) - frames[1].astype(int)).sum(-1) > 30
    assert changed.any()
    np.testing.assert_array_equal(replay.render_replay(q[:1], 48, 80)[0], frames[0])  # deterministic
    with pytest.raises(ValueError, match=r"\(T, 54\)"):
        replay.render_replay(np.zeros((2, 53)))
    with pytest.raises(ValueError, match="NaN"):
        replay.render_replay(np.full((1, 54), np.nan))


def test_retarget_cli_writes_actions_and_video(tmp_path):
    streams.write(tmp_path / "s.npz", synthetic_stream(9))
    assert cli.main(["retarget", str(tmp_path / "s.npz"), str(tmp_path / "a.npz"),
                     "--video", str(tmp_path / "replay.mp4")]) == 0
    out = np.load(tmp_path / "a.npz")
    assert out["actions"].shape[1] == 54 and np.isfinite(out["actions"]).all()
    assert (tmp_path / "replay.mp4").stat().st_size > 1000


def test_missing_offscreen_gl_gives_an_actionable_error(monkeypatch):
    """A headless machine without OSMesa/EGL: the error says what to install, and keeps the cause."""
    import mujoco

    def no_gl(*args, **kwargs):
        raise ImportError("Unable to load OpenGL library: libOSMesa.so.8")

    monkeypatch.setattr(mujoco, "Renderer", no_gl)
    with pytest.raises(RuntimeError, match="apt-get install libosmesa6") as info:
        replay.render_replay(np.zeros((2, layout.ACTION_DIM)), 16, 16)
    assert isinstance(info.value.__cause__, ImportError)
