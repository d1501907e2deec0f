"""CPU smoke version of configs/synthetic_distill.py (CI: the whole distillation recipe at toy size,
on the same causal layout; the teacher is configs/synthetic_teacher_tiny.py's model)."""

import dataclasses

from configs import synthetic, synthetic_distill


def get_config(phase: str = "warmup"):
    cfg = synthetic_distill.get_config(phase)
    model = synthetic.teacher_model(dim=32, num_layers=2, num_heads=2, ffn_dim=64, freq_dim=32, dtype="float32")
    return dataclasses.replace(
        cfg, model=model, total_steps=6 if phase == "warmup" else 10,
        # toy steps: larger rates so that a few steps move the student measurably
        optim=dataclasses.replace(cfg.optim, lr=3e-3, ema_decay=0.5),  # an EMA that follows a few steps
        critic_optim=dataclasses.replace(cfg.critic_optim, lr=1e-3),
        data=dataclasses.replace(cfg.data, batch_size=2, worker_count=0),
        ckpt=dataclasses.replace(cfg.ckpt, every=5),
        log=dataclasses.replace(cfg.log, every=2))
