"""Shared pieces of the 5B recipes (imported by configs/stage*.py; not a recipe itself)."""

from rynn_jax.models.dit import WanDiTConfig
from rynn_jax.sharding import MeshConfig
from rynn_jax.training.config import CheckpointConfig, DataConfig, LogConfig, LossConfig, OptimConfig, TrainConfig
from rynn_jax.training.lora import LoraConfig

# Pre-encoded latent shards (python -m rynn_jax.data.preencode); relative to the working directory,
# override with --set data.sources.egodex=/path/egodex-*.array_record
EGODEX = "data/latents/egodex/egodex-*.array_record"
VITRA = "data/latents/vitra/vitra-*.array_record"
ROBOT = "data/latents/robot/robot-*.array_record"
# Stage 1 mixes its two sources by clip count, EgoDex 0.91M : VITRA 1.23M (the paper gives no ratio).
STAGE1_MIX = dict(sources={"egodex": EGODEX, "vitra": VITRA}, weights={"egodex": 0.91, "vitra": 1.23})


def model(control: str = "add-plus") -> WanDiTConfig:
    # bf16 matmuls/attention, fp32 master weights. Measured on H200s (bench/sharding_sweep.py,
    # 8190-token clips, docs/SHARDING.md §4), one GPU: MFU 35.8% → 41.4% from padding the tokens
    # to 8192 (token_multiple: cuBLAS runs the weight-gradient GEMMs on slow sm80 kernels when
    # they contract over 8190 tokens), → 43.9% from remat "save_dots_attn" (each block keeps its
    # matmul outputs and cuDNN attention outputs; norms and GELU are recomputed; peak 126 GB);
    # two GPUs, fsdp=2: 43.4%. On 80 GB GPUs: --set model.remat=full.
    return WanDiTConfig.ti2v_5b(dtype="bfloat16", param_dtype="float32", remat="save_dots_attn",
                                token_multiple=16, control=control)


def config(*, control: str, lora_rank: int, lr: float, total_steps: int, sources: dict[str, str],
           weights: dict[str, float], init_from: str, ckpt_dir: str) -> TrainConfig:
    sft = lora_rank == 0
    return TrainConfig(
        model=model(control),
        lora=LoraConfig(rank=lora_rank, alpha=float(max(lora_rank, 1))),
        # SFT: 200 warm-up steps, EMA 0.999 (paper). LoRA: same schedule; EMA of the adapters only.
        optim=OptimConfig(lr=lr, warmup_steps=200, schedule="cosine", weight_decay=0.01, grad_clip=1.0,
                          ema_decay=0.999),
        loss=LossConfig(shift=5.0, exclude_first_frame=True, use_control=control != "none"),
        data=DataConfig(kind="latents", batch_size=8, sources=sources, weights=weights, worker_count=4),
        mesh=MeshConfig(data=1, fsdp=-1, tensor=1, context=1),
        ckpt=CheckpointConfig(dir=ckpt_dir, every=500, keep=3, init_from=init_from),
        log=LogConfig(dir=ckpt_dir + "/logs", every=10, sample_every=0),
        total_steps=total_steps,
        # LoRA: the frozen base in bf16 halves its memory; SFT trains everything in fp32.
        frozen_dtype="float32" if sft else "bfloat16",
    )
