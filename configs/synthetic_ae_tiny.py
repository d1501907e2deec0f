"""CPU / CI smoke version of configs/synthetic_ae.py: a 0.17M-parameter autoencoder of the same
layout on 5-frame 64×112 clips of tiny sim episodes.

    python -m rynn_jax.sim.cli generate --task all --n 2 --out data/sim_tiny/train --resolution tiny
    python -m rynn_jax.sim.cli generate --task all --n 1 --seed 1000 --out data/sim_tiny/heldout --resolution tiny
    python train.py --config configs/synthetic_ae_tiny.py
"""

from rynn_jax.models.vae import WanVAEConfig
from rynn_jax.training.autoencoder import AutoencoderDataConfig, AutoencoderTrainConfig
from rynn_jax.training.config import CheckpointConfig, LogConfig, OptimConfig


def get_config() -> AutoencoderTrainConfig:
    return AutoencoderTrainConfig(
        model=WanVAEConfig.synthetic(base_dim=8, decoder_base_dim=8, z_dim=4),
        data=AutoencoderDataConfig(
            train_dirs=("data/sim_tiny/train/*/episode_*",), heldout_dirs=("data/sim_tiny/heldout/*/episode_*",),
            height=64, width=112, num_frames=5, batch_size=4, eval_clips=8, stats_clips=8),
        optim=OptimConfig(lr=3e-3, warmup_steps=10, weight_decay=0.0, ema_decay=0.0),
        ckpt=CheckpointConfig(dir="runs/synthetic_ae_tiny/ckpt", every=50, keep=2),
        log=LogConfig(dir="runs/synthetic_ae_tiny/logs", every=10),
        total_steps=100,
        eval_every=50,
        export_dir="runs/synthetic_ae_tiny/vae",
    )
