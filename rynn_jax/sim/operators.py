"""Scripted operators: task-level motion primitives → a recorded operator stream.

The script plans in robot space (palm poses of both hands + a grip level per hand), like an
operator watching the robot would; the stream it writes is what a human's trackers and gloves
would have recorded, so the whole teleop path (stream → resample → tracker chain → IK and hand
retargeting → 54-D actions) runs on it unchanged:

  segments (primitive, duration) ─ human timing ─▶ palm poses [T,2,4,4], grips [T,2] at 120 Hz
      ─ tremor ─▶ `tracker.trackers_from_targets` (inverse chain, random chest pose) ─▶ 5 trackers
      grips ─ hand FK of the robot hand at the blended joint pose, operator hand size, noise ─▶ 2×21 keypoints

Human-like timing: every segment's duration is scaled by a log-normal factor (σ = 0.15), the
second arm reacts with a random delay, motions follow minimum-jerk profiles, and a smooth
band-limited tremor (≈2 mm, 1–4 Hz) plus white tracker noise (0.3 mm) rides on top. Tracker
timestamps run at 120 Hz with jitter, the glove at 90 Hz on its own clock.

Frames: palm frame = the IK end-effector (`{side}_ee`) = the retargeter's palm axes: z toward
the fingers, fingers curl toward +x, thumb toward −y (left) / +y (right). The first sample is
the robot's home pose, which is what `retarget` calibrates T_ee against.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

from rynn_jax.kinematics import fk, hand_retarget, ik, mjcf_model, retarget, se3, streams, tracker
from rynn_jax.sim import scenes

TRACKER_HZ, GLOVE_HZ = 120.0, 90.0
# Palm-frame grasp geometry (metres): the palm face is at x = +0.008, fingers start at z ≈ 0.09.
PALM_FACE, PALM_BACK, GRASP_Z = 0.008, 0.016, 0.08
# Hand joint poses the grip level blends (finger{1..5}_joint{1..4}; thumb first).
Q_OPEN = np.array([0.1, 0.1, 0.1, 0.1] + [0.1, 0.0, 0.1, 0.1] * 4)
Q_CLOSED = np.array([1.2, 0.6, 0.6, 0.6] + [1.3, 0.0, 1.2, 1.0] * 4)
FLEX = np.array([4 * f + k for f in range(1, 5) for k in (0, 2, 3)])   # flexion joints of fingers 2-5


@dataclasses.dataclass(frozen=True)
class Segment:
    """Both hands move to their targets over `duration` seconds (None = hold the last pose)."""
    duration: float
    left: np.ndarray | None = None     # 4×4 palm pose target (robot world frame)
    right: np.ndarray | None = None
    grip: tuple[float | None, float | None] = (None, None)   # 0 open … 1 closed; None = hold
    name: str = ""


def closure(hand_q_20: np.ndarray) -> np.ndarray:
    """How closed a hand is, from its 20 joints: 0 at Q_OPEN, 1 at Q_CLOSED (flexion joints)."""
    q = np.asarray(hand_q_20)[..., FLEX]
    return (q.mean(-1) - Q_OPEN[FLEX].mean()) / (Q_CLOSED[FLEX].mean() - Q_OPEN[FLEX].mean())


# --------------------------------------------------------------------------------------------------
# Palm orientations and poses (robot world frame: x forward, y left, z up)
# --------------------------------------------------------------------------------------------------


def _rz(yaw: float) -> np.ndarray:
    c, s = np.cos(yaw), np.sin(yaw)
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1.0]])


def palm_rotation(facing: np.ndarray, fingers: np.ndarray) -> np.ndarray:
    """Palm axes from where the palm faces (+x, the side fingers curl to) and where the fingers point (+z)."""
    x = facing / np.linalg.norm(facing)
    z = fingers - x * (fingers @ x)
    z /= np.linalg.norm(z)
    return np.stack([x, np.cross(z, x), z], axis=1)


def pose(rot: np.ndarray, pos) -> np.ndarray:
    t = np.eye(4)
    t[:3, :3], t[:3, 3] = rot, pos
    return t


def top_grasp(point_top, yaw: float, clearance: float = 0.006) -> np.ndarray:
    """Palm down over `point_top` (top centre of an object), fingers forward rotated by yaw;
    the fingers' middle (palm z = GRASP_Z) is above the point, the palm face `clearance` above it."""
    rot = palm_rotation(np.array([0, 0, -1.0]), _rz(yaw) @ np.array([1.0, 0, 0]))
    p = np.asarray(point_top, float) - rot[:, 2] * GRASP_Z + np.array([0, 0, PALM_FACE + clearance])
    return pose(rot, p)


def side_palm(facing_y: float, pos) -> np.ndarray:
    """Palm vertical, facing ±y (facing_y = ±1), fingers forward; `pos` is the palm origin."""
    return pose(palm_rotation(np.array([0, facing_y, 0.0]), np.array([1.0, 0, 0])), pos)


def shifted(t: np.ndarray, d) -> np.ndarray:
    out = t.copy()
    out[:3, 3] += np.asarray(d, float)
    return out


# --------------------------------------------------------------------------------------------------
# Task scripts
# --------------------------------------------------------------------------------------------------


def plan(scene: scenes.Scene, obj_pos: dict[str, np.ndarray], obj_yaw: dict[str, float],
         rng: np.random.Generator) -> list[Segment]:
    """The task's segments from the settled object poses (the operator looks at the scene)."""
    segments = [ready(rng)] + _task_segments(scene, obj_pos, obj_yaw, rng)
    return segments


def ready(rng: np.random.Generator) -> Segment:
    """Both hands raised in front of the body, palms down: every script starts here (from the
    robot's home pose, a direct path to some side-palm poses drives the right arm's IK into its
    joint-1 limit; through this pose it never does)."""
    jitter = rng.normal(0, 0.015, (2, 3))
    return Segment(0.6, top_grasp(np.array([0.42, 0.2, 0.93]) + jitter[0], -0.3),
                   top_grasp(np.array([0.42, -0.2, 0.93]) + jitter[1], 0.3), (0.1, 0.1), "ready")


def _task_segments(scene: scenes.Scene, obj_pos: dict[str, np.ndarray], obj_yaw: dict[str, float],
                   rng: np.random.Generator) -> list[Segment]:
    lay, z_table = scene.layout, scenes.TABLE_Z
    up = lambda h: np.array([0, 0, h])  # noqa: E731
    if scene.task == "dual_pick":
        grasps, places = {}, {}
        for side, name in (("left", "apple"), ("right", "banana")):
            o = scene.object(name)
            top = obj_pos[name] + up(o.half_height)
            yaw = obj_yaw[name] if name == "banana" else (-0.3 if side == "left" else 0.3) + rng.normal(0, 0.1)
            grasps[side] = top_grasp(top, yaw)
            dest = np.array([*lay["place_xy"][name], z_table + 2 * o.half_height + 0.006])
            places[side] = shifted(grasps[side], dest - top)
        return [
            Segment(1.1, shifted(grasps["left"], up(0.1)), shifted(grasps["right"], up(0.1)), (0.1, 0.1), "reach"),
            Segment(0.6, grasps["left"], grasps["right"], name="descend"),
            Segment(0.4, grip=(0.7, 0.7), name="grasp"),
            Segment(0.5, shifted(grasps["left"], up(0.12)), shifted(grasps["right"], up(0.12)), name="lift"),
            Segment(1.1, shifted(places["left"], up(0.1)), shifted(places["right"], up(0.1)), name="carry"),
            Segment(0.5, places["left"], places["right"], name="lower"),
            Segment(0.35, grip=(0.0, 0.0), name="release"),
            Segment(0.6, shifted(places["left"], up(0.12)), shifted(places["right"], up(0.12)), name="retreat"),
        ]
    if scene.task == "push_block":
        b, half = obj_pos["block"], scene.object("block").half_height
        z = z_table + 0.06
        x = b[0] - 0.045
        gap = 0.03
        l_start = side_palm(-1, [x, b[1] + half + PALM_FACE + gap, z])
        l_end = side_palm(-1, [x, lay["middle_y"] + half + PALM_FACE, z])
        r_start = side_palm(+1, [x, lay["middle_y"] + half + PALM_BACK + gap, z])
        r_end = side_palm(+1, [x, lay["goal_y"] + half + PALM_BACK, z])
        return [
            Segment(1.0, shifted(l_start, up(0.1)), grip=(0.15, 0.1), name="reach left"),
            Segment(0.5, l_start, name="descend left"),
            Segment(1.2, l_end, shifted(r_start, up(0.16)), name="push left"),
            Segment(0.5, shifted(l_end, [0, 0.06, 0.14]), grip=(None, 0.15), name="retreat left"),
            Segment(0.5, right=r_start, name="descend right"),
            Segment(1.3, right=r_end, name="push right"),
            Segment(0.5, right=shifted(r_end, [0, -0.03, 0.12]), name="retreat right"),
        ]
    if scene.task == "bimanual_lift":
        p, half = obj_pos["pillow"], np.asarray(lay["pillow_half"])
        x = p[0] - 0.05
        gap = 0.04
        l_grasp = side_palm(-1, [x, p[1] + half[1] + PALM_FACE + 0.002, p[2]])
        r_grasp = side_palm(+1, [x, p[1] - half[1] - PALM_FACE - 0.002, p[2]])
        tray = np.array([*lay["tray_xy"], lay["tray_base_z"] + half[2] + 0.006])
        d = tray - p
        return [
            Segment(1.2, shifted(l_grasp, [0, gap, 0.1]), shifted(r_grasp, [0, -gap, 0.1]), (0.1, 0.1), "reach"),
            Segment(0.6, shifted(l_grasp, [0, gap, 0]), shifted(r_grasp, [0, -gap, 0]), name="descend"),
            Segment(0.5, l_grasp, r_grasp, (0.6, 0.6), name="squeeze"),
            Segment(0.6, shifted(l_grasp, up(0.1)), shifted(r_grasp, up(0.1)), name="lift"),
            Segment(1.2, shifted(l_grasp, d + up(0.1)), shifted(r_grasp, d + up(0.1)), name="carry"),
            Segment(0.6, shifted(l_grasp, d), shifted(r_grasp, d), name="lower"),
            Segment(0.35, grip=(0.0, 0.0), name="release"),
            Segment(0.6, shifted(l_grasp, d + [0, gap, 0.1]), shifted(r_grasp, d + [0, -gap, 0.1]), name="retreat"),
        ]
    if scene.task == "lid_placement":
        lid, box = obj_pos["lid"], obj_pos["box"]
        lid_h = scene.object("lid").half_height
        box_half = np.asarray(lay["box_half"])
        top = lid + up(lid_h + 0.02)                             # the knob's top
        grasp = top_grasp(top, -0.3 + rng.normal(0, 0.1))
        dest_lid = np.array([box[0], box[1], box[2] + box_half[2] + lid_h + 0.004])
        place = shifted(grasp, dest_lid - lid)
        hold = side_palm(+1, [box[0] - 0.05, box[1] - box_half[1] - PALM_FACE - 0.01, box[2]])
        return [
            Segment(1.1, shifted(grasp, up(0.1)), shifted(hold, [0, -0.05, 0.1]), (0.1, 0.1), "reach"),
            Segment(0.6, grasp, shifted(hold, [0, -0.005, 0]), name="descend"),
            Segment(0.4, grip=(0.7, 0.3), name="grasp"),
            Segment(0.5, shifted(grasp, up(0.16)), name="lift"),
            Segment(1.2, shifted(place, up(0.08)), name="carry"),
            Segment(0.6, place, name="lower"),
            Segment(0.35, grip=(0.0, 0.1), name="release"),
            Segment(0.6, shifted(place, up(0.12)), shifted(hold, [0, -0.06, 0.08]), name="retreat"),
        ]
    raise ValueError(f"no operator script for task {scene.task!r}")


# --------------------------------------------------------------------------------------------------
# Timing, interpolation, noise
# --------------------------------------------------------------------------------------------------


def _min_jerk(u: np.ndarray) -> np.ndarray:
    u = np.clip(u, 0.0, 1.0)
    return u ** 3 * (10 - 15 * u + 6 * u * u)


def _mat2quat(r: np.ndarray) -> np.ndarray:
    q = np.zeros(4)
    mujoco.mju_mat2Quat(q, np.ascontiguousarray(r, np.float64).reshape(9))
    return q


def _quat2mat(q: np.ndarray) -> np.ndarray:
    m = np.zeros(9)
    mujoco.mju_quat2Mat(m, q / np.linalg.norm(q))
    return m.reshape(3, 3)


def _slerp(q0: np.ndarray, q1: np.ndarray, u: float) -> np.ndarray:
    if q0 @ q1 < 0:
        q1 = -q1
    dot = min(1.0, float(q0 @ q1))
    th = np.arccos(dot)
    if th < 1e-6:
        q = (1 - u) * q0 + u * q1
    else:
        q = (np.sin((1 - u) * th) * q0 + np.sin(u * th) * q1) / np.sin(th)
    return q / np.linalg.norm(q)


@dataclasses.dataclass(frozen=True)
class Timeline:
    """Keyframes after human timing: per side, times [K] and poses [K,4,4]; grips per side."""
    t_pose: tuple[np.ndarray, np.ndarray]
    poses: tuple[np.ndarray, np.ndarray]
    t_grip: tuple[np.ndarray, np.ndarray]
    grips: tuple[np.ndarray, np.ndarray]
    segments: list[dict]          # name, start, end (for metadata / debugging)
    end: float                    # when the last motion ends [s]


def humanize(segments: list[Segment], home: np.ndarray, rng: np.random.Generator, *, start: float,
             max_end: float, grip0: float = 0.1) -> Timeline:
    """Random durations (log-normal σ 0.15), a per-arm reaction lag, fit into [start, max_end]."""
    dur = np.array([s.duration for s in segments]) * np.exp(rng.normal(0, 0.15, len(segments)))
    total = dur.sum() + 0.25
    if start + total > max_end:
        dur *= (max_end - start - 0.25) / dur.sum()
    ends = start + np.cumsum(dur)
    starts = ends - dur
    lag = rng.uniform(0.0, 0.12, 2)                      # each arm's reaction delay
    t_pose, poses, t_grip, grips = [], [], [], []
    for side in range(2):
        tk, pk, tg, gk = [0.0, start], [home[side], home[side]], [0.0, start], [grip0, grip0]
        for s, a, b in zip(segments, starts, ends):
            target = s.left if side == 0 else s.right
            g = s.grip[side]
            a2, b2 = a + lag[side], b + lag[side] * 0.5       # lag on the start, catch up by the end
            if target is not None:
                tk += [a2, b2]
                pk += [pk[-1], target]
            if g is not None:
                tg += [a2, b2]
                gk += [gk[-1], g]
        t_pose.append(np.asarray(tk))
        poses.append(np.stack(pk))
        t_grip.append(np.asarray(tg))
        grips.append(np.asarray(gk))
    info = [{"name": s.name, "start": round(float(a), 3), "end": round(float(b), 3)}
            for s, a, b in zip(segments, starts, ends)]
    return Timeline(tuple(t_pose), tuple(poses), tuple(t_grip), tuple(grips), info, float(ends[-1] + lag.max()))


def _eval_keys(tk: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Segment index and min-jerk phase of each time (holding before/after keyframes)."""
    i = np.clip(np.searchsorted(tk, t, side="right") - 1, 0, len(tk) - 2)
    span = np.maximum(tk[i + 1] - tk[i], 1e-9)
    return i, _min_jerk((t - tk[i]) / span)


def sample_timeline(tl: Timeline, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Palm poses [T,2,4,4] and grips [T,2] at times t (min-jerk between keyframes, slerp)."""
    poses = np.zeros((len(t), 2, 4, 4))
    grips = np.zeros((len(t), 2))
    for side in range(2):
        i, u = _eval_keys(tl.t_pose[side], t)
        p = tl.poses[side]
        quats = np.stack([_mat2quat(m[:3, :3]) for m in p])
        for n in range(len(t)):
            a, b = p[i[n]], p[i[n] + 1]
            poses[n, side] = pose(_quat2mat(_slerp(quats[i[n]], quats[i[n] + 1], u[n])),
                                  (1 - u[n]) * a[:3, 3] + u[n] * b[:3, 3])
        ig, ug = _eval_keys(tl.t_grip[side], t)
        grips[:, side] = (1 - ug) * tl.grips[side][ig] + ug * tl.grips[side][ig + 1]
    return poses, grips


def smooth_noise(rng: np.random.Generator, t: np.ndarray, shape: tuple, amp: float,
                 f_lo: float = 1.0, f_hi: float = 4.0, n: int = 4) -> np.ndarray:
    """Band-limited noise: a sum of `n` random sinusoids per channel, RMS ≈ amp."""
    f = rng.uniform(f_lo, f_hi, (n,) + shape)
    ph = rng.uniform(0, 2 * np.pi, (n,) + shape)
    a = amp * np.sqrt(2.0 / n)
    return a * np.sin(2 * np.pi * f[None] * t.reshape((-1, 1) + (1,) * len(shape)) + ph[None]).sum(1)


# --------------------------------------------------------------------------------------------------
# Robot space → recorded stream
# --------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _robot():
    emb = mjcf_model.embodiment()
    return emb, retarget.robot_arrays(emb, jnp.float32)


def home_poses() -> np.ndarray:
    """Palm poses [2,4,4] of the robot's home configuration."""
    emb, robot = _robot()
    q = np.stack([emb.home_q[0:7], emb.home_q[27:34]])
    return np.asarray(jax.vmap(fk.chain_tip)(robot.arms, jnp.asarray(q, robot.arms.axis_n3.dtype)), np.float64)


@functools.lru_cache(maxsize=1)
def _programs():
    """Jitted helpers, compiled once per process (shapes are fixed per episode length)."""
    keypoints = jax.jit(jax.vmap(jax.vmap(lambda f, q: hand_retarget.robot_keypoints(f, q)[0], (0, 0)), (None, 0)))
    inverse_chain = jax.jit(jax.vmap(tracker.trackers_from_targets, in_axes=(None, 0, 0, None)))
    pos_quat = jax.jit(se3.pos_quat_from_pose)

    def elbow_path(arms, q0, palms_t244):
        """Elbow points along an IK solve of the planned palm path (no elbow prior)."""
        def body(q, t):
            r = ik.solve_arms(arms, t, q)
            anchors = jax.vmap(lambda c, qq: fk.chain_fk(c, qq).anchor_n3[ik.IKConfig().elbow_joint])(arms, r.q_n)
            return r.q_n, anchors
        return jax.lax.scan(body, q0, palms_t244)[1]

    return keypoints, inverse_chain, pos_quat, jax.jit(elbow_path)


ELBOW_HZ = 30.0


def operator_elbows(tl: Timeline, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The operator's elbow points [T,2,3] in robot space: where the robot's own elbow goes when
    its palms follow the plan (an operator's arm posture is consistent with its hand), plus a
    smooth 1 cm wander. An arbitrary elbow guess fights the IK's null-space prior and can pull
    the shoulder into a joint limit (tested: 3/20 failed reaches with a fixed-offset guess)."""
    emb, robot = _robot()
    t_plan = np.arange(0.0, t[-1] + 1.0 / ELBOW_HZ, 1.0 / ELBOW_HZ)
    palms = sample_timeline(tl, t_plan)[0]
    dt = robot.arms.axis_n3.dtype
    q0 = jnp.asarray(np.stack([emb.home_q[0:7], emb.home_q[27:34]]), dt)
    e_plan = np.asarray(_programs()[3](robot.arms, q0, jnp.asarray(palms, dt)), np.float64)   # [P,2,3]
    e = np.stack([[np.interp(t, t_plan, e_plan[:, s, c]) for c in range(3)] for s in range(2)]).transpose(2, 0, 1)
    return e + smooth_noise(rng, t, (2, 3), 0.01, 0.2, 1.0) * (t > 0.2)[:, None, None]


def hand_keypoints(grip_t2: np.ndarray, hand_scale: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Operator hand skeletons [T,2,21,3] (wrist frame) for grip levels [T,2]: the robot hand's
    keypoints at the blended joint pose, scaled to the operator's hand, plus 1 mm noise."""
    emb, robot = _robot()
    q = Q_OPEN + grip_t2[..., None] * (Q_CLOSED - Q_OPEN)                       # [T,2,20]
    dt = robot.fingers.axis_n3.dtype
    kp = np.asarray(_programs()[0](robot.fingers, jnp.asarray(q, dt)), np.float64)   # [T,2,21,3]
    kp = kp * hand_scale[None, :, None, None]
    return kp + rng.normal(0, 0.001, kp.shape) * (np.arange(21) > 0)[None, None, :, None]


def make_stream(tl: Timeline, duration: float, rng: np.random.Generator, *, task: str, seed: int,
                camera_world: np.ndarray) -> tuple[streams.Stream, dict]:
    """Sample the timeline on jittered tracker / glove clocks and write operator-side signals."""
    dt_t = 1.0 / TRACKER_HZ
    t_trk = np.arange(0.0, duration + 0.1, dt_t)
    t_trk[1:] += rng.uniform(-0.15, 0.15, len(t_trk) - 1) * dt_t
    t_glove = np.arange(0.0, duration + 0.1, 1.0 / GLOVE_HZ)
    t_glove[1:] += rng.uniform(-0.1, 0.1, len(t_glove) - 1) / GLOVE_HZ
    palms, _ = sample_timeline(tl, t_trk)
    palms[:, :, :3, 3] += smooth_noise(rng, t_trk, (2, 3), 0.0015) * (t_trk > 0.2)[:, None, None]
    _, grips = sample_timeline(tl, t_glove)
    elbows = operator_elbows(tl, t_trk, rng)
    calib = tracker.default_calibration()
    chest_pos = np.array([rng.uniform(-1, 1), rng.uniform(-1, 1), rng.uniform(1.25, 1.45)])
    chest_yaw = rng.uniform(-np.pi, np.pi)
    chest = pose(_rz(chest_yaw), chest_pos)
    _, inverse_chain, pos_quat, _ = _programs()
    trk44 = inverse_chain(calib, jnp.asarray(palms, jnp.float32), jnp.asarray(elbows, jnp.float32),
                          jnp.asarray(chest, jnp.float32))
    trk = np.asarray(pos_quat(trk44), np.float64)
    trk[..., :3] += rng.normal(0, 0.0003, trk[..., :3].shape)
    trk[..., 3:] *= np.sign(trk[..., 3:4] + 1e-12)
    hand_scale = rng.uniform(0.93, 1.07, 2)
    kps = hand_keypoints(grips, hand_scale, rng)
    # Head camera in the tracking world (the inverse chain's rigid part; approximate: the chain
    # scales translation by s, so only points near the chest map exactly).
    cam_rel = np.linalg.inv(np.asarray(calib.t_base_s44[0], np.float64)) @ camera_world
    cam_rel[:3, 3] /= float(calib.scale)
    meta = {"source": "rynn_jax.sim.operators", "task": task, "seed": seed,
            "T_world_camera": (chest @ cam_rel).tolist(), "hand_scale": hand_scale.round(4).tolist(),
            "chest_pose": chest.tolist(), "note": "T_world_camera is approximate (translation scale s)"}
    stream = streams.Stream(tracker_t=t_trk, tracker_pose=trk, tracker_valid=np.ones((len(t_trk), 5), bool),
                            hand_t=t_glove, hand_keypoints=kps.astype(np.float32),
                            hand_valid=np.ones((len(t_glove), 2), bool), meta=meta)
    return stream, {"chest_yaw": float(chest_yaw), "hand_scale": hand_scale.tolist()}
