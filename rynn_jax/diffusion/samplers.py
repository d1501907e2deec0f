"""Flow-matching samplers for the bidirectional DiT: Euler and FlowUniPC (bh2, order 2).

The model is seen through one pure function, `velocity_fn(x_bthwc, t_bf) -> v_bthwc`, with a
per-frame timestep so that TI2V can give the clean first frame t = 0. Schedules are static:
every per-step scalar (sigmas, timesteps, UniPC weights) is computed on the host in float64
and fed to a `lax.scan`, so a whole sampler is one jittable function of the noise with no
control flow and no log(0) on the device.

UniPC follows Wan2.2's FlowUniPCMultistepScheduler (data prediction, B(h) = expm1(-h)):
  * x0 prediction from flow output: m_i = x_i - sigma_i * v_i.
  * predictor order min(2, i + 1, N - i): first-order warm-up and a first-order final step
    (which lands exactly on m_{N-1} since sigma_N = 0);
  * corrector (UniC) before every predictor except the first, with the order the previous
    predictor used; it re-uses the model output at the predicted point, so each step costs one
    model evaluation, and the corrected sample is never itself fed to the model.
Both updates are linear in (x, m_i, m_{i-1}, m_{i-2}), so each is stored as a handful of weights.
"""

from typing import Any, Callable, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rynn_jax.diffusion import x0_euler
from rynn_jax.diffusion.schedules import NUM_TRAIN_TIMESTEPS, flow_sigmas, flow_timesteps

# (x_bthwc, t_bf) -> v_bthwc: the DiT velocity at per-frame timesteps t in [0, 1000].
VelocityFn = Callable[[jax.Array, jax.Array], jax.Array]
# (x_bthwc, t_bf, context) -> v_bthwc: a model that still needs its text context.
ContextModelFn = Callable[[jax.Array, jax.Array, Any], jax.Array]


# ---------------------------------------------------------------------------------------------
# Noise, TI2V frame-0 handling, CFG
# ---------------------------------------------------------------------------------------------


def initial_noise(key: jax.Array, shape_bthwc: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
    """Standard normal starting latent; the same key always gives the same noise. `key`: one key
    for the batch, or a (B,) batch of keys, sample b's noise from key b alone (`x0_euler.normal`)."""
    return x0_euler.normal(key, shape_bthwc, dtype)


def replace_first_frame(x_bthwc: jax.Array, first_frame_b1hwc: jax.Array | None) -> jax.Array:
    """TI2V: overwrite latent frame 0 with the clean image latent (no-op when None)."""
    if first_frame_b1hwc is None:
        return x_bthwc
    return x_bthwc.at[:, :1].set(first_frame_b1hwc.astype(x_bthwc.dtype))


def frame_timesteps(t: jax.Array, batch: int, num_frames: int, first_frame_clean: bool) -> jax.Array:
    """Per-frame timesteps (B, F), float32; frame 0 gets 0 when it holds the clean image latent."""
    # float32, not the latent dtype: bf16 cannot represent e.g. 999 exactly.
    t_bf = jnp.full((batch, num_frames), t, dtype=jnp.float32)
    if first_frame_clean:
        t_bf = t_bf.at[:, 0].set(0.0)
    return t_bf


def make_cfg_velocity_fn(
    model_fn: ContextModelFn,
    cond_context: Any,
    uncond_context: Any,
    guidance_scale: float | jax.Array,
) -> VelocityFn:
    """Classifier-free guidance as one batched model call: uncond + g * (cond - uncond).

    Contexts are pytrees of arrays with a leading batch axis; cond and uncond are concatenated
    on that axis (cond first), so the model sees batch 2B and runs once per step.
    """
    context_2b = jax.tree.map(lambda c, u: jnp.concatenate([c, u], axis=0), cond_context, uncond_context)

    def velocity_fn(x_bthwc: jax.Array, t_bf: jax.Array) -> jax.Array:
        x_2b = jnp.concatenate([x_bthwc, x_bthwc], axis=0)
        t_2b = jnp.concatenate([t_bf, t_bf], axis=0)
        v_cond, v_uncond = jnp.split(model_fn(x_2b, t_2b, context_2b), 2, axis=0)
        return v_uncond + guidance_scale * (v_cond - v_uncond)

    return velocity_fn


def _velocity(
    velocity_fn: VelocityFn, x_bthwc: jax.Array, t: jax.Array, first_frame_b1hwc: jax.Array | None
) -> jax.Array:
    b, f = x_bthwc.shape[:2]
    t_bf = frame_timesteps(t, b, f, first_frame_b1hwc is not None)
    # The solver state stays in its own dtype (float32) whatever the model computes in.
    return velocity_fn(x_bthwc, t_bf).astype(x_bthwc.dtype)


# ---------------------------------------------------------------------------------------------
# The schedule as the solvers see it
# ---------------------------------------------------------------------------------------------


def _solver_sigmas(num_steps: int, shift: float) -> np.ndarray:
    """Wan's sigmas as the reference solver sees them: its sigma table is float32."""
    return flow_sigmas(num_steps, shift).astype(np.float32).astype(np.float64)


def _model_timesteps(num_steps: int, shift: float, integer_timesteps: bool) -> np.ndarray:
    """What the model is fed, float32 (N,). Wan truncates: int(sigma * 1000); the exact
    sigma * 1000 is offered for models/tests that want the solver's own time."""
    if integer_timesteps:
        return flow_timesteps(num_steps, shift).astype(np.float32)
    return (_solver_sigmas(num_steps, shift)[:-1] * NUM_TRAIN_TIMESTEPS).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Euler
# ---------------------------------------------------------------------------------------------


class _EulerStep(NamedTuple):
    timestep: np.ndarray  # model timestep for step i, (N,)
    dsigma: np.ndarray  # sigma_{i+1} - sigma_i (negative), (N,)


def sample_euler(
    velocity_fn: VelocityFn,
    noise_bthwc: jax.Array,
    *,
    num_steps: int = 50,
    shift: float = 5.0,
    first_frame_latent: jax.Array | None = None,
    integer_timesteps: bool = True,
    return_trajectory: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """First-order flow ODE solve x_{i+1} = x_i + (sigma_{i+1} - sigma_i) * v(x_i, t_i).

    Same schedule, TI2V handling and options as `sample_unipc`.
    """
    steps = _EulerStep(
        timestep=_model_timesteps(num_steps, shift, integer_timesteps),
        dsigma=np.diff(_solver_sigmas(num_steps, shift)).astype(noise_bthwc.dtype),
    )

    def body(x_bthwc: jax.Array, step: _EulerStep) -> tuple[jax.Array, jax.Array | None]:
        v_bthwc = _velocity(velocity_fn, x_bthwc, step.timestep, first_frame_latent)
        x_next = replace_first_frame(x_bthwc + step.dsigma * v_bthwc, first_frame_latent)
        return x_next, (x_next if return_trajectory else None)

    x0_bthwc, xs_nbthwc = jax.lax.scan(body, replace_first_frame(noise_bthwc, first_frame_latent), steps)
    return (x0_bthwc, xs_nbthwc) if return_trajectory else x0_bthwc


# ---------------------------------------------------------------------------------------------
# FlowUniPC (bh2, order 2)
# ---------------------------------------------------------------------------------------------


class UniPCStep(NamedTuple):
    """Per-step scalars of UniPC, each of shape (N,). Names: `this` = m_i (x0 prediction at
    the current point), `prev` = m_{i-1}, `prevprev` = m_{i-2}, `last` = corrected sample of
    the previous step, `x` = the current (predicted) sample."""

    sigma: np.ndarray  # sigma_i, turns v into the x0 prediction
    timestep: np.ndarray  # model timestep for step i (int(sigma_i * 1000) by default), float
    corr_x: np.ndarray  # corrector weights: x_c = corr_x*x + corr_last*last + corr_this*m_i
    corr_last: np.ndarray  #   + corr_prev*m_{i-1} + corr_prevprev*m_{i-2}
    corr_this: np.ndarray
    corr_prev: np.ndarray
    corr_prevprev: np.ndarray
    pred_x: np.ndarray  # predictor weights: x_{i+1} = pred_x*x_c + pred_this*m_i + pred_prev*m_{i-1}
    pred_this: np.ndarray
    pred_prev: np.ndarray


def _lambda(sigma: float) -> float:
    """Half log-SNR log(alpha / sigma) with alpha = 1 - sigma; +inf at sigma = 0."""
    return np.inf if sigma == 0.0 else float(np.log1p(-sigma) - np.log(sigma))


def _bh2_phi(h: float) -> float:
    """expm1(-h), which is both h*phi_1 and B(h) for bh2 in data-prediction form."""
    return -1.0 if np.isinf(h) else float(np.expm1(-h))


def unipc_orders(num_steps: int, solver_order: int = 2) -> np.ndarray:
    """Predictor order per step: warm-up from 1 and lower order at the end (lower_order_final)."""
    i = np.arange(num_steps)
    return np.minimum(np.minimum(solver_order, i + 1), num_steps - i)


def unipc_coefficients(num_steps: int, shift: float) -> UniPCStep:
    """Host-side float64 UniPC weights for Wan's schedule (see module docstring)."""
    # Same float32-rounded sigmas as the reference solver; model timesteps are truncated from
    # the float64 values (as in the reference), see `_model_timesteps`.
    sigmas = _solver_sigmas(num_steps, shift)
    lambdas = [_lambda(s) for s in sigmas]
    orders = unipc_orders(num_steps)
    n = num_steps
    c = {name: np.zeros(n) for name in UniPCStep._fields if name not in ("sigma", "timestep")}

    for i in range(n):
        # Corrector: refine the sample at sigma_i from the previous step's corrected sample
        # (`last`, at sigma_{i-1}) now that m_i is known, with the previous predictor's order.
        if i == 0:
            c["corr_x"][i] = 1.0
        else:
            order = orders[i - 1]
            alpha_t = 1.0 - sigmas[i]
            h = lambdas[i] - lambdas[i - 1]
            phi = _bh2_phi(h)  # h*phi_1 == B(h)
            if order == 1:
                rho_prevprev, rho_this = 0.0, 0.5
                d1_scale = 0.0
            else:
                rk = (lambdas[i - 2] - lambdas[i - 1]) / h
                # UniC-2 weights solve the order conditions R rho = b, R = [[1, 1], [rk, 1]],
                # b_k = k! * hh*phi_{k+1}(hh) / B(h) with hh = -h (data prediction).
                hh = -h
                hphi_2 = phi / hh - 1.0
                hphi_3 = hphi_2 / hh - 0.5
                rhs = np.array([hphi_2 / phi, 2.0 * hphi_3 / phi])
                rho_prevprev, rho_this = np.linalg.solve(np.array([[1.0, 1.0], [rk, 1.0]]), rhs)
                d1_scale = rho_prevprev / rk  # weight of D1 = (m_{i-2} - m_{i-1}) / rk
            c["corr_last"][i] = sigmas[i] / sigmas[i - 1]
            c["corr_this"][i] = -alpha_t * phi * rho_this
            c["corr_prevprev"][i] = -alpha_t * phi * d1_scale
            # m_{i-1} enters through the base step and through both differences.
            c["corr_prev"][i] = -alpha_t * phi * (1.0 - rho_this - d1_scale)

        # Predictor: step from sigma_i to sigma_{i+1} using m_i (and m_{i-1} at order 2).
        order = orders[i]
        alpha_t = 1.0 - sigmas[i + 1]
        h = lambdas[i + 1] - lambdas[i]
        phi = _bh2_phi(h)
        c["pred_x"][i] = sigmas[i + 1] / sigmas[i]
        c["pred_this"][i] = -alpha_t * phi
        if order == 2:
            # Order-2 UniP uses the fixed rho = 1/2 on D1 = (m_{i-1} - m_i) / rk.
            rk = (lambdas[i - 1] - lambdas[i]) / h
            c["pred_this"][i] += alpha_t * phi * 0.5 / rk
            c["pred_prev"][i] = -alpha_t * phi * 0.5 / rk

    return UniPCStep(
        sigma=sigmas[:-1],
        timestep=flow_timesteps(num_steps, shift).astype(np.float64),
        **c,
    )


def sample_unipc(
    velocity_fn: VelocityFn,
    noise_bthwc: jax.Array,
    *,
    num_steps: int = 50,
    shift: float = 5.0,
    first_frame_latent: jax.Array | None = None,
    integer_timesteps: bool = True,
    return_trajectory: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """FlowUniPC (bh2, order 2) solve from sigma_0 ~ 1 to 0; one model call per step.

    first_frame_latent (B, 1, H, W, C): TI2V image latent; it replaces frame 0 before every
      model call and after every step, and frame 0 is given timestep 0.
    integer_timesteps: feed the model int(sigma * 1000) as Wan does (default); False feeds
      sigma * 1000 exactly, so that the model's time agrees with the solver's.
    return_trajectory: also return the sample after every step, (N, B, T, H, W, C).
    """
    dtype = noise_bthwc.dtype
    coeffs = unipc_coefficients(num_steps, shift)
    # Weights are float64 on the host; cast once to the state dtype (f32 normally, f64 in tests).
    # Timesteps stay float32 (bf16 would turn 999 into 1000).
    steps = jax.tree.map(lambda a: np.asarray(a, dtype=dtype), coeffs)._replace(
        timestep=_model_timesteps(num_steps, shift, integer_timesteps)
    )
    x_bthwc = replace_first_frame(noise_bthwc, first_frame_latent)
    zeros = jnp.zeros_like(x_bthwc)
    carry0 = (x_bthwc, zeros, zeros, zeros)  # (x, last, m_prev, m_prevprev)

    def body(carry, s: UniPCStep):
        x, last, m_prev, m_prevprev = carry
        x = replace_first_frame(x, first_frame_latent)
        v = _velocity(velocity_fn, x, s.timestep, first_frame_latent)
        m_this = x - s.sigma * v  # x0 prediction (flow: x = (1-s) x0 + s noise, v = noise - x0)
        x_c = (
            s.corr_x * x
            + s.corr_last * last
            + s.corr_this * m_this
            + s.corr_prev * m_prev
            + s.corr_prevprev * m_prevprev
        )
        x_next = s.pred_x * x_c + s.pred_this * m_this + s.pred_prev * m_prev
        x_next = replace_first_frame(x_next, first_frame_latent)
        return (x_next, x_c, m_this, m_prev), (x_next if return_trajectory else None)

    (x0_bthwc, *_), xs_nbthwc = jax.lax.scan(body, carry0, steps)
    return (x0_bthwc, xs_nbthwc) if return_trajectory else x0_bthwc


# ---------------------------------------------------------------------------------------------
# Convenience
# ---------------------------------------------------------------------------------------------


def sample(
    key: jax.Array,
    velocity_fn: VelocityFn,
    shape_bthwc: tuple[int, ...],
    *,
    solver: Literal["unipc", "euler"] = "unipc",
    num_steps: int = 50,
    shift: float = 5.0,
    first_frame_latent: jax.Array | None = None,
    integer_timesteps: bool = True,
    dtype: Any = jnp.float32,
) -> jax.Array:
    """Noise from `key`, then solve; deterministic per key. Jit with solver/num_steps/shift static."""
    noise_bthwc = initial_noise(key, shape_bthwc, dtype)
    return SOLVERS[solver](
        velocity_fn,
        noise_bthwc,
        num_steps=num_steps,
        shift=shift,
        first_frame_latent=first_frame_latent,
        integer_timesteps=integer_timesteps,
    )


SOLVERS = {"unipc": sample_unipc, "euler": sample_euler}  # solver name → solve(velocity_fn, noise, ...)

__all__ = [
    "SOLVERS",
    "VelocityFn",
    "UniPCStep",
    "frame_timesteps",
    "initial_noise",
    "make_cfg_velocity_fn",
    "replace_first_frame",
    "sample",
    "sample_euler",
    "sample_unipc",
    "unipc_coefficients",
    "unipc_orders",
]
