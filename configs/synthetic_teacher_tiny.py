"""CPU smoke version of configs/synthetic_teacher.py (CI: the whole synthetic recipe at toy size)."""

import dataclasses

from configs import synthetic, synthetic_teacher


def get_config():
    cfg = synthetic_teacher.get_config()
    model = synthetic.teacher_model(dim=32, num_layers=2, num_heads=2, ffn_dim=64, freq_dim=32, dtype="float32")
    return dataclasses.replace(
        cfg, model=model, total_steps=6,
        optim=dataclasses.replace(cfg.optim, warmup_steps=2),
        data=dataclasses.replace(cfg.data, batch_size=2, worker_count=0),
        ckpt=dataclasses.replace(cfg.ckpt, every=3),
        log=dataclasses.replace(cfg.log, every=2))
