"""The models under evaluation, as one call: (episode name, reference image, control video, prompt)
→ generated video. Thin wrappers around the project's own paths, no sampler of their own:

* teacher: `serving.bidirectional.WorldModel.generate` (TI2V: the reference image pinned as latent
  frame 0, the control video encoded by the VAE, the flow-matching sampler), modules from
  `serving.assemble.build_world_model` (`load_dit` / `load_vae` directories, or the tiny random
  models when neither is given).
  It also carries `reconstruct` (truth → VAE → truth), the "autoencoder" ceiling variant.
* student: the causal student streamed block by block through `serving.session.StreamingSession`
  built as `serve.py demo --world sim` builds it (`serving.assemble.streaming_session`), rolled out by
  `serving.clip.rollout` (the last block's missing control frames hold the last pose).

An episode's noise comes from the seed and its name (`serving.clip.episode_key`), so results do
not depend on which episodes run, in which order, or whether the run was resumed.
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

from rynn_jax.serving.assemble import build_world_model, streaming_session
from rynn_jax.serving.bidirectional import SamplingConfig, to_model_range, to_uint8
from rynn_jax.serving.clip import episode_key, rollout
from rynn_jax.serving.prompts import text_contexts

Runner = Callable[[str, np.ndarray, np.ndarray, str], np.ndarray]


def teacher(dit: str | None, vae: str | None, seed: int, sampling: SamplingConfig, *, text: str | None = None,
            text_embeddings: str | None = None) -> Runner:
    model = build_world_model(dit, vae, seed)
    contexts = text_contexts(text, text_embeddings, model.dit_cfg.text_len, model.dit_cfg.text_dim)

    def run(name: str, reference_hw3: np.ndarray, skeleton_thw3: np.ndarray, prompt: str) -> np.ndarray:
        if (len(skeleton_thw3) - 1) % 4:
            raise ValueError(f"the teacher generates 1 + 4k frames, got a {len(skeleton_thw3)}-frame control video")
        return model.generate(episode_key(seed, name), reference_hw3, skeleton_thw3, contexts(prompt),
                              sampling)

    def reconstruct(video_thw3: np.ndarray) -> np.ndarray:
        """The ground truth through the VAE and back: the best any model in this latent space can do."""
        return to_uint8(model.decode(model.encode(to_model_range(video_thw3)[None]))[0])

    run.reconstruct = reconstruct
    return run


def student(dit: str | None, vae: str | None, seed: int, *, text: str | None = None,
            text_embeddings: str | None = None) -> Runner:
    session = streaming_session(dit, vae, seed, random_weights=dit is None and vae is None)
    contexts = text_contexts(text, text_embeddings, session.dit_cfg.text_len, session.dit_cfg.text_dim)

    def run(name: str, reference_hw3: np.ndarray, skeleton_thw3: np.ndarray, prompt: str) -> np.ndarray:
        keys = jnp.stack([episode_key(seed, name)])
        return rollout(session, reference_hw3[None], skeleton_thw3[None], contexts(prompt)[None], keys)[0]

    return run
