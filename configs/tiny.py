"""CI / CPU smoke recipe: a ~100k-parameter DiT with the control branch, LoRA off, synthetic data.

    python train.py --config configs/tiny.py [--set total_steps=50 --set ckpt.dir=/tmp/tiny]
"""

from rynn_jax.models.dit import WanDiTConfig
from rynn_jax.sharding import MeshConfig
from rynn_jax.training.config import CheckpointConfig, DataConfig, LogConfig, LossConfig, OptimConfig, TrainConfig
from rynn_jax.training.lora import LoraConfig


def get_config() -> TrainConfig:
    model = WanDiTConfig.tiny(control="add-plus")
    return TrainConfig(
        model=model,
        lora=LoraConfig(rank=0),
        optim=OptimConfig(lr=3e-3, warmup_steps=10, ema_decay=0.99, weight_decay=0.0),
        loss=LossConfig(),
        data=DataConfig(kind="synthetic", batch_size=8, text_len=model.text_len,
                        synthetic_shape=(3, 4, 4), synthetic_clips=4),
        mesh=MeshConfig(data=1, fsdp=-1, tensor=1, context=1),
        ckpt=CheckpointConfig(dir="", every=20, keep=2),
        log=LogConfig(dir="", every=10),
        total_steps=200,
        min_sharded_size=1 << 30,  # tiny: nothing is large
    )
