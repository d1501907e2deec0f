"""Differentiable damped-least-squares IK for the 7-DoF arms (RynnWorld-Teleop, Appendix B).

One iteration, exactly the paper's recipe:
    e        = [p_t − p ; log(R_t Rᵀ)]                       6-D task error (world frame)
    J = UΣVᵀ, λ = λ_min + 0.01 / (1 + σ_max)                 adaptive damping
    J#_λ     = V diag(σ_i / (σ_i² + λ²)) Uᵀ                  damped pseudo-inverse
    Δq       = J#_λ e
    Δq      += (I − J#_λ J) w (q_ref − q)                    null-space shoulder prior
    q        ← clip(q + Δq, q_min, q_max)                    hard joint limits
where q_ref comes from a partial IK that moves the elbow (M6 joint 4 origin) toward the
upper-arm tracker's reference using only the 3×2 sub-Jacobian of q0, q1, and w = 0.5 on them.

We evaluate J#_λ e as Jᵀ(JJᵀ + λ²I)⁻¹ e (or (JᵀJ + λ²I)⁻¹Jᵀ e for a tall J), the same matrix
in closed form (V diag(σ/(σ²+λ²)) Uᵀ, tested to 1e-12): it needs only σ_max, taken from the
same small Gram matrix (closed form for 2×2, else power iteration by repeated squaring; no SVD,
which is slow batched on GPUs), so the solver stays differentiable at singular arms. The 6×6
SPD system is solved in closed form by 3×3 blocks: on CPU the real-time step is bound by the
number of kernels it launches (LU with its pivot loop, or an unrolled Cholesky, cost more).

λ is computed once per iteration from the arm's full Jacobian and also damps the re-solve
with limit-bound joints pinned (`pin_saturated`). With `min_elbow_bend` > 0 (the teleop
retargeter's setting) targets beyond the arm's reach are first pulled in (`clamp_to_reach`).

Static shapes: a fixed `n_iters` loop (lax.fori_loop, reverse-differentiable) with a
per-problem "done" mask that freezes a solution once it meets the tolerances; one extra trip
only evaluates, so the reported error is that of the returned q without a final FK. `vmap`
over arms, time steps and sessions. Bad targets (non-finite, non-orthonormal) hold the warm
start.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rynn_jax.kinematics import fk, se3
from rynn_jax.kinematics.mjcf_model import Chain

Array = jnp.ndarray


@dataclasses.dataclass(frozen=True, kw_only=True)
class IKConfig:
    n_iters: int = 24             # fixed iteration count (static loop length)
    lambda_min: float = 1e-3      # λ_min of the adaptive damping
    lambda_gain: float = 0.01     # λ = λ_min + lambda_gain / (1 + σ_max)   (paper: 0.01)
    elbow_weight: float = 0.5     # w on the shoulder joints q0, q1           (paper: 0.5)
    elbow_joint: int = 3          # elbow point = origin of this joint (M6 joint 4)
    pin_saturated: bool = True   # re-solve with limit-bound joints pinned (see dls_step)
    max_step: float = 0.4         # per-iteration ‖Δq‖∞ cap [rad]; keeps far targets stable
    tol_pos: float = 1e-4         # done when ‖e_p‖ < tol_pos [m] ...
    tol_rot: float = 1e-3         # ... and ‖e_r‖ < tol_rot [rad] ...
    tol_null: float = 1e-3        # ... and the null-space step is below this [rad]
    early_exit: bool = False      # True: while_loop that stops when done (latency; no reverse AD)
    ortho_tol: float = 1e-3       # targets with ‖RᵀR − I‖ above this are rejected (held)
    min_elbow_bend: float = 0.0   # [rad] > 0: targets beyond the reach this elbow bend allows are
                                  # pulled in (`clamp_to_reach`; the retargeter uses 0.3 ≈ 7 mm)
    wrist_joint: int = 4          # spherical wrist centre = origin of this joint (M6 joint 5)


class IKResult(NamedTuple):
    q_n: Array           # joint solution (warm start if the target was rejected)
    pos_err: Array       # final ‖p_t − p‖ [m]
    rot_err: Array       # final rotation error [rad]
    converged: Array     # met tol_pos and tol_rot
    valid: Array         # target was usable (finite, orthonormal)
    iters: Array         # iterations that actually updated q


def _inv3(m_33: Array, det_floor: Array) -> Array:
    """Closed-form inverse of a 3×3 SPD matrix (adjugate / determinant), all elementwise.
    The determinant is floored (`det_floor` ≤ its exact value) so round-off can never make
    it zero or negative at a singular arm."""
    c0, c1, c2 = m_33[:, 0], m_33[:, 1], m_33[:, 2]
    adj = jnp.stack([jnp.cross(c1, c2), jnp.cross(c2, c0), jnp.cross(c0, c1)])   # rows of det·M⁻¹
    return adj / jnp.maximum(jnp.dot(c0, adj[0]), det_floor)


def _spd_solve(a_mm: Array, b_mk: Array, floor: Array) -> Array:
    """X = A⁻¹ B for a small symmetric positive-definite A whose eigenvalues are ≥ `floor`.

    m ≤ 3: closed-form inverse; m = 6 (the arm's J Jᵀ): 3×3 blocks and their Schur complement
    (both SPD with eigenvalues ≥ floor); else LAPACK Cholesky. Why not jnp.linalg.solve: on CPU
    it is an LU call plus a while loop turning pivots into a permutation, and an IK iteration is
    bound by the number of kernels it launches, not by its flops."""
    m = a_mm.shape[-1]
    if m == 1:
        return b_mk / jnp.maximum(a_mm, floor)
    if m == 2:
        a, b, d = a_mm[0, 0], a_mm[0, 1], a_mm[1, 1]
        inv = jnp.stack([jnp.stack([d, -b]), jnp.stack([-b, a])]) / jnp.maximum(a * d - b * b, floor ** 2)
        return inv @ b_mk
    if m == 3:
        return _inv3(a_mm, floor ** 3) @ b_mk
    if m == 6:
        p_inv = _inv3(a_mm[:3, :3], floor ** 3)
        w = p_inv @ a_mm[:3, 3:]                                            # P⁻¹ Q
        s_inv = _inv3(a_mm[3:, 3:] - a_mm[3:, :3] @ w, floor ** 3)           # Schur complement
        x2 = s_inv @ (b_mk[3:] - w.T @ b_mk[:3])
        return jnp.concatenate([p_inv @ b_mk[:3] - w @ x2, x2], axis=0)
    return jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(a_mm, lower=True), b_mk)


def _gram(j_mn: Array) -> Array:
    """The smaller Gram matrix: J Jᵀ (m ≤ n) or Jᵀ J. Both have eigenvalues σ_i²."""
    return j_mn @ j_mn.T if j_mn.shape[0] <= j_mn.shape[1] else j_mn.T @ j_mn


def _sigma_max_gram(g_mm: Array, squarings: int = 4) -> Array:
    """√λ_max of a Gram matrix. 2×2: closed form. Larger: power iteration from a fixed start,
    done as `squarings` matrix squarings (G^16 v₀ for 4: the same vector as 16 mat-vec
    iterations in a quarter of the sequential kernels). The Rayleigh quotient is accurate
    even when σ₁ ≈ σ₂ (any vector in their span gives ≈ σ₁²), the slow case of the iteration."""
    tiny = jnp.finfo(g_mm.dtype).tiny
    m = g_mm.shape[-1]
    if m == 1:
        return jnp.sqrt(jnp.maximum(g_mm[0, 0], tiny))
    if m == 2:
        a, b, d = g_mm[0, 0], g_mm[0, 1], g_mm[1, 1]
        disc = jnp.sqrt(jnp.maximum(0.25 * (a - d) ** 2 + b * b, tiny))   # floors keep grads finite
        return jnp.sqrt(jnp.maximum(0.5 * (a + d) + disc, tiny))
    p = g_mm / jnp.maximum(jnp.trace(g_mm), tiny)       # eigenvalues in [0, 1]: powers cannot overflow
    for _ in range(squarings):
        p = p @ p
    # A fixed start with distinct entries: never orthogonal to the top eigenvector in practice.
    v = p @ jnp.linspace(1.0, 2.0, m, dtype=g_mm.dtype)
    v = v * jax.lax.rsqrt(jnp.maximum(v @ v, tiny))
    return jnp.sqrt(jnp.maximum(v @ (g_mm @ v), tiny))


def sigma_max(j_mn: Array) -> Array:
    """Largest singular value of J (see `_sigma_max_gram`)."""
    return _sigma_max_gram(_gram(j_mn))


def adaptive_lambda(j_mn: Array, cfg: IKConfig) -> Array:
    """The paper's λ = λ_min + gain / (1 + σ_max(J))."""
    return cfg.lambda_min + cfg.lambda_gain / (1.0 + sigma_max(j_mn))


def damped_apply(j_mn: Array, rhs_mk: Array, lam: Array | None = None,
                 cfg: IKConfig = IKConfig()) -> Array:
    """J#_λ · rhs ([n, k]) through the smaller Gram matrix: Jᵀ(JJᵀ + λ²I)⁻¹ rhs for a wide J,
    (JᵀJ + λ²I)⁻¹Jᵀ rhs for a tall one (equal matrices). lam=None: the adaptive λ of `cfg`,
    with σ_max from the same Gram matrix."""
    g = _gram(j_mn)
    if lam is None:
        lam = cfg.lambda_min + cfg.lambda_gain / (1.0 + _sigma_max_gram(g))
    lam2 = jnp.asarray(lam * lam, g.dtype)
    a = g + lam2 * jnp.eye(g.shape[0], dtype=g.dtype)
    if j_mn.shape[0] <= j_mn.shape[1]:
        return j_mn.T @ _spd_solve(a, rhs_mk, 0.5 * lam2)
    return _spd_solve(a, j_mn.T @ rhs_mk, 0.5 * lam2)


def damped_pinv(j_mn: Array, lam: Array) -> Array:
    """J#_λ (n × m); equals V diag(σ/(σ²+λ²)) Uᵀ."""
    return damped_apply(j_mn, jnp.eye(j_mn.shape[0], dtype=j_mn.dtype), lam)


def damped_pinv_svd(j_mn: Array, lam: Array) -> Array:
    """The paper's literal SVD form (reference for tests; not differentiable at σ_i = σ_j)."""
    u, s, vt = jnp.linalg.svd(j_mn, full_matrices=False)
    return (vt.T * (s / (s * s + lam * lam))) @ u.T


def _target_ok(t_44: Array, cfg: IKConfig) -> Array:
    finite = jnp.all(jnp.isfinite(t_44))
    safe = jnp.where(finite, t_44, jnp.eye(4, dtype=t_44.dtype))
    return finite & (se3.orthonormality_error(safe[:3, :3]) < cfg.ortho_tol)


def clamp_to_reach(chain: Chain, t_target_44: Array, cfg: IKConfig) -> Array:
    """Pull a target whose wrist centre lies beyond the reach the arm has with its elbow still
    bent by `min_elbow_bend` back onto that sphere about the shoulder (orientation kept).

    Why: an operator reaching further than the robot (s = 1.5 scales the reach) otherwise drives
    the arm into the straight-elbow singularity, where the paper's small λ lets the wrist roll
    joints swing ±0.4 rad per iteration along directions the task barely sees. On the M6 the
    shoulder (joints 1-3) and wrist (5-7) axes meet in points, so the shoulder → wrist-centre
    distance depends on the elbow angle alone and the pulled-in target is reachable."""
    dt = t_target_44.dtype
    if cfg.min_elbow_bend <= 0:
        return t_target_44
    k = cfg.elbow_joint
    # Geometry of the chain only: evaluated at trace time when the chain is a constant (no
    # kernels in the real-time step), traced (and loop-hoisted by XLA) when it is an argument.
    with jax.ensure_compile_time_eval():
        bend = jnp.where(chain.lower_n[k] <= -cfg.min_elbow_bend, -cfg.min_elbow_bend, cfg.min_elbow_bend)
        bent = fk.chain_fk(chain, jnp.zeros(chain.lower_n.shape, dt).at[k].set(bend.astype(dt)))
        shoulder, wrist = bent.anchor_n3[0], bent.anchor_n3[cfg.wrist_joint]
        r_max = jnp.linalg.norm(wrist - shoulder)
        wrist_in_tip = bent.tip_44[:3, :3].T @ (wrist - bent.tip_44[:3, 3])    # constant: spherical wrist
    v = t_target_44[:3, 3] + t_target_44[:3, :3] @ wrist_in_tip - shoulder
    shrink = jnp.minimum(1.0, r_max / jnp.maximum(jnp.linalg.norm(v), 1e-9)) - 1.0
    return t_target_44.at[:3, 3].add(shrink * v)


def _dls_update(jac: Array, e: Array, prior: Array, lam: Array) -> tuple[Array, Array]:
    """Δq = J#_λ e + (I − J#_λ J) prior; also returns the null-space part. One factorisation
    serves both right-hand sides (e and J·prior)."""
    x = damped_apply(jac, jnp.stack([e, jac @ prior], axis=-1), lam)
    dq_null = prior - x[:, 1]
    return x[:, 0] + dq_null, dq_null


def dls_step(chain: Chain, q_n: Array, t_target_44: Array, elbow_ref_3: Array,
             elbow_w: Array, cfg: IKConfig) -> tuple[Array, Array, Array]:
    """One DLS iteration. Returns (q_next, task error e_6 at q, null-space step norm)."""
    frames = fk.chain_fk(chain, q_n)
    e = se3.pose_error(t_target_44, frames.tip_44)
    jac = fk.geometric_jacobian(frames)
    # Partial IK for the shoulder: move the elbow toward its reference with q0, q1 only.
    elbow = frames.anchor_n3[cfg.elbow_joint]
    je = fk.point_jacobian(frames, elbow, 2)
    dq_shoulder = damped_apply(je, (elbow_ref_3 - elbow)[:, None], cfg=cfg)[:, 0]
    prior = jnp.zeros_like(q_n).at[:2].set(elbow_w * dq_shoulder)          # w (q_ref − q)
    lower, upper = chain.lower_n.astype(q_n.dtype), chain.upper_n.astype(q_n.dtype)
    lam = adaptive_lambda(jac, cfg)          # once per iteration, from the arm's full Jacobian
    dq, dq_null = _dls_update(jac, e, prior, lam)
    if cfg.pin_saturated:
        # Joints whose step would cross a limit are pinned at it and drop out of J; the free
        # joints absorb the remaining task error (clipping alone stalls next to a limit).
        free = ((q_n + dq >= lower) & (q_n + dq <= upper)).astype(q_n.dtype)
        pinned = (1.0 - free) * (jnp.clip(q_n + dq, lower, upper) - q_n)
        dq, dq_null = _dls_update(jac * free, e - jac @ pinned, prior * free, lam)
        dq = dq + pinned
    # Cap the step (uniform scaling keeps its direction), then hard-clip to the limits.
    dq = dq * jnp.minimum(1.0, cfg.max_step / jnp.maximum(jnp.max(jnp.abs(dq)), 1e-12))
    q_next = jnp.clip(q_n + dq, lower, upper)
    return q_next, e, jnp.max(jnp.abs(dq_null))


def solve(chain: Chain, t_target_44: Array, q_init_n: Array, elbow_ref_3: Array | None = None,
          cfg: IKConfig = IKConfig()) -> IKResult:
    """Solve one arm. `elbow_ref_3` (base frame) switches the null-space prior on; pass NaN
    (or None) for no prior. vmap over arms / time / sessions; grad w.r.t. target & elbow ref."""
    dt = q_init_n.dtype
    lower, upper = chain.lower_n.astype(dt), chain.upper_n.astype(dt)
    q0 = jnp.clip(jnp.where(jnp.isfinite(q_init_n), q_init_n, 0.5 * (lower + upper)), lower, upper)
    valid = _target_ok(t_target_44, cfg)
    # A rejected target is swapped for the identity before any arithmetic and the loop is
    # stopped at once, so NaN can reach neither the solution nor its gradient.
    t_safe = jnp.where(valid, t_target_44, jnp.eye(4, dtype=dt))
    t_reach = clamp_to_reach(chain, t_safe, cfg)
    if elbow_ref_3 is None:
        elbow_ref_3 = jnp.full(3, jnp.nan, dt)
    has_elbow = jnp.all(jnp.isfinite(elbow_ref_3)) & (cfg.elbow_weight > 0)
    elbow_safe = jnp.where(has_elbow, elbow_ref_3, 0.0)
    elbow_w = jnp.where(has_elbow, cfg.elbow_weight, 0.0).astype(dt)

    # Trip k evaluates the error at q_k and then updates q unless done (or k = n_iters), so the
    # error of the returned q is the last one evaluated: no FK after the loop.
    def trip(q, k):
        q_next, e, null = dls_step(chain, q, t_reach, elbow_safe, elbow_w, cfg)
        done = ((jnp.linalg.norm(e[:3]) < cfg.tol_pos) & (jnp.linalg.norm(e[3:]) < cfg.tol_rot)
                & (null < cfg.tol_null)) | ~valid
        stop = done | (k >= cfg.n_iters)
        return jnp.where(stop, q, q_next), e, stop, (~stop).astype(jnp.int32)

    init = (q0, jnp.zeros(6, dt), jnp.zeros((), bool), jnp.zeros((), jnp.int32))
    if cfg.early_exit:
        # Real-time path: stop as soon as the tolerances hold (forward-mode AD only).
        def body(c):
            q, e, stop, upd = trip(c[0], c[3])
            return q, e, stop, c[3] + upd

        q, e, _, iters = jax.lax.while_loop(lambda c: ~c[2], body, init)
    else:
        def body(k, c):
            q, e, stop, upd = trip(c[0], k)
            return q, e, stop, c[3] + upd

        q, e, _, iters = jax.lax.fori_loop(0, cfg.n_iters + 1, body, init)
    # Errors are reported against the operator's target, not the pulled-in one.
    pos_err = jnp.where(valid, jnp.linalg.norm(e[:3] + t_safe[:3, 3] - t_reach[:3, 3]), 0.0)
    rot_err = jnp.where(valid, jnp.linalg.norm(e[3:]), 0.0)
    q = jnp.where(valid, q, q0)
    return IKResult(q, pos_err, rot_err, (pos_err < cfg.tol_pos) & (rot_err < cfg.tol_rot) & valid,
                    valid, iters)


def solve_arms(arms: Chain, t_target_s44: Array, q_init_s7: Array,
               elbow_ref_s3: Array | None = None, cfg: IKConfig = IKConfig()) -> IKResult:
    """Both arms at once (vmap over the stacked left/right chains). Add leading batch axes
    (time, sessions) with further `jax.vmap(..., in_axes=(None, 0, 0, 0))`."""
    if elbow_ref_s3 is None:
        elbow_ref_s3 = jnp.full(q_init_s7.shape[:-1] + (3,), jnp.nan, q_init_s7.dtype)
    return jax.vmap(lambda c, t, q, e: solve(c, t, q, e, cfg))(arms, t_target_s44, q_init_s7, elbow_ref_s3)


def solve_multistart(chain: Chain, t_target_44: Array, q_init_n: Array, seeds_kn: Array,
                     elbow_ref_3: Array | None = None, cfg: IKConfig = IKConfig()) -> IKResult:
    """Cold-start solve: run the warm start plus K fixed seeds in parallel and keep the warm
    start if it converged (continuity), else the lowest-error seed. A local method alone
    cannot escape every joint-limit basin of the M6; a handful of seeds does (see tests)."""
    starts = jnp.concatenate([q_init_n[None], seeds_kn.astype(q_init_n.dtype)], axis=0)
    res = jax.vmap(lambda q: solve(chain, t_target_44, q, elbow_ref_3, cfg))(starts)
    score = res.pos_err + 0.1 * res.rot_err + jnp.where(res.converged, 0.0, 1.0)
    best = jnp.where(res.converged[0], 0, jnp.argmin(score))
    return jax.tree.map(lambda a: a[best], res)


def default_seeds(chain: Chain, k: int = 8, seed: int = 0) -> jnp.ndarray:
    """K reproducible seeds spread uniformly inside the joint limits (numpy → [..., K, n])."""
    rng = np.random.default_rng(seed)
    lo, hi = np.asarray(chain.lower_n), np.asarray(chain.upper_n)
    u = rng.uniform(size=(k,) + lo.shape)
    return jnp.asarray(np.moveaxis(lo + u * (hi - lo), 0, -2))
