"""Embodiment model, FK/Jacobians, SE(3) helpers and the DLS IK.

float64 checks run inside `jax.enable_x64(True)` so other test files keep float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from rynn_jax.kinematics import fk, ik, layout, mjcf_model, se3, tracker


@pytest.fixture
def x64():
    # Scoped float64: other test files in the same process keep float32.
    ctx = jax.enable_x64(True) if hasattr(jax, "enable_x64") else jax.experimental.enable_x64()
    with ctx:
        yield


@pytest.fixture(scope="module")
def emb():
    return mjcf_model.embodiment()


def _rot_angle(a_33: np.ndarray, b_33: np.ndarray) -> np.ndarray:
    c = (np.trace(np.swapaxes(a_33, -1, -2) @ b_33, axis1=-2, axis2=-1) - 1.0) / 2.0
    # arccos is ill-conditioned at 1: use the antisymmetric part for tiny angles.
    r = np.swapaxes(a_33, -1, -2) @ b_33
    s = 0.5 * np.linalg.norm(np.stack([r[..., 2, 1] - r[..., 1, 2], r[..., 0, 2] - r[..., 2, 0],
                                       r[..., 1, 0] - r[..., 0, 1]], -1), axis=-1)
    return np.arctan2(s, c)


# ---------------------------------------------------------------- model / layout

def test_model_loads_and_matches_action_layout(emb):
    m = mjcf_model.load_model()
    assert m.nq == m.nv == layout.ACTION_DIM == 54
    names = tuple(m.joint(i).name for i in range(m.njnt))
    assert names == layout.ACTION_NAMES
    assert m.camera("head_camera").id >= 0
    for side in layout.SIDES:
        for s in [f"{side}_ee", f"{side}_elbow", f"{side}_flange"] + [f"{side}_finger{f}_tip" for f in range(1, 6)]:
            assert m.site(s).id >= 0
    assert m.nmesh == 0                                       # capsules/boxes only
    assert np.all(emb.tree.lower_q < emb.tree.upper_q)
    assert np.all((emb.home_q >= emb.tree.lower_q) & (emb.home_q <= emb.tree.upper_q))
    arm, hand = layout.unpack_action(jnp.arange(54.0))
    np.testing.assert_array_equal(layout.pack_action(arm, hand), np.arange(54.0))


# ---------------------------------------------------------------- FK

def test_tree_fk_matches_mujoco_1000_configs_float64(emb, x64):
    m = mjcf_model.load_model()
    d = mujoco.MjData(m)
    rng = np.random.default_rng(0)
    q_bq = rng.uniform(emb.tree.lower_q, emb.tree.upper_q, size=(1000, m.nq))
    body_p, body_r, site_p, site_r = jax.jit(jax.vmap(lambda q: fk.tree_fk(emb.tree, q)))(jnp.asarray(q_bq))
    assert body_p.dtype == jnp.float64
    ref_bp, ref_br, ref_sp, ref_sr = [], [], [], []
    for q in q_bq:
        d.qpos[:] = q
        mujoco.mj_kinematics(m, d)
        ref_bp.append(d.xpos.copy()); ref_br.append(d.xmat.reshape(-1, 3, 3).copy())
        ref_sp.append(d.site_xpos.copy()); ref_sr.append(d.site_xmat.reshape(-1, 3, 3).copy())
    assert np.max(np.abs(np.asarray(body_p) - np.stack(ref_bp))) < 1e-6
    assert np.max(np.abs(np.asarray(site_p) - np.stack(ref_sp))) < 1e-6
    assert np.max(_rot_angle(np.asarray(body_r), np.stack(ref_br))) < 1e-6
    assert np.max(_rot_angle(np.asarray(site_r), np.stack(ref_sr))) < 1e-6


def test_chain_fk_and_jacobians_match_mujoco(emb, x64):
    m = mjcf_model.load_model()
    d = mujoco.MjData(m)
    rng = np.random.default_rng(1)
    for trial in range(5):
        q = rng.uniform(emb.tree.lower_q, emb.tree.upper_q)
        d.qpos[:] = q
        mujoco.mj_kinematics(m, d)
        mujoco.mj_comPos(m, d)
        for s, side in enumerate(layout.SIDES):
            chain = jax.tree.map(lambda a: a[s], emb.arms)
            q_arm = jnp.asarray(q[layout.ARM_SLICES[side]])
            frames = fk.chain_fk(chain, q_arm)
            sid = m.site(f"{side}_ee").id
            np.testing.assert_allclose(frames.tip_44[:3, 3], d.site_xpos[sid], atol=1e-12)
            np.testing.assert_allclose(frames.tip_44[:3, :3], d.site_xmat[sid].reshape(3, 3), atol=1e-12)
            jp, jr = np.zeros((3, m.nv)), np.zeros((3, m.nv))
            mujoco.mj_jacSite(m, d, jp, jr, sid)
            ref = np.vstack([jp, jr])[:, layout.ARM_SLICES[side]]
            np.testing.assert_allclose(fk.geometric_jacobian(frames), ref, atol=1e-12)
            np.testing.assert_allclose(fk.autodiff_jacobian(chain, q_arm), ref, atol=1e-12)
            elbow = frames.anchor_n3[3]
            np.testing.assert_allclose(elbow, d.site_xpos[m.site(f"{side}_elbow").id], atol=1e-12)


def test_fk_float32_jit_vmap_grad(emb):
    chain = jax.tree.map(lambda a: a[0], emb.arms)
    q_b7 = jnp.asarray(np.random.default_rng(2).uniform(chain.lower_n, chain.upper_n, (16, 7)), jnp.float32)
    tips = jax.jit(jax.vmap(lambda q: fk.chain_tip(chain, q)))(q_b7)
    assert tips.dtype == jnp.float32 and tips.shape == (16, 4, 4)
    g = jax.grad(lambda q: fk.chain_tip(chain, q)[0, 3])(q_b7[0])
    np.testing.assert_allclose(g, fk.geometric_jacobian(fk.chain_fk(chain, q_b7[0]))[0], atol=1e-5)


# ---------------------------------------------------------------- SE(3)

def test_se3_roundtrips_and_edge_cases(x64):
    rng = np.random.default_rng(3)
    w = rng.normal(size=(200, 3))
    w = w / np.linalg.norm(w, axis=-1, keepdims=True) * rng.uniform(0, np.pi - 1e-6, (200, 1))
    r = se3.exp_so3(jnp.asarray(w))
    np.testing.assert_allclose(se3.log_so3(r), w, atol=1e-9)
    q = se3.matrix_to_quat(r)
    for qi, ri in zip(np.asarray(q)[:20], np.asarray(r)[:20]):
        ref = np.zeros(4)
        mujoco.mju_mat2Quat(ref, ri.reshape(-1))
        ref = ref * np.sign(ref[0])
        np.testing.assert_allclose(qi, ref, atol=1e-12)
    np.testing.assert_allclose(se3.quat_to_matrix(q), r, atol=1e-12)
    t = se3.make_pose(r[:5], jnp.asarray(rng.normal(size=(5, 3))))
    np.testing.assert_allclose(se3.inverse(t) @ t, np.broadcast_to(np.eye(4), (5, 4, 4)), atol=1e-12)
    # θ = 0 and θ = π: finite values and gradients.
    jac_fn = jax.jit(jax.jacfwd(lambda v: se3.log_so3(se3.exp_so3(v))))
    grad_fn = jax.jit(jax.grad(lambda m: jnp.sum(se3.log_so3(m) ** 2)))
    for w0 in [np.zeros(3), np.array([np.pi, 0, 0]), np.array([0, 1e-9, 0])]:
        assert np.all(np.isfinite(jac_fn(jnp.asarray(w0))))
        assert np.all(np.isfinite(grad_fn(se3.exp_so3(jnp.asarray(w0)))))
    assert abs(float(se3.rotation_angle(se3.exp_so3(jnp.asarray([0.0, 0.0, np.pi])))) - np.pi) < 1e-9


def test_se3_agrees_with_jaxlie(x64):
    jaxlie = pytest.importorskip("jaxlie")
    rng = np.random.default_rng(4)
    for _ in range(10):
        w = rng.normal(size=3)
        ref = jaxlie.SO3.exp(jnp.asarray(w))
        np.testing.assert_allclose(se3.exp_so3(jnp.asarray(w)), ref.as_matrix(), atol=1e-12)
        np.testing.assert_allclose(se3.log_so3(ref.as_matrix()), ref.log(), atol=1e-9)


# ---------------------------------------------------------------- IK

def _arm(emb, s=0):
    return jax.tree.map(lambda a: jnp.asarray(a[s]), emb.arms)


def test_damped_pinv_equals_spec_svd_form(x64):
    rng = np.random.default_rng(5)
    for lam in [1e-3, 0.05]:
        j = jnp.asarray(rng.normal(size=(6, 7)))
        np.testing.assert_allclose(ik.damped_pinv(j, lam), ik.damped_pinv_svd(j, lam), atol=1e-12)
        j_sing = j.at[:, 3].set(j[:, 2])                  # rank-deficient
        np.testing.assert_allclose(ik.damped_pinv(j_sing, lam), ik.damped_pinv_svd(j_sing, lam), atol=1e-10)
        # Tall (the elbow's 3×2 sub-Jacobian, solved through JᵀJ) and the 3×3 / 4×4 Gram paths.
        for shape in [(3, 2), (3, 5), (4, 6)]:
            jt = jnp.asarray(rng.normal(size=shape))
            np.testing.assert_allclose(ik.damped_pinv(jt, lam), ik.damped_pinv_svd(jt, lam), atol=1e-12)


@pytest.fixture(scope="module")
def ik_targets(emb):
    """500 reachable targets per arm (1000 problems): FK of uniform random joints (float32)."""
    rng = np.random.default_rng(6)
    q_b27 = rng.uniform(emb.arms.lower_n, emb.arms.upper_n, size=(500, 2, 7)).astype(np.float32)
    arms = jax.tree.map(jnp.asarray, emb.arms)
    t = jax.jit(jax.vmap(lambda q: jax.vmap(fk.chain_tip)(arms, q)))(jnp.asarray(q_b27))
    return q_b27, t


def _success(res) -> np.ndarray:
    return np.asarray((res.pos_err < 1e-3) & (res.rot_err < np.deg2rad(0.5)))


def test_ik_reaches_random_targets_warm_start(emb, ik_targets):
    """Tracking regime: warm start from a nearby configuration (previous frame)."""
    q_true, t = ik_targets
    arms = jax.tree.map(jnp.asarray, emb.arms)
    q0 = np.clip(q_true + np.random.default_rng(7).normal(0, 0.05, q_true.shape), emb.arms.lower_n, emb.arms.upper_n)
    res = jax.jit(jax.vmap(lambda tt, qq: ik.solve_arms(arms, tt, qq)))(t, jnp.asarray(q0, jnp.float32))
    assert _success(res).mean() >= 0.99
    assert np.all(np.isfinite(res.q_n))
    assert np.all((res.q_n >= emb.arms.lower_n) & (res.q_n <= emb.arms.upper_n))


def test_ik_reaches_random_targets_cold_start_multistart(emb, ik_targets):
    """Cold start from the home pose + 8 fixed seeds (a local method cannot escape every
    joint-limit basin from one start: single-start success is ~80%)."""
    q_true, t = ik_targets
    arms = jax.tree.map(jnp.asarray, emb.arms)
    seeds = ik.default_seeds(arms, k=8)                                   # [2, 8, 7]
    home = jnp.asarray(emb.home_q, jnp.float32)
    q_home = jnp.stack([home[layout.LEFT_ARM], home[layout.RIGHT_ARM]])
    cfg = ik.IKConfig(n_iters=30)
    solve = jax.vmap(lambda c, tt, q, sd: ik.solve_multistart(c, tt, q, sd, None, cfg))
    res = jax.jit(jax.vmap(lambda tt: solve(arms, tt, q_home, seeds)))(t)
    assert _success(res).mean() >= 0.99
    assert np.all((res.q_n >= emb.arms.lower_n) & (res.q_n <= emb.arms.upper_n))


@pytest.fixture(scope="module")
def left_solver(emb):
    """(chain, jitted solve(t, q, elbow), jitted grad_t sum(q_n)(t, q)) shared by tests (one compile each)."""
    chain = _arm(emb)
    solve = jax.jit(lambda t, q, e: ik.solve(chain, t, q, e))
    grad_fn = jax.jit(jax.grad(lambda t, q: jnp.sum(ik.solve(chain, t, q).q_n)))
    return chain, solve, grad_fn


def test_ik_limits_singularities_unreachable(left_solver):
    chain, solve3, grad_fn = left_solver
    solve = lambda t, q: solve3(t, q, jnp.full(3, jnp.nan))
    lo, hi = np.asarray(chain.lower_n), np.asarray(chain.upper_n)
    # Singular configurations: straight elbow (q4 = 0), aligned wrist axes (q6 = 0), both.
    singular = [np.array([0.3, 0.2, -0.5, 0.0, 0.4, 0.5, 0.1]), np.array([0.3, 0.2, -0.5, -1.0, 0.4, 0.0, 0.1]),
                np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])]
    for qs in singular:
        t = fk.chain_tip(chain, jnp.asarray(qs, jnp.float32))
        for eps in [0.0, 1e-4, 1e-2]:
            res = solve(t, jnp.asarray(np.clip(qs + eps, lo, hi), jnp.float32))
            assert np.all(np.isfinite(res.q_n)) and res.pos_err < 1e-3
        assert np.all(np.isfinite(grad_fn(t, jnp.asarray(qs, jnp.float32))))
    # Unreachable (3 m away) and targets beyond the limits: finite, inside the limits.
    far = fk.chain_tip(chain, jnp.zeros(7)).at[:3, 3].add(3.0)
    res = solve(far, jnp.zeros(7))
    assert np.all(np.isfinite(res.q_n)) and np.all((res.q_n >= lo) & (res.q_n <= hi)) and not res.converged


def test_null_space_prior_moves_elbow_not_ee(emb, x64):
    chain = jax.tree.map(lambda a: jnp.asarray(a[0]), emb.arms)
    q = jnp.asarray([0.3, -0.6, -0.8, -1.4, 0.3, 0.2, 0.1])
    frames = fk.chain_fk(chain, q)
    t_ee, elbow = frames.tip_44, frames.anchor_n3[3]
    # Reference: the elbow rotated 0.1 rad about the shoulder–wrist axis (reachable by the
    # self-motion, so a pure null-space move exists).
    axis = frames.tip_44[:3, 3] - frames.anchor_n3[0]
    axis = axis / jnp.linalg.norm(axis)
    ref = frames.anchor_n3[0] + se3.exp_so3(0.1 * axis) @ (elbow - frames.anchor_n3[0])
    cfg = ik.IKConfig()
    q1, e, _ = ik.dls_step(chain, q, t_ee, ref, jnp.asarray(0.5), cfg)
    f1 = fk.chain_fk(chain, q1)
    d_elbow_before = float(jnp.linalg.norm(ref - elbow))
    d_elbow_after = float(jnp.linalg.norm(ref - f1.anchor_n3[3]))
    ee_move = float(jnp.linalg.norm(f1.tip_44[:3, 3] - t_ee[:3, 3]))
    ee_rot = float(se3.rotation_angle(f1.tip_44[:3, :3] @ t_ee[:3, :3].T))
    assert d_elbow_after < 0.95 * d_elbow_before                         # toward the reference
    step = float(jnp.linalg.norm(q1 - q))
    assert ee_move < 0.05 * step ** 2 + 1e-4 and ee_rot < 0.05 * step ** 2 + 1e-4   # first order: none
    # Full solve with the prior: the EE still converges, the elbow ends nearer the reference.
    solve = jax.jit(lambda e: ik.solve(chain, t_ee, q, e, cfg))
    with_prior, without = solve(ref), solve(jnp.full(3, jnp.nan))
    assert with_prior.converged
    assert jnp.linalg.norm(fk.chain_fk(chain, with_prior.q_n).anchor_n3[3] - ref) < \
        0.5 * jnp.linalg.norm(fk.chain_fk(chain, without.q_n).anchor_n3[3] - ref)


def test_ik_gradients_match_finite_differences(emb, x64):
    """d q_out / d (wrist tracker pose, upper-arm tracker, scale s, T_ee) through the tracker
    chain and the fixed-iteration IK, against central differences (float64)."""
    chain = jax.tree.map(lambda a: jnp.asarray(a[0]), emb.arms)
    q_true = jnp.asarray([0.2, -0.5, -0.9, -1.3, 0.2, 0.3, -0.2])
    frames = fk.chain_fk(chain, q_true)
    calib0 = tracker.default_calibration()
    calib0 = calib0._replace(t_base_s44=jnp.asarray(calib0.t_base_s44), t_ee_s44=jnp.asarray(calib0.t_ee_s44))
    targets = jnp.stack([frames.tip_44, frames.tip_44])
    elbows = jnp.stack([frames.anchor_n3[3], frames.anchor_n3[3]]) + jnp.asarray([0.0, 0.02, -0.03])
    trk0 = tracker.trackers_from_targets(calib0, targets, elbows)
    q_init = q_true + 0.05
    w = jnp.asarray(np.random.default_rng(8).normal(size=7))
    cfg = ik.IKConfig(n_iters=30)

    def out(x):   # [wrist translation 3, wrist rotation 3, upper-arm translation 3, scale, T_ee translation 3]
        wrist = trk0[2]
        wrist = se3.make_pose(se3.exp_so3(x[3:6]) @ wrist[:3, :3], wrist[:3, 3] + x[:3])
        upper = trk0[1].at[:3, 3].add(x[6:9])
        calib = calib0._replace(scale=calib0.scale + x[9], t_ee_s44=calib0.t_ee_s44.at[0, :3, 3].add(x[10:13]))
        t, e = tracker.arm_targets(calib, trk0.at[2].set(wrist).at[1].set(upper))
        return jnp.dot(w, ik.solve(chain, t[0], q_init, e[0], cfg).q_n)

    x = jnp.zeros(13)
    g = jax.jit(jax.grad(out))(x)
    eps = 1e-6
    pert = jnp.concatenate([jnp.eye(13), -jnp.eye(13)]) * eps
    vals = jax.jit(jax.vmap(out))(pert)
    fd = np.asarray((vals[:13] - vals[13:]) / (2 * eps))
    np.testing.assert_allclose(g, fd, rtol=1e-4, atol=1e-6)
    assert np.abs(g[:6]).max() > 1e-2 and np.abs(g[6:9]).max() > 1e-4   # target and elbow prior both matter


def test_ik_bad_input_holds_never_nan(emb, left_solver):
    chain, solve, grad_fn = left_solver
    q0 = jnp.asarray(emb.home_q[layout.LEFT_ARM], jnp.float32)
    t = fk.chain_tip(chain, q0 + 0.1)
    no_elbow = jnp.full(3, jnp.nan)
    bad = [t.at[0, 3].set(jnp.nan), t.at[:3, :3].multiply(1.3), t.at[0, 1].add(0.2), jnp.full((4, 4), jnp.inf, jnp.float32)]
    for tb in bad:
        res = solve(tb, q0, no_elbow)
        assert not res.valid and not res.converged
        np.testing.assert_array_equal(res.q_n, q0)                  # hold the warm start
        assert np.all(np.isfinite(grad_fn(tb, q0)))
    res = solve(t, q0.at[2].set(jnp.nan), jnp.asarray([jnp.nan, 0.0, 0.0]))  # NaN warm start / elbow
    assert res.valid and res.converged and np.all(np.isfinite(res.q_n))


def test_ik_agrees_with_mink(emb):
    """Independent solver (mink: MuJoCo kinematics + QP differential IK) on the same targets
    and warm starts: both reach the targets and land on nearby joint solutions."""
    mink = pytest.importorskip("mink")
    m = mjcf_model.load_model()
    chain = _arm(emb)
    rng = np.random.default_rng(9)
    lo, hi = emb.arms.lower_n[0], emb.arms.upper_n[0]
    q_true = rng.uniform(lo + 0.3, hi - 0.3, size=(20, 7))
    q_init = q_true + rng.normal(0, 0.05, q_true.shape)
    tips = jax.jit(jax.vmap(lambda q: fk.chain_tip(chain, q)))(jnp.asarray(q_true, jnp.float32))
    ours = jax.jit(jax.vmap(lambda t, q: ik.solve(chain, t, q)))(tips, jnp.asarray(q_init, jnp.float32))
    conf = mink.Configuration(m)
    task = mink.FrameTask("left_ee", "site", position_cost=1.0, orientation_cost=1.0)
    limits = [mink.ConfigurationLimit(m)]
    diffs, errs = [], []
    for t, q0 in zip(np.asarray(tips, np.float64), q_init):
        q = emb.home_q.copy()
        q[layout.LEFT_ARM] = q0
        conf.update(q)
        task.set_target(mink.SE3.from_rotation_and_translation(mink.SO3.from_matrix(t[:3, :3]), t[:3, 3]))
        for _ in range(60):
            vel = mink.solve_ik(conf, [task], 0.1, "daqp", damping=1e-6, limits=limits)
            conf.integrate_inplace(vel, 0.1)
        err = task.compute_error(conf)
        errs.append(max(np.linalg.norm(err[:3]), np.linalg.norm(err[3:])))
        diffs.append(np.abs(conf.q[layout.LEFT_ARM] - np.asarray(ours.q_n[len(diffs)])).max())
    assert np.all(np.asarray(errs) < 1e-3) and np.all(ours.converged)
    assert np.median(diffs) < 0.05


def test_sigma_max_power_iteration_matches_svd(x64):
    rng = np.random.default_rng(0)
    cases = [rng.standard_normal((6, 7)), rng.standard_normal((3, 2)),
             np.diag([2.0, 2.0 - 1e-9, 1.0, 0.5, 0.1, 0.0])[:, :6] @ np.eye(6, 7),  # σ₁ ≈ σ₂
             np.zeros((6, 7))]
    for j in cases:
        want = np.linalg.svd(j, compute_uv=False)[0]
        np.testing.assert_allclose(float(ik.sigma_max(jnp.asarray(j))), want, rtol=1e-8, atol=1e-12)


def test_right_home_mirrors_left(emb):
    """q_right = MIRROR_SIGNS · q_left is the mirror image (y → −y) of the left arm, link by
    link; the home pose is mirrored that way."""
    arms = jax.tree.map(jnp.asarray, emb.arms)
    q_left = jnp.asarray(np.random.default_rng(3).uniform(-1.0, 1.0, size=(20, 7)))
    fl = jax.vmap(lambda q: fk.chain_fk(jax.tree.map(lambda a: a[0], arms), q))(q_left)
    fr = jax.vmap(lambda q: fk.chain_fk(jax.tree.map(lambda a: a[1], arms), q))(q_left * mjcf_model.MIRROR_SIGNS)
    flip = jnp.asarray([1.0, -1.0, 1.0])
    np.testing.assert_allclose(fr.anchor_n3, fl.anchor_n3 * flip, atol=1e-5)
    np.testing.assert_allclose(fr.tip_44[:, :3, 3], fl.tip_44[:, :3, 3] * flip, atol=1e-5)
    home = emb.home_q
    np.testing.assert_allclose(home[layout.RIGHT_ARM], mjcf_model.MIRROR_SIGNS * home[layout.LEFT_ARM])


def test_reach_clamp_keeps_the_elbow_bent(emb):
    """A target 0.25 m beyond the reach: with `min_elbow_bend` the arm stops with the elbow bent
    by that much, pointing at the target (no straight-elbow singularity); reachable targets
    are left alone."""
    chain = _arm(emb)
    cfg = ik.IKConfig(min_elbow_bend=0.3)
    q = jnp.asarray([0.3, -0.5, -0.6, -1.2, 0.2, 0.3, 0.1])
    t_in = fk.chain_tip(chain, q)
    np.testing.assert_array_equal(ik.clamp_to_reach(chain, t_in, cfg), t_in)
    shoulder = fk.chain_fk(chain, q).anchor_n3[0]
    out = t_in.at[:3, 3].add(0.25 * (t_in[:3, 3] - shoulder) / jnp.linalg.norm(t_in[:3, 3] - shoulder))
    res = jax.jit(lambda t: ik.solve(chain, t, q, None, cfg))(out)
    assert np.all(np.isfinite(res.q_n)) and not res.converged
    assert abs(float(res.q_n[3])) > 0.29                     # elbow still bent (limit −2.53…0)
    pulled = ik.clamp_to_reach(chain, out, cfg)
    # The solver reaches the pulled-in target; the error is reported against the operator's.
    reached = fk.chain_tip(chain, res.q_n)
    assert float(jnp.linalg.norm(reached[:3, 3] - pulled[:3, 3])) < 1e-3
    np.testing.assert_allclose(res.pos_err, jnp.linalg.norm(out[:3, 3] - reached[:3, 3]), rtol=1e-3)
