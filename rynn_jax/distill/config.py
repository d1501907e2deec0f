"""Distillation configuration: frozen dataclasses, one comment per field. Recipes live in
`configs/distill_*.py` (each defines `get_config() -> DistillConfig`); command-line overrides use
train.py's `--set a.b=value` machinery (`rynn_jax.training.config.apply_overrides`)."""

from __future__ import annotations

import dataclasses
import os
from typing import Literal

from rynn_jax.models.causal import CausalConfig
from rynn_jax.models.dit import WanDiTConfig
from rynn_jax.serving.block_step import StepConfig
from rynn_jax.sharding import MeshConfig
from rynn_jax.training.config import (
    CheckpointConfig,
    DataConfig,
    LogConfig,
    OptimConfig,
    run_recipe,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WarmupConfig:
    """Phase A: causal flow matching with block-wise teacher forcing."""
    shift: float = 5.0  # per-frame sigma: u ~ U(0,1), sigma = shift·u / (1 + (shift−1)·u)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DMDConfig:
    """Phase B: distribution matching distillation with a learned fake score (the critic)."""
    shift: float = 5.0  # DMD / critic noise level: u ~ U(min_sigma, max_sigma), then shifted
    min_sigma: float = 0.02  # released: timesteps 20 .. 980
    max_sigma: float = 0.98
    guidance_scale: float = 0.0  # real score p_cond + g·(p_cond − p_uncond); released 0 = no CFG
    critic_updates: int = 5  # critic updates per generator update (released dfake_gen_update_ratio)
    # "regression": the same self-forcing rollout, but its blocks are regressed onto the clip's own
    # ground-truth latents (mean squared error, frames 1..) instead of the DMD gradient: no teacher
    # call, no critic, one update per iteration. Exposure bias is what it fixes (every block is
    # conditioned on the student's own earlier blocks), for budgets too small for DMD's critic; it
    # regresses to the mean where the data is uncertain, so samples are blurrier than DMD's.
    objective: Literal["dmd", "regression"] = "dmd"
    # Gradient path of the generator rollout (see rollout.py):
    cache_grad: bool = True  # gradients flow through the KV cache across blocks
    grad_blocks: int = 0  # only the last N blocks are differentiated (0 = all); bounds memory
    last_step_only: bool = False  # exit at the last denoising step instead of a random one
    remat_blocks: bool = True  # rematerialise each rollout block in the backward pass


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistillConfig:
    phase: Literal["warmup", "dmd"] = "warmup"
    model: WanDiTConfig = dataclasses.field(default_factory=WanDiTConfig)  # teacher = student = critic
    causal: CausalConfig = dataclasses.field(default_factory=CausalConfig)  # student blocks / cache
    student_steps: StepConfig = dataclasses.field(default_factory=StepConfig)  # 4 steps, shift 5, x0-Euler
    warmup: WarmupConfig = dataclasses.field(default_factory=WarmupConfig)
    dmd: DMDConfig = dataclasses.field(default_factory=DMDConfig)
    # Generator (student) optimiser: phase A lr 1e-5; phase B lr 2e-6, Adam β=(0, 0.999), EMA 0.99.
    optim: OptimConfig = dataclasses.field(default_factory=lambda: OptimConfig(
        lr=1e-5, warmup_steps=0, schedule="constant", weight_decay=0.0, grad_clip=10.0, ema_decay=0.99))
    # Critic (fake score) optimiser, phase B only: lr 5e-7, Adam β=(0, 0.999), no EMA.
    critic_optim: OptimConfig = dataclasses.field(default_factory=lambda: OptimConfig(
        lr=5e-7, b1=0.0, warmup_steps=0, schedule="constant", weight_decay=0.0, grad_clip=10.0,
        ema_decay=0.0))
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    ckpt: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)  # init_from = teacher
    log: LogConfig = dataclasses.field(default_factory=LogConfig)
    # Phase B starts the student from a phase-A run's checkpoint directory, or from exported student
    # weights (`rynn_jax.distill.export`); "" = from the teacher.
    student_from: str = ""
    student_from_ema: bool = True  # take the phase-A EMA weights (else the raw params)
    teacher_dtype: str = "float32"  # storage of the frozen teacher ("bfloat16" halves it)
    critic_dtype: str = "float32"  # master weights of the critic
    total_steps: int = 1000  # iterations: phase B runs critic updates every iteration, see dmd.critic_updates
    seed: int = 0  # init (when no teacher weights are given) and noise: fold_in(rng, step)
    distributed: bool = False  # multi-host: jax.distributed.initialize() first
    min_sharded_size: int = 2 ** 22  # startup check: arrays this large must not be replicated
    eval_every: int = 0  # student–teacher sample distance on a fixed batch every N steps (0 = never)
    teacher_eval_steps: int = 20  # Euler steps of the teacher's reference samples
    debug_kill_at_step: int = 0  # fault injection for tests: send debug_kill_signal after dispatching this step
    debug_kill_signal: Literal["SIGKILL", "SIGINT", "SIGTERM"] = "SIGKILL"  # SIGINT/SIGTERM: clean stop


def load_config(path: str | os.PathLike[str]) -> DistillConfig:
    """Run a recipe file and return its `get_config()`; `file.py:arg` calls `get_config("arg")`
    (big_vision style, e.g. `configs/distill_5b.py:dmd` for phase B)."""
    path, _, arg = os.fspath(path).partition(":")
    return run_recipe(path, DistillConfig, arg)
