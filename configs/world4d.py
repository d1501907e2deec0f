"""RynnWorld-4D's three training stages (docs/RYNNWORLD4D.md), on the synthetic world's
pre-encoded RGB / depth / flow latents, starting from a converted Wan DiT (the synthetic teacher)
cloned into the depth and flow branches.

    python train.py --config configs/world4d.py:1 --set ckpt.init_from=weights/teacher   # stage 1
    python train.py --config configs/world4d.py:2 --set ckpt.init_from=...               # stage 2 …

Stage table (SPEC_4D §3; learning rates: the paper's, warm-up: the released scripts'):
    1  all but JA (no JA modules)          lr 2e-5  warm-up 300  λ_flow 0.5
    2  JA + modality embeddings only       lr 5e-5  warm-up 200  λ_flow 1.0  branch dropout 0.2
    3  all                                 lr 1e-5  warm-up 500  λ_flow 1.0  branch dropout 0.05
AdamW (0.9, 0.95), weight decay 1e-4, clip 1.0, cosine; EMA 0.9999 (stage 3: 0.999).
"""

import dataclasses

from rynn_jax.models.dit import WanDiTConfig
from rynn_jax.models.dit4d import WanDiT4DConfig
from rynn_jax.sharding import MeshConfig
from rynn_jax.training.config import CheckpointConfig, DataConfig, LogConfig, OptimConfig, TrainConfig, World4DLossConfig
from rynn_jax.training.lora import LoraConfig

_STAGES = {  # stage → (lr, warm-up, λ_flow, branch dropout, train, EMA decay)
    1: (2e-5, 300, 0.5, 0.0, "all", 0.9999),
    2: (5e-5, 200, 1.0, 0.2, "joint", 0.9999),
    3: (1e-5, 500, 1.0, 0.05, "all", 0.999),
}


def tiny_model(**overrides) -> WanDiT4DConfig:
    return WanDiT4DConfig.tiny(**overrides)


def stage(n: int, model: WanDiT4DConfig | None = None) -> TrainConfig:
    lr, warmup, flow_weight, dropout, train, ema = _STAGES[n]
    model = model or WanDiT4DConfig.full(base=WanDiTConfig.ti2v_5b(eps=1e-5, dtype="bfloat16", remat="save_dots"))
    if n == 1:
        model = dataclasses.replace(model, joint_layers=())
    return TrainConfig(
        model=model,
        lora=LoraConfig(rank=0),
        optim=OptimConfig(lr=lr, warmup_steps=warmup, b1=0.9, b2=0.95, weight_decay=1e-4, grad_clip=1.0,
                          ema_decay=ema),
        loss=World4DLossConfig(flow_weight=flow_weight, branch_dropout=dropout, train=train),
        data=DataConfig(kind="latents", batch_size=8, text_len=model.text_len),
        mesh=MeshConfig(data=1, fsdp=-1, tensor=1, context=1),
        ckpt=CheckpointConfig(every=500, keep=3),
        log=LogConfig(every=10),
        total_steps=2000,
    )


def get_config(n: str = "3") -> TrainConfig:
    return stage(int(n))
