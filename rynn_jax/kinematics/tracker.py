"""Operator trackers → robot end-effector targets (the paper's retargeting chain, Appendix B).

    T_target = T_base · Scale_s(T_chest⁻¹ · T_wrist) · T_ee

The wrist pose is taken relative to the chest tracker, its translation scaled by s (1.5 by
default: the robot's reach is larger than an arm's), re-expressed in the robot frame T_base,
and offset by the fixed wrist-tracker→palm transform T_ee. The upper-arm tracker goes
through the same chain to give the elbow reference of the IK's null-space prior.

`Calibration` is a pytree of arrays, so gradients flow to it (e.g. to fit T_ee from data).
Tracker poses travel as [x, y, z, qw, qx, qy, qz]; quaternions are normalised here, and a
pose that is non-finite or has a degenerate quaternion is reported invalid (callers hold the
last valid one, see `retarget.py`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from rynn_jax.kinematics import se3

Array = jnp.ndarray

# Order of the five body trackers everywhere (streams, state, calibration).
TRACKERS: tuple[str, ...] = ("chest", "left_upper_arm", "left_wrist", "right_upper_arm", "right_wrist")
CHEST, UPPER_ARM, WRIST = 0, (1, 3), (2, 4)     # indices; (left, right) pairs


class Calibration(NamedTuple):
    t_base_s44: Array       # [2,4,4] robot-frame pose that the operator's chest maps to, per arm
    t_ee_s44: Array         # [2,4,4] wrist tracker → robot palm (IK end-effector) frame
    elbow_offset_s3: Array  # [2,3] elbow point in the upper-arm tracker frame [m]
    scale: Array            # s: translation-only scale of chest→wrist (paper: 1.5)


def default_calibration(chest_pos_3: np.ndarray = np.array([0.0, 0.0, 1.121]),
                        scale: float = 1.5) -> Calibration:
    """Chest mapped to the robot's chest point (between the arm bases), identity rotations."""
    base = np.eye(4)
    base[:3, 3] = chest_pos_3
    return Calibration(t_base_s44=jnp.asarray(np.stack([base, base])),
                       t_ee_s44=jnp.asarray(np.stack([np.eye(4), np.eye(4)])),
                       elbow_offset_s3=jnp.zeros((2, 3)), scale=jnp.asarray(scale))


def tracker_valid(pq_n7: Array, quat_norm_range: tuple[float, float] = (0.5, 2.0)) -> Array:
    """[..., 7] → bool: finite and a usable quaternion (norm inside `quat_norm_range`)."""
    finite = jnp.all(jnp.isfinite(pq_n7), axis=-1)
    qn = jnp.linalg.norm(jnp.where(finite[..., None], pq_n7, 0.0)[..., 3:], axis=-1)
    return finite & (qn > quat_norm_range[0]) & (qn < quat_norm_range[1])


def tracker_poses(pq_n7: Array) -> Array:
    """[..., 7] → [..., 4, 4]; invalid entries become NaN poses (never silently identity)."""
    ok = tracker_valid(pq_n7)
    safe = jnp.where(ok[..., None], pq_n7, jnp.asarray([0, 0, 0, 1, 0, 0, 0], pq_n7.dtype))
    return jnp.where(ok[..., None, None], se3.pose_from_pos_quat(safe), jnp.nan)


def arm_targets(calib: Calibration, t_trackers_n44: Array) -> tuple[Array, Array]:
    """Five tracker poses [5,4,4] → (EE targets [2,4,4], elbow references [2,3]) in the robot frame."""
    chest_inv = se3.inverse(t_trackers_n44[CHEST])
    wrist = t_trackers_n44[jnp.asarray(WRIST)]
    upper = t_trackers_n44[jnp.asarray(UPPER_ARM)]
    rel = se3.scale_translation(chest_inv @ wrist, calib.scale)
    t_target = calib.t_base_s44 @ rel @ calib.t_ee_s44
    rel_u = calib.t_base_s44 @ se3.scale_translation(chest_inv @ upper, calib.scale)
    elbow = rel_u[..., :3, :3] @ calib.elbow_offset_s3[..., None] + rel_u[..., :3, 3:]
    return t_target, elbow[..., 0]


def calibrate_ee(calib: Calibration, t_trackers_n44: Array, t_robot_ee_s44: Array) -> Calibration:
    """Choose T_ee so the operator's current (neutral) pose maps exactly onto the robot's
    current end-effector poses: T_ee = (T_base · Scale_s(T_chest⁻¹ T_wrist))⁻¹ · T_robot_ee."""
    chest_inv = se3.inverse(t_trackers_n44[CHEST])
    rel = se3.scale_translation(chest_inv @ t_trackers_n44[jnp.asarray(WRIST)], calib.scale)
    t_ee = se3.inverse(calib.t_base_s44 @ rel) @ t_robot_ee_s44
    return calib._replace(t_ee_s44=t_ee)


def calibrate(calib: Calibration, t_trackers_n44: Array, t_robot_ee_s44: Array) -> Calibration:
    """Map the operator's current (neutral) pose exactly onto the robot's current end-effector
    poses by fitting, per arm, T_base's translation and T_ee's rotation; T_base keeps its
    rotation and T_ee its translation (the physical tracker → palm lever).

    Why not `calibrate_ee`: it puts the whole operator/robot position offset (tens of cm, since
    s·(chest → wrist) never lands on the robot's palm) into T_ee, a lever in the wrist frame,
    so every wrist rotation also swings the palm by that lever; here a wrist rotation turns the
    palm in place and only wrist translations move it."""
    chest_inv = se3.inverse(t_trackers_n44[CHEST])
    rel = se3.scale_translation(chest_inv @ t_trackers_n44[jnp.asarray(WRIST)], calib.scale)   # [2,4,4]
    r_base = calib.t_base_s44[..., :3, :3]
    r_wrist = r_base @ rel[..., :3, :3]                                   # wrist frame in robot axes
    r_ee = jnp.swapaxes(r_wrist, -1, -2) @ t_robot_ee_s44[..., :3, :3]
    p_ee = calib.t_ee_s44[..., :3, 3]
    p_base = (t_robot_ee_s44[..., :3, 3] - (r_base @ rel[..., :3, 3:])[..., 0]
              - (r_wrist @ p_ee[..., None])[..., 0])
    return calib._replace(t_base_s44=se3.make_pose(r_base, p_base), t_ee_s44=se3.make_pose(r_ee, p_ee))


def trackers_from_targets(calib: Calibration, t_target_s44: Array, elbow_s3: Array,
                          t_chest_44: Array | None = None) -> Array:
    """Inverse of `arm_targets` (synthetic operator streams for tests, benchmarks and demos):
    robot EE targets and elbow points → five tracker poses [5,4,4] (upper-arm trackers get the
    chest's rotation)."""
    dt = t_target_s44.dtype
    chest = jnp.eye(4, dtype=dt) if t_chest_44 is None else t_chest_44
    rel = se3.inverse(calib.t_base_s44) @ t_target_s44 @ se3.inverse(calib.t_ee_s44)
    wrist = chest @ se3.scale_translation(rel, 1.0 / calib.scale)
    base_inv = se3.inverse(calib.t_base_s44)
    elbow_rel = (base_inv[..., :3, :3] @ elbow_s3[..., None] + base_inv[..., :3, 3:])[..., 0]
    rot = jnp.broadcast_to(chest[:3, :3], (2, 3, 3))
    # Tracker origin sits so that origin + R·offset lands on the (unscaled) elbow point.
    pos = (chest[:3, :3] @ (elbow_rel / calib.scale)[..., None])[..., 0] + chest[:3, 3] \
        - (rot @ calib.elbow_offset_s3[..., None])[..., 0] / calib.scale
    upper = se3.make_pose(rot, pos)
    return jnp.stack([chest, upper[0], wrist[0], upper[1], wrist[1]])
