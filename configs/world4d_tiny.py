"""RynnWorld-4D at toy size on synthetic latents (CPU smoke run of the three stages' objective).

    python train.py --config configs/world4d_tiny.py                      # stage 3 recipe: all trained
    python train.py --config configs/world4d_tiny.py --set loss.train=joint --set loss.branch_dropout=0.2
"""

import dataclasses

from configs import world4d


def get_config():
    cfg = world4d.stage(3)
    return dataclasses.replace(
        cfg, model=world4d.tiny_model(), total_steps=6,
        optim=dataclasses.replace(cfg.optim, warmup_steps=2, lr=3e-3),
        data=dataclasses.replace(cfg.data, kind="synthetic", batch_size=2, text_len=16, synthetic_shape=(3, 4, 4)),
        ckpt=dataclasses.replace(cfg.ckpt, every=3),
        log=dataclasses.replace(cfg.log, every=2),
        min_sharded_size=1 << 30)
