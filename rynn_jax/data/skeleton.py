"""Hand skeleton geometry: ARKit → MediaPipe-21 names, world → camera, projection, 2D/depth skeleton.

MediaPipe order (as in `rynn_jax.render`): 0 wrist; thumb 1-4 (CMC, MCP, IP, tip); index 5-8,
middle 9-12, ring 13-16, little 17-20 (MCP, PIP, DIP, tip); our point 21 is the elbow.

ARKit hand joints as EgoDex stores them (facts from apple/ml-egodex's joint list): the wrist is
`<side>Hand`; fingers have Metacarpal, Knuckle, IntermediateBase, IntermediateTip, Tip; the thumb
has no Metacarpal (Knuckle, IntermediateBase, IntermediateTip, Tip). MediaPipe's thumb CMC/MCP/IP/
tip therefore are the thumb's Knuckle/IntermediateBase/IntermediateTip/Tip, and each other
finger's MCP/PIP/DIP/tip its Knuckle/IntermediateBase/IntermediateTip/Tip (metacarpals unused).
The elbow is `<side>Forearm` (the ARKit forearm joint sits at the elbow).
"""

from __future__ import annotations

import numpy as np

from rynn_jax.data.errors import DataError

SIDES = ("left", "right")
NUM_JOINTS = 21
NUM_POINTS = 22  # 21 joints + elbow
ELBOW = 21
_FINGERS = ("Thumb", "IndexFinger", "MiddleFinger", "RingFinger", "LittleFinger")
_SEGMENTS = ("Knuckle", "IntermediateBase", "IntermediateTip", "Tip")

# OpenCV camera axes from ARKit camera axes (x right, y up, z towards the viewer).
ARKIT_TO_OPENCV = np.diag([1.0, -1.0, -1.0])


def arkit_hand_joints(side: str) -> tuple[str, ...]:
    """The 21 ARKit joint names of one hand in MediaPipe order."""
    return (f"{side}Hand",) + tuple(f"{side}{f}{s}" for f in _FINGERS for s in _SEGMENTS)


def arkit_elbow(side: str) -> str:
    return f"{side}Forearm"


def to_camera(points_w_n3: np.ndarray, cam_pose_44: np.ndarray) -> np.ndarray:
    """World points (..., N, 3) → camera frame, given the camera pose (camera → world) (..., 4, 4)."""
    R = cam_pose_44[..., :3, :3]
    t = cam_pose_44[..., :3, 3]
    # p_c = Rᵀ (p_w − t)
    return np.einsum("...ji,...nj->...ni", R, points_w_n3 - t[..., None, :])


def apply_pose(points_n3: np.ndarray, pose_44: np.ndarray) -> np.ndarray:
    """x' = R x + t for a (..., 4, 4) pose and (..., N, 3) points."""
    return np.einsum("...ij,...nj->...ni", pose_44[..., :3, :3], points_n3) + pose_44[..., None, :3, 3]


def project(K_33: np.ndarray, points_n3: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pinhole projection (u, v) = (fx x/z + s y/z + cx, fy y/z + cy); returns (uv (..., 2), z)."""
    z = points_n3[..., 2]
    safe = np.where(np.abs(z) > 1e-9, z, 1.0)
    x, y = points_n3[..., 0] / safe, points_n3[..., 1] / safe
    u = K_33[0, 0] * x + K_33[0, 1] * y + K_33[0, 2]
    v = K_33[1, 1] * y + K_33[1, 2]
    return np.stack([u, v], -1), z


def finish_skeleton(path: str, joints_cam: np.ndarray, elbows_cam: np.ndarray, valid: np.ndarray,
                    K_33: np.ndarray, min_valid_fraction: float = 0.0) -> dict[str, np.ndarray]:
    """Check, zero the untracked, and add the 2D/depth skeleton.

    joints_cam (T, 2, 21, 3), elbows_cam (T, 2, 3), valid (T, 2, 22) bool, K (3, 3) of the output
    frames. Non-finite coordinates on a *tracked* point are bad data (DataError "nan joints");
    on an untracked point they are expected and zeroed.
    """
    points = np.concatenate([joints_cam, elbows_cam[:, :, None, :]], axis=2).astype(np.float64)
    valid = np.asarray(valid, bool)
    finite = np.isfinite(points).all(-1)
    if (valid & ~finite).any():
        t = int(np.argwhere(valid & ~finite)[0, 0])
        raise DataError(path, "nan joints", f"tracked joint is not finite at clip frame {t}")
    if not np.isfinite(K_33).all():
        raise DataError(path, "nan intrinsics")
    hand_tracked = valid[..., :NUM_JOINTS].any(-1)  # (T, 2)
    if hand_tracked.mean() < min_valid_fraction:
        raise DataError(path, "too few tracked hands",
                        f"{hand_tracked.mean():.2f} < {min_valid_fraction:.2f}")
    points = np.where(valid[..., None], points, 0.0)
    uv, z = project(K_33.astype(np.float64), points)
    uv = np.where(valid[..., None], uv, 0.0)
    z = np.where(valid, z, 0.0)
    return {
        "joints_cam": points[:, :, :NUM_JOINTS].astype(np.float32),
        "elbows_cam": points[:, :, ELBOW].astype(np.float32),
        "valid": valid,
        "uv": uv.astype(np.float32),
        "depth": z.astype(np.float32),
        "intrinsics": np.asarray(K_33, np.float32),
    }
