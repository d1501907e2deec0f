"""Decoders of the synthetic autoencoder's latent space (configs/synthetic_ae.py, exported to
synthetic.AUTOENCODER), trained with its encoder frozen, so the teacher and the student stay valid
(rynn_jax/training/decoder.py, docs/autoencoder.md "Decoders"):

    python train.py --config configs/synthetic_decoder.py:tae   # the real-time tiny decoder → synthetic.TINY_DECODER
    python train.py --config configs/synthetic_decoder.py:vae   # the autoencoder's decoder fine-tuned → runs/…/autoencoder
    python train.py --config configs/synthetic_decoder.py:vae_wide   # a wider decoder (64), from scratch → runs/…/autoencoder
    python train.py --config configs/synthetic_decoder.py:vae_flat   # 128 wide at every level, from scratch
    python -m rynn_jax.training.decoder export --config configs/synthetic_decoder.py:tae --out DIR   # newest checkpoint

`:tae` trains TAEConfig.synthetic() (1.72M parameters; 84 ms per 3-latent block at 128×224 on 2
CPU cores, vs 938 ms for the autoencoder's decoder) from scratch on 17-frame clips of the training
episodes' head-camera video; `:vae` fine-tunes the exported decoder (the committed autoencoder's
decoder half) on the same clips and exports a whole autoencoder directory with the encoder and the
latent statistics unchanged; `:vae_wide` trains a decoder 64 wide at full resolution (revision 5's
was 48: ≈ 1.8× its decoder parameters) from scratch behind the same frozen encoder — whether decoder
capacity is what held the held-out RGB PSNR near 30 dB (the encoder + decoder continuation gained
only ≈ 0.3 dB per 4,000 steps at the end of its schedule); it became revision 6's decoder, after a
fine-tune on depth and flow (configs/synthetic_ae4d.py:wide). All score the
held-out episodes after training (`heldout.json`: `psnr` = this decoder, `psnr_autoencoder` = the
autoencoder's own, on the same latents). `:vae_flat` moves capacity to where the error is (spatial
detail): 128 channels at every level (`decoder_dim_mult` (1, 1, 1)) instead of 128 at the two low
resolutions and 64 at the full one; 7.8M decoder parameters against `:vae_wide`'s 6.6M (the
committed autoencoder's, revision 6), about 3× the full-resolution stage's FLOPs
(≈ 1.9× the decoder's). Its first run (6,000 steps, 14 steps/s on one H100) scored under revision 6
on RGB, depth and flow (docs/autoencoder.md), so it is a recipe, not a revision.

The first `:vae_wide` run (one H100, lr 1e-3, 12,000-step schedule stopped at 7,838 steps): PSNR on
training batches 26.7, 29.4, 30.6, 30.9 dB at steps 500, 1,500, 4,200, 5,200 — above the
autoencoder's own decoder's 29.2–29.6 — then the loss jumped eightfold near step 5,500 (lr 6.4e-4,
gradient norms 0.01–0.05, far under the clip) and had not recovered when it stopped: held-out 26.1 dB
against 29.7 for the autoencoder's decoder on the same clips. Hence its lower peak rate: at 4e-4 on
a 9,000-step schedule (7.4 min at 20.5 steps/s on one H100) it ran through and scored **31.01 dB**
held-out against 29.72 (96 clips; `psnr_streaming` the same within 3e-5), so 9,000 steps are its
schedule.

Sizing: a step is one frozen-encoder forward and one decoder forward + backward
at 16 × 17 × 128×224. The autoencoder recipe's full step (encoder and decoder, both with gradients)
ran 13.8–15.4 steps/s on one H200, data loading included, so ≥ 15 steps/s is expected here:
`:tae` 20,000 steps ≈ 20–25 min, `:vae` 6,000 steps ≈ 7 min. On a CPU, a short run for a look
(400 steps at batch 4: 22.9 dB held-out after 42 min on 2 shared cores; docs/autoencoder.md):
`--set data.batch_size=4 --set data.worker_count=0 --set total_steps=400 --set optim.warmup_steps=40`.
"""

import dataclasses

from configs import synthetic
from rynn_jax.models.tae import TAEConfig
from rynn_jax.training.autoencoder import SIM_VIDEOS, AutoencoderDataConfig
from rynn_jax.training.config import CheckpointConfig, LogConfig, OptimConfig
from rynn_jax.training.decoder import DecoderTrainConfig

FLAVOURS = ("tae", "vae", "vae_wide", "vae_flat")
WIDE_DECODER = 64  # vae_wide's decoder_base_dim
FLAT_DECODER = 128, (1, 1, 1)  # vae_flat's decoder_base_dim and decoder_dim_mult


def get_config(flavour: str = "tae") -> DecoderTrainConfig:
    if flavour not in FLAVOURS:
        raise ValueError(f"flavour must be one of {FLAVOURS}, got {flavour!r}")
    tae = flavour == "tae"
    scratch = flavour != "vae"  # the tiny decoder and the wide and flat ones start from a random init
    run = f"{synthetic.RUNS}/decoder_{flavour}"
    return DecoderTrainConfig(
        decoder="tae" if tae else "vae",
        vae_decoder_width={"vae_wide": WIDE_DECODER, "vae_flat": FLAT_DECODER[0]}.get(flavour, 0),
        vae_decoder_dim_mult=FLAT_DECODER[1] if flavour == "vae_flat" else (),
        tae=TAEConfig.synthetic(z_dim=synthetic.LATENT_CHANNELS),
        data=AutoencoderDataConfig(
            train_dirs=(f"{synthetic.DATA_TRAIN}/*/episode_*",),
            heldout_dirs=(f"{synthetic.DATA_HELDOUT}/*/episode_*",),
            videos={"rgb": SIM_VIDEOS["rgb"]},  # what a served decoder decodes; skeletons are only encoded
            height=synthetic.HEIGHT, width=synthetic.WIDTH, num_frames=17, batch_size=16, worker_count=8,
            read_threads=2, eval_clips=96),
        # from scratch: the autoencoder recipe's rate (the wide decoder: 2.5× lower, it diverged at
        # 1e-3); fine-tuning: 5× lower, from its trained decoder
        optim=OptimConfig(lr=(4e-4 if flavour.startswith("vae_") else 1e-3) if scratch else 2e-4,
                          warmup_steps=200 if scratch else 100, schedule="cosine",
                          end_lr_factor=0.05, weight_decay=0.0, grad_clip=1.0, ema_decay=0.0),
        ckpt=CheckpointConfig(dir=f"{run}/ckpt", every=1000, keep=2, init_from=synthetic.AUTOENCODER),
        log=LogConfig(dir=f"{run}/logs", every=50),
        total_steps=(9000 if flavour.startswith("vae_") else 20000) if scratch else 6000,
        eval_every=0,
        # the tiny decoder goes where serving looks for it (opt-in: --decoder tiny); a fine-tuned
        # autoencoder replaces synthetic.AUTOENCODER only by hand, after its held-out PSNR is read
        export_dir=synthetic.TINY_DECODER if tae else f"{run}/autoencoder",
    )


def tiny(cfg: DecoderTrainConfig) -> DecoderTrainConfig:
    """A CPU/CI-sized variant of `cfg` (configs/synthetic_decoder_tiny.py)."""
    return dataclasses.replace(
        cfg, tae=TAEConfig.synthetic(z_dim=synthetic.LATENT_CHANNELS, decoder_widths=(16, 8, 8, 8), blocks_per_stage=1),
        vae_decoder_width=12 if cfg.vae_decoder_width else 0,  # vae_flat's (1, 1, 1) keeps: 12 at every level
        total_steps=100,
        data=dataclasses.replace(cfg.data, height=64, width=96, num_frames=5, batch_size=4, worker_count=0,
                                 eval_clips=8),
        optim=dataclasses.replace(cfg.optim, lr=3e-3, warmup_steps=10),
        ckpt=dataclasses.replace(cfg.ckpt, every=50),
        log=dataclasses.replace(cfg.log, every=10))
