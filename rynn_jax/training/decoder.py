"""Decoders for our autoencoder's latent space, trained with its encoder frozen.

    python train.py --config configs/synthetic_decoder.py:tae     # a tiny decoder, from scratch
    python train.py --config configs/synthetic_decoder.py:vae     # the autoencoder's own decoder, fine-tuned
    python -m rynn_jax.training.decoder export --config configs/synthetic_decoder.py:tae --out DIR

The encoder half of the exported autoencoder (`ckpt.init_from`, e.g. weights/synthetic/autoencoder)
is loaded once and never updated: it maps each clip to its normalized latents, exactly what
pre-encoding stored and the teacher and student learned to produce, so every model trained on that
latent space stays valid. Only a decoder of those latents is trained, in one of two flavours that
share this code path:

  * decoder="tae": a tiny decoder in the TAEHV layout (models/tae.py, `cfg.tae`, decoder only),
    trained from scratch for real-time decoding; exported as a directory `load_tae` reads
    (config.json + model.safetensors in the official names), whose latents_mean/std are the
    autoencoder's, so normalize=False means the autoencoder's raw posterior mean as well.
  * decoder="vae": the autoencoder's own decoder (post_quant_conv + decoder), fine-tuned from its
    exported weights; exported as a full autoencoder directory `load_vae` reads, with the encoder
    parameters and the latent statistics bit for bit as they were and the new decoder.

Data: the head-camera RGB videos only (`data.videos`): a served decoder only ever decodes
generated RGB, while the skeleton video is only encoded. Clips, held-out evaluation and PSNR are
training/autoencoder.py's, as are the train state, the optimizer, checkpoints (exact resume after
a kill) and the step loop (`autoencoder.run_steps`).

Read top to bottom: Config → State → Update → Evaluation → Export → Loop → CLI.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rynn_jax import converted_weights, errors
from rynn_jax.atomic import atomic_dir
from rynn_jax.models import tae as tae_lib
from rynn_jax.models import vae as vae_lib
from rynn_jax.models.tae import TAEConfig, TinyAutoencoder
from rynn_jax.models.vae import WanVAE
from rynn_jax.serving import codecs
from rynn_jax.training import autoencoder as ae
from rynn_jax.training import optim
from rynn_jax.training.autoencoder import SIM_VIDEOS, AutoencoderDataConfig, Item
from rynn_jax.training.config import CheckpointConfig, LogConfig, OptimConfig
from rynn_jax.training.state import TrainState
from rynn_jax.training.step import apply_gradients

log = logging.getLogger("rynn_jax.training")

# --------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecoderTrainConfig:
    # What is trained: a tiny decoder (`tae`, from scratch) or the autoencoder's own decoder (`vae`, fine-tuned).
    decoder: Literal["tae", "vae"] = "tae"
    # decoder="tae": its architecture (decoder_only; z_dim and strides must be the autoencoder's;
    # dtype is ignored in training, float32, and the export's is export_dtype).
    tae: TAEConfig = dataclasses.field(default_factory=TAEConfig.synthetic)
    data: AutoencoderDataConfig = dataclasses.field(
        default_factory=lambda: AutoencoderDataConfig(videos={"rgb": SIM_VIDEOS["rgb"]}))  # RGB: what is decoded
    optim: OptimConfig = dataclasses.field(default_factory=lambda: OptimConfig(lr=1e-3, ema_decay=0.0))
    # init_from: the exported autoencoder (required): its encoder, frozen, and for decoder="vae" the
    # decoder to start from.
    ckpt: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    log: LogConfig = dataclasses.field(default_factory=LogConfig)
    vae_dtype: Literal["bfloat16", "float32"] = "bfloat16"  # decoder="vae": its compute dtype (float32 master weights)
    # decoder="vae": 0 fine-tunes the exported decoder; N > 0 trains a new one N wide at full
    # resolution (WanVAEConfig.decoder_base_dim) from a random init (seed), behind the same frozen
    # encoder: more decoder capacity without changing the latents the teacher and student read.
    vae_decoder_width: int = 0
    # with vae_decoder_width: the new decoder's width multipliers per level (WanVAEConfig.decoder_dim_mult;
    # empty: the autoencoder's dim_mult), e.g. (1, 1, 1) for a full-resolution stage as wide as the rest
    vae_decoder_dim_mult: tuple[int, ...] = ()
    # Pixel MSE is what PSNR measures, the number the decoder is judged by, so it is the loss; an L1
    # term (sharper edges, less PSNR) is there to try, off by default.
    mse_weight: float = 1.0
    l1_weight: float = 0.0
    total_steps: int = 4000  # optimizer steps (the schedule spans them)
    seed: int = 0  # the tiny decoder's init
    eval_every: int = 0  # held-out PSNR every N steps (0 = only after training, on the export)
    export_dir: str = ""  # after training: write the decoder (tae) or autoencoder (vae) directory here
    export_dtype: Literal["bfloat16", "float32"] = "bfloat16"  # storage dtype of the exported parameters
    # Fault injection for tests: SIGKILL this process right after dispatching this step (0 = never).
    debug_kill_at_step: int = 0

    def __post_init__(self):
        d = self.data
        for name, value in (("data.batch_size", d.batch_size), ("total_steps", self.total_steps),
                            ("data.eval_clips", d.eval_clips)):
            if value < 1:
                raise ValueError(f"{name} must be ≥ 1, got {value}")
        if not d.videos:
            raise ValueError("data.videos names no video file")
        if min(self.mse_weight, self.l1_weight) < 0 or self.mse_weight + self.l1_weight == 0:
            raise ValueError("mse_weight and l1_weight must be ≥ 0, not both 0")
        if self.decoder == "tae" and not self.tae.decoder_only:
            raise ValueError("tae.decoder_only must be True: only a decoder is trained")
        if self.vae_decoder_width < 0 or (self.vae_decoder_width and self.decoder != "vae"):
            raise ValueError(f"vae_decoder_width must be ≥ 0 and only set with decoder='vae', got "
                             f"{self.vae_decoder_width} with decoder={self.decoder!r}")
        if self.vae_decoder_dim_mult and not self.vae_decoder_width:
            raise ValueError("vae_decoder_dim_mult shapes a new decoder: set vae_decoder_width too")


def decoder_vae_config(cfg: DecoderTrainConfig, vae_cfg: vae_lib.WanVAEConfig) -> vae_lib.WanVAEConfig:
    """The autoencoder being trained: the exported one's config, with vae_decoder_width (and
    vae_decoder_dim_mult) if set."""
    if not cfg.vae_decoder_width:
        return vae_cfg
    return dataclasses.replace(vae_cfg, decoder_base_dim=cfg.vae_decoder_width,
                               decoder_dim_mult=tuple(cfg.vae_decoder_dim_mult))


def check_fit(cfg: DecoderTrainConfig, vae_cfg: vae_lib.WanVAEConfig) -> None:
    """The recipe against the autoencoder it trains for: one line naming what differs."""
    where = f"ckpt.init_from {cfg.ckpt.init_from}"
    s, d = vae_cfg.temporal_stride, cfg.data
    if d.num_frames < 1 + s or (d.num_frames - 1) % s:
        raise errors.UsageError(f"data.num_frames must be 1 + {s}·k with k ≥ 1 (the autoencoder's temporal "
                                f"stride), got {d.num_frames}")
    if d.height % vae_cfg.spatial_stride or d.width % vae_cfg.spatial_stride:
        raise errors.UsageError(f"data.height × data.width {d.height}×{d.width}: not multiples of the "
                                f"autoencoder's spatial stride {vae_cfg.spatial_stride}")
    if cfg.decoder != "tae":
        return
    t = cfg.tae
    if t.z_dim != vae_cfg.z_dim:
        raise errors.UsageError(f"tae.z_dim {t.z_dim}: the autoencoder at {where} has {vae_cfg.z_dim} latent channels")
    if (t.decoder_temporal_stride, t.spatial_stride) != (s, vae_cfg.spatial_stride):
        raise errors.UsageError(f"tae: strides {t.decoder_temporal_stride}×{t.spatial_stride} (time × space) differ "
                                f"from the autoencoder's {s}×{vae_cfg.spatial_stride} at {where}")


# --------------------------------------------------------------------------------------------------
# State: the frozen encoder half in `frozen`, the decoder being trained in `params`
# --------------------------------------------------------------------------------------------------


def _encoder_side(path: tuple, _) -> bool:
    """nnx filter: the autoencoder's encoder half (what makes latents); the rest is its decoder."""
    return str(path[0]) in ("encoder", "quant_conv")


def load_autoencoder(cfg: DecoderTrainConfig) -> WanVAE:
    """The exported autoencoder of `ckpt.init_from`, checked against the recipe."""
    from rynn_jax.models.vae_weights import load_vae

    path = cfg.ckpt.init_from
    if not path:
        raise errors.UsageError("ckpt.init_from: set it to the exported autoencoder whose encoder stays frozen",
                                fix="e.g. --set ckpt.init_from=weights/synthetic/autoencoder")
    errors.existing(path, "ckpt.init_from", kind="directory")
    if not converted_weights.is_converted_dir(path):
        raise errors.InputError(f"ckpt.init_from {path}: not an exported autoencoder (no params/ and config.json)")
    vae = load_vae(path)
    check_fit(cfg, vae.cfg)
    return vae


class Parts:
    """The frozen encoder and the trained decoder of one flavour as pure functions of their states
    (`frozen`: the encoder half as exported; `params`: the decoder, float32)."""

    def __init__(self, cfg: DecoderTrainConfig, vae_cfg: vae_lib.WanVAEConfig):
        self.flavour = cfg.decoder
        vae_cfg = decoder_vae_config(cfg, vae_cfg)  # the encoder half is the exported one either way
        self.vae_cfg = vae_cfg

        def split(dtype: str) -> tuple[nnx.GraphDef, nnx.State, nnx.State]:  # the autoencoder computing in `dtype`
            return nnx.split(vae_lib.abstract_vae(dataclasses.replace(vae_cfg, dtype=dtype)), _encoder_side, ...)

        # float32: the latents exactly as pre-encoding computed them (load_vae's compute dtype)
        self.encoder_graphdef, _, decoder_half = split("float32")
        self.decoder_half_shapes = decoder_half  # ShapeDtypeStructs: encoding never reads them
        self.vae_graphdef = split(cfg.vae_dtype)[0]
        self.tae_cfg = dataclasses.replace(cfg.tae, dtype="float32", latents_mean=vae_cfg.latents_mean,
                                           latents_std=vae_cfg.latents_std)
        self.tae_graphdef = nnx.split(tae_lib.abstract_tae(self.tae_cfg), nnx.Param)[0]
        self._latents = jax.jit(self.latents)

    def encoder(self, frozen: nnx.State) -> Callable[[jax.Array], jax.Array]:
        """The frozen encoder as a function of the video (one compiled program per Parts)."""
        return lambda video: self._latents(frozen, video)

    def latents(self, frozen: nnx.State, video: jax.Array) -> jax.Array:
        """Video in [-1, 1] (B, 1 + 4k, H, W, 3) → normalized latents (B, 1 + k, h, w, z)."""
        encoder = nnx.merge(self.encoder_graphdef, frozen, self.decoder_half_shapes)
        return jax.lax.stop_gradient(encoder.encode_frames(video, None, first=True, normalize=True)[0])

    def decoder_module(self, params: nnx.State, frozen: nnx.State) -> WanVAE | TinyAutoencoder:
        """The decoder as a module: the tiny autoencoder, or the whole autoencoder with this decoder."""
        if self.flavour == "tae":
            return nnx.merge(self.tae_graphdef, params)
        return nnx.merge(self.vae_graphdef, frozen, params)

    def decode(self, params: nnx.State, frozen: nnx.State, z: jax.Array, clip: bool = True) -> jax.Array:
        """Normalized latents → video (B, 1 + 4k, H, W, 3); clip=False: unclamped (for the loss)."""
        model = self.decoder_module(params, frozen)
        if self.flavour == "tae":
            frames, _ = model.decode_frames(z, None, normalize=True, clip=clip)
            return frames[:, self.tae_cfg.decoder_temporal_stride - 1:]  # as tae.decode: start-up frames dropped
        return model.decode_frames(z, None, first=True, normalize=True, clip=clip)[0]


def init_state(cfg: DecoderTrainConfig, tx: optax.GradientTransformation
               ) -> tuple[Parts, TrainState, WanVAE]:
    """(parts, fresh train state, the loaded autoencoder). params: the tiny decoder at random
    (seed) or the autoencoder's decoder half in float32; frozen: its encoder half, as exported."""
    vae = load_autoencoder(cfg)
    parts = Parts(cfg, vae.cfg)
    _, frozen, decoder_half = nnx.split(vae, _encoder_side, ...)
    frozen = jax.tree.map(jnp.copy, frozen)  # the train step donates the state; `vae` keeps its own arrays
    if cfg.decoder == "tae":
        params = nnx.state(tae_lib.init_tae(parts.tae_cfg, cfg.seed), nnx.Param)
    elif cfg.vae_decoder_width:
        fresh = vae_lib.init_vae(dataclasses.replace(parts.vae_cfg, dtype="float32", param_dtype="float32"), cfg.seed)
        params = nnx.split(fresh, _encoder_side, ...)[2]
    else:
        params = jax.tree.map(lambda p: jnp.asarray(p, jnp.float32), decoder_half)
    ema = jax.tree.map(jnp.copy, params) if cfg.optim.ema_decay > 0 else nnx.State({})
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, frozen=frozen, stats=nnx.State({}),
                       opt_state=tx.init(params), ema=ema, rng=jax.random.PRNGKey(cfg.seed))
    return parts, state, vae


# --------------------------------------------------------------------------------------------------
# Update
# --------------------------------------------------------------------------------------------------


def losses(parts: Parts, params: nnx.State, frozen: nnx.State, video_u8: jax.Array, cfg: DecoderTrainConfig
           ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Weighted MSE (+ L1) of the unclamped reconstruction of the frozen encoder's latents."""
    x = ae.to_unit(video_u8)
    err = parts.decode(params, frozen, parts.latents(frozen, x), clip=False) - x
    mse, l1 = jnp.mean(jnp.square(err)), jnp.mean(jnp.abs(err))
    return cfg.mse_weight * mse + cfg.l1_weight * l1, {"mse": mse, "l1": l1, "psnr": ae.psnr(mse)}


def make_step(cfg: DecoderTrainConfig, parts: Parts, tx: optax.GradientTransformation):
    """(TrainState, {"video": uint8}) → (TrainState, metrics), pure; `frozen` passes through unchanged."""
    schedule_lr = optim.lr_schedule(cfg.optim, cfg.total_steps)
    grad_fn = jax.value_and_grad(lambda p, f, v: losses(parts, p, f, v, cfg), has_aux=True)

    def step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, dict[str, jax.Array]]:
        (loss, parts_), grads = grad_fn(state.params, state.frozen, batch["video"])
        new, metrics = apply_gradients(state, grads, loss, tx, cfg.optim, schedule_lr)
        return new, {**metrics, **parts_}

    return step


# --------------------------------------------------------------------------------------------------
# Evaluation: frozen-encoder latents → each decoder, whole clip and streaming (the serving path)
# --------------------------------------------------------------------------------------------------

Decoder = WanVAE | TinyAutoencoder
_decode = jax.jit(lambda lib, g, p, z: lib.decode(g, p, z), static_argnums=(0, 1))
_decode_chunk = jax.jit(lambda lib, g, p, c, z, first: lib.decode_chunk(g, p, c, z, first=first),
                        static_argnums=(0, 1, 5))


def decode_whole(model: Decoder, z: jax.Array) -> jax.Array:
    codec, params = codecs.split(model)
    return _decode(codec.lib, codec.graphdef, params, z)


def decode_streaming(model: Decoder, z: jax.Array, height: int, width: int) -> jax.Array:
    """One latent per `decode_chunk` call through the serving codec (cache carried); the first
    call's 3 padding frames dropped: equal to `decode_whole`."""
    codec, params = codecs.split(model)
    cache = codec.init_decode_cache(z.shape[0], height, width)
    frames = []
    for i in range(z.shape[1]):
        y, cache = _decode_chunk(codec.lib, codec.graphdef, params, cache, z[:, i:i + 1], i == 0)
        frames.append(y)
    return jnp.concatenate(frames, axis=1)[:, 3:]


def evaluate(encode: Callable[[jax.Array], jax.Array], decoders: Mapping[str, Decoder],
             data: AutoencoderDataConfig, items: Sequence[Item], streaming: bool = False) -> dict[str, float]:
    """Mean per-clip PSNR (dB) of `data.eval_clips` fixed clips decoded from `encode`'s latents by
    each decoder: keys `psnr{name}` and `psnr{name}_{video}`; with `streaming`, the first decoder
    also through the streaming codec (`psnr_streaming`) and its largest difference from the whole clip."""
    names = list(data.videos)
    scores: dict[str, list[tuple[int, float]]] = {}
    max_diff = 0.0
    for kinds, video_u8 in ae.fixed_clips(data, items, data.eval_clips, ae.EVAL_STREAM):
        x = ae.to_unit(jnp.asarray(video_u8))
        z = encode(x)
        outs = {name: decode_whole(model, z) for name, model in decoders.items()}
        if streaming:
            first = next(iter(decoders))
            outs["_streaming"] = decode_streaming(decoders[first], z, x.shape[2], x.shape[3])
            max_diff = max(max_diff, float(jnp.max(jnp.abs(outs["_streaming"] - outs[first]))))
        for name, y in outs.items():
            clip_psnr = np.asarray(ae.psnr(jnp.mean(jnp.square(y - x), axis=(1, 2, 3, 4))))
            scores.setdefault(name, []).extend(zip(kinds.tolist(), clip_psnr.tolist()))
    out: dict[str, float] = {}
    for name, rows in scores.items():
        out[f"psnr{name}"] = float(np.mean([p for _, p in rows]))
        out |= {f"psnr{name}_{names[k]}": float(np.mean([p for kk, p in rows if kk == k]))
                for k in sorted({k for k, _ in rows})}
    if streaming:
        out["streaming_max_abs_diff"] = max_diff
    out["clips"] = data.eval_clips
    return out


# --------------------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------------------


def export(cfg: DecoderTrainConfig, parts: Parts, state_params: nnx.State, frozen: nnx.State, out_dir: str,
           autoencoder: WanVAE) -> dict:
    """Write the tiny decoder's directory (tae) or the whole autoencoder's (vae), load it back with
    the project's loader and score it on the held-out clips next to the autoencoder's own decoder
    (`heldout.json`); the directory appears only once all of it is written."""
    from rynn_jax.models.tae_weights import load_tae, save_tae
    from rynn_jax.models.vae_weights import load_vae

    cast = lambda tree: jax.tree.map(lambda p: p.astype(cfg.export_dtype), tree)  # noqa: E731
    with atomic_dir(out_dir) as tmp:  # whole, held-out scores included, or absent
        if cfg.decoder == "tae":
            export_cfg = dataclasses.replace(parts.tae_cfg, dtype=cfg.export_dtype)
            save_tae(str(tmp), tae_lib.tae_from_params(export_cfg, nnx.to_pure_dict(cast(state_params))))
            loaded: Decoder = load_tae(str(tmp))
        else:
            export_cfg = dataclasses.replace(parts.vae_cfg, param_dtype=cfg.export_dtype)
            whole = nnx.merge(parts.vae_graphdef, cast(frozen), cast(state_params))
            pure = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(whole, nnx.Param)))
            converted_weights.save_params(str(tmp), pure, export_cfg)
            loaded = load_vae(str(tmp))
        params = nnx.state(loaded, nnx.Param)
        summary = {"decoder": cfg.decoder, "parameters": int(sum(x.size for x in jax.tree.leaves(params))),
                   "bytes": int(sum(x.nbytes for x in jax.tree.leaves(params)))}
        if cfg.data.heldout_dirs:
            items = ae.video_items(ae.episode_dirs(cfg.data.heldout_dirs, "data.heldout_dirs"), cfg.data.videos)
            encode = parts.encoder(nnx.split(autoencoder, _encoder_side, ...)[1])
            summary["heldout"] = evaluate(encode, {"": loaded, "_autoencoder": autoencoder}, cfg.data, items,
                                          streaming=True)
        with open(tmp / "heldout.json", "w") as f:
            json.dump(summary, f, indent=1)
    log.info("exported %s: %s", out_dir, summary)
    return summary


# --------------------------------------------------------------------------------------------------
# Loop
# --------------------------------------------------------------------------------------------------


def train(cfg: DecoderTrainConfig) -> list[float]:
    """Runs (or resumes) `cfg`, then exports when cfg.export_dir is set; returns this call's losses."""
    tx = optim.make_optimizer(cfg.optim, cfg.total_steps)
    parts, state, vae = init_state(cfg, tx)  # the autoencoder first: its errors before any data is read
    train_items = ae.video_items(ae.episode_dirs(cfg.data.train_dirs, "data.train_dirs"), cfg.data.videos)
    heldout = (ae.video_items(ae.episode_dirs(cfg.data.heldout_dirs, "data.heldout_dirs"), cfg.data.videos)
               if cfg.data.heldout_dirs else [])
    log.info("%d training videos, %d held-out videos; %s decoder: %d parameters (encoder frozen: %d)",
             len(train_items), len(heldout), cfg.decoder, vae_lib.count_params(state.params),
             vae_lib.count_params(state.frozen))
    data_iter = ae.make_iterator(cfg.data, train_items)

    def evaluate_state(st: TrainState) -> dict[str, float]:
        model = parts.decoder_module(ae.final_params(st), st.frozen)
        return evaluate(parts.encoder(st.frozen), {"": model}, cfg.data, heldout)

    state, losses_seen = ae.run_steps(cfg, state, make_step(cfg, parts, tx), data_iter,
                                      evaluate_state if heldout else None)
    if cfg.export_dir:
        export(cfg, parts, ae.final_params(state), state.frozen, cfg.export_dir, vae)
    return losses_seen


# --------------------------------------------------------------------------------------------------
# CLI: export a run's newest checkpoint
# --------------------------------------------------------------------------------------------------


def restore(cfg: DecoderTrainConfig) -> tuple[Parts, TrainState, WanVAE]:
    """The newest readable training state under cfg.ckpt.dir (for export), with its parts and the
    autoencoder of ckpt.init_from."""
    tx = optim.make_optimizer(cfg.optim, cfg.total_steps)
    parts, fresh, vae = init_state(cfg, tx)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), fresh)
    return parts, ae.restore_newest(cfg.ckpt, abstract), vae


def main(argv: Sequence[str] | None = None) -> dict:
    a, cfg = ae.export_cli("python -m rynn_jax.training.decoder", __doc__, DecoderTrainConfig,
                           "configs/synthetic_decoder.py:tae or :vae", argv)
    parts, state, vae = restore(cfg)
    summary = export(cfg, parts, ae.final_params(state, use_ema=not a.raw), state.frozen, a.out, vae)
    print(json.dumps({"step": int(state.step), **summary}, indent=1))
    return summary


if __name__ == "__main__":
    # Through the importable module, so that the recipe's DecoderTrainConfig is the class checked.
    from rynn_jax.training import decoder

    sys.exit(errors.run(decoder.main))
