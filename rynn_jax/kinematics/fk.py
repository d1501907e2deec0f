"""Forward kinematics and Jacobians in JAX (jit / vmap / grad; float32 or float64).

`tree_fk` reproduces `mujoco.mj_kinematics` for every body and site of the model; `chain_fk`
is the lean serial-chain version that IK and retargeting run in their inner loops. Constants
are cast to the dtype of `q`, so a float64 `q` (under x64) gives float64 kinematics.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rynn_jax.kinematics import se3
from rynn_jax.kinematics.mjcf_model import Chain, KinematicTree

Array = jnp.ndarray


def tree_fk(tree: KinematicTree, qpos: Array) -> tuple[Array, Array, Array, Array]:
    """Whole-model FK. qpos [nq] → (body_pos [B,3], body_rot [B,3,3], site_pos [S,3], site_rot [S,3,3]).

    Bodies are processed one tree depth at a time (a batched gather + matmul per level), which
    keeps the traced graph small: ~15 levels instead of one op chain per body.
    """
    dt = qpos.dtype
    c = lambda x: jnp.asarray(x, dt)
    n_body = len(tree.parent_b)
    max_j = max(1, max(len(j) for j in tree.joints_b))
    # Joint slots per body, padded with "no joint" (angle 0, any axis).
    jid = np.full((n_body, max_j), -1)
    for b, js in enumerate(tree.joints_b):
        jid[b, :len(js)] = js
    has = jid >= 0
    axis_bk3 = np.where(has[..., None], tree.jnt_axis_j3[np.maximum(jid, 0)], [0.0, 0.0, 1.0])
    anchor_bk3 = np.where(has[..., None], tree.jnt_pos_j3[np.maximum(jid, 0)], 0.0)
    angle_bk = jnp.where(has, qpos[tree.jnt_qpos_j[np.maximum(jid, 0)]], 0.0)

    pos = jnp.zeros((n_body, 3), dt)
    rot = jnp.broadcast_to(jnp.eye(3, dtype=dt), (n_body, 3, 3))
    for idx in _levels(tree):
        par = tree.parent_b[idx]
        p = pos[par] + jnp.einsum("bij,bj->bi", rot[par], c(tree.pos_b3[idx]))
        r = rot[par] @ c(tree.rot_b33[idx])
        for k in range(max_j):
            # MuJoCo rotates about the joint anchor: keep the anchor fixed in the world.
            a = c(anchor_bk3[idx, k])
            anchor = p + jnp.einsum("bij,bj->bi", r, a)
            r = r @ se3.axis_angle_to_matrix(c(axis_bk3[idx, k]), angle_bk[idx, k])
            p = anchor - jnp.einsum("bij,bj->bi", r, a)
        pos = pos.at[idx].set(p)
        rot = rot.at[idx].set(r)
    sb = tree.site_body_s
    site_pos = pos[sb] + jnp.einsum("sij,sj->si", rot[sb], c(tree.site_pos_s3))
    site_rot = rot[sb] @ c(tree.site_rot_s33)
    return pos, rot, site_pos, site_rot


def _levels(tree: KinematicTree) -> list[np.ndarray]:
    """Body indices grouped by depth below the world (world itself excluded)."""
    depth = np.zeros(len(tree.parent_b), int)
    for b in range(1, len(tree.parent_b)):
        depth[b] = depth[tree.parent_b[b]] + 1
    return [np.flatnonzero(depth == d) for d in range(1, depth.max() + 1)]


class ChainFrames(NamedTuple):
    """Output of `chain_fk`, all in the chain's base frame."""
    anchor_n3: Array    # joint k origin (= its anchor)
    axis_n3: Array      # joint k axis, base-frame unit vector
    tip_44: Array       # tip site pose


def chain_fk(chain: Chain, q_n: Array) -> ChainFrames:
    """Serial-chain FK. Python loop over the (static, ≤ 7) joints; vmap for stacked chains.

    Link k's rotation is R_k = R_{k-1} F_k Rot(a_k, q_k) with F_k Rot(a, q) = cos q F + sin q F[a]×
    + (1 − cos q) F a aᵀ (Rodrigues), so the chain-only products F[a]×, F a aᵀ, F a are formed
    once (at trace time for a constant chain) and each joint costs two small matmuls: the
    real-time IK is bound by the number of kernels, not by flops."""
    dt = q_n.dtype
    with jax.ensure_compile_time_eval():
        f_n33 = chain.rot_fixed_n33.astype(dt)
        a_n3 = chain.axis_n3.astype(dt)
        f_skew = f_n33 @ se3.skew(a_n3)
        f_aat = f_n33 @ (a_n3[:, :, None] * a_n3[:, None, :])
        lever_n32 = jnp.stack([chain.pos_fixed_n3.astype(dt), (f_n33 @ a_n3[:, :, None])[..., 0]], axis=-1)
        tip_34 = jnp.concatenate([chain.rot_tip_33.astype(dt), chain.pos_tip_3.astype(dt)[:, None]], axis=-1)
    c, s = jnp.cos(q_n)[:, None, None], jnp.sin(q_n)[:, None, None]
    joint_n33 = c * f_n33 + s * f_skew + (1.0 - c) * f_aat                # F_k Rot(a_k, q_k)
    r = jnp.eye(3, dtype=dt)
    p = jnp.zeros(3, dtype=dt)
    anchors, axes = [], []
    for k in range(q_n.shape[-1]):
        pa = r @ lever_n32[k]                                               # [origin offset, axis]
        p = p + pa[:, 0]
        anchors.append(p)
        axes.append(pa[:, 1])
        r = r @ joint_n33[k]
    tip = r @ tip_34
    return ChainFrames(jnp.stack(anchors), jnp.stack(axes), se3.make_pose(tip[:, :3], p + tip[:, 3]))


def chain_tip(chain: Chain, q_n: Array) -> Array:
    """Tip pose [4,4] only."""
    return chain_fk(chain, q_n).tip_44


def geometric_jacobian(frames: ChainFrames, point_3: Array | None = None) -> Array:
    """Analytic 6×n geometric Jacobian of a point on the last link (default: the tip) in the
    base frame: rows [v; ω], column k = [z_k × (p − a_k); z_k]."""
    p = frames.tip_44[:3, 3] if point_3 is None else point_3
    z = frames.axis_n3
    jv = jnp.cross(z, p[None, :] - frames.anchor_n3)
    return jnp.concatenate([jv.T, z.T], axis=0)


def point_jacobian(frames: ChainFrames, point_3: Array, n_joints: int) -> Array:
    """3×n_joints linear Jacobian of a point carried by link `n_joints - 1` (e.g. the elbow)."""
    z = frames.axis_n3[:n_joints]
    return jnp.cross(z, point_3[None, :] - frames.anchor_n3[:n_joints]).T


def autodiff_jacobian(chain: Chain, q_n: Array) -> Array:
    """6×n Jacobian of the tip by forward-mode autodiff: linear rows = ∂p/∂q, angular rows =
    vee(∂R/∂q_k Rᵀ). Equals `geometric_jacobian` (tested); kept as the reference."""
    tip = lambda q: chain_tip(chain, q)
    t = tip(q_n)
    dt_44n = jax.jacfwd(tip)(q_n)                      # [4, 4, n]
    jv = dt_44n[:3, 3, :]
    jw = jax.vmap(lambda d: se3.vee(d @ t[:3, :3].T), in_axes=2, out_axes=1)(dt_44n[:3, :3, :])
    return jnp.concatenate([jv, jw], axis=0)
