"""One synthetic episode: scene → scripted operator stream → retarget → simulate → render → checks.

    scenes.build(task, seed) ─ settle ─▶ operators.plan/humanize/make_stream ─▶ rynn-teleop-stream/1
        ─ retarget (resample to 16 fps, tracker chain, DLS IK, hand retargeting) ─▶ actions [T,54]
        ─ simulate (kinematic robot, physical objects, weld grasps) ─▶ states, body poses, contacts
        ─ render ─▶ RGB, depth, segmentation, optical flow (all ground truth), skeleton video
        ─ checks ─▶ success / failure reasons

Robot drive (documented choice): the robot is kinematic. Between video frames the 16 fps action
is linearly interpolated at the physics rate (512 Hz) and followed by a critically damped
second-order servo (ω = 40 rad/s, ≈ 25 ms lag) whose output is written to qpos/qvel before every
physics step (joint limits enforced). Objects are free bodies simulated by MuJoCo; they touch the
table, tray, box, plate and — in the push task — the hand geoms. `observation.state` is the servo
output at frame time, so it lags `action` like a position-controlled arm.

Grasps (documented): a weld constraint palm ↔ object is switched on when the simulated hand's
closure (`operators.closure`) exceeds 0.5 while its palm geom is within 2.5 cm of the object, and
off when closure drops below 0.3. The weld keeps the relative pose at the moment of attachment.
Hands and grasped objects do not collide (the grasp is the constraint).

Determinism: the scene, script, noise and stream come from `numpy.random.default_rng(seed)`,
the retargeting is a fixed-iteration XLA program, MuJoCo is single-threaded: the same
(task, seed, resolution, frames) gives the same arrays.
"""

from __future__ import annotations

import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

from rynn_jax.kinematics import chain_hands, fk, layout, replay, retarget, streams, tracker
from rynn_jax.render import RenderConfig, render_video
from rynn_jax.sim import operators, scenes
from rynn_jax.sim.resolutions import RESOLUTIONS

FPS = streams.VIDEO_FPS
DEFAULT_FRAMES = 113          # 7.0 s at 16 fps (one compile of the retargeting per process)
SERVO_OMEGA = 40.0            # rad/s
ATTACH_CLOSURE, RELEASE_CLOSURE, ATTACH_DIST = 0.5, 0.3, 0.025
PENETRATION_TOL = 0.006       # m, rigid contacts (the compliant pillow gets 2×)
MAX_OBJECT_SPEED = 3.0        # m/s at a frame end; faster = an object flung by the contact solver
SETTLE_S = 0.4


@dataclasses.dataclass
class Episode:
    task: str
    seed: int
    success: bool
    failures: list[str]
    stream: streams.Stream
    t: np.ndarray                 # [T] seconds
    actions: np.ndarray           # [T,54] retargeted joint commands
    states: np.ndarray            # [T,54] simulated joint positions at frame time
    rgb: np.ndarray               # [T,H,W,3] uint8
    depth: np.ndarray             # [T,H,W] float32, metres along the optical axis
    segmentation: np.ndarray      # [T,H,W] uint8 labels (see `labels`)
    flow: np.ndarray              # [T-1,H,W,2] float32 pixels (dx, dy), frame t → t+1
    skeleton_rgb: np.ndarray      # [T,H,W,3] uint8 depth-aware skeleton control video
    joints_cam: np.ndarray        # [T,2,21,3] operator hands in the head camera (OpenCV), metres
    elbows_cam: np.ndarray        # [T,2,3]
    skeleton_valid: np.ndarray    # [T,2,22]
    intrinsics: np.ndarray        # [3,3]
    camera_pose: np.ndarray       # [4,4] world ← camera (OpenCV axes)
    object_poses: np.ndarray      # [T,O,7] free objects' [x,y,z,qw,qx,qy,qz]
    labels: list[str]             # segmentation label names, index = label value
    info: dict                    # checks, timings, script, appearance


# --------------------------------------------------------------------------------------------------
# Retargeting (the same steps as `kinematics.cli.retarget_stream`, with one cached compile)
# --------------------------------------------------------------------------------------------------


def retarget_stream(stream: streams.Stream, t_out: np.ndarray) -> dict:
    """Stream → actions on the clock `t_out` (calibrated on its first step, as the CLI does),
    plus the retargeted palm targets and elbows (for the skeleton video)."""
    rs = streams.resample(stream, t_out)
    if not rs["trackers_fresh"][0].all() or not rs["hands_fresh"][0].all():
        raise ValueError("the stream must have fresh trackers and hands at the first video frame")
    emb, robot = operators._robot()
    dt = robot.arms.axis_n3.dtype
    state = retarget.initial_state(emb, dt)
    calib = tracker.default_calibration()
    home_ee = jax.vmap(fk.chain_tip)(robot.arms, state.arm_q_s7)
    calib = tracker.calibrate(calib, tracker.tracker_poses(jnp.asarray(rs["trackers"][0], dt)), home_ee)
    trk, hands = jnp.asarray(rs["trackers"], dt), jnp.asarray(rs["hands"], dt)
    _, actions, info = retarget.trajectory_jit(robot, calib, state, trk, hands)
    palms, elbows = chain_hands.chain_targets(calib, trk)
    actions = np.asarray(actions, np.float64)
    if not np.all(np.isfinite(actions)):
        raise RuntimeError("non-finite joints in the retargeted actions")
    return {"actions": actions, "palms": palms, "elbows": elbows,
            "hands": rs["hands"], "fresh": rs["trackers_fresh"].all(1) & rs["hands_fresh"].all(1),
            "ik_pos_err": np.asarray(info.ik.pos_err), "ik_rot_err": np.asarray(info.ik.rot_err),
            "hand_tip_err": np.asarray(info.hand_tip_err_s)}


# --------------------------------------------------------------------------------------------------
# Simulation
# --------------------------------------------------------------------------------------------------


def _free_objects(scene: scenes.Scene) -> list[str]:
    return [o.name for o in scene.objects if o.free]


def _object_pose(m, d, name) -> np.ndarray:
    b = m.body(name).id
    return np.concatenate([d.xpos[b], d.xquat[b]])


def settle(scene: scenes.Scene) -> mujoco.MjData:
    """Robot at home, objects dropped onto their supports and left to rest for SETTLE_S."""
    m = scene.model
    d = mujoco.MjData(m)
    emb, _ = operators._robot()
    d.qpos[:layout.ACTION_DIM] = emb.home_q
    mujoco.mj_forward(m, d)
    for _ in range(int(SETTLE_S / m.opt.timestep)):
        d.qpos[:layout.ACTION_DIM] = emb.home_q
        d.qvel[:layout.ACTION_DIM] = 0.0
        mujoco.mj_step(m, d)
    d.time = 0.0
    return d


def _yaw(quat: np.ndarray) -> float:
    w, x, y, z = quat
    return float(np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z)))


def _activate_weld(m, d, eq: int) -> None:
    b1, b2 = m.eq_obj1id[eq], m.eq_obj2id[eq]
    r1 = d.xmat[b1].reshape(3, 3)
    relpos = r1.T @ (d.xpos[b2] - d.xpos[b1])
    q1inv = np.zeros(4)
    mujoco.mju_negQuat(q1inv, d.xquat[b1])
    relq = np.zeros(4)
    mujoco.mju_mulQuat(relq, q1inv, d.xquat[b2])
    m.eq_data[eq, :3] = 0.0                         # anchor at body2's origin
    m.eq_data[eq, 3:6] = relpos
    m.eq_data[eq, 6:10] = relq
    m.eq_data[eq, 10] = 1.0                         # torque scale
    d.eq_active[eq] = 1


class Robot:
    """The kinematic robot driving a settled scene one video frame at a time: the servo, the weld
    grasps and the contact / speed statistics (`simulate` replays a whole action sequence through
    it; a closed-loop policy calls `advance` with the actions it chose)."""

    def __init__(self, scene: scenes.Scene, d: mujoco.MjData):
        m = self.m = scene.model
        self.scene, self.d = scene, d
        n = self.n = layout.ACTION_DIM
        self.sub = int(round(1.0 / (FPS * m.opt.timestep)))
        self.lo, self.hi = m.jnt_range[:n, 0].copy(), m.jnt_range[:n, 1].copy()
        self.q, self.v = d.qpos[:n].copy(), np.zeros(n)
        self.welds = {m.eq(i).name: i for i in range(m.neq)}
        self.palm_geom = {s: next(g for g in range(m.ngeom) if m.geom_bodyid[g] == m.body(f"{s}_palm").id and
                                  m.geom_type[g] == mujoco.mjtGeom.mjGEOM_BOX) for s in scenes.SIDES}
        self.obj_geoms = {o.name: [g for g in range(m.ngeom) if m.geom_bodyid[g] == m.body(o.name).id]
                          for o in scene.objects}
        self.attached: dict[str, str | None] = {"left": None, "right": None}
        self.events: list[dict] = []
        self.free = _free_objects(scene)
        self.max_pen = {"rigid": 0.0, "soft": 0.0}
        self.max_speed = 0.0
        self.soft_geoms = {g for name in ("pillow",) if name in self.obj_geoms for g in self.obj_geoms[name]}
        self._fromto = np.zeros(6)

    def _grasp_logic(self, step_t: float) -> None:
        m, d, scene = self.m, self.d, self.scene
        for side in scenes.SIDES:
            c = float(operators.closure(self.q[layout.HAND_SLICES[side]]))
            if self.attached[side] is None and c > ATTACH_CLOSURE:
                for o in scene.objects:
                    if side not in o.graspable_by:
                        continue
                    dist = min(mujoco.mj_geomDistance(m, d, self.palm_geom[side], g, 0.2, self._fromto)
                               for g in self.obj_geoms[o.name])
                    if dist < ATTACH_DIST:
                        _activate_weld(m, d, self.welds[f"grasp_{side}_{o.name}"])
                        self.attached[side] = o.name
                        self.events.append({"t": round(step_t, 4), "side": side, "event": "attach", "object": o.name,
                                            "palm_distance": round(float(dist), 4)})
                        break
            elif self.attached[side] is not None and c < RELEASE_CLOSURE:
                d.eq_active[self.welds[f"grasp_{side}_{self.attached[side]}"]] = 0
                self.events.append({"t": round(step_t, 4), "side": side, "event": "release",
                                    "object": self.attached[side]})
                self.attached[side] = None

    def _contacts(self) -> None:
        d = self.d
        for i in range(d.ncon):
            c = d.contact[i]
            key = "soft" if (c.geom1 in self.soft_geoms or c.geom2 in self.soft_geoms) else "rigid"
            self.max_pen[key] = max(self.max_pen[key], -float(c.dist))

    def advance(self, a0: np.ndarray, a1: np.ndarray, k: int) -> None:
        """Frame k → k+1: the command moves linearly from a0 to a1, the servo follows it."""
        m, d, n, w, dt = self.m, self.d, self.n, SERVO_OMEGA, self.m.opt.timestep
        q, v = self.q, self.v
        for s in range(self.sub):
            u = (s + 1) / self.sub
            cmd = (1 - u) * a0 + u * a1
            acc = w * w * (cmd - q) - 2 * w * v
            v = v + acc * dt
            q = q + v * dt
            clipped = (q < self.lo) | (q > self.hi)
            q = np.clip(q, self.lo, self.hi)
            v[clipped] = 0.0
            d.qpos[:n] = q
            d.qvel[:n] = v
            self.q, self.v = q, v
            mujoco.mj_step(m, d)
            if s % 4 == 3:
                self._grasp_logic(k / FPS + u / FPS)
                self._contacts()
        for name in self.free:
            jadr = m.body(name).dofadr[0]
            self.max_speed = max(self.max_speed, float(np.linalg.norm(d.qvel[jadr:jadr + 3])))

    def finish(self) -> None:
        """Leave the data at the servo's final joints (what `goal_reached` reads)."""
        self.d.qpos[:self.n] = self.q
        mujoco.mj_forward(self.m, self.d)


def simulate(scene: scenes.Scene, d: mujoco.MjData, actions: np.ndarray) -> dict:
    """Drive the settled scene with the 16 fps actions; record per-frame states and poses."""
    m = scene.model
    T = len(actions)
    robot = Robot(scene, d)
    qpos_frames = np.zeros((T, m.nq))
    states = np.zeros((T, robot.n))
    xpos = np.zeros((T, m.nbody, 3))
    xquat = np.zeros((T, m.nbody, 4))
    for k in range(T):
        # Frame k is observed at t_k; then the command moves toward action[k+1] until t_{k+1}.
        mujoco.mj_forward(m, d)
        qpos_frames[k] = d.qpos
        states[k] = robot.q
        xpos[k], xquat[k] = d.xpos, d.xquat
        if k == T - 1:
            break
        robot.advance(actions[k], actions[k + 1], k)
    robot.finish()
    free = robot.free
    object_poses = np.stack([[np.concatenate([xpos[k, m.body(o).id], xquat[k, m.body(o).id]]) for o in free]
                             for k in range(T)]) if free else np.zeros((T, 0, 7))
    return {"qpos": qpos_frames, "states": states, "xpos": xpos, "xquat": xquat, "events": robot.events,
            "max_penetration": robot.max_pen, "max_object_speed": robot.max_speed, "object_poses": object_poses,
            "attached_at_end": dict(robot.attached), "final": d}


# --------------------------------------------------------------------------------------------------
# Rendering: RGB, depth, segmentation, flow, skeleton
# --------------------------------------------------------------------------------------------------


def segmentation_labels(scene: scenes.Scene) -> tuple[list[str], np.ndarray]:
    """Label names and a geom → label table: 0 background/static scene, 1 left robot, 2 right
    robot, then one label per task object (in `scene.objects` order)."""
    m = scene.model
    names = ["background", "robot_left", "robot_right"] + [o.name for o in scene.objects]
    body_label = np.zeros(m.nbody, np.uint8)
    for b in range(1, m.nbody):
        root = b
        while m.body_parentid[root] != 0:
            root = m.body_parentid[root]
        rname = m.body(root).name
        if rname.startswith("left_"):
            body_label[b] = 1
        elif rname.startswith("right_"):
            body_label[b] = 2
        elif rname in names:
            body_label[b] = names.index(rname)
    return names, body_label[m.geom_bodyid]


def ensure_headless_gl() -> None:
    """Use OSMesa (software) rendering when no GL backend was chosen and there is no display.
    MuJoCo reads MUJOCO_GL once, at `import mujoco`; if that happened with the variable unset on
    a headless machine, the renderer's context class is switched to OSMesa's here."""
    from mujoco.rendering.classic import gl_context

    if getattr(gl_context, "_MUJOCO_GL", "") or os.environ.get("DISPLAY"):
        return                                   # a backend was chosen explicitly, or there is a display
    os.environ.setdefault("MUJOCO_GL", "osmesa")  # for child processes
    from mujoco.osmesa import GLContext

    gl_context.GLContext = GLContext


def render_frames(scene: scenes.Scene, qpos: np.ndarray, height: int, width: int) -> dict:
    """Head-camera RGB [T,H,W,3], depth [T,H,W] and per-pixel geom ids [T,H,W] (−1 = none)."""
    ensure_headless_gl()
    m = scene.model
    d = mujoco.MjData(m)
    T = len(qpos)
    rgb = np.zeros((T, height, width, 3), np.uint8)
    depth = np.zeros((T, height, width), np.float32)
    geom = np.full((T, height, width), -1, np.int32)
    r = replay.offscreen_renderer(m, height, width)
    try:
        for k in range(T):
            d.qpos[:] = qpos[k]
            mujoco.mj_forward(m, d)
            r.update_scene(d, camera="head_camera")
            rgb[k] = r.render()
            r.enable_depth_rendering()
            depth[k] = r.render()
            r.disable_depth_rendering()
            r.enable_segmentation_rendering()
            seg = r.render()
            r.disable_segmentation_rendering()
            geom[k] = np.where(seg[..., 1] == int(mujoco.mjtObj.mjOBJ_GEOM), seg[..., 0], -1)
    finally:
        r.close()
    return {"rgb": rgb, "depth": depth, "geom": geom}


def backproject(depth_hw: np.ndarray, K: np.ndarray) -> np.ndarray:
    """Camera-frame 3-D points [H,W,3] (OpenCV axes) of a z-depth image."""
    h, w = depth_hw.shape
    v, u = np.mgrid[0:h, 0:w].astype(np.float64)
    x = (u - K[0, 2]) / K[0, 0] * depth_hw
    y = (v - K[1, 2]) / K[1, 1] * depth_hw
    return np.stack([x, y, depth_hw.astype(np.float64)], -1)


def optical_flow(depth: np.ndarray, geom: np.ndarray, geom_body: np.ndarray, xpos: np.ndarray,
                 xquat: np.ndarray, K: np.ndarray, cam_pose: np.ndarray) -> np.ndarray:
    """Ground-truth forward flow [T-1,H,W,2]: each pixel's 3-D point (depth) rides on its body
    (segmentation → geom → body) from pose t to pose t+1 and is projected again. Pixels that
    see nothing (sky / no geom) get 0. Camera = `cam_pose` (static head camera)."""
    T, h, w = depth.shape
    flow = np.zeros((T - 1, h, w, 2), np.float32)
    cam_inv = np.linalg.inv(cam_pose)
    v, u = np.mgrid[0:h, 0:w].astype(np.float64)

    def rot(qs):
        out = np.zeros((len(qs), 9))
        for i, q in enumerate(qs):
            mujoco.mju_quat2Mat(out[i], q)
        return out.reshape(-1, 3, 3)

    for k in range(T - 1):
        body = np.where(geom[k] >= 0, geom_body[np.maximum(geom[k], 0)], 0)
        pc = backproject(depth[k], K)
        pw = pc @ cam_pose[:3, :3].T + cam_pose[:3, 3]
        r0, r1 = rot(xquat[k]), rot(xquat[k + 1])
        rb0, pb0, rb1, pb1 = r0[body], xpos[k][body], r1[body], xpos[k + 1][body]
        local = np.einsum("hwji,hwj->hwi", rb0, pw - pb0)               # R0ᵀ (p − x0)
        pw1 = np.einsum("hwij,hwj->hwi", rb1, local) + pb1
        pc1 = pw1 @ cam_inv[:3, :3].T + cam_inv[:3, 3]
        z1 = np.maximum(pc1[..., 2], 1e-6)
        u1 = K[0, 0] * pc1[..., 0] / z1 + K[0, 2]
        v1 = K[1, 1] * pc1[..., 1] / z1 + K[1, 2]
        ok = (geom[k] >= 0)[..., None]
        flow[k] = np.where(ok, np.stack([u1 - u, v1 - v], -1), 0.0)
    return flow


def skeleton_in_camera(ret: dict, cam_pose: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The operator's hands through the tracker chain (retargeted palm frames ⊗ the stream's
    21 keypoints) and the elbow references, in the head camera's OpenCV frame (what a live sim
    session renders too: `chain_hands.hands_through_chain`)."""
    return chain_hands.hands_through_chain(ret["palms"], ret["hands"], ret["elbows"], ret["fresh"], cam_pose)


# --------------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------------


def _tilt(quat: np.ndarray) -> float:
    r = np.zeros(9)
    mujoco.mju_quat2Mat(r, quat)
    return float(np.arccos(np.clip(r.reshape(3, 3)[2, 2], -1, 1)))


def goal_reached(scene: scenes.Scene, d: mujoco.MjData) -> tuple[bool, dict]:
    """Task goal on the final state; returns (ok, measured quantities)."""
    m, lay, z_t = scene.model, scene.layout, scenes.TABLE_Z
    pos = {o.name: d.xpos[m.body(o.name).id].copy() for o in scene.objects}
    quat = {o.name: d.xquat[m.body(o.name).id].copy() for o in scene.objects}
    out: dict = {}
    if scene.task == "dual_pick":
        ok = True
        for name in ("apple", "banana"):
            h = scene.object(name).half_height
            off_plate = float(np.linalg.norm(pos[name][:2] - lay["plate_xy"]))
            on_table = abs(pos[name][2] - (z_t + h)) < 0.012
            out[name] = {"off_plate_m": round(off_plate, 4), "height_above_table_m": round(float(pos[name][2] - z_t), 4)}
            ok &= on_table and off_plate > lay["plate_radius"] + 0.005
        return bool(ok), out
    if scene.task == "push_block":
        b, h = pos["block"], scene.object("block").half_height
        out = {"block_y": round(float(b[1]), 4), "block_z": round(float(b[2] - z_t), 4)}
        ok = b[1] < lay["goal_y_max"] and abs(b[2] - (z_t + h)) < 0.01 and abs(b[0] - 0.55) < 0.35
        return bool(ok), out
    if scene.task == "bimanual_lift":
        p = pos["pillow"]
        tray = m.body("tray").id
        local = d.xmat[tray].reshape(3, 3).T @ (p - d.xpos[tray])
        inner = np.asarray(lay["tray_inner"])
        out = {"pillow_in_tray_xy": np.round(local[:2], 4).tolist(), "pillow_z": round(float(p[2] - lay["tray_base_z"]), 4)}
        ok = np.all(np.abs(local[:2]) < inner) and p[2] - lay["tray_base_z"] < lay["pillow_half"][2] + 0.02
        return bool(ok), out
    lid, box = pos["lid"], pos["box"]
    box_top = box[2] + lay["box_half"][2]
    out = {"lid_box_xy_m": round(float(np.linalg.norm(lid[:2] - box[:2])), 4),
           "lid_above_box_top_m": round(float(lid[2] - box_top), 4), "lid_tilt_rad": round(_tilt(quat["lid"]), 4)}
    ok = (np.linalg.norm(lid[:2] - box[:2]) < 0.025 and abs(lid[2] - box_top - lay["lid_half"][2]) < 0.01
          and _tilt(quat["lid"]) < np.deg2rad(10))
    return bool(ok), out


def unstable(qpos: np.ndarray, max_object_speed: float) -> bool:
    """An unreliable simulation: non-finite state, or an object ever faster than MAX_OBJECT_SPEED
    at a frame end (flung by the contact solver). Generated episodes with it are dropped; a
    closed-loop trial with it fails."""
    return bool(not np.isfinite(qpos).all() or max_object_speed > MAX_OBJECT_SPEED)


def sanity_checks(scene: scenes.Scene, sim: dict, ret: dict, actions: np.ndarray) -> list[str]:
    """Physical sanity: joint limits, interpenetration, stability, tracking, grasps."""
    m = scene.model
    n = layout.ACTION_DIM
    lo, hi = m.jnt_range[:n, 0], m.jnt_range[:n, 1]
    fails = []
    for what, q in (("action", actions), ("state", sim["states"])):
        if np.any(q < lo - 1e-6) or np.any(q > hi + 1e-6):
            fails.append(f"{what} outside joint limits")
    if sim["max_penetration"]["rigid"] > PENETRATION_TOL:
        fails.append(f"interpenetration {sim['max_penetration']['rigid'] * 1e3:.1f} mm")
    if sim["max_penetration"]["soft"] > 2 * PENETRATION_TOL:
        fails.append(f"soft interpenetration {sim['max_penetration']['soft'] * 1e3:.1f} mm")
    if unstable(sim["qpos"], sim["max_object_speed"]):
        fails.append(f"unstable simulation (object speed {sim['max_object_speed']:.2f} m/s)")
    if np.max(ret["ik_pos_err"]) > 0.01:
        fails.append(f"IK error {np.max(ret['ik_pos_err']) * 1e3:.1f} mm")
    attached = {(e["side"], e["object"]) for e in sim["events"] if e["event"] == "attach"}
    for o in scene.objects:
        for side in o.graspable_by:
            if (side, o.name) not in attached:
                fails.append(f"{side} hand never grasped {o.name}")
    if any(v is not None for v in sim["attached_at_end"].values()):
        fails.append("object still grasped at the end")
    return fails


# --------------------------------------------------------------------------------------------------
# The whole episode
# --------------------------------------------------------------------------------------------------


def script(scene: scenes.Scene, d: mujoco.MjData, num_frames: int
           ) -> tuple[operators.Timeline, streams.Stream, dict]:
    """The scripted operator of the settled scene (its seed's plan, timing and stream)."""
    m = scene.model
    rng = np.random.default_rng([scene.seed, scenes.TASKS.index(scene.task), 9])
    pos = {o.name: d.xpos[m.body(o.name).id].copy() for o in scene.objects}
    yaw = {o.name: _yaw(d.xquat[m.body(o.name).id]) for o in scene.objects}
    segments = operators.plan(scene, pos, yaw, rng)
    duration = (num_frames - 1) / FPS
    tl = operators.humanize(segments, operators.home_poses(), rng, start=rng.uniform(0.2, 0.4),
                            max_end=duration - 0.5)
    stream, op_info = operators.make_stream(tl, duration, rng, task=scene.task, seed=scene.seed,
                                            camera_world=scenes.camera_pose_opencv(m, d))
    return tl, stream, op_info


def generate(task: str, seed: int, *, resolution: str | tuple[int, int] = "tiny",
             num_frames: int = DEFAULT_FRAMES, render: bool = True, shadows: bool | None = None) -> Episode:
    """One episode of `task` from `seed`. `render=False` skips images (fast success statistics);
    `shadows` defaults to on except at "tiny" resolution."""
    height, width = RESOLUTIONS[resolution] if isinstance(resolution, str) else resolution
    if shadows is None:
        shadows = resolution != "tiny"
    tim: dict[str, float] = {}
    t0 = time.perf_counter()
    scene = scenes.build(task, seed, width=width, height=height, shadows=shadows)
    d = settle(scene)
    m = scene.model
    tl, stream, op_info = script(scene, d, num_frames)
    cam_pose = scenes.camera_pose_opencv(m, d)
    tim["scene_script_s"] = time.perf_counter() - t0

    t1 = time.perf_counter()
    t_video = np.arange(num_frames) / FPS
    ret = retarget_stream(stream, t_video)
    actions = ret["actions"]
    tim["retarget_s"] = time.perf_counter() - t1

    t1 = time.perf_counter()
    sim = simulate(scene, d, actions)
    goal_ok, goal = goal_reached(scene, sim["final"])
    failures = sanity_checks(scene, sim, ret, actions)
    if not goal_ok:
        failures.append("goal not reached")
    tim["simulate_s"] = time.perf_counter() - t1

    K = scenes.camera_intrinsics(m, width, height)
    joints, elbows, valid = skeleton_in_camera(ret, cam_pose)
    labels, geom_label = segmentation_labels(scene)
    if render:
        t1 = time.perf_counter()
        frames = render_frames(scene, sim["qpos"], height, width)
        tim["render_s"] = time.perf_counter() - t1
        t1 = time.perf_counter()
        flow = optical_flow(frames["depth"], frames["geom"], m.geom_bodyid, sim["xpos"], sim["xquat"], K, cam_pose)
        seg = np.where(frames["geom"] >= 0, geom_label[np.maximum(frames["geom"], 0)], 0).astype(np.uint8)
        tim["flow_s"] = time.perf_counter() - t1
        t1 = time.perf_counter()
        skel = np.asarray(render_video(RenderConfig(width=width, height=height), joints, elbows, K, valid))
        tim["skeleton_s"] = time.perf_counter() - t1
        rgb, depth = frames["rgb"], frames["depth"]
    else:
        rgb = np.zeros((0, height, width, 3), np.uint8)
        depth = np.zeros((0, height, width), np.float32)
        seg = np.zeros((0, height, width), np.uint8)
        flow = np.zeros((0, height, width, 2), np.float32)
        skel = np.zeros((0, height, width, 3), np.uint8)
    tim["total_s"] = time.perf_counter() - t0
    info = {
        "goal": goal, "events": sim["events"], "segments": tl.segments, "operator": op_info,
        "max_penetration_m": {k: round(v, 5) for k, v in sim["max_penetration"].items()},
        "max_object_speed_mps": round(sim["max_object_speed"], 4),
        "ik_pos_err_mm_max": round(float(np.max(ret["ik_pos_err"]) * 1e3), 3),
        "ik_pos_err_mm_median": round(float(np.median(ret["ik_pos_err"]) * 1e3), 3),
        "hand_tip_err_mm_median": round(float(np.median(ret["hand_tip_err"]) * 1e3), 3),
        "appearance": scene.appearance, "layout": scene.layout, "timings_s": {k: round(v, 3) for k, v in tim.items()},
        "resolution": [height, width], "robot_drive": "kinematic, servo omega 40 rad/s", "scene_xml_chars": len(scene.xml),
    }
    return Episode(task=task, seed=seed, success=not failures, failures=failures, stream=stream, t=t_video,
                   actions=actions.astype(np.float32), states=sim["states"].astype(np.float32), rgb=rgb,
                   depth=depth, segmentation=seg, flow=flow, skeleton_rgb=skel, joints_cam=joints,
                   elbows_cam=elbows, skeleton_valid=valid, intrinsics=K, camera_pose=cam_pose,
                   object_poses=sim["object_poses"].astype(np.float32), labels=labels, info=info)
