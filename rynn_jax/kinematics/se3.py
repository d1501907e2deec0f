"""Small SO(3)/SE(3) toolkit on plain arrays (rotation matrices, wxyz quaternions, 4x4 poses).

Why our own instead of jaxlie: IK and retargeting need the log map to be finite *and* have
finite gradients at θ = 0 and θ = π, and we want plain arrays that vmap over any batch shape.
Tests check every function against jaxlie (when installed) and against MuJoCo's quaternion code.
All functions broadcast over leading axes and keep the input dtype.
"""

from __future__ import annotations

import jax.numpy as jnp

Array = jnp.ndarray


def skew(v_3: Array) -> Array:
    """[..., 3] → [..., 3, 3] with skew(a) @ b == cross(a, b)."""
    x, y, z = v_3[..., 0], v_3[..., 1], v_3[..., 2]
    o = jnp.zeros_like(x)
    return jnp.stack([
        jnp.stack([o, -z, y], -1),
        jnp.stack([z, o, -x], -1),
        jnp.stack([-y, x, o], -1)], -2)


def vee(m_33: Array) -> Array:
    """Inverse of `skew` on the antisymmetric part."""
    return 0.5 * jnp.stack([m_33[..., 2, 1] - m_33[..., 1, 2],
                            m_33[..., 0, 2] - m_33[..., 2, 0],
                            m_33[..., 1, 0] - m_33[..., 0, 1]], -1)


def axis_angle_to_matrix(axis_3: Array, angle: Array) -> Array:
    """Rodrigues for a *unit* axis: I + sin θ K + (1 - cos θ) K²."""
    k = skew(axis_3)
    s, c = jnp.sin(angle)[..., None, None], jnp.cos(angle)[..., None, None]
    eye = jnp.eye(3, dtype=k.dtype)
    return eye + s * k + (1.0 - c) * (k @ k)


def _safe_norm(v: Array, eps: float) -> tuple[Array, Array]:
    """(‖v‖, is_small); the norm's gradient stays finite at v = 0 (double-where trick)."""
    sq = jnp.sum(v * v, axis=-1)
    small = sq < eps * eps
    return jnp.sqrt(jnp.where(small, 1.0, sq)), small


def exp_so3(w_3: Array) -> Array:
    """Rotation vector → matrix, smooth through θ = 0."""
    theta, small = _safe_norm(w_3, 1e-6)
    k = skew(w_3)
    th2 = theta * theta
    # Taylor at small θ: sinθ/θ ≈ 1 - θ²/6, (1 - cosθ)/θ² ≈ 1/2 - θ²/24.
    sq = jnp.sum(w_3 * w_3, -1)
    a = jnp.where(small, 1.0 - sq / 6.0, jnp.sin(theta) / theta)
    b = jnp.where(small, 0.5 - sq / 24.0, (1.0 - jnp.cos(theta)) / th2)
    eye = jnp.eye(3, dtype=w_3.dtype)
    return eye + a[..., None, None] * k + b[..., None, None] * (k @ k)


def matrix_to_quat(r_33: Array) -> Array:
    """Rotation matrix → unit quaternion wxyz with w ≥ 0 (Shepperd's method, branch-free).

    All four candidate formulas are evaluated with clamped square-root arguments so the
    branch that is not taken can never inject NaN into values or gradients.
    """
    m00, m11, m22 = r_33[..., 0, 0], r_33[..., 1, 1], r_33[..., 2, 2]
    tr = m00 + m11 + m22
    tiny = jnp.asarray(1e-12, r_33.dtype)
    # Candidate 0: w largest.
    s0 = 2.0 * jnp.sqrt(jnp.maximum(1.0 + tr, tiny))
    q0 = jnp.stack([0.25 * s0, (r_33[..., 2, 1] - r_33[..., 1, 2]) / s0,
                    (r_33[..., 0, 2] - r_33[..., 2, 0]) / s0,
                    (r_33[..., 1, 0] - r_33[..., 0, 1]) / s0], -1)
    s1 = 2.0 * jnp.sqrt(jnp.maximum(1.0 + m00 - m11 - m22, tiny))
    q1 = jnp.stack([(r_33[..., 2, 1] - r_33[..., 1, 2]) / s1, 0.25 * s1,
                    (r_33[..., 0, 1] + r_33[..., 1, 0]) / s1,
                    (r_33[..., 0, 2] + r_33[..., 2, 0]) / s1], -1)
    s2 = 2.0 * jnp.sqrt(jnp.maximum(1.0 - m00 + m11 - m22, tiny))
    q2 = jnp.stack([(r_33[..., 0, 2] - r_33[..., 2, 0]) / s2,
                    (r_33[..., 0, 1] + r_33[..., 1, 0]) / s2, 0.25 * s2,
                    (r_33[..., 1, 2] + r_33[..., 2, 1]) / s2], -1)
    s3 = 2.0 * jnp.sqrt(jnp.maximum(1.0 - m00 - m11 + m22, tiny))
    q3 = jnp.stack([(r_33[..., 1, 0] - r_33[..., 0, 1]) / s3,
                    (r_33[..., 0, 2] + r_33[..., 2, 0]) / s3,
                    (r_33[..., 1, 2] + r_33[..., 2, 1]) / s3, 0.25 * s3], -1)
    pick = jnp.argmax(jnp.stack([tr, m00, m11, m22], -1), axis=-1)[..., None]
    q = jnp.where(pick == 0, q0, jnp.where(pick == 1, q1, jnp.where(pick == 2, q2, q3)))
    q = q * jnp.where(q[..., :1] < 0, -1.0, 1.0)
    return q / jnp.linalg.norm(q, axis=-1, keepdims=True)


def quat_to_matrix(q_4: Array) -> Array:
    """wxyz quaternion (normalised here) → rotation matrix."""
    q = q_4 / jnp.linalg.norm(q_4, axis=-1, keepdims=True)
    w, x, y, z = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    return jnp.stack([
        jnp.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
        jnp.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
        jnp.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1)], -2)


def log_so3(r_33: Array) -> Array:
    """Rotation matrix → rotation vector (θ·axis, θ ∈ [0, π]); finite values and gradients
    everywhere, through the quaternion: θ = 2·atan2(‖v‖, w)."""
    q = matrix_to_quat(r_33)
    w, v = q[..., 0], q[..., 1:]
    n, small = _safe_norm(v, 1e-7)
    # 2 atan2(n, w) / n → 2 / w as n → 0 (w → 1 there because w ≥ 0).
    scale = jnp.where(small, 2.0 / jnp.maximum(w, 0.5), 2.0 * jnp.arctan2(n, w) / n)
    return scale[..., None] * v


def rotation_angle(r_33: Array) -> Array:
    """Geodesic angle of a rotation (radians)."""
    return jnp.linalg.norm(log_so3(r_33), axis=-1)


def make_pose(rot_33: Array, pos_3: Array) -> Array:
    """(R, p) → 4x4 homogeneous pose."""
    top = jnp.concatenate([rot_33, pos_3[..., :, None]], axis=-1)
    bottom = jnp.broadcast_to(jnp.asarray([0, 0, 0, 1], rot_33.dtype), top.shape[:-2] + (1, 4))
    return jnp.concatenate([top, bottom], axis=-2)


def pose_from_pos_quat(pq_7: Array) -> Array:
    """[x, y, z, qw, qx, qy, qz] → 4x4 pose."""
    return make_pose(quat_to_matrix(pq_7[..., 3:]), pq_7[..., :3])


def pos_quat_from_pose(t_44: Array) -> Array:
    """4x4 pose → [x, y, z, qw, qx, qy, qz] (w ≥ 0)."""
    return jnp.concatenate([t_44[..., :3, 3], matrix_to_quat(t_44[..., :3, :3])], axis=-1)


def inverse(t_44: Array) -> Array:
    """Inverse of a rigid transform without a general matrix inverse."""
    r_t = jnp.swapaxes(t_44[..., :3, :3], -1, -2)
    return make_pose(r_t, -(r_t @ t_44[..., :3, 3:])[..., 0])


def scale_translation(t_44: Array, s: Array | float) -> Array:
    """Scale_s(T): scale the translation of T by s, keep its rotation."""
    return make_pose(t_44[..., :3, :3], s * t_44[..., :3, 3])


def pose_error(t_target_44: Array, t_current_44: Array) -> Array:
    """6-D task error [p_t - p, log(R_t Rᵀ)], both in the world frame (geometric-Jacobian
    convention: linear part at the point, angular part as a world rotation vector)."""
    dp = t_target_44[..., :3, 3] - t_current_44[..., :3, 3]
    dr = log_so3(t_target_44[..., :3, :3] @ jnp.swapaxes(t_current_44[..., :3, :3], -1, -2))
    return jnp.concatenate([dp, dr], axis=-1)


def project_to_so3(m_33: Array) -> Array:
    """Nearest rotation matrix (polar decomposition by SVD, det fixed to +1)."""
    u, _, vt = jnp.linalg.svd(m_33)
    d = jnp.sign(jnp.linalg.det(u @ vt))
    u = u.at[..., :, -1].multiply(d[..., None])
    return u @ vt


def orthonormality_error(m_33: Array) -> Array:
    """max |RᵀR − I| plus |det R − 1|: 0 for a rotation."""
    eye = jnp.eye(3, dtype=m_33.dtype)
    rtr = jnp.swapaxes(m_33, -1, -2) @ m_33
    return jnp.max(jnp.abs(rtr - eye), axis=(-1, -2)) + jnp.abs(jnp.linalg.det(m_33) - 1.0)
