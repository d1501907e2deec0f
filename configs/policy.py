"""The RynnWorld-4D policy at SPEC size, one recipe per vision encoder (docs/POLICY.md):

    python -m rynn_jax.policy.train --config configs/policy.py:world4d \
        --set policy.backbone.dit=weights/world4d --set policy.backbone.vae=weights/vae \
        --set data.train_dirs="('data/sim/*/episode_*',)"
    python -m rynn_jax.policy.train --config configs/policy.py:world4d_rgb ...   # (b) RGB-branch features
    python -m rynn_jax.policy.train --config configs/policy.py:cnn ...           # (c) CNN from scratch

AdamW 1e-4, β (0.9, 0.9), weight decay 0.05, clip 1.0, EMA 0.9999, tri-stage schedule (2 % warm-up
from 0.1·lr, 8 % hold, exponential decay to 1e-6·lr), batch 64. 100 epochs of 200 episodes × 113
frames per task ≈ 140k steps at batch 64; the default 100k steps is the released config's 50 epochs.
"""

import dataclasses

from rynn_jax.policy.config import PolicyConfig
from rynn_jax.policy.train import PolicyTrainConfig


def get_config(encoder: str = "world4d") -> PolicyTrainConfig:
    cfg = PolicyTrainConfig(policy=PolicyConfig.full(encoder))
    steps = cfg.total_steps
    return dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, warmup_steps=steps // 50,
                                                              hold_steps=steps * 2 // 25))
