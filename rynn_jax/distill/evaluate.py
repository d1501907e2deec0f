"""Student–teacher sample distance on a fixed batch: the distillation's progress signal.

Teacher samples: the bidirectional teacher, Euler on the shifted schedule, frame 0 pinned (TI2V).
Student samples: the causal 4-step rollout (all steps, no gradient) with the EMA weights. The
distance compares the two *distributions* (a DMD student is not a pairwise ODE match): per
(frame, channel) mean and standard deviation over batch and space, squared differences averaged
over frames 1.. (frame 0 is the shared reference). `make_sample_hook` writes the same student
samples as MP4 videos (skeleton | student | ground truth), through train.py's sample-video code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rynn_jax.diffusion import samplers
from rynn_jax.distill import rollout as rollout_lib
from rynn_jax.distill.config import DistillConfig
from rynn_jax.distill.state import DistillState
from rynn_jax.models.vae import WanVAE
from rynn_jax.training import samples as samples_lib

Batch = dict[str, jax.Array]


def sample_distance(a_bthwc: jax.Array, b_bthwc: jax.Array) -> jax.Array:
    stats = lambda x: (x[:, 1:].mean(axis=(0, 2, 3)), x[:, 1:].std(axis=(0, 2, 3)))
    (ma, sa), (mb, sb) = stats(a_bthwc), stats(b_bthwc)
    return jnp.mean(jnp.square(ma - mb) + jnp.square(sa - sb))


def teacher_samples(cfg: DistillConfig, graphdef: nnx.GraphDef, teacher: nnx.State, stats: nnx.State,
                    batch: Batch, rng: jax.Array) -> jax.Array:
    model = nnx.merge(graphdef, teacher, stats)
    control = batch["control_video_latents"] if cfg.model.control != "none" else None
    velocity = lambda x, t: model(x, t, batch["text_embedding"], control)
    shape = batch["video_latents"].shape
    noise = jax.random.normal(rng, (shape[0], shape[1] * shape[2] * shape[3] * shape[4])).reshape(shape)
    return samplers.sample_euler(velocity, noise, num_steps=cfg.teacher_eval_steps, shift=cfg.student_steps.shift,
                                 first_frame_latent=batch["img_latent"].astype(jnp.float32))


def student_samples(cfg: DistillConfig, graphdef: nnx.GraphDef, params: nnx.State, stats: nnx.State,
                    batch: Batch, rng: jax.Array) -> jax.Array:
    control = batch["control_video_latents"] if cfg.model.control != "none" else None
    return rollout_lib.rollout(graphdef, params, stats, batch["img_latent"], batch["text_embedding"], control, rng,
                               num_frames=batch["video_latents"].shape[1], ccfg=cfg.causal, scfg=cfg.student_steps,
                               dcfg=dataclasses.replace(cfg.dmd, last_step_only=True), grad=False)


def make_distance_fn(cfg: DistillConfig, graphdef: nnx.GraphDef):
    """distance(params, teacher_x0, stats, batch, rng) → scalar (jit it once; teacher_x0 fixed)."""
    def distance(params, teacher_x0, stats, batch, rng):
        return sample_distance(student_samples(cfg, graphdef, params, stats, batch, rng), teacher_x0)
    return distance


def make_sample_hook(cfg: DistillConfig, graphdef: nnx.GraphDef, vae: WanVAE, batch: dict[str, np.ndarray],
                     out_dir: str, seed: int = 0) -> Callable[[int, DistillState], None]:
    """A distill loop hook writing `out_dir/sample_{step:07d}.mp4`: skeleton | the student's 4-step
    causal rollout (EMA weights when kept; fixed noise, so successive files differ by the weights
    only) | ground truth, for the first clip of `batch`."""
    clip = samples_lib.first_clip(batch)
    sample = jax.jit(lambda params, stats: student_samples(cfg, graphdef, params, stats, clip,
                                                           jax.random.PRNGKey(seed)))

    def generate(st: DistillState) -> jax.Array:
        return sample(st.ema if len(st.ema) else st.student, st.stats)

    return samples_lib.make_video_hook(vae, clip, out_dir, generate)
