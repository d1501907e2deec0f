"""The CNN policy at toy size on a few synthetic episodes: a CPU smoke run of the trainer.

    python -m rynn_jax.sim.cli generate --task push_block --n 2 --out data/sim_policy --resolution tiny
    python -m rynn_jax.policy.train --config configs/policy_cnn_tiny.py
    python serve.py policy --task push_block --episodes 2 --policy runs/policy_cnn_tiny-<time>/export
"""

import dataclasses

from rynn_jax.policy.config import PolicyConfig
from rynn_jax.policy.train import PolicyDataConfig, PolicyTrainConfig


def get_config() -> PolicyTrainConfig:
    cfg = PolicyTrainConfig(policy=PolicyConfig.tiny("cnn"),
                            data=PolicyDataConfig(train_dirs=("data/sim_policy/*/episode_*",), batch_size=8))
    return dataclasses.replace(
        cfg, total_steps=60,
        optim=dataclasses.replace(cfg.optim, lr=1e-3, warmup_steps=3, hold_steps=30, end_lr_factor=0.01,
                                  ema_decay=0.9),
        ckpt=dataclasses.replace(cfg.ckpt, every=30), log=dataclasses.replace(cfg.log, every=10))
