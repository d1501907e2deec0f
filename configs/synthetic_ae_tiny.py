"""CPU / CI smoke version of configs/synthetic_ae.py: a 0.17M-parameter autoencoder of the same
layout on 5-frame 64×96 clips of the same episode directories (any resolution: frames are resized).
Same paths as the real recipe (checkpoints, export): run it in a scratch WORKDIR.

    CONFIG_SUFFIX=_tiny RES=64x96 N_TRAIN=2 N_HELDOUT=1 WORKDIR=/tmp/smoke scripts/synthetic_world_model.sh data heldout autoencoder
"""

import dataclasses

from configs import synthetic, synthetic_ae
from rynn_jax.models.vae import WanVAEConfig


def get_config():
    cfg = synthetic_ae.get_config()
    return dataclasses.replace(
        cfg, model=WanVAEConfig.synthetic(base_dim=8, decoder_base_dim=8, z_dim=synthetic.LATENT_CHANNELS), total_steps=100,
        data=dataclasses.replace(cfg.data, height=64, width=96, num_frames=5, batch_size=4, worker_count=0,
                                 eval_clips=8, stats_clips=8),
        optim=dataclasses.replace(cfg.optim, lr=3e-3, warmup_steps=10),
        ckpt=dataclasses.replace(cfg.ckpt, every=50),
        log=dataclasses.replace(cfg.log, every=10))
