"""Randomized MuJoCo scenes for the paper's four robot tasks (its Stage 2 robot data, Sec. 3.4).

Each scene is the 54-DoF embodiment (`kinematics/assets/rynn_bimanual.xml`, loaded unchanged)
plus a table, the task's objects and lights, built with `mujoco.MjSpec` from a seed:

| task            | objects                                     | goal                                          |
|-----------------|---------------------------------------------|-----------------------------------------------|
| `dual_pick`     | plate (static), apple, banana on the plate  | apple and banana resting on the table, off the plate |
| `push_block`    | block on the left of the table              | block resting right of the middle (y < −0.12 m) |
| `bimanual_lift` | pillow (soft contacts), tray (static) behind it | pillow resting inside the tray            |
| `lid_placement` | box (free, heavy), lid with a knob          | lid resting on the box, centred, level        |

Randomized per seed: object positions and yaw (the apple's full 3-D orientation), colors,
procedural textures (checker / gradient / noise) of table, floor and objects, the key light's
position, color and intensity and the ambient level. Objects are dropped a few millimetres above
their support and settle in simulation before recording, so their resting 6-DoF pose comes out of
the physics. The head camera is the embodiment's (fovy 42° = RealSense D435i color vertical FOV).

Contacts: objects collide with the table, the tray/box/plate and each other (contype bit 0);
the robot's hand geoms collide with objects only (bit 1, push task) — the robot is driven
kinematically (see `episode.py`), so robot–table contact is never needed. Grasps are weld
equality constraints palm ↔ object, inactive until the simulated hand closes on an object
(`episode.py`); one weld per (hand, graspable object).
"""

from __future__ import annotations

import dataclasses

import mujoco
import numpy as np

from rynn_jax.kinematics import mjcf_model

TASKS = ("dual_pick", "push_block", "bimanual_lift", "lid_placement")
DESCRIPTIONS = {
    "dual_pick": "Pick up the apple and the banana from the plate and place them on the table.",
    "push_block": "Push the block to the middle with the left arm, then on to the right with the right arm.",
    "bimanual_lift": "Lift the pillow with both hands and put it into the tray.",
    "lid_placement": "Place the lid onto the box.",
}
TABLE_Z = 0.78                 # table top height [m] (arm bases at 1.121 m)
TABLE_CENTER = (0.55, 0.0)     # table centre in the world's xy [m]
TABLE_HALF = (0.40, 0.70)      # half extents [m]
TIMESTEP = 1.0 / 512.0         # physics step: 32 substeps per 16 fps frame
SIDES = ("left", "right")
OBJECT_GROUP, HAND_GROUP = 1, 2   # contype bits (see module docstring)


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    name: str                  # body name (also the segmentation label name)
    free: bool                 # has a free joint (simulated) or is static
    half_height: float         # resting half height above its support [m]
    graspable_by: tuple[str, ...] = ()   # sides whose palm may weld to it


@dataclasses.dataclass(frozen=True)
class Scene:
    task: str
    seed: int
    model: mujoco.MjModel
    objects: tuple[ObjectInfo, ...]
    layout: dict            # task geometry the operator script and the goal check use (world frame)
    appearance: dict        # what was randomized (for metadata.json)
    xml: str                # the compiled scene as MJCF (reproducible without this code)

    def object(self, name: str) -> ObjectInfo:
        return next(o for o in self.objects if o.name == name)


def _rgba(rng: np.random.Generator, lo: float = 0.15, hi: float = 0.95) -> list[float]:
    return [*rng.uniform(lo, hi, 3).round(3).tolist(), 1.0]


def _material(spec: mujoco.MjSpec, rng: np.random.Generator, name: str, base_rgb: np.ndarray,
              cube: bool = False, repeat: float = 4.0) -> dict:
    """A procedural texture + material around `base_rgb`; returns what was chosen."""
    kind = rng.choice(["checker", "gradient", "noise", "flat"])
    c1 = np.clip(base_rgb + rng.normal(0, 0.06, 3), 0, 1)
    c2 = np.clip(base_rgb * rng.uniform(0.55, 0.85), 0, 1)
    tex = spec.add_texture()
    tex.name = f"tex_{name}"
    tex.type = mujoco.mjtTexture.mjTEXTURE_CUBE if cube else mujoco.mjtTexture.mjTEXTURE_2D
    tex.width = tex.height = 64
    tex.rgb1, tex.rgb2 = c1.tolist(), c2.tolist()
    if kind == "checker":
        tex.builtin = mujoco.mjtBuiltin.mjBUILTIN_CHECKER
    elif kind == "gradient":
        tex.builtin = mujoco.mjtBuiltin.mjBUILTIN_GRADIENT
    elif kind == "noise":
        tex.builtin = mujoco.mjtBuiltin.mjBUILTIN_FLAT
        tex.mark = mujoco.mjtMark.mjMARK_RANDOM
        tex.random = float(rng.uniform(0.05, 0.3))
        tex.markrgb = c2.tolist()
    else:
        tex.builtin = mujoco.mjtBuiltin.mjBUILTIN_FLAT
    mat = spec.add_material()
    mat.name = f"mat_{name}"
    mat.textures[mujoco.mjtTextureRole.mjTEXROLE_RGB] = tex.name
    mat.texrepeat = [repeat, repeat]
    mat.texuniform = not cube
    mat.specular = float(rng.uniform(0.05, 0.5))
    mat.shininess = float(rng.uniform(0.05, 0.5))
    return {"texture": str(kind), "rgb1": c1.round(3).tolist(), "rgb2": c2.round(3).tolist()}


def _yaw_quat(yaw: float) -> list[float]:
    return [float(np.cos(yaw / 2)), 0.0, 0.0, float(np.sin(yaw / 2))]


def _add_free(spec, name, pos, quat, geoms: list[dict], mat: str, **solver) -> None:
    body = spec.worldbody.add_body(name=name, pos=list(pos), quat=list(quat))
    body.add_freejoint(name=f"{name}_free")
    for i, g in enumerate(geoms):
        geom = body.add_geom(name=f"{name}_g{i}", material=mat, contype=OBJECT_GROUP,
                             conaffinity=OBJECT_GROUP | HAND_GROUP, condim=4, priority=1,
                             friction=[0.9, 0.02, 0.002], **g, **solver)
        geom.rgba = [1, 1, 1, 1]


def _add_static(spec, name, pos, quat, geoms: list[dict], mat: str) -> None:
    body = spec.worldbody.add_body(name=name, pos=list(pos), quat=list(quat))
    for i, g in enumerate(geoms):
        body.add_geom(name=f"{name}_g{i}", material=mat, contype=OBJECT_GROUP, conaffinity=OBJECT_GROUP,
                      condim=3, friction=[0.9, 0.02, 0.002], **g)


def _box(half, pos=(0, 0, 0), **kw) -> dict:
    return dict(type=mujoco.mjtGeom.mjGEOM_BOX, size=list(half), pos=list(pos), **kw)


def build(task: str, seed: int, *, width: int = 832, height: int = 480, shadows: bool = True) -> Scene:
    """The randomized scene of `task` for `seed` (deterministic). `shadows`: the key light casts
    shadows (software rendering: ≈2.5× the RGB render time)."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose from {TASKS}")
    rng = np.random.default_rng([seed, TASKS.index(task), 8])
    spec = mujoco.MjSpec.from_file(str(mjcf_model.DEFAULT_MJCF))
    spec.modelname = f"rynn_sim_{task}"
    spec.option.timestep = TIMESTEP
    spec.option.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    spec.option.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    spec.visual.global_.offwidth = max(width, 640)
    spec.visual.global_.offheight = max(height, 480)
    spec.visual.quality.shadowsize = 1024
    # Robot: heavy joints (it is overwritten every substep; armature keeps contact impulses from
    # deflecting it within a step), hand geoms collide with objects only.
    for j in spec.joints:
        j.armature = 5.0
    for g in spec.geoms:
        parent = g.parent.name if g.parent is not None else ""
        if ("palm" in parent or "finger" in parent) and task == "push_block":
            g.contype, g.conaffinity = HAND_GROUP, 0
    appearance: dict = {}

    # Lights: the MJCF's overhead light dimmed, plus a randomized key light; headlight = ambient.
    for light in spec.lights:
        light.diffuse = [0.25, 0.25, 0.25]
        light.castshadow = False
    key = spec.worldbody.add_light(name="key_light")
    key_pos = np.array([rng.uniform(-0.2, 0.9), rng.uniform(-1.0, 1.0), rng.uniform(1.8, 2.8)])
    key.pos = key_pos.tolist()
    key.dir = (np.array([0.55, 0.0, TABLE_Z]) - key_pos).tolist()
    key_rgb = np.clip(rng.uniform(0.55, 0.95) * np.array([1.0, 1.0, 1.0]) + rng.normal(0, 0.05, 3), 0, 1)
    key.diffuse = key_rgb.tolist()
    key.castshadow = shadows
    ambient = float(rng.uniform(0.15, 0.4))
    spec.visual.headlight.ambient = [ambient] * 3
    spec.visual.headlight.diffuse = [0.25] * 3
    appearance["light"] = {"pos": key_pos.round(3).tolist(), "rgb": key_rgb.round(3).tolist(),
                           "ambient": round(ambient, 3), "shadows": shadows}

    # Back wall (closes the view above the table), floor and table.
    appearance["wall"] = _material(spec, rng, "wall", rng.uniform(0.5, 0.9, 3), repeat=3.0)
    spec.worldbody.add_geom(name="wall", material="mat_wall", **_box([0.02, 2.0, 1.5], (1.4, 0, 1.5)))
    appearance["floor"] = _material(spec, rng, "floor", rng.uniform(0.3, 0.7, 3), repeat=8.0)
    for g in spec.geoms:
        if g.name == "floor":
            g.material, g.rgba = "mat_floor", [1, 1, 1, 1]
    appearance["table"] = _material(spec, rng, "table", rng.uniform(0.35, 0.8, 3) * [1.0, 0.85, 0.7], repeat=6.0)
    cx, cy = TABLE_CENTER
    table = spec.worldbody.add_body(name="table", pos=[cx, cy, TABLE_Z])
    table.add_geom(name="table_top", material="mat_table", contype=OBJECT_GROUP, conaffinity=OBJECT_GROUP,
                   condim=3, friction=[0.8, 0.02, 0.002], **_box([TABLE_HALF[0], TABLE_HALF[1], 0.02], (0, 0, -0.02)))
    for sx in (-1, 1):
        for sy in (-1, 1):
            table.add_geom(material="mat_table", **_box([0.025, 0.025, (TABLE_Z - 0.04) / 2],
                                                         (sx * (TABLE_HALF[0] - 0.05), sy * (TABLE_HALF[1] - 0.05),
                                                          -0.04 - (TABLE_Z - 0.04) / 2)))

    z0 = TABLE_Z
    layout: dict = {"table_z": TABLE_Z}
    drop = 0.003
    if task == "dual_pick":
        plate_xy = np.array([rng.uniform(0.47, 0.55), rng.uniform(-0.03, 0.03)])
        appearance["plate"] = _material(spec, rng, "plate", rng.uniform(0.75, 0.95, 3))
        _add_static(spec, "plate", [*plate_xy, z0 + 0.006], _yaw_quat(rng.uniform(-np.pi, np.pi)),
                    [dict(type=mujoco.mjtGeom.mjGEOM_CYLINDER, size=[0.12, 0.006, 0])], "mat_plate")
        surface = z0 + 0.012
        apple_r = rng.uniform(0.03, 0.036)
        apple_xy = plate_xy + [rng.uniform(-0.02, 0.02), rng.uniform(0.045, 0.065)]
        appearance["apple"] = _material(spec, rng, "apple", np.array([rng.uniform(0.6, 0.9), rng.uniform(0.05, 0.35), 0.08]), cube=True, repeat=1)
        q = rng.normal(size=4)
        _add_free(spec, "apple", [*apple_xy, surface + apple_r + drop], (q / np.linalg.norm(q)).tolist(),
                  [dict(type=mujoco.mjtGeom.mjGEOM_SPHERE, size=[apple_r, 0, 0], mass=0.15)], "mat_apple")
        banana_r, banana_l = 0.018, rng.uniform(0.05, 0.065)
        banana_xy = plate_xy + [rng.uniform(-0.02, 0.02), -rng.uniform(0.045, 0.065)]
        banana_yaw = rng.uniform(-0.5, 0.5)
        appearance["banana"] = _material(spec, rng, "banana", np.array([0.9, rng.uniform(0.7, 0.85), 0.15]), cube=True, repeat=1)
        _add_free(spec, "banana", [*banana_xy, surface + banana_r + drop],
                  _yaw_quat(banana_yaw), [dict(type=mujoco.mjtGeom.mjGEOM_CAPSULE, size=[banana_r, banana_l, 0],
                                               quat=[0.7071068, 0.7071068, 0, 0], mass=0.12)], "mat_banana")
        objects = (ObjectInfo("plate", False, 0.006), ObjectInfo("apple", True, apple_r, ("left",)),
                   ObjectInfo("banana", True, banana_r, ("right",)))
        layout.update(plate_xy=plate_xy.tolist(), plate_radius=0.12,
                      place_xy={"apple": [float(apple_xy[0]) + rng.uniform(-0.02, 0.02), rng.uniform(0.22, 0.27)],
                                "banana": [float(banana_xy[0]) + rng.uniform(-0.02, 0.02), -rng.uniform(0.22, 0.27)]})
    elif task == "push_block":
        half = rng.uniform(0.022, 0.028)
        block_xy = np.array([rng.uniform(0.48, 0.55), rng.uniform(0.2, 0.25)])
        appearance["block"] = _material(spec, rng, "block", rng.uniform(0.1, 0.9, 3), cube=True, repeat=1)
        _add_free(spec, "block", [*block_xy, z0 + half + drop], _yaw_quat(rng.uniform(-0.3, 0.3)),
                  [_box([half] * 3, mass=0.2)], "mat_block")
        objects = (ObjectInfo("block", True, half),)
        layout.update(middle_y=float(rng.uniform(-0.02, 0.02)), goal_y=float(rng.uniform(-0.24, -0.19)),
                      goal_y_max=-0.12)
    elif task == "bimanual_lift":
        half = np.array([rng.uniform(0.055, 0.065), rng.uniform(0.09, 0.105), rng.uniform(0.03, 0.04)])
        pillow_xy = np.array([rng.uniform(0.43, 0.47), rng.uniform(-0.03, 0.03)])
        tray_xy = np.array([rng.uniform(0.64, 0.67), rng.uniform(-0.03, 0.03)])
        appearance["pillow"] = _material(spec, rng, "pillow", rng.uniform(0.4, 0.95, 3), cube=True, repeat=2)
        appearance["tray"] = _material(spec, rng, "tray", rng.uniform(0.1, 0.6, 3))
        soft = dict(solref=[0.03, 0.6], solimp=[0.7, 0.95, 0.01, 0.5, 2])   # compliant: "soft-ish"
        _add_free(spec, "pillow", [*pillow_xy, z0 + half[2] + drop], _yaw_quat(rng.uniform(-0.15, 0.15)),
                  [_box(half.tolist(), mass=0.25)], "mat_pillow", **soft)
        inner = (0.085, 0.145)
        rim_h, base_h, t = 0.03, 0.006, 0.008
        tray_geoms = [_box([inner[0] + t, inner[1] + t, base_h / 2], (0, 0, base_h / 2))]
        for s in (-1, 1):
            tray_geoms.append(_box([t / 2, inner[1] + t, rim_h / 2], (s * (inner[0] + t / 2), 0, rim_h / 2)))
            tray_geoms.append(_box([inner[0] + t, t / 2, rim_h / 2], (0, s * (inner[1] + t / 2), rim_h / 2)))
        _add_static(spec, "tray", [*tray_xy, z0], _yaw_quat(rng.uniform(-0.1, 0.1)), tray_geoms, "mat_tray")
        objects = (ObjectInfo("pillow", True, float(half[2]), ("left", "right")), ObjectInfo("tray", False, rim_h / 2))
        layout.update(pillow_half=half.tolist(), tray_xy=tray_xy.tolist(), tray_inner=list(inner),
                      tray_base_z=z0 + base_h)
    else:  # lid_placement
        box_half = np.array([rng.uniform(0.06, 0.07), rng.uniform(0.06, 0.07), rng.uniform(0.045, 0.055)])
        box_xy = np.array([rng.uniform(0.48, 0.54), rng.uniform(-0.12, -0.07)])
        lid_xy = np.array([rng.uniform(0.48, 0.54), rng.uniform(0.12, 0.16)])
        lid_half = np.array([box_half[0] + 0.008, box_half[1] + 0.008, 0.008])
        appearance["box"] = _material(spec, rng, "box", rng.uniform(0.2, 0.9, 3), cube=True, repeat=1)
        appearance["lid"] = _material(spec, rng, "lid", rng.uniform(0.2, 0.9, 3), cube=True, repeat=1)
        box_yaw = rng.uniform(-0.2, 0.2)
        _add_free(spec, "box", [*box_xy, z0 + box_half[2] + drop], _yaw_quat(box_yaw),
                  [_box(box_half.tolist(), mass=1.5)], "mat_box")
        _add_free(spec, "lid", [*lid_xy, z0 + lid_half[2] + drop], _yaw_quat(box_yaw + rng.uniform(-0.2, 0.2)),
                  [_box(lid_half.tolist(), mass=0.1),
                   dict(type=mujoco.mjtGeom.mjGEOM_CYLINDER, size=[0.012, 0.01, 0], pos=[0, 0, lid_half[2] + 0.01], mass=0.01)],
                  "mat_lid")
        objects = (ObjectInfo("box", True, float(box_half[2])), ObjectInfo("lid", True, float(lid_half[2]), ("left",)))
        layout.update(box_half=box_half.tolist(), lid_half=lid_half.tolist())

    # One (initially inactive) weld per (hand palm, graspable object).
    for obj in objects:
        for side in obj.graspable_by:
            eq = spec.add_equality()
            eq.name = f"grasp_{side}_{obj.name}"
            eq.type = mujoco.mjtEq.mjEQ_WELD
            eq.objtype = mujoco.mjtObj.mjOBJ_BODY
            eq.name1, eq.name2 = f"{side}_palm", obj.name
            eq.active = False
            eq.solref = [0.01, 1.0]
    model = spec.compile()
    return Scene(task=task, seed=seed, model=model, objects=objects, layout=layout,
                 appearance=appearance, xml=spec.to_xml())


def camera_intrinsics(model: mujoco.MjModel, width: int, height: int, camera: str = "head_camera") -> np.ndarray:
    """Pinhole K (OpenCV convention, pixel centres at integers) of a MuJoCo camera rendered at
    width × height (MuJoCo's fovy is vertical; square pixels)."""
    fovy = np.deg2rad(model.cam_fovy[model.camera(camera).id])
    f = (height / 2) / np.tan(fovy / 2)
    return np.array([[f, 0.0, (width - 1) / 2], [0.0, f, (height - 1) / 2], [0.0, 0.0, 1.0]], np.float32)


def camera_pose_opencv(model: mujoco.MjModel, data: mujoco.MjData, camera: str = "head_camera") -> np.ndarray:
    """World ← camera 4×4 in OpenCV axes (x right, y down, z forward); MuJoCo cameras look
    along −z with y up, so the axes are flipped."""
    c = model.camera(camera).id
    t = np.eye(4)
    t[:3, :3] = data.cam_xmat[c].reshape(3, 3) @ np.diag([1.0, -1.0, -1.0])
    t[:3, 3] = data.cam_xpos[c]
    return t
