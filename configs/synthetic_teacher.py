"""The synthetic-world teacher: a small action-conditioned WanDiT trained from scratch on the
pre-encoded synthetic episodes (configs/synthetic.py has the data, split and model size).

One stage with the control branch from step 0 (the paper's video stage then action stage, folded
into one: a from-scratch model on one domain gains nothing from a control-free warm-up). TI2V:
frame 0 is the clean reference latent and is left out of the loss; the control latent is fused by
the distribution-aligned addition. Constant learning rate after warm-up, so a run stopped at any
step (the GPU is lent in ≤ 25-minute pieces) ends with usable EMA weights.

    python train.py --config configs/synthetic_teacher.py [--set total_steps=...]
"""

from configs import synthetic
from rynn_jax.sharding import MeshConfig
from rynn_jax.training.config import CheckpointConfig, DataConfig, LogConfig, LossConfig, OptimConfig, TrainConfig
from rynn_jax.training.lora import LoraConfig


def get_config() -> TrainConfig:
    model = synthetic.teacher_model()
    run = f"{synthetic.RUNS}/teacher"
    return TrainConfig(
        model=model,
        lora=LoraConfig(rank=0),
        optim=OptimConfig(lr=4e-4, warmup_steps=300, schedule="constant", weight_decay=0.01, grad_clip=1.0,
                          ema_decay=0.999),
        loss=LossConfig(shift=5.0, exclude_first_frame=True, use_control=True),
        data=DataConfig(kind="latents", batch_size=32, sources={"robot": synthetic.LATENTS},
                        weights={"robot": 1.0}, worker_count=8, text_len=synthetic.TEXT_LEN),
        mesh=MeshConfig(data=1, fsdp=-1, tensor=1, context=1),
        ckpt=CheckpointConfig(dir=run, every=500, keep=2),
        log=LogConfig(dir=f"{run}/logs", every=50, sample_every=0),
        total_steps=20000,
        min_sharded_size=1 << 30,  # one GPU, nothing to shard
    )
