"""CPU toy size of configs/world4d_synthetic.py (the tiny teacher's dims; CONFIG_SUFFIX=_tiny in
scripts/synthetic_world_model.sh): same stages, paths and variants, a few steps each."""

import dataclasses

from configs import world4d_synthetic


def get_config(arg: str = "1"):
    n, _, variant = arg.partition(",")
    m = world4d_synthetic.model(control=variant == "control", dim=32, num_layers=2, num_heads=2, ffn_dim=64, freq_dim=32, dtype="float32")
    cfg = world4d_synthetic.stage(int(n), variant or "joint", m)
    return dataclasses.replace(
        cfg, total_steps=4,
        optim=dataclasses.replace(cfg.optim, warmup_steps=2),
        data=dataclasses.replace(cfg.data, batch_size=2, worker_count=0),
        ckpt=dataclasses.replace(cfg.ckpt, every=2),
        log=dataclasses.replace(cfg.log, every=2))
