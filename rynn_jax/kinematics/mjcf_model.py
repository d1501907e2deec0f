"""Read the embodiment MJCF through `mujoco` into static numpy tables for the JAX kinematics.

Two views of the same model:
* `KinematicTree`: every body (parent index, local pose, hinge joints) and every site, for
  whole-robot FK that must match `mujoco.mj_kinematics`.
* `Chain`: a serial chain from a base frame to one site, with fixed transforms folded, as
  stacked arrays. Left/right arms (7 joints) or the five fingers (4 joints) stack into one
  `Chain` with a leading axis, so IK and retargeting `vmap` over them.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import NamedTuple

import mujoco
import numpy as np

from rynn_jax.kinematics import layout

ASSET_DIR = Path(__file__).resolve().parent / "assets"
DEFAULT_MJCF = ASSET_DIR / "rynn_bimanual.xml"


def _quat_to_mat(q_4: np.ndarray) -> np.ndarray:
    m = np.zeros(9)
    mujoco.mju_quat2Mat(m, np.asarray(q_4, np.float64))
    return m.reshape(3, 3)


@functools.lru_cache(maxsize=4)
def load_model(path: str | None = None) -> mujoco.MjModel:
    """Compile the MJCF (cached). Default: the bundled bimanual embodiment."""
    return mujoco.MjModel.from_xml_path(str(path or DEFAULT_MJCF))


@dataclasses.dataclass(frozen=True)
class KinematicTree:
    """Whole-model kinematics tables (numpy, float64). Bodies are in MuJoCo order (parents first).

    A body with several hinges applies them in order, each about its own anchor, as MuJoCo does.
    """
    parent_b: np.ndarray        # [B] parent body index (world's parent is -1)
    pos_b3: np.ndarray          # [B, 3] body offset in parent frame
    rot_b33: np.ndarray         # [B, 3, 3] body orientation in parent frame
    joints_b: tuple[tuple[int, ...], ...]  # hinge joint ids per body
    jnt_axis_j3: np.ndarray     # [J, 3] unit axis in body frame
    jnt_pos_j3: np.ndarray      # [J, 3] anchor in body frame
    jnt_qpos_j: np.ndarray      # [J] qpos address
    site_body_s: np.ndarray     # [S] body of each site
    site_pos_s3: np.ndarray     # [S, 3]
    site_rot_s33: np.ndarray    # [S, 3, 3]
    body_names: tuple[str, ...]
    site_names: tuple[str, ...]
    joint_names: tuple[str, ...]
    lower_q: np.ndarray         # [nq] joint lower limits
    upper_q: np.ndarray         # [nq]

    def site_id(self, name: str) -> int:
        return self.site_names.index(name)


def kinematic_tree(model: mujoco.MjModel | None = None) -> KinematicTree:
    m = model if model is not None else load_model()
    if np.any(m.jnt_type != mujoco.mjtJoint.mjJNT_HINGE):
        raise ValueError("only hinge joints are supported by the JAX kinematics")
    joints_b = tuple(tuple(int(j) for j in range(m.body_jntadr[b], m.body_jntadr[b] + m.body_jntnum[b]))
                     if m.body_jntnum[b] > 0 else () for b in range(m.nbody))
    lower = np.full(m.nq, -np.inf)
    upper = np.full(m.nq, np.inf)
    for j in range(m.njnt):
        if m.jnt_limited[j]:
            lower[m.jnt_qposadr[j]], upper[m.jnt_qposadr[j]] = m.jnt_range[j]
    return KinematicTree(
        parent_b=np.where(np.arange(m.nbody) == 0, -1, m.body_parentid).astype(np.int64),
        pos_b3=m.body_pos.copy(),
        rot_b33=np.stack([_quat_to_mat(q) for q in m.body_quat]),
        joints_b=joints_b,
        jnt_axis_j3=m.jnt_axis.copy(),
        jnt_pos_j3=m.jnt_pos.copy(),
        jnt_qpos_j=m.jnt_qposadr.copy(),
        site_body_s=m.site_bodyid.copy(),
        site_pos_s3=m.site_pos.copy(),
        site_rot_s33=np.stack([_quat_to_mat(q) for q in m.site_quat]) if m.nsite else np.zeros((0, 3, 3)),
        body_names=tuple(m.body(i).name for i in range(m.nbody)),
        site_names=tuple(m.site(i).name for i in range(m.nsite)),
        joint_names=tuple(m.joint(i).name for i in range(m.njnt)),
        lower_q=lower, upper_q=upper)


class Chain(NamedTuple):
    """Serial chain of n hinges from a base frame to a tip site (a JAX pytree of arrays).

    Frame k (k = 0..n-1) = frame k-1 · (rot_fixed[k], pos_fixed[k]) · Rot(axis[k], q[k]);
    frame -1 is the chain base; tip = frame n-1 · (rot_tip, pos_tip). Joint anchors are the
    frame origins (hinges with a non-zero anchor are rejected at extraction).
    Extra leading axes stack several chains (arms: [2, ...], fingers: [5, ...]).
    """
    rot_fixed_n33: np.ndarray
    pos_fixed_n3: np.ndarray
    axis_n3: np.ndarray
    lower_n: np.ndarray
    upper_n: np.ndarray
    rot_tip_33: np.ndarray
    pos_tip_3: np.ndarray


def _body_local(tree: KinematicTree, b: int) -> np.ndarray:
    t = np.eye(4)
    t[:3, :3], t[:3, 3] = tree.rot_b33[b], tree.pos_b3[b]
    return t


def chain_to_site(tree: KinematicTree, site: str, base_body: str = "world") -> tuple[Chain, tuple[int, ...]]:
    """Serial chain from `base_body`'s frame to `site`. Returns (chain, qpos indices)."""
    s = tree.site_id(site)
    base = tree.body_names.index(base_body)
    path = []
    b = int(tree.site_body_s[s])
    while b != base:
        if b <= 0:
            raise ValueError(f"site {site!r} is not below body {base_body!r}")
        path.append(b)
        b = int(tree.parent_b[b])
    path.reverse()
    pending = np.eye(4)  # fixed transform accumulated since the last joint frame
    rots, poss, axes, qidx = [], [], [], []
    for b in path:
        pending = pending @ _body_local(tree, b)
        for j in tree.joints_b[b]:
            if np.linalg.norm(tree.jnt_pos_j3[j]) > 1e-12:
                raise ValueError(f"joint {tree.joint_names[j]!r} has a non-zero anchor")
            rots.append(pending[:3, :3].copy())
            poss.append(pending[:3, 3].copy())
            axes.append(tree.jnt_axis_j3[j] / np.linalg.norm(tree.jnt_axis_j3[j]))
            qidx.append(int(tree.jnt_qpos_j[j]))
            pending = np.eye(4)
    tip = np.eye(4)
    tip[:3, :3], tip[:3, 3] = tree.site_rot_s33[s], tree.site_pos_s3[s]
    pending = pending @ tip
    qidx_t = tuple(qidx)
    chain = Chain(np.stack(rots), np.stack(poss), np.stack(axes),
                  tree.lower_q[list(qidx_t)], tree.upper_q[list(qidx_t)],
                  pending[:3, :3].copy(), pending[:3, 3].copy())
    return chain, qidx_t


def stack_chains(chains: list[Chain]) -> Chain:
    return Chain(*[np.stack(parts) for parts in zip(*chains)])


@dataclasses.dataclass(frozen=True)
class Embodiment:
    """Everything the teleop kinematics needs from the MJCF, extracted once."""
    tree: KinematicTree
    arms: Chain            # [2, 7]: world → {side}_ee
    fingers: Chain         # [2, 5, 4]: {side}_palm → {side}_finger{f}_tip
    home_q: np.ndarray     # [54] a comfortable start pose (arms bent, hands open)


# q_right = MIRROR_SIGNS · q_left puts the right arm in the mirror image (y → −y) of the left
# one (every link frame; tested), from the two URDF chains' axis conventions.
MIRROR_SIGNS = np.array([-1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0])

# Arms bent forward at the elbow, hands in front of the chest, fingers open. Chosen by us; the
# right arm mirrors the left (an unmirrored right home pointed that palm sideways, and operator
# motion calibrated onto it drove the right IK into its joint-1/3 limits).
_HOME_LEFT = np.array([0.0, -0.4, -0.3, -1.6, 0.0, 0.0, 0.0])
HOME_ARM_Q = {"left": _HOME_LEFT, "right": MIRROR_SIGNS * _HOME_LEFT}


@functools.lru_cache(maxsize=4)
def embodiment(path: str | None = None) -> Embodiment:
    tree = kinematic_tree(load_model(path))
    arms, fingers_by_side = [], []
    for side in layout.SIDES:
        arm, qidx = chain_to_site(tree, f"{side}_ee")
        if qidx != tuple(range(layout.ARM_SLICES[side].start, layout.ARM_SLICES[side].stop)):
            raise ValueError(f"{side} arm joints are not at the layout's action indices: {qidx}")
        arms.append(arm)
        fingers = []
        for f in range(1, 6):
            ch, qidx = chain_to_site(tree, f"{side}_finger{f}_tip", base_body=f"{side}_palm")
            start = layout.HAND_SLICES[side].start + 4 * (f - 1)
            if qidx != tuple(range(start, start + 4)):
                raise ValueError(f"{side} finger{f} joints are not at the layout's indices: {qidx}")
            fingers.append(ch)
        fingers_by_side.append(stack_chains(fingers))
    home = np.zeros(layout.ACTION_DIM)
    for side in layout.SIDES:
        home[layout.ARM_SLICES[side]] = HOME_ARM_Q[side]
    home = np.clip(home, tree.lower_q, tree.upper_q)
    return Embodiment(tree=tree, arms=stack_chains(arms), fingers=stack_chains(fingers_by_side),
                      home_q=home)
