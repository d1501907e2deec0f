"""CI / CPU smoke recipe for distillation: the tiny control DiT as teacher (seeded random weights
unless ckpt.init_from is set), 4 latent frames in blocks of 2, synthetic data.

    python distill.py --config configs/distill_tiny.py                                 # phase A
    python distill.py --config configs/distill_tiny.py --set phase=dmd --set student_from=/tmp/a/ckpt
"""

from rynn_jax.distill.config import DistillConfig, DMDConfig, WarmupConfig
from rynn_jax.models.causal import CausalConfig
from rynn_jax.models.dit import WanDiTConfig
from rynn_jax.serving.block_step import StepConfig
from rynn_jax.sharding import MeshConfig
from rynn_jax.training.config import (
    CheckpointConfig,
    DataConfig,
    LogConfig,
    OptimConfig,
)


def get_config() -> DistillConfig:
    model = WanDiTConfig.tiny(control="add-plus")
    return DistillConfig(
        phase="warmup",
        model=model,
        causal=CausalConfig(frames_per_block=2, window_frames=3),
        student_steps=StepConfig(num_steps=4, shift=5.0, solver="x0_euler"),
        warmup=WarmupConfig(shift=5.0),
        dmd=DMDConfig(critic_updates=5, guidance_scale=0.0),
        # tiny: larger learning rates and a shorter EMA than the 5B recipe (2e-6 / 5e-7, EMA 0.99) so
        # that a few dozen steps show progress
        optim=OptimConfig(lr=2e-3, b1=0.0, b2=0.999, warmup_steps=0, schedule="constant", weight_decay=0.0,
                          grad_clip=10.0, ema_decay=0.9),
        critic_optim=OptimConfig(lr=1e-3, b1=0.0, b2=0.999, warmup_steps=0, schedule="constant",
                                 weight_decay=0.0, grad_clip=10.0, ema_decay=0.0),
        data=DataConfig(kind="synthetic", batch_size=4, text_len=model.text_len, synthetic_shape=(4, 4, 4),
                        synthetic_clips=4),
        mesh=MeshConfig(data=1, fsdp=-1, tensor=1, context=1),
        ckpt=CheckpointConfig(dir="", every=20, keep=2),
        log=LogConfig(dir="", every=10),
        total_steps=40,
        min_sharded_size=1 << 30,
    )
