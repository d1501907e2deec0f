"""The operator's hands through the tracker chain, in the robot frame, seen from a robot camera.

    palm targets (T_base · Scale_s(T_chest⁻¹ · T_wrist) · T_ee) ⊗ the hand's 21 wrist-frame keypoints
        ─ robot camera (robot frame ← camera, OpenCV axes) ─▶ joints in the camera

This is the skeleton a sim episode's control video shows (`sim.episode`) and a live sim session
renders (`live.operator`). It is not a rigid picture of the tracking world: the chain scales
chest → wrist translations by s (1.5) and leaves the hands their size, so no camera in the tracking
world gives it (`teleop.camera_hands.hands_in_camera`, rigid, shows the hands s times larger).
"""

from __future__ import annotations

import jax
import numpy as np

from rynn_jax.kinematics import tracker

_targets = jax.jit(jax.vmap(lambda calib, trk: tracker.arm_targets(calib, tracker.tracker_poses(trk)),
                            in_axes=(None, 0)))


def chain_targets(calib: tracker.Calibration, trackers_t57: jax.Array) -> tuple[np.ndarray, np.ndarray]:
    """Palm targets (T, 2, 4, 4) and elbow references (T, 2, 3), robot frame, float64, of tracker
    samples (T, 5, 7) through the calibrated chain (`tracker.arm_targets`; lost samples give NaN)."""
    palms, elbows = _targets(calib, trackers_t57)
    return np.asarray(palms, np.float64), np.asarray(elbows, np.float64)


def hands_through_chain(palms: np.ndarray, hands: np.ndarray, elbows: np.ndarray, fresh: np.ndarray,
                        robot_camera: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Joints (T, 2, 21, 3) and elbows (T, 2, 3), float32, in the camera `robot_camera` (4×4, robot
    frame ← camera, OpenCV axes): each hand's keypoints (T, 2, 21, 3) placed in its palm target
    (T, 2, 4, 4), the elbow references (T, 2, 3) as they are; validity (T, 2, 22) is `fresh` (T,)."""
    cam_inv = np.linalg.inv(robot_camera)
    world = np.einsum("tsij,tsnj->tsni", palms[..., :3, :3], hands) + palms[:, :, None, :3, 3]
    joints = world @ cam_inv[:3, :3].T + cam_inv[:3, 3]
    elbows = elbows @ cam_inv[:3, :3].T + cam_inv[:3, 3]
    valid = np.repeat(fresh[:, None, None], 22, axis=2).repeat(2, axis=1)
    return joints.astype(np.float32), elbows.astype(np.float32), valid
