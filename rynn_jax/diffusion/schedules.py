"""Flow-matching noise schedules (Wan2.2 convention).

Convention: x_sigma = (1 - sigma) * x0 + sigma * noise, the model predicts the velocity
v = noise - x0, so x0 = x - sigma * v. sigma = 1 is pure noise, sigma = 0 is data.

Wan's sampling schedule: sigmas = linspace(sigma_max, 0, N + 1)[:-1], warped by the shift
`shift * s / (1 + (shift - 1) * s)`, followed by a terminal 0. The model is fed integer
timesteps int(sigma * 1000) (truncated, not rounded), while the solver uses sigma itself.
Everything here is host-side numpy float64: schedules are static and are baked into the
jitted sampler as constants.
"""

import numpy as np

NUM_TRAIN_TIMESTEPS = 1000

# Wan builds sigma_max from a float32 training table, so it is float32(0.999) rather than
# 0.999 (a 1.3e-8 difference; it changes no truncated timestep for the usual step counts).
WAN_SIGMA_MAX = float(np.float32(1.0 - 1.0 / NUM_TRAIN_TIMESTEPS))


def shift_sigmas(sigmas: np.ndarray, shift: float) -> np.ndarray:
    """Warps sigmas towards the noisy end: shift * s / (1 + (shift - 1) * s)."""
    sigmas = np.asarray(sigmas, dtype=np.float64)
    return shift * sigmas / (1.0 + (shift - 1.0) * sigmas)


def flow_sigmas(num_steps: int, shift: float, sigma_max: float = WAN_SIGMA_MAX) -> np.ndarray:
    """The N shifted sampling sigmas followed by the terminal 0: float64, shape (N + 1,)."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    base_n = np.linspace(sigma_max, 0.0, num_steps + 1)[:-1]
    return np.concatenate([shift_sigmas(base_n, shift), [0.0]])


def flow_timesteps(num_steps: int, shift: float, sigma_max: float = WAN_SIGMA_MAX) -> np.ndarray:
    """Model timesteps int(sigma * 1000) for the N sampling sigmas: int64, shape (N,).

    Truncation (not rounding) of the float64 shifted sigma, as Wan's FlowUniPC scheduler does.
    """
    sigmas_n = flow_sigmas(num_steps, shift, sigma_max)[:-1]
    return (sigmas_n * NUM_TRAIN_TIMESTEPS).astype(np.int64)
