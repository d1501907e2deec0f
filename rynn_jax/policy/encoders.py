"""Vision encoders behind one protocol: an observation (RGB, depth as grey RGB) → the policy's
vision input, from frozen parameters passed in explicitly (so jitted callers take them as
arguments, never as baked-in constants).

    World4DFeatures (world4d, world4d_rgb)  one frozen RynnWorld-4D forward to `backbone.layer`:
        frame 0 = VAE(RGB), VAE(depth as grey video), VAE(white = zero flow); frames 1.. noise
        (independent per branch, from a key); timesteps 0 | 500 …; text = the goal tokens
        ─▶ (B, T, S, 3·D) (world4d) or the RGB third (B, T, S, D) (world4d_rgb)
    ImageInput (cnn)   RGB + one depth channel in [−1, 1], (B, H, W, 4); the CNN is trained with
        the head, inside `model.Policy`
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rynn_jax.policy.config import PolicyConfig


class VisionEncoder(Protocol):
    params: object  # frozen pytree (empty for ImageInput)

    def apply(self, params, rgb_bhw3: jax.Array, depth_rgb_bhw3: jax.Array, goal_bgk: jax.Array,
              rng: jax.Array) -> jax.Array:
        """uint8 RGB and depth-as-grey-RGB (B, H, W, 3) at cfg.image_size and the goal tokens →
        the policy's vision input."""
        ...


def to_unit(x_u8: jax.Array) -> jax.Array:
    return x_u8.astype(jnp.float32) / 127.5 - 1.0


class ImageInput:
    params: dict = {}

    def apply(self, params, rgb_bhw3, depth_rgb_bhw3, goal_bgk, rng):
        return jnp.concatenate([to_unit(rgb_bhw3), to_unit(depth_rgb_bhw3[..., :1])], axis=-1)


def load_dit4d(path: str):
    """A WanDiT4D from a directory in the rynn_jax.converted_weights layout (config.json with its nested base)."""
    from rynn_jax import converted_weights
    from rynn_jax.models.dit import WanDiTConfig
    from rynn_jax.models.dit4d import WanDiT4DConfig, abstract_dit4d, dit4d_from_params

    tup = lambda d: {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}  # noqa: E731
    with open(os.path.join(path, converted_weights.CONFIG_FILE)) as f:
        raw = json.load(f)
    if raw.pop("__class__", "WanDiT4DConfig") != "WanDiT4DConfig":
        raise ValueError(f"{path}: not a WanDiT4D directory")
    cfg = WanDiT4DConfig(base=WanDiTConfig(**tup(raw.pop("base"))), **tup(raw))
    abstract = nnx.to_pure_dict(nnx.state(abstract_dit4d(cfg)))
    return dit4d_from_params(cfg, converted_weights.restore_params(path, abstract))


RANDOM = "random"  # backbone.dit / backbone.vae: SPEC-size random weights (latency without a checkpoint)


def random_backbone(layer: int, seed: int = 1):
    """The full-size 4D model's first `layer` + 1 blocks (all the feature pass runs; JA at 0, 3, …
    as the release has it) with random bf16 weights."""
    from rynn_jax.models.dit import WanDiTConfig
    from rynn_jax.models.dit4d import WanDiT4DConfig, init_dit4d

    base = WanDiTConfig.ti2v_5b(eps=1e-5, dtype="bfloat16", param_dtype="bfloat16", num_layers=layer + 1)
    return init_dit4d(WanDiT4DConfig.full(base=base, joint_layers=tuple(range(0, layer + 1, 3))), seed=seed)


class World4DFeatures:
    """Frozen RynnWorld-4D block features ("tiny" builds random toy weights for tests, "random"
    random SPEC-size ones for latency benches)."""

    def __init__(self, cfg: PolicyConfig):
        from rynn_jax.models import vae as vae_lib
        from rynn_jax.models.dit4d import WanDiT4DConfig, init_dit4d

        self.cfg = cfg
        bb = cfg.backbone
        for name, value in (("backbone.dit", bb.dit), ("backbone.vae", bb.vae)):
            if value not in ("tiny", RANDOM) and not os.path.isdir(value):
                raise FileNotFoundError(f"{name} {value!r}: no such directory (or 'tiny' / 'random' for toy / "
                                        "SPEC-size random weights)")
        dit = (init_dit4d(WanDiT4DConfig.tiny(), seed=1) if bb.dit == "tiny" else
               random_backbone(bb.layer) if bb.dit == RANDOM else load_dit4d(bb.dit))
        if bb.fp8:
            from rynn_jax.models.fp8 import load_scales, quantize_dit, with_static_scales

            dit = quantize_dit(dit)
            if bb.fp8_scales:
                dit = with_static_scales(dit, load_scales(bb.fp8_scales))
        if bb.fp8_attention:
            from rynn_jax.models.fp8 import with_fp8_attention

            dit = with_fp8_attention(dit)
        z = dit.cfg.in_channels
        if bb.vae == "tiny":
            vae = vae_lib.init_vae(vae_lib.WanVAEConfig.tiny(z_dim=z, latents_mean=(0.0,) * z, latents_std=(1.0,) * z), 2)
        elif bb.vae == RANDOM:
            vae = vae_lib.init_vae(vae_lib.WanVAEConfig(dtype="bfloat16", param_dtype="bfloat16"), 2)
        else:
            from rynn_jax.models.vae_weights import load_vae
            vae = load_vae(bb.vae)
        if vae.cfg.z_dim != z:
            raise ValueError(f"backbone.vae has {vae.cfg.z_dim} latent channels, the 4D model reads {z}")
        if not 0 <= bb.layer < dit.cfg.base.num_layers:
            raise ValueError(f"backbone.layer {bb.layer} outside the model's {dit.cfg.base.num_layers} blocks")
        if bb.unrolled and not (bb.fp8 and not bb.fp8_scales):  # the serving layout, blocks past the feature cut
            from rynn_jax.models.dit4d import unrolled4d

            dit = unrolled4d(dit, num_layers=bb.layer + 1)
        if cfg.head.goal_dim != dit.cfg.text_dim or cfg.head.goal_len > dit.cfg.text_len:
            raise ValueError(f"head.goal_dim/goal_len {cfg.head.goal_dim}/{cfg.head.goal_len} must match the 4D "
                             f"model's text width {dit.cfg.text_dim} (≤ {dit.cfg.text_len} tokens)")
        width = (3 if cfg.encoder == "world4d" else 1) * dit.cfg.base.dim
        if cfg.compressor.in_dim != width:
            raise ValueError(f"compressor.in_dim {cfg.compressor.in_dim} ≠ the {cfg.encoder} feature width {width}")
        self.dit_cfg, self.vae_cfg = dit.cfg, vae.cfg
        (self._dit_def, dit_state), (self._vae_def, vae_state) = nnx.split(dit), nnx.split(vae)
        # the flow branch's frame 0 is the same all-white image every step: encoded once, here
        h, w = bb.image_size
        white = jax.jit(vae_lib.encode, static_argnums=0)(self._vae_def, vae_state, jnp.ones((1, 1, h, w, 3)))
        self.params = {"dit": dit_state, "vae": vae_state, "white_latent": white}

    def apply(self, params, rgb_bhw3, depth_rgb_bhw3, goal_bgk, rng):
        z, t_bf = self.latents(params, rgb_bhw3, depth_rgb_bhw3, rng)
        return self.features(params, z, t_bf, goal_bgk)

    def latents(self, params, rgb_bhw3, depth_rgb_bhw3, rng):
        """The backbone's input: the observation (RGB, depth image, an all-ones flow image) through
        the VAE as latent frame 0, noise after it; per-frame timesteps (frame 0 clean). The flow
        image's latent is params["white_latent"], encoded once."""
        from rynn_jax.models import vae as vae_lib

        bb = self.cfg.backbone
        b = rgb_bhw3.shape[0]
        h, w = bb.image_size
        images = jnp.stack([to_unit(rgb_bhw3), to_unit(depth_rgb_bhw3)])
        images = jax.image.resize(images, (2, b, h, w, 3), "linear").reshape(2 * b, 1, h, w, 3)
        z0 = vae_lib.encode(self._vae_def, params["vae"], images)  # (2B, 1, h', w', z)
        white = jnp.broadcast_to(params["white_latent"], (1, b, *z0.shape[1:]))
        z0 = jnp.concatenate([z0.reshape(2, b, *z0.shape[1:]), white])[:, :, 0]  # (3, B, h', w', z)
        noise = jax.random.normal(rng, (3, b, bb.latent_frames - 1, *z0.shape[2:]), jnp.float32)
        z = jnp.concatenate([z0[:, :, None], noise], axis=2)
        t_bf = jnp.concatenate([jnp.zeros((b, 1)), jnp.full((b, bb.latent_frames - 1), bb.timestep)], axis=1)
        return (z[0], z[1], z[2]), t_bf

    def features(self, params, z, t_bf, goal_bgk, dit=None):
        """(B, T, S, C) block features of latents `z` (the three branches) at timesteps t_bf, the
        text context = the goal tokens, zero-padded to the model's text length; `dit`: another
        module for the backbone (calibration), else params["dit"]'s."""
        dcfg = self.dit_cfg
        b, f, hh, ww, _ = z[0].shape
        goal = goal_bgk[:, :self.cfg.head.goal_len].astype(jnp.float32)
        ctx = jnp.zeros((b, dcfg.text_len, dcfg.text_dim), jnp.float32).at[:, :goal.shape[1]].set(goal)
        dit = nnx.merge(self._dit_def, params["dit"]) if dit is None else dit
        feats = dit.features(z, t_bf, ctx, self.cfg.backbone.layer)
        if self.cfg.encoder == "world4d_rgb":
            feats = feats[..., :dcfg.base.dim]
        pt, ph, pw = dcfg.patch_size
        return feats.reshape(b, f // pt, (hh // ph) * (ww // pw), feats.shape[-1])

    def calibrate_fp8(self, observations, *, margin: float = 1.0):
        """The FP8 backbone (`backbone.fp8`, per-token scales) with static activation scales
        calibrated on observation batches (rgb, depth_rgb, goal, rng) run as `apply` runs them;
        `fp8.save_scales(path, result)` writes the file `backbone.fp8_scales` reads."""
        from rynn_jax.models import fp8

        self._require_per_token_fp8("calibrate_fp8")

        def run(dit, obs):
            rgb, depth, goal, rng = obs
            z, t_bf = self.latents(self.params, rgb, depth, rng)
            return self.features(None, z, t_bf, goal, dit=dit)

        return fp8.calibrate(nnx.merge(self._dit_def, self.params["dit"]), run, observations, margin=margin,
                             progress=False, layers=self.cfg.backbone.layer + 1)

    def _require_per_token_fp8(self, caller: str) -> None:
        if not self.cfg.backbone.fp8 or self.cfg.backbone.fp8_scales:
            raise ValueError(f"{caller}: needs backbone.fp8 with per-token scales (no fp8_scales)")

    def with_static_scales(self, scales: dict[str, np.ndarray], source: str = "in memory") -> "World4DFeatures":
        """This per-token FP8 backbone with static activation scales (`fp8.static_scales` of
        `calibrate_fp8`'s result): what `backbone.fp8_scales = source` builds, without building or
        loading the backbone again (same weights, shared)."""
        from rynn_jax.models import fp8

        self._require_per_token_fp8("with_static_scales")
        bb = self.cfg.backbone
        new = copy.copy(self)
        dit = fp8.with_static_scales(nnx.merge(self._dit_def, self.params["dit"]), scales)
        if bb.unrolled:
            from rynn_jax.models.dit4d import unrolled4d

            dit = unrolled4d(dit, num_layers=bb.layer + 1)
        new._dit_def, dit_state = nnx.split(dit)
        new.dit_cfg = dit.cfg
        new.params = {**self.params, "dit": dit_state}
        new.cfg = dataclasses.replace(self.cfg, backbone=dataclasses.replace(bb, fp8_scales=source))
        return new


def make_encoder(cfg: PolicyConfig) -> VisionEncoder:
    return ImageInput() if cfg.encoder == "cnn" else World4DFeatures(cfg)


def depth_image(depth_m: np.ndarray) -> np.ndarray:
    """Depth in metres (…, H, W) → the grey RGB the 4D model reads (data.geometry_video)."""
    from rynn_jax.data.geometry_video import depth_to_rgb

    return depth_to_rgb(depth_m)
