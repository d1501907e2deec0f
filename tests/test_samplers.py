"""Flow-matching schedule and samplers: closed-form schedule values, UniPC parity with
diffusers' UniPCMultistepScheduler (which reproduces Wan2.2's FlowUniPCMultistepScheduler for
this configuration), ODE convergence on Gaussian data, TI2V frame 0, CFG and determinism."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rynn_jax.diffusion.samplers import (
    make_cfg_velocity_fn,
    sample,
    sample_euler,
    sample_unipc,
    unipc_orders,
)
from rynn_jax.diffusion.schedules import WAN_SIGMA_MAX, flow_sigmas, flow_timesteps, shift_sigmas

# ---------------------------------------------------------------------------------------------
# Schedule
# ---------------------------------------------------------------------------------------------


def _shifted(s: float, shift: float = 5.0) -> float:
    return shift * s / (1 + (shift - 1) * s)


def test_flow_sigmas_known_points():
    sigmas = flow_sigmas(50, 5.0)
    assert sigmas.dtype == np.float64 and sigmas.shape == (51,)
    # First sigma: 5 * 0.999 / (1 + 4 * 0.999); Wan's 0.999 is float32(0.999), 1.3e-8 off.
    assert sigmas[0] == pytest.approx(5 * 0.999 / (1 + 4 * 0.999), abs=1e-8)
    assert sigmas[0] == _shifted(WAN_SIGMA_MAX)
    assert sigmas[25] == pytest.approx(_shifted(0.999 * 0.5), abs=1e-8)  # midpoint of the base grid
    assert sigmas[49] == pytest.approx(_shifted(0.999 / 50), abs=1e-8)  # 0.0925..., the last big step
    assert sigmas[-1] == 0.0
    assert np.all(np.diff(sigmas) < 0)
    # shift 1 is the identity warp: the plain base grid.
    np.testing.assert_array_equal(flow_sigmas(4, 1.0), [WAN_SIGMA_MAX * k / 4 for k in (4, 3, 2, 1, 0)])
    assert shift_sigmas(np.array([0.0, 1.0]), 5.0).tolist() == [0.0, 1.0]


def test_flow_timesteps_truncate():
    t = flow_timesteps(50, 5.0)
    assert t.dtype == np.int64 and t.shape == (50,)
    assert t[:12].tolist() == [999, 995, 991, 987, 982, 978, 973, 968, 963, 957, 952, 946]
    assert t[-5:].tolist() == [356, 302, 241, 172, 92]
    scaled = flow_sigmas(50, 5.0)[:-1] * 1000
    np.testing.assert_array_equal(t, np.floor(scaled))
    # Truncation, not rounding: some steps would round up.
    assert np.sum(t != np.round(scaled)) > 5


def test_unipc_orders_warmup_and_lower_order_final():
    assert unipc_orders(50).tolist() == [1] + [2] * 48 + [1]
    assert unipc_orders(2).tolist() == [1, 1]
    assert unipc_orders(1).tolist() == [1]


# ---------------------------------------------------------------------------------------------
# Parity with the reference UniPC (diffusers == Wan FlowUniPC for this config)
# ---------------------------------------------------------------------------------------------


def _test_velocity(x, t_bf, w, xp):
    """Deterministic nonlinear field that depends on the per-frame timestep."""
    tau = t_bf[:, :, None, None, None].astype(x.dtype) / 1000.0
    return (0.3 + tau) * x - 1.5 * tau**2 * w + 0.2 * xp.sin(3 * x)


def _reference_unipc(x_init, w, num_steps, shift, first_frame=None):
    """Trajectory of diffusers' UniPCMultistepScheduler in float64, driven as Wan's TI2V loop
    drives its scheduler: frame 0 replaced via a mask after every step, frame-0 timestep 0."""
    torch = pytest.importorskip("torch")
    from diffusers import UniPCMultistepScheduler

    sched = UniPCMultistepScheduler(
        prediction_type="flow_prediction",
        use_flow_sigmas=True,
        flow_shift=shift,
        solver_order=2,
        solver_type="bh2",
        predict_x0=True,
        lower_order_final=True,
        final_sigmas_type="zero",
    )
    # diffusers' default flow grid is linspace(1, 1/1000); Wan's is linspace(0.999, 0). Passing
    # Wan's unshifted grid makes diffusers apply the same shift and the same int() truncation.
    sched.set_timesteps(sigmas=np.linspace(WAN_SIGMA_MAX, 0.0, num_steps + 1)[:-1])
    np.testing.assert_array_equal(sched.timesteps.numpy(), flow_timesteps(num_steps, shift))
    np.testing.assert_array_equal(sched.sigmas.numpy(), flow_sigmas(num_steps, shift).astype(np.float32))
    sched.sigmas = sched.sigmas.double()  # its weights then run in float64, like our host tables

    keep = np.ones_like(x_init)
    clean = np.zeros_like(x_init)
    if first_frame is not None:
        keep[:, 0] = 0.0
        clean[:, :1] = first_frame
    x = clean + keep * x_init
    trajectory = []
    for t in sched.timesteps:
        t_bf = np.full(x.shape[:2], float(t))
        if first_frame is not None:
            t_bf[:, 0] = 0.0
        v = _test_velocity(x, t_bf, w, np)
        out = sched.step(torch.from_numpy(v), t, torch.from_numpy(x), return_dict=False)[0].numpy()
        x = clean + keep * out
        trajectory.append(x)
    return np.stack(trajectory)


@pytest.mark.parametrize("num_steps,ti2v", [(50, False), (50, True), (4, False)])
def test_unipc_matches_diffusers_step_by_step(num_steps, ti2v):
    rng = np.random.default_rng(0)
    x_init = rng.standard_normal((1, 4, 2, 2, 3))
    w = rng.standard_normal(x_init.shape)
    first_frame = rng.standard_normal((1, 1, 2, 2, 3)) if ti2v else None
    ref = _reference_unipc(x_init, w, num_steps, 5.0, first_frame)

    def run(dtype):
        ff = None if first_frame is None else jnp.asarray(first_frame, dtype)
        return sample_unipc(
            lambda x, t: _test_velocity(x, t, jnp.asarray(w, dtype), jnp),
            jnp.asarray(x_init, dtype),
            num_steps=num_steps,
            shift=5.0,
            first_frame_latent=ff,
            return_trajectory=True,
        )[1]

    with jax.enable_x64(True):
        ours64 = np.asarray(run(jnp.float64))
    assert ours64.shape == ref.shape
    # Same algorithm in float64 on both sides: agreement is at rounding level (~1e-15 seen).
    np.testing.assert_allclose(ours64, ref, rtol=0, atol=1e-10)
    # Production float32 path stays close to the float64 reference over the whole solve.
    np.testing.assert_allclose(np.asarray(run(jnp.float32)), ref, rtol=0, atol=2e-5)


# ---------------------------------------------------------------------------------------------
# Convergence on Gaussian data (exact velocity and exact ODE solution in closed form)
# ---------------------------------------------------------------------------------------------

_MU, _SD = 0.5, 1.5


def _gaussian_velocity(x, t_bf):
    """E[noise - x0 | x_sigma] for x0 ~ N(mu, sd^2), x_sigma = (1-sigma) x0 + sigma noise."""
    sigma = t_bf[:, :, None, None, None].astype(x.dtype) / 1000.0
    a = 1.0 - sigma
    var = a**2 * _SD**2 + sigma**2
    return (sigma - a * _SD**2) / var * (x - a * _MU) - _MU


def _gaussian_ode_error(sampler, num_steps, x_init):
    # The probability-flow map is affine: it keeps the standardized value of x fixed.
    s0 = float(np.float32(flow_sigmas(num_steps, 5.0)[0]))  # solvers use float32 sigmas
    a0 = 1.0 - s0
    exact = _MU + _SD * (x_init - a0 * _MU) / np.sqrt(a0**2 * _SD**2 + s0**2)
    # integer_timesteps=False: the field must be evaluated at the solver's own sigma.
    out = sampler(
        _gaussian_velocity, jnp.asarray(x_init), num_steps=num_steps, shift=5.0, integer_timesteps=False
    )
    return float(np.max(np.abs(np.asarray(out) - exact)))


def test_euler_and_unipc_converge_to_exact_gaussian_flow():
    x_init = np.random.default_rng(1).standard_normal((2, 2, 3, 2, 2))
    with jax.enable_x64(True):
        euler = {n: _gaussian_ode_error(sample_euler, n, x_init) for n in (50, 100, 200)}
        unipc = {n: _gaussian_ode_error(sample_unipc, n, x_init) for n in (50, 100, 200)}
    # Euler: first order, the error halves when the steps double.
    assert 0.4 < euler[100] / euler[50] < 0.6 and 0.4 < euler[200] / euler[100] < 0.6
    assert euler[200] < 0.05
    # UniPC: higher order (seen ~1/4 per doubling) and 50 UniPC steps beat 200 Euler steps.
    assert unipc[200] < unipc[100] / 3
    assert unipc[200] < 1e-3
    assert unipc[50] < euler[200] / 2


# ---------------------------------------------------------------------------------------------
# TI2V frame 0, CFG, determinism
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sampler", [sample_euler, sample_unipc])
def test_first_frame_replaced_and_clean_timestep(sampler):
    rng = np.random.default_rng(0)
    noise = jnp.asarray(rng.standard_normal((2, 4, 2, 2, 3)), jnp.float32)
    first_frame = jnp.asarray(5.0 + rng.standard_normal((2, 1, 2, 2, 3)), jnp.float32)

    def velocity_fn(x, t_bf):
        # Poison the output if any model call sees a wrong frame 0 or frame-0 timestep, or
        # non-uniform timesteps on the other frames.
        bad = (
            jnp.any(x[:, :1] != first_frame)
            | jnp.any(t_bf[:, 0] != 0)
            | jnp.any(t_bf[:, 1:] != t_bf[:, 1:2])
            | jnp.any(t_bf[:, 1] <= 0)
        )
        return 3.0 * x + jnp.where(bad, jnp.nan, 0.0)

    x0, traj = jax.jit(functools.partial(sampler, velocity_fn, num_steps=6, return_trajectory=True))(
        noise, first_frame_latent=first_frame
    )
    assert bool(jnp.all(jnp.isfinite(x0)))
    np.testing.assert_array_equal(x0[:, :1], first_frame)
    frame0_nb = traj[:, :, :1]
    np.testing.assert_array_equal(frame0_nb, jnp.broadcast_to(first_frame, frame0_nb.shape))
    assert float(jnp.max(jnp.abs(x0[:, 1:] - noise[:, 1:]))) > 0.1  # other frames did move


def _tiny_model(x_bthwc, t_bf, context):
    """A context-dependent stand-in for the DiT: (B,T,H,W,C), (B,T), {"emb": (B,L,C)}."""
    emb_bc = jnp.mean(context["emb"], axis=1)[:, None, None, None, :]
    tau = t_bf[:, :, None, None, None] / 1000.0
    return jnp.tanh(x_bthwc) * (1.0 + emb_bc) - tau * emb_bc


def _contexts(batch=2, length=5, channels=3):
    rng = np.random.default_rng(7)
    return (
        {"emb": jnp.asarray(rng.standard_normal((batch, length, channels)), jnp.float32)},
        {"emb": jnp.asarray(rng.standard_normal((batch, length, channels)), jnp.float32)},
    )


def test_cfg_single_batched_call_and_scales():
    cond, uncond = _contexts()
    x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 4, 2, 2, 3)), jnp.float32)
    t_bf = jnp.array([[0.0, 999.0, 999.0, 999.0], [0.0, 500.0, 500.0, 500.0]])
    seen_batches = []

    def counting_model(x, t, ctx):
        seen_batches.append((x.shape[0], t.shape[0], ctx["emb"].shape[0]))
        return _tiny_model(x, t, ctx)

    v1 = jax.jit(make_cfg_velocity_fn(counting_model, cond, uncond, 1.0))(x, t_bf)
    assert seen_batches == [(4, 4, 4)]  # one call, cond and uncond stacked on batch
    np.testing.assert_allclose(v1, jax.jit(_tiny_model)(x, t_bf, cond), rtol=0, atol=1e-6)

    v_cond, v_uncond = jax.jit(_tiny_model)(x, t_bf, cond), jax.jit(_tiny_model)(x, t_bf, uncond)
    v4 = jax.jit(make_cfg_velocity_fn(_tiny_model, cond, uncond, 4.0))(x, t_bf)
    np.testing.assert_allclose(v4, v_uncond + 4.0 * (v_cond - v_uncond), rtol=0, atol=1e-5)
    assert float(jnp.max(jnp.abs(v4 - v_cond))) > 0.1


def test_end_to_end_sample_deterministic_per_seed():
    cond, uncond = _contexts()
    velocity_fn = make_cfg_velocity_fn(_tiny_model, cond, uncond, 5.0)
    first_frame = jnp.asarray(np.random.default_rng(3).standard_normal((2, 1, 2, 2, 3)), jnp.float32)

    @jax.jit
    def generate(seed):
        key = jax.random.key(seed)
        return sample(key, velocity_fn, (2, 4, 2, 2, 3), num_steps=8, first_frame_latent=first_frame)

    a = generate(0)
    b = generate(0)
    c = generate(1)
    assert bool(jnp.all(jnp.isfinite(a)))
    np.testing.assert_array_equal(a, b)
    assert float(jnp.max(jnp.abs(a[:, 1:] - c[:, 1:]))) > 1e-2
    np.testing.assert_array_equal(a[:, :1], c[:, :1])  # frame 0 is the image either way
