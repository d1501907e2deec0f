"""The CNN policy (row (c) of docs/POLICY.md) at a size a 2-core CPU trains in about 45 minutes:
RGB + depth at 96×160, four conv stages (16 → 128 channels, 6 × 10 tokens), a 128-wide Flow Former
(32 learned queries, 2 layers) and a 128-wide action head (3 + 3 layers), goal = the hashed task
embedding. Same trainer, loss, schedule shape and evaluation as the SPEC-size recipe
(configs/policy.py:cnn); only the widths, the batch and the step count are smaller.

    python -m rynn_jax.sim.cli generate --task all --n 60 --out data/sim_cpu --workers 2 --resolution 96x160
    python -m rynn_jax.policy.train --config configs/policy_cnn_cpu.py
    python serve.py policy --task all --episodes 35 --resolution 96x160 --workers 2 \
        --policy runs/policy_cnn_cpu-<time>/export --name cnn_cpu --out outputs/policy
"""

import dataclasses

from rynn_jax.policy.config import CnnConfig, CompressorConfig, HeadConfig, PolicyConfig
from rynn_jax.policy.train import PolicyDataConfig, PolicyTrainConfig


def get_config() -> PolicyTrainConfig:
    policy = PolicyConfig(
        encoder="cnn",
        cnn=CnnConfig(channels=(16, 32, 64, 128), image_size=(96, 160), groups=8),
        compressor=CompressorConfig(in_dim=128, hidden_dim=256, dim=128, num_frames=1, queries_per_frame=32,
                                    layers=2, heads=4, head_dim=32),
        head=HeadConfig(dim=128, heads=4, encoder_layers=3, decoder_layers=3, goal_dim=64, goal_len=4,
                        attn_dropout=0.1, resid_dropout=0.05, mlp_dropout=0.0))
    cfg = PolicyTrainConfig(policy=policy, total_steps=6000,
                            data=PolicyDataConfig(train_dirs=("data/sim_cpu/*/episode_*",), batch_size=32,
                                                  cache_episodes=256))
    steps = cfg.total_steps
    return dataclasses.replace(
        cfg, optim=dataclasses.replace(cfg.optim, lr=5e-4, warmup_steps=steps // 50, hold_steps=steps * 2 // 5,
                                       end_lr_factor=0.01, ema_decay=0.999),
        ckpt=dataclasses.replace(cfg.ckpt, every=500), log=dataclasses.replace(cfg.log, every=50))
