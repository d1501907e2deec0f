"""DMD on closed-form toys: the gradient's sign and normalisation move a generator onto the teacher.

The teacher is a Gaussian mixture, whose flow-matching x0-prediction E[x0 | x_σ] under
x_σ = (1 − σ)·x0 + σ·ε is exact (Tweedie). `dmd_gradient` / `dmd_loss` are the very functions
the video DMD uses. Two generators:
  * a Gaussian mixture with learnable means, fake score in closed form → the means land on the
    teacher's (tight tolerance): proof of sign and fixed point without any learned critic;
  * an MLP pushing N(0, I) forward, fake score an MLP critic trained by flow matching on the
    generator's samples, 5 critic updates per generator update, Adam β=(0, 0.999) as released →
    MMD to the teacher drops by an order of magnitude, moments match.
Also the real score's classifier-free guidance on a tiny DiT teacher, against separate calls.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rynn_jax.distill import dmd
from rynn_jax.models.dit import WanDiTConfig, init_dit


def gmm_x0(x_t, sigma, means_kd, stds_kd, logw_k):
    """E[x0 | x_σ] for x0 ~ Σ_k w_k N(μ_k, diag(s_k²)), x_σ = (1 − σ)x0 + σε. x_t (N, D), sigma (N,)."""
    a = (1.0 - sigma)[:, None, None]
    s = sigma[:, None, None]
    var = a ** 2 * stds_kd[None] ** 2 + s ** 2  # (N, K, D)
    diff = x_t[:, None] - a * means_kd[None]
    logp = logw_k[None] - 0.5 * (jnp.log(var) + diff ** 2 / var).sum(-1)
    post = jax.nn.softmax(logp, axis=-1)  # (N, K)
    cond = means_kd[None] + a * stds_kd[None] ** 2 / var * diff
    return (post[..., None] * cond).sum(1)


def gmm_sample(rng, n, means_kd, stds_kd, logw_k):
    rk, rz = jax.random.split(rng)
    k = jax.random.categorical(rk, logw_k, shape=(n,))
    return means_kd[k] + stds_kd[k] * jax.random.normal(rz, (n, means_kd.shape[1]))


def mmd(x, y, bandwidths=(0.2, 0.5, 1.0, 2.0)):
    """Biased RBF-kernel MMD² (multi-bandwidth)."""
    def k(a, b):
        d2 = ((a[:, None] - b[None]) ** 2).sum(-1)
        return sum(jnp.exp(-d2 / (2 * h * h)) for h in bandwidths)
    return float(k(x, x).mean() + k(y, y).mean() - 2 * k(x, y).mean())


TEACHER_MEANS = jnp.array([[-1.5, 0.0], [1.5, 0.5], [0.0, 2.0]])
TEACHER_STDS = jnp.full((3, 2), 0.4)
TEACHER_LOGW = jnp.log(jnp.array([0.3, 0.3, 0.4]))


def test_dmd_gradient_is_per_sample_normalised():
    x0 = jnp.array([[1.0, 3.0], [0.0, 0.0]])
    p_real = jnp.array([[0.0, 1.0], [2.0, 2.0]])
    p_fake = jnp.array([[1.0, 1.0], [1.0, 2.0]])
    grad = dmd.dmd_gradient(x0, p_real, p_fake)
    np.testing.assert_allclose(grad, [[1.0 / 1.5, 0.0], [-0.5, 0.0]], rtol=1e-6)
    # ∂loss/∂x0 = grad / #elements
    g = jax.grad(lambda x: dmd.dmd_loss(x, dmd.dmd_gradient(x, p_real, p_fake)))(x0)
    np.testing.assert_allclose(g, grad / x0.size, rtol=1e-6)
    # frame weights: weighted-out entries neither count in the normaliser nor get a gradient
    w = jnp.array([[1.0, 0.0]])
    np.testing.assert_allclose(dmd.dmd_gradient(x0, p_real, p_fake, w), [[1.0, 0.0], [-0.5, 0.0]], rtol=1e-6)


def test_dmd_closed_form_gmm_generator_converges_to_teacher():
    """Generator: the teacher's mixture with its means displaced (and learnable); fake score exact."""
    start = TEACHER_MEANS + jnp.array([0.9, -0.7])
    tx = optax.adam(0.03, b1=0.0, b2=0.999)

    def gen_loss(means, rng):
        r_k, r_s, r_n = jax.random.split(rng, 3)
        k = jax.random.categorical(r_k, TEACHER_LOGW, shape=(512,))
        x0 = means[k] + TEACHER_STDS[k] * jax.random.normal(r_n, (512, 2))
        sigma = dmd.sample_sigmas(r_s, 512, shift=5.0)
        eps = jax.random.normal(jax.random.fold_in(r_n, 1), x0.shape)
        x_t = jax.lax.stop_gradient((1 - sigma[:, None]) * x0 + sigma[:, None] * eps)
        p_real = gmm_x0(x_t, sigma, TEACHER_MEANS, TEACHER_STDS, TEACHER_LOGW)
        p_fake = gmm_x0(x_t, sigma, jax.lax.stop_gradient(means), TEACHER_STDS, TEACHER_LOGW)
        return dmd.dmd_loss(x0, dmd.dmd_gradient(x0, p_real, p_fake))

    @jax.jit
    def train(means):
        def body(carry, i):
            means, opt = carry
            g = jax.grad(gen_loss)(means, jax.random.PRNGKey(i))
            upd, opt = tx.update(g, opt, means)
            return (optax.apply_updates(means, upd), opt), None
        return jax.lax.scan(body, (means, tx.init(means)), jnp.arange(250))[0][0]

    # Sign: the first gradient points from the displaced means back towards the teacher's.
    g0 = jax.grad(gen_loss)(start, jax.random.PRNGKey(0))
    assert float(jnp.sum(g0 * (start - TEACHER_MEANS))) > 0
    final = train(start)
    np.testing.assert_allclose(final, TEACHER_MEANS, atol=0.08)


def _mlp_init(rng, sizes):
    params = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        w = jax.random.normal(jax.random.fold_in(rng, i), (a, b)) * np.sqrt(1.0 / a)
        params.append((w, jnp.zeros((b,))))
    return params


def _mlp(params, x):
    for w, b in params[:-1]:
        x = jax.nn.silu(x @ w + b)
    w, b = params[-1]
    return x @ w + b


def test_dmd_mlp_generator_with_learned_critic_matches_gmm():
    """Full DMD loop: learned fake score, 5 critic updates per generator update, Adam β=(0,0.999)."""
    rng = jax.random.PRNGKey(0)
    gen = _mlp_init(jax.random.fold_in(rng, 1), [2, 64, 64, 2])
    gen[-1] = (gen[-1][0] * 0.3, jnp.array([0.5, 3.0]))  # start off-target: a blob near (0.5, 3)
    critic = _mlp_init(jax.random.fold_in(rng, 2), [3, 128, 128, 2])
    tx_g = optax.adam(6e-3, b1=0.0, b2=0.999)
    tx_c = optax.adam(3e-3, b1=0.0, b2=0.999)
    n, shift = 256, 3.0

    def x0_of(params, r):
        return _mlp(params, jax.random.normal(r, (n, 2)))

    def critic_x0(params, x_t, sigma):
        return x_t - sigma[:, None] * _mlp(params, jnp.concatenate([x_t, sigma[:, None]], -1))

    def critic_loss(params, x0, r):
        r_s, r_e = jax.random.split(r)
        sigma = dmd.sample_sigmas(r_s, n, shift)
        eps = jax.random.normal(r_e, x0.shape)
        x_t = (1 - sigma[:, None]) * x0 + sigma[:, None] * eps
        v = _mlp(params, jnp.concatenate([x_t, sigma[:, None]], -1))
        return jnp.mean((v - (eps - x0)) ** 2)

    def gen_loss(params, critic, r):
        r_z, r_s, r_e = jax.random.split(r, 3)
        x0 = x0_of(params, r_z)
        sigma = dmd.sample_sigmas(r_s, n, shift)
        eps = jax.random.normal(r_e, x0.shape)
        x_t = jax.lax.stop_gradient((1 - sigma[:, None]) * x0 + sigma[:, None] * eps)
        p_real = gmm_x0(x_t, sigma, TEACHER_MEANS, TEACHER_STDS, TEACHER_LOGW)
        p_fake = critic_x0(jax.lax.stop_gradient(critic), x_t, sigma)
        return dmd.dmd_loss(x0, dmd.dmd_gradient(x0, p_real, p_fake))

    def critic_round(carry, r):
        gen, critic, opt_c = carry
        x0 = jax.lax.stop_gradient(x0_of(gen, jax.random.fold_in(r, 0)))
        g = jax.grad(critic_loss)(critic, x0, jax.random.fold_in(r, 1))
        upd, opt_c = tx_c.update(g, opt_c, critic)
        return (gen, optax.apply_updates(critic, upd), opt_c), None

    @jax.jit
    def train(gen, critic, steps_key):
        def body(carry, r):
            gen, critic, opt_g, opt_c = carry
            (_, critic, opt_c), _ = jax.lax.scan(critic_round, (gen, critic, opt_c), jax.random.split(r, 5))
            g = jax.grad(gen_loss)(gen, critic, jax.random.fold_in(r, 99))
            upd, opt_g = tx_g.update(g, opt_g, gen)
            return (optax.apply_updates(gen, upd), critic, opt_g, opt_c), None

        # critic warm start on the initial generator (as DMD starts from a critic that fits it)
        (_, critic, opt_c), _ = jax.lax.scan(critic_round, (gen, critic, tx_c.init(critic)),
                                             jax.random.split(jax.random.fold_in(steps_key, 7), 200))
        carry = (gen, critic, tx_g.init(gen), opt_c)
        return jax.lax.scan(body, carry, jax.random.split(steps_key, 600))[0][0]

    # The critic is initialised "from the teacher" in the real system; here it first fits the generator.
    teacher = gmm_sample(jax.random.PRNGKey(5), 2000, TEACHER_MEANS, TEACHER_STDS, TEACHER_LOGW)
    before = x0_of(gen, jax.random.PRNGKey(6))
    gen = train(gen, critic, jax.random.PRNGKey(3))
    after = _mlp(gen, jax.random.normal(jax.random.PRNGKey(6), (2000, 2)))
    m0, m1 = mmd(before, teacher), mmd(after, teacher)
    print("mmd", m0, m1, "mean", after.mean(0), teacher.mean(0), "std", after.std(0), teacher.std(0))
    assert m1 < 0.1 * m0, (m0, m1)
    np.testing.assert_allclose(after.mean(0), teacher.mean(0), atol=0.15)
    np.testing.assert_allclose(after.std(0), teacher.std(0), atol=0.15)


# --------------------------------------------------------------------------------------------------
# Real score with classifier-free guidance (teacher = a tiny DiT)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("given_uncond", [True, False])
def test_real_score_guidance_is_cfg_of_separate_calls(given_uncond):
    """real_score batches cond and uncond into one call; it must equal p_c + g·(p_c − p_u) from two
    separate teacher calls (uncond = batch["uncond_text_embedding"], else zeros), and g = 0 must be
    the plain conditional x0-prediction without an unconditional call."""
    cfg = WanDiTConfig.tiny(control="add-plus")
    teacher = init_dit(cfg, seed=2)
    rng = np.random.default_rng(0)
    nnx.update(teacher, jax.tree.map(lambda a: a + 0.1 * jnp.asarray(rng.standard_normal(a.shape), a.dtype),
                                     nnx.state(teacher, nnx.Param)))  # text/control paths start at 0: move them
    b, t, hw, c = 2, 3, (4, 4), cfg.in_channels

    def normal(*shape: int) -> jax.Array:
        return jnp.asarray(rng.standard_normal(shape), jnp.float32)

    x_t, control = normal(b, t, *hw, c), normal(b, t, *hw, c)
    t_bf = jnp.asarray([[0.0, 700.0, 700.0], [0.0, 300.0, 300.0]], jnp.float32)
    batch = {"text_embedding": normal(b, cfg.text_len, cfg.text_dim)}
    uncond = jnp.zeros_like(batch["text_embedding"])
    if given_uncond:  # one unconditional embedding for the whole batch, broadcast like the released one
        uncond = jnp.broadcast_to(normal(1, cfg.text_len, cfg.text_dim), uncond.shape)
        batch["uncond_text_embedding"] = uncond[:1]

    graphdef, state = nnx.split(teacher)
    x0_prediction = jax.jit(lambda ctx: dmd.x0_prediction(nnx.merge(graphdef, state), x_t, t_bf, ctx, control))
    real_score = jax.jit(lambda g, b: dmd.real_score(nnx.merge(graphdef, state), x_t, t_bf, b, control, g),
                         static_argnums=0)
    p_cond, p_uncond = x0_prediction(batch["text_embedding"]), x0_prediction(uncond)
    scale = float(jnp.abs(p_cond).max())
    assert float(jnp.abs(p_cond - p_uncond).max()) > 1e-2 * scale  # the text matters: the check can fail
    g = 2.5
    np.testing.assert_allclose(real_score(g, batch), p_cond + g * (p_cond - p_uncond), atol=1e-5 * scale, rtol=0)
    # g = 0: one conditional call; a NaN unconditional embedding would poison any CFG (0·NaN = NaN)
    poisoned = {**batch, "uncond_text_embedding": jnp.full_like(uncond[:1], jnp.nan)}
    np.testing.assert_allclose(real_score(0.0, poisoned), p_cond, atol=1e-6 * scale, rtol=0)
