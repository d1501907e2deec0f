"""The models under evaluation, as one call: requests (episode name, reference image, control
video, prompt) → generated videos. Thin wrappers around the project's own paths, no sampler of
their own:

* teacher: `serving.bidirectional.WorldModel.generate` (TI2V: the reference image pinned as latent
  frame 0, the control video encoded by the VAE, the flow-matching sampler), modules from
  `serving.assemble.build_world_model` (`load_dit` / `load_vae` directories, or the tiny random
  models when neither is given).
  It also carries `reconstruct` (truth → VAE → truth), the "autoencoder" ceiling variant.
* world4d: RynnWorld-4D (`serving.world4d.World4DModel.generate`): from the episode's first frame
  and its depth, RGB + depth (metres) + flow (pixels), and the three streams' VAE round trip as
  its "autoencoder" variant (`serving.assemble.build_world4d`: `load_dit4d` / `load_vae`, or tiny
  random models). It takes the whole ground truth (`Truth`) and returns a `Generated`.
* autoencoder: no generator, only the round trip of the episode's videos through `--vae`
  (`load_vae`, or the tiny random VAE the 4D model's smoke test uses): RGB, and depth and flow where
  the episode has them, scored as a model's output. It is the "autoencoder" variant of the two
  models above without either of them: the ceiling of any model in that latent space, one command.
* student: the causal student streamed block by block through `serving.session.StreamingSession`
  built as `serve.py demo --world sim` builds it (`serving.assemble.streaming_session`), rolled out by
  `serving.clip.rollout` (the last block's missing control frames hold the last pose).

An episode's noise comes from the seed and its name (`serving.clip.episode_key`), so results do
not depend on which episodes run, in which order, or whether the run was resumed. The teacher and
the student generate `batch` clips per model call (`eval.py --batch`: one executable, the last call
padded with repeats of its last request); a clip's noise is its own key's in any batch, so a batch
size changes a video only by the rounding of batched matmuls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

from rynn_jax.eval.episodes import Generated, Truth, with_encodings
from rynn_jax.models.vae import WanVAEConfig, init_vae
from rynn_jax.models.vae_weights import load_vae
from rynn_jax.serving.assemble import build_world4d, build_world_model, streaming_session
from rynn_jax.serving.bidirectional import SamplingConfig, VAECodec, to_model_range, to_uint8
from rynn_jax.serving.clip import episode_key, rollout
from rynn_jax.serving.prompts import text_contexts
from rynn_jax.serving.world4d import Sample4D, decoded_sample


@dataclasses.dataclass(frozen=True)
class Request:
    """One clip to generate: episode `name` (its noise key), the reference image (H, W, 3) and the
    control video (T, H, W, 3), both uint8, and the task's prompt."""
    name: str
    reference_hw3: np.ndarray
    skeleton_thw3: np.ndarray
    prompt: str


Runner = Callable[[list[Request]], list[np.ndarray]]
# (keys (B,), references (B, H, W, 3), control videos (B, T, H, W, 3), contexts (B, S, K)) → (B, T, H, W, 3)
BatchFn = Callable[[jnp.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def batched(generate: BatchFn, batch: int, seed: int, contexts: Callable[[str], np.ndarray]) -> Runner:
    """Requests → videos, `batch` per call of `generate`, each clip's key from `seed` and its episode
    name and its context from its prompt; the last call is padded with its last request, so every
    call runs the same executable."""
    if batch < 1:
        raise ValueError(f"batch must be ≥ 1, got {batch}")

    def run(requests: list[Request]) -> list[np.ndarray]:
        sizes = {r.skeleton_thw3.shape for r in requests}
        if len(sizes) > 1:
            raise ValueError(f"one batch of clips needs one control-video size, got {sorted(sizes)}")
        videos = []
        for i in range(0, len(requests), batch):
            part = requests[i:i + batch]
            full = part + [part[-1]] * (batch - len(part))
            out = generate(jnp.stack([episode_key(seed, r.name) for r in full]),
                           np.stack([r.reference_hw3 for r in full]), np.stack([r.skeleton_thw3 for r in full]),
                           np.stack([contexts(r.prompt) for r in full]))
            videos.extend(out[:len(part)])
        return videos

    return run


def teacher(dit: str | None, vae: str | None, seed: int, sampling: SamplingConfig, *, text: str | None = None,
            text_embeddings: str | None = None, batch: int = 1) -> Runner:
    model = build_world_model(dit, vae, seed)
    contexts = text_contexts(text, text_embeddings, model.dit_cfg.text_len, model.dit_cfg.text_dim)

    def generate(keys_b, references_bhw3, skeletons_bthw3, contexts_bsk) -> np.ndarray:
        t = skeletons_bthw3.shape[1]
        if (t - 1) % 4:
            raise ValueError(f"the teacher generates 1 + 4k frames, got a {t}-frame control video")
        return model.generate_batch(keys_b, references_bhw3, skeletons_bthw3, contexts_bsk, sampling)

    run = batched(generate, batch, seed, contexts)
    run.reconstruct = lambda truth: rgb_round_trip(model, truth)
    return run


def rgb_round_trip(codec: VAECodec, truth: Truth) -> Generated:
    """The ground truth through the VAE and back: the best any model in this latent space can do
    (`codec`: the VAE alone, or a world model's, `SplitModels` being one)."""
    return Generated(to_uint8(codec.decode(codec.encode(to_model_range(truth.frames)[None]))[0]))


def geometry_round_trip(codec: VAECodec, truth: Truth) -> Generated:
    """RGB, depth and flow videos through the shared VAE and back, read as metres and pixels."""
    t = with_encodings(truth)
    if t.depth_video is None or t.flow_video is None:
        raise ValueError(f"episode {t.name}: no depth.npz / flow.npz to reconstruct")
    back = codec.decode(codec.encode(to_model_range(np.stack([t.frames, t.depth_video, t.flow_video]))))
    return generated(decoded_sample(back[0], back[1], back[2]))


def autoencoder(vae: str | None, seed: int) -> Callable[[str, Truth], Generated]:
    """The round trip as the model: all three videos where the episode has depth and flow, else RGB."""
    codec = VAECodec(load_vae(vae) if vae is not None else init_vae(WanVAEConfig.tiny(), seed))

    def run(name: str, truth: Truth) -> Generated:
        geometric = truth.depth is not None and truth.flow is not None
        return geometry_round_trip(codec, truth) if geometric else rgb_round_trip(codec, truth)

    return run


def world4d(dit: str | None, vae: str | None, seed: int, sampling: SamplingConfig, *, text: str | None = None,
            text_embeddings: str | None = None) -> Callable[[str, Truth], Generated]:
    model = build_world4d(dit, vae, seed)
    contexts = text_contexts(text, text_embeddings, model.dit_cfg.text_len, model.dit_cfg.text_dim)

    def run(name: str, truth: Truth) -> Generated:
        if truth.depth is None:
            raise ValueError(f"episode {name}: no depth.npz, and RynnWorld-4D starts from the first frame's depth")
        return generated(model.generate(episode_key(seed, name), truth.frames[0], truth.depth[0],
                                        contexts(truth.prompt), len(truth.frames), sampling,
                                        skeleton_thw3=truth.skeleton))  # read only with a control branch

    run.reconstruct = lambda truth: geometry_round_trip(model, truth)
    return run


def generated(s: Sample4D) -> Generated:
    return Generated(s.rgb, s.depth, s.flow, depth_video=s.depth_video, flow_video=s.flow_video)


def student(dit: str | None, vae: str | None, seed: int, *, text: str | None = None,
            text_embeddings: str | None = None, batch: int = 1) -> Runner:
    session = streaming_session(dit, vae, seed, random_weights=dit is None and vae is None)
    contexts = text_contexts(text, text_embeddings, session.dit_cfg.text_len, session.dit_cfg.text_dim)

    def generate(keys_b, references_bhw3, skeletons_bthw3, contexts_bsk) -> np.ndarray:
        return rollout(session, references_bhw3, skeletons_bthw3, jnp.asarray(contexts_bsk), keys_b)

    return batched(generate, batch, seed, contexts)
