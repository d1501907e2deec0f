"""Depth-aware skeleton renderer: signed-distance rasterization of joints and bones, pure JAX.

Input per frame: both hands' 21 MediaPipe joints and the elbows in the OpenCV camera frame
(x right, y down, z forward, metres) plus intrinsics K; output an RGB frame (H, W, 3).

Projection: (u, v, 1) ~ K (x, y, z); pixel (row i, column j) has its centre at (u, v) = (j, i)
(OpenCV convention: integer coordinates are pixel centres).

Drawing: every primitive is a capsule in pixel space — a bone is a segment whose radius and color
are interpolated between its endpoints, a joint disc is a zero-length capsule. Coverage of a pixel
is clip(0.5 - sd, 0, 1) with sd the signed distance to the capsule (a one-pixel anti-aliased
edge). Primitives are composited with the "over" operator back to front: sorted by depth (joint
discs at the joint's z minus `joint_depth_bias_m`, so a joint sits on top of the bones meeting
at it; bones at the mean z of their endpoints), ties broken by primitive index — the result is
a deterministic function of the input.

Radius: r_px = radius_m * f / z, f = (fx + fy) / 2, clipped to [min_radius_px, max_radius_px],
so nearer points are drawn larger. Color: the point's depth, normalised over
[depth_near_m, depth_far_m] and clipped, indexes its hand's colormap (skeleton_style.depth_colormap:
dark and saturated when near, pale when far; left hand blue family, right hand red family).

Missing-joint rule (documented contract, tested): a point is *visible* iff its `valid` entry is
true (bool mask) or >= cfg.min_confidence (float confidences; NaN counts as 0), all of its
coordinates are finite, and z > cfg.z_min_m (in front of the camera). Invisible points draw no
disc, and a bone is drawn only if both of its endpoints are visible. Inside the jitted renderer
non-finite joints are therefore *skipped*, never propagated: a frame where the tracker lost some
joints renders the remaining ones. The validating wrappers `render_frame` / `render_video` raise
ValueError for malformed inputs (shapes, non-finite or out-of-range intrinsics) and, with
on_nan="raise", for non-finite joints that are marked valid.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from rynn_jax.render import skeleton_style as sk

Array = jnp.ndarray


@dataclasses.dataclass(frozen=True, kw_only=True)
class RenderConfig:
    """Renderer settings; hashable, so it is a static argument of the jitted functions."""

    width: int = 832  # output width W in pixels
    height: int = 480  # output height H in pixels
    fps: int = 16  # frame rate of rendered pose streams (used by the video writer)
    depth_near_m: float = 0.2  # depth at the near (dark, saturated) end of the colormaps
    depth_far_m: float = 1.2  # depth at the far (pale) end; depths outside are clipped
    z_min_m: float = 0.05  # points with z <= z_min_m (at or behind the camera) are skipped
    min_confidence: float = 0.5  # float `valid` entries below this are skipped
    joint_radius_m: float = 0.007  # physical radius of a joint disc
    bone_radius_m: float = 0.0045  # physical radius (half thickness) of a finger bone
    forearm_radius_m: float = 0.012  # physical radius of the elbow → wrist capsule
    min_radius_px: float = 1.0  # lower clip of every projected radius
    max_radius_px: float = 48.0  # upper clip of every projected radius
    joint_depth_bias_m: float = 0.005  # joint discs sort this much nearer than their depth
    background_rgb: tuple[int, int, int] = (245, 245, 240)  # off-white background, sRGB 0-255
    left_stops_rgb: tuple[tuple[int, int, int], ...] = sk.LEFT_STOPS_RGB  # left map, near → far
    right_stops_rgb: tuple[tuple[int, int, int], ...] = sk.RIGHT_STOPS_RGB  # right colormap
    colormap_size: int = 256  # entries of each colormap lookup table

    def __post_init__(self):
        if self.width < 1 or self.height < 1:
            raise ValueError(f"image size must be positive, got {self.width}x{self.height}")
        if not 0 < self.depth_near_m < self.depth_far_m:
            raise ValueError(f"need 0 < depth_near_m < depth_far_m, got "
                             f"{self.depth_near_m}, {self.depth_far_m}")
        if not 0 < self.min_radius_px <= self.max_radius_px:
            raise ValueError(f"need 0 < min_radius_px <= max_radius_px, got "
                             f"{self.min_radius_px}, {self.max_radius_px}")
        if self.z_min_m <= 0:
            raise ValueError(f"z_min_m must be > 0, got {self.z_min_m}")


def default_intrinsics(cfg: RenderConfig, hfov_deg: float = 69.0) -> np.ndarray:
    """Pinhole K (3, 3) for the config's image: horizontal FOV `hfov_deg` (RealSense D435i color
    camera ≈ 69°), square pixels, principal point at the image centre."""
    f = (cfg.width / 2) / np.tan(np.deg2rad(hfov_deg) / 2)
    return np.array([[f, 0.0, (cfg.width - 1) / 2],
                     [0.0, f, (cfg.height - 1) / 2],
                     [0.0, 0.0, 1.0]], np.float32)


def project_points(K: Array, points_n3: Array) -> tuple[Array, Array]:
    """Pinhole projection of camera-frame points [..., 3] → (uv [..., 2] pixels, z [...])."""
    z = points_n3[..., 2]
    uvw = points_n3 @ K.T
    return uvw[..., :2] / z[..., None], z


def radius_px(cfg: RenderConfig, radius_m, focal, z: Array) -> Array:
    """Projected radius in pixels: radius_m * focal / z clipped to the config's range."""
    return jnp.clip(radius_m * focal / z, cfg.min_radius_px, cfg.max_radius_px)


def depth_colors(cfg: RenderConfig, z_hp: Array) -> Array:
    """Colors [2, P, 3] in sRGB [0, 1] of depths z_hp [2, P] (hand 0 left, hand 1 right)."""
    lut_hn3 = jnp.asarray(np.stack([sk.depth_colormap(cfg.left_stops_rgb, cfg.colormap_size),
                                    sk.depth_colormap(cfg.right_stops_rgb, cfg.colormap_size)]))
    n = cfg.colormap_size
    s = jnp.clip((z_hp - cfg.depth_near_m) / (cfg.depth_far_m - cfg.depth_near_m), 0.0, 1.0)
    x = s * (n - 1)
    i0 = jnp.clip(jnp.floor(x).astype(jnp.int32), 0, n - 2)
    w = (x - i0)[..., None]
    gather = jax.vmap(lambda lut, idx: lut[idx])  # per hand
    return (1 - w) * gather(lut_hn3, i0) + w * gather(lut_hn3, i0 + 1)


def visible_points(cfg: RenderConfig, points_hp3: Array, valid_hp: Array) -> Array:
    """The documented visibility rule (module docstring) → bool [2, 22]."""
    if valid_hp.dtype == jnp.bool_:
        ok = valid_hp
    else:
        ok = valid_hp >= cfg.min_confidence
    finite = jnp.all(jnp.isfinite(points_hp3), axis=-1)
    return ok & finite & (jnp.where(finite, points_hp3[..., 2], 0.0) > cfg.z_min_m)


# Primitive tables (numpy constants): for each primitive, its two endpoint indices and the kind.
_BONE_A = np.array([a for a, _ in sk.BONES])
_BONE_B = np.array([b for _, b in sk.BONES])
_DISC = np.array(sk.DISC_POINTS)


def _primitives(cfg: RenderConfig, uv_hp2, z_hp, vis_hp, focal):
    """Per-primitive capsule parameters, sorted far → near; leading dim 2 · (discs + bones)."""
    # Sanitise invisible points so no NaN/inf reaches the arithmetic (they are masked anyway).
    uv_hp2 = jnp.where(vis_hp[..., None], uv_hp2, 0.0)
    z_hp = jnp.where(vis_hp, z_hp, 1.0)
    col_hp3 = depth_colors(cfg, z_hp)
    is_forearm = np.array([bone == sk.FOREARM_BONE for bone in sk.BONES])
    bone_rm = np.where(is_forearm, cfg.forearm_radius_m, cfg.bone_radius_m)
    r_joint_hp = radius_px(cfg, cfg.joint_radius_m, focal, z_hp)

    def per_hand(uv_p2, z_p, vis_p, col_p3, rj_p):
        # Discs: zero-length capsules.
        disc = dict(a=uv_p2[_DISC], b=uv_p2[_DISC], ra=rj_p[_DISC], rb=rj_p[_DISC],
                    ca=col_p3[_DISC], cb=col_p3[_DISC], on=vis_p[_DISC],
                    key=z_p[_DISC] - cfg.joint_depth_bias_m)
        bone = dict(a=uv_p2[_BONE_A], b=uv_p2[_BONE_B],
                    ra=radius_px(cfg, bone_rm, focal, z_p[_BONE_A]),
                    rb=radius_px(cfg, bone_rm, focal, z_p[_BONE_B]),
                    ca=col_p3[_BONE_A], cb=col_p3[_BONE_B], on=vis_p[_BONE_A] & vis_p[_BONE_B],
                    key=0.5 * (z_p[_BONE_A] + z_p[_BONE_B]))
        return jax.tree.map(lambda d, b: jnp.concatenate([b, d]), disc, bone)

    prims = jax.vmap(per_hand)(uv_hp2, z_hp, vis_hp, col_hp3, r_joint_hp)
    prims = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), prims)
    # Far first; invisible ones are no-ops, put them first too. Stable sort → deterministic.
    key = jnp.where(prims["on"], prims["key"], jnp.inf)
    order = jnp.argsort(-key, stable=True)
    return jax.tree.map(lambda x: x[order], prims)


def render_projected(cfg: RenderConfig, uv_hp2: Array, z_hp: Array, vis_hp: Array,
                     focal) -> Array:
    """Renders already-projected points (the "2D joints + depth" entry point).

    uv_hp2 [2, 22, 2] pixel coordinates, z_hp [2, 22] camera depths (m), vis_hp [2, 22] bool,
    focal: scalar focal length in pixels (sets r_px = r_m * focal / z). Returns float32
    (H, W, 3) in [0, 1]. Pure, jit- and vmap-able; does not validate.
    """
    prims = _primitives(cfg, uv_hp2, z_hp, vis_hp, focal)
    v_h = jnp.arange(cfg.height, dtype=jnp.float32)[:, None]
    u_w = jnp.arange(cfg.width, dtype=jnp.float32)[None, :]
    bg = jnp.asarray(cfg.background_rgb, jnp.float32) / 255.0
    img_hw3 = jnp.broadcast_to(bg, (cfg.height, cfg.width, 3))

    def draw(img_hw3, p):
        ba = p["b"] - p["a"]
        pu, pv = u_w - p["a"][0], v_h - p["a"][1]
        t = jnp.clip((pu * ba[0] + pv * ba[1]) / jnp.maximum(ba @ ba, 1e-12), 0.0, 1.0)
        du, dv = pu - t * ba[0], pv - t * ba[1]
        sd = jnp.sqrt(du * du + dv * dv) - (p["ra"] + t * (p["rb"] - p["ra"]))
        cov = jnp.where(p["on"], jnp.clip(0.5 - sd, 0.0, 1.0), 0.0)[..., None]
        color = p["ca"] + t[..., None] * (p["cb"] - p["ca"])
        return img_hw3 + cov * (color - img_hw3), None

    # unroll=4 lets XLA fuse four primitives per pass over the image (~1.4x faster on CPU).
    img_hw3, _ = jax.lax.scan(draw, img_hw3, prims, unroll=4)
    return img_hw3


def _stack_points(joints_hj3: Array, elbows_h3: Array) -> Array:
    return jnp.concatenate([joints_hj3, elbows_h3[:, None, :]], axis=1)  # [2, 22, 3]


@functools.partial(jax.jit, static_argnums=0)
def render_frame_unchecked(cfg: RenderConfig, joints_hj3: Array, elbows_h3: Array, K: Array,
                           valid_hp: Array) -> Array:
    """The pure renderer: joints [2, 21, 3], elbows [2, 3] (camera frame, m), K [3, 3],
    valid [2, 22] (bool, or float confidence) → float32 (H, W, 3) in [0, 1]. No validation;
    jit- and vmap-able (the config is static)."""
    points_hp3 = _stack_points(joints_hj3, elbows_h3).astype(jnp.float32)
    K = K.astype(jnp.float32)
    vis_hp = visible_points(cfg, points_hp3, valid_hp)
    safe_hp3 = jnp.where(vis_hp[..., None], points_hp3, jnp.array([0.0, 0.0, 1.0]))
    uv_hp2, z_hp = project_points(K, safe_hp3)
    return render_projected(cfg, uv_hp2, z_hp, vis_hp, 0.5 * (K[0, 0] + K[1, 1]))


@functools.partial(jax.jit, static_argnums=0)
def render_video_unchecked(cfg: RenderConfig, joints_thj3: Array, elbows_th3: Array, K: Array,
                           valid_thp: Array) -> Array:
    """`render_frame_unchecked` vmapped over time: [T, ...] inputs → float32 (T, H, W, 3).
    K is [3, 3] (shared) or [T, 3, 3]."""
    k_axis = 0 if K.ndim == 3 else None
    return jax.vmap(render_frame_unchecked, in_axes=(None, 0, 0, k_axis, 0))(
        cfg, joints_thj3, elbows_th3, K, valid_thp)


def to_uint8(img: Array) -> Array:
    """float [0, 1] → uint8 with round-half-up."""
    return jnp.floor(jnp.clip(img, 0.0, 1.0) * 255.0 + 0.5).astype(jnp.uint8)


# ----------------------------------------------------------------------------- validation

def _concrete(x) -> np.ndarray | None:
    """x as a numpy array, or None when it is a tracer (value checks are then skipped)."""
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def _check_shape(name: str, x, shape: tuple[int, ...]):
    if tuple(np.shape(x)) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(np.shape(x))}")


def _check_intrinsics(cfg: RenderConfig, K, lead: tuple[int, ...]):
    if tuple(np.shape(K)) not in ((3, 3), lead + (3, 3)):
        raise ValueError(f"K must have shape (3, 3){' or ' + str(lead + (3, 3)) if lead else ''},"
                         f" got {tuple(np.shape(K))}")
    k = _concrete(K)
    if k is None:
        return
    k = k.reshape(-1, 3, 3).astype(np.float64)
    if not np.all(np.isfinite(k)):
        raise ValueError("K contains non-finite values")
    fx, fy, cx, cy = k[:, 0, 0], k[:, 1, 1], k[:, 0, 2], k[:, 1, 2]
    if np.any(fx <= 0) or np.any(fy <= 0):
        raise ValueError(f"focal lengths must be > 0, got fx={fx.min()}, fy={fy.min()}")
    if np.any((cx < 0) | (cx > cfg.width - 1) | (cy < 0) | (cy > cfg.height - 1)):
        raise ValueError(f"principal point must lie inside the {cfg.width}x{cfg.height} image "
                         f"(0 <= cx <= {cfg.width - 1}, 0 <= cy <= {cfg.height - 1}), got "
                         f"cx in [{cx.min()}, {cx.max()}], cy in [{cy.min()}, {cy.max()}]")
    if not np.allclose(k[:, 2], [0.0, 0.0, 1.0]) or np.any(k[:, 1, 0] != 0):
        raise ValueError(f"K must be upper-triangular with last row [0, 0, 1], got {k[0].tolist()}")


def _check_points(cfg: RenderConfig, joints, elbows, valid, on_nan: str,
                  lead: tuple[int, ...]):
    if on_nan not in ("skip", "raise"):
        raise ValueError(f"on_nan must be 'skip' or 'raise', got {on_nan!r}")
    _check_shape("joints_cam", joints, lead + (2, sk.NUM_HAND_JOINTS, 3))
    _check_shape("elbows_cam", elbows, lead + (2, 3))
    if valid is not None:
        _check_shape("valid", valid, lead + (2, sk.NUM_POINTS))
    if on_nan == "raise":
        j, e = _concrete(joints), _concrete(elbows)
        if j is None or e is None:
            return
        pts = np.concatenate([j, e[..., None, :]], axis=-2)
        bad = ~np.all(np.isfinite(pts), axis=-1)
        if valid is not None and (v := _concrete(valid)) is not None:
            bad &= v if v.dtype == bool else v >= cfg.min_confidence
        if bad.any():
            idx = [tuple(int(i) for i in row) for row in np.argwhere(bad)[:8]]
            raise ValueError(f"non-finite joint coordinates at (…, hand, point) {idx} "
                             f"({int(bad.sum())} in total; point 21 is the elbow)")


def _default_valid(lead: tuple[int, ...]) -> Array:
    return jnp.ones(lead + (2, sk.NUM_POINTS), jnp.bool_)


def render_frame(cfg: RenderConfig, joints_cam, elbows_cam, K, valid=None, *,
                 on_nan: str = "skip", as_uint8: bool = True) -> Array:
    """Validating renderer for one frame.

    joints_cam [2, 21, 3] (hand 0 left, 1 right; MediaPipe order), elbows_cam [2, 3], both in
    the OpenCV camera frame in metres; K [3, 3]; valid [2, 22] bool or confidence (index 21 =
    elbow), default all valid. on_nan="skip" skips non-finite joints (module rule); "raise"
    raises ValueError for non-finite joints that are marked valid. Returns (H, W, 3) uint8, or
    float32 in [0, 1] with as_uint8=False. Raises ValueError on wrong shapes and on non-finite or
    out-of-range intrinsics (fx, fy <= 0, principal point outside the image).
    """
    _check_points(cfg, joints_cam, elbows_cam, valid, on_nan, ())
    _check_intrinsics(cfg, K, ())
    valid = _default_valid(()) if valid is None else jnp.asarray(valid)
    img = render_frame_unchecked(cfg, jnp.asarray(joints_cam), jnp.asarray(elbows_cam),
                                 jnp.asarray(K), valid)
    return to_uint8(img) if as_uint8 else img


def render_video(cfg: RenderConfig, joints_cam, elbows_cam, K, valid=None, *,
                 on_nan: str = "skip", as_uint8: bool = True) -> Array:
    """`render_frame` over time via jax.vmap: joints [T, 2, 21, 3], elbows [T, 2, 3],
    K [3, 3] or [T, 3, 3], valid [T, 2, 22] or None → (T, H, W, 3)."""
    if np.ndim(joints_cam) != 4:
        raise ValueError(f"joints_cam must have shape (T, 2, 21, 3), got {np.shape(joints_cam)}")
    lead = (np.shape(joints_cam)[0],)
    _check_points(cfg, joints_cam, elbows_cam, valid, on_nan, lead)
    _check_intrinsics(cfg, K, lead)
    valid = _default_valid(lead) if valid is None else jnp.asarray(valid)
    vid = render_video_unchecked(cfg, jnp.asarray(joints_cam), jnp.asarray(elbows_cam),
                                 jnp.asarray(K), valid)
    return to_uint8(vid) if as_uint8 else vid
