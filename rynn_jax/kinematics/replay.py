"""MuJoCo replay: render the robot following a 54-D action trajectory (kinematic playback).

Headless rendering needs an offscreen GL: set `MUJOCO_GL=osmesa` (Debian's `libosmesa6`) on CPU
machines or `MUJOCO_GL=egl` on GPU machines before mujoco is imported.
"""

from __future__ import annotations

import mujoco
import numpy as np

from rynn_jax.kinematics import layout, mjcf_model


def offscreen_renderer(model: mujoco.MjModel, height: int, width: int) -> mujoco.Renderer:
    """`mujoco.Renderer`, with an actionable error when no offscreen OpenGL can be created (the
    usual cause on a fresh headless machine: Mesa's OSMesa library is not installed)."""
    import os

    try:
        return mujoco.Renderer(model, height, width)
    except Exception as e:  # mujoco/PyOpenGL raise several types for a missing GL library
        backend = os.environ.get("MUJOCO_GL", "(unset)")
        raise RuntimeError(
            f"MuJoCo could not create an offscreen OpenGL context (MUJOCO_GL={backend}): {e}. "
            "On a headless CPU machine install Mesa's OSMesa (Debian/Ubuntu: apt-get install "
            "libosmesa6) and use MUJOCO_GL=osmesa; on a GPU machine MUJOCO_GL=egl.") from e


def joint_qpos_addresses(model: mujoco.MjModel) -> np.ndarray:
    """qpos index of each of the 54 action joints, in action order."""
    ids = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, name) for name in layout.ACTION_NAMES]
    missing = [n for n, i in zip(layout.ACTION_NAMES, ids) if i < 0]
    if missing:
        raise ValueError(f"the model has no joints named {missing[:5]}")
    return np.asarray([model.jnt_qposadr[i] for i in ids])


def front_camera(model: mujoco.MjModel, data: mujoco.MjData) -> mujoco.MjvCamera:
    """A free camera 1.6 m in front of the robot, looking back at the centre of its bodies."""
    cam = mujoco.MjvCamera()
    cam.type = mujoco.mjtCamera.mjCAMERA_FREE
    mujoco.mj_kinematics(model, data)
    cam.lookat[:] = data.xpos[1:].mean(axis=0)  # body 0 is the world
    cam.distance = 1.6
    cam.azimuth, cam.elevation = 180.0, -15.0
    return cam


def render_replay(actions_t54: np.ndarray, height: int = 240, width: int = 416,
                  camera: str | None = None) -> np.ndarray:
    """Frames (T, H, W, 3) uint8 of the robot at each action, seen by a camera in front of it
    (default) or by a named model camera (e.g. "head_camera", the robot's own view)."""
    actions_t54 = np.asarray(actions_t54, np.float64)
    if actions_t54.ndim != 2 or actions_t54.shape[1] != layout.ACTION_DIM:
        raise ValueError(f"actions must be (T, {layout.ACTION_DIM}), got {actions_t54.shape}")
    if not np.isfinite(actions_t54).all():
        raise ValueError("actions contain NaN or Inf")
    model = mjcf_model.load_model()
    data = mujoco.MjData(model)
    adr = joint_qpos_addresses(model)
    frames = np.empty((len(actions_t54), height, width, 3), np.uint8)
    view = front_camera(model, data) if camera is None else camera
    renderer = offscreen_renderer(model, height, width)
    try:
        for i, q in enumerate(actions_t54):
            data.qpos[adr] = q
            mujoco.mj_kinematics(model, data)
            renderer.update_scene(data, camera=view)
            frames[i] = renderer.render()
    finally:
        renderer.close()
    return frames
