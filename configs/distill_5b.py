"""Distillation of the stage-2 RynnWorld-Teleop 5B model into the 4-step causal student (paper §3.5).

    python distill.py --config configs/distill_5b.py:warmup     # phase A, from the stage-2 export
    python distill.py --config configs/distill_5b.py:dmd        # phase B, from phase A's checkpoints

Released hyper-parameters: blocks of 3 latent frames, cache of 21 frames (1 sink + 20), 4 steps
with shift 5 (timesteps [999, 937, 833, 624]); phase A lr 1e-5; phase B generator lr 2e-6, critic
lr 5e-7, Adam β=(0, 0.999), 5 critic updates per generator update, EMA 0.99, σ ∈ [0.02, 0.98]
(shift 5), no CFG. Step counts are not published: total_steps are placeholders to set per run.
Memory plan (what fits on one / two H200s): docs/distill.md.
"""

from configs import base_5b
from rynn_jax.distill.config import DistillConfig, DMDConfig, WarmupConfig
from rynn_jax.models.causal import CausalConfig
from rynn_jax.serving.block_step import StepConfig
from rynn_jax.sharding import MeshConfig
from rynn_jax.training.config import (
    CheckpointConfig,
    DataConfig,
    LogConfig,
    OptimConfig,
)

TEACHER = "checkpoints/stage2_export"  # the bidirectional stage-2 model, rynn_jax.convert layout
RUNS = {"warmup": "runs/distill_a", "dmd": "runs/distill_b"}


def get_config(phase: str = "warmup") -> DistillConfig:
    if phase not in RUNS:
        raise ValueError(f"phase must be one of {sorted(RUNS)}, got {phase!r}")
    warm = phase == "warmup"
    optim = OptimConfig(lr=1e-5 if warm else 2e-6, b1=0.9 if warm else 0.0, b2=0.999, warmup_steps=0,
                        schedule="constant", weight_decay=0.0, grad_clip=10.0, ema_decay=0.99)
    return DistillConfig(
        phase=phase,
        # bf16 compute, fp32 master weights, every layer rematerialised
        model=base_5b.model(control="add-plus"),
        causal=CausalConfig(frames_per_block=3, window_frames=20, policy="full"),
        student_steps=StepConfig(num_steps=4, shift=5.0, solver="x0_euler"),
        warmup=WarmupConfig(shift=5.0),
        dmd=DMDConfig(shift=5.0, min_sigma=0.02, max_sigma=0.98, guidance_scale=0.0, critic_updates=5,
                      cache_grad=True, grad_blocks=0, last_step_only=False, remat_blocks=True),
        optim=optim,
        critic_optim=OptimConfig(lr=5e-7, b1=0.0, b2=0.999, warmup_steps=0, schedule="constant",
                                 weight_decay=0.0, grad_clip=10.0, ema_decay=0.0),
        # 21-frame (81-video-frame) robot clips; one clip per device (see docs/distill.md)
        data=DataConfig(kind="latents", batch_size=2, sources={"robot": base_5b.ROBOT}, worker_count=4),
        mesh=MeshConfig(data=1, fsdp=-1, tensor=1, context=1),
        ckpt=CheckpointConfig(dir=RUNS[phase] + "/ckpt", every=250, keep=3, init_from=TEACHER),
        # sample videos (skeleton | student | truth) also need a VAE: --set log.sample_vae=PATH
        log=LogConfig(dir=RUNS[phase] + "/logs", every=10, sample_every=500),
        student_from="" if warm else RUNS["warmup"] + "/ckpt",
        teacher_dtype="bfloat16",  # frozen: bf16 storage halves it (it computes in bf16 anyway)
        critic_dtype="float32",
        total_steps=3000 if warm else 5000,
        eval_every=0,
    )
