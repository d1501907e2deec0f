"""RynnWorld-4D on the synthetic world: the three stages of configs/world4d.py (SPEC_4D §3) at the
synthetic teacher's size, starting from its weights, on the pre-encoded RGB / depth / flow shards.

    python train.py --config configs/world4d_synthetic.py:1       # stage 1 from weights/synthetic/teacher
    python -m rynn_jax.training.export_weights --config configs/world4d_synthetic.py:1 \\
        --out weights/synthetic/world4d_stage1 --dtype bfloat16   # stage 2 starts from this, stage 3 from stage 2's
    python train.py --config configs/world4d_synthetic.py:2,independent   # the ablation: no joint attention

(`scripts/synthetic_world_model.sh preencode4d world4d` runs the chain.) Adapted from the 5B stages:

* Model: three branches of the synthetic teacher's size (256 wide, 8 blocks, 32-channel latents),
  joint attention every 3rd block (0, 3, 6), bidirectional, frame-wise, with RoPE. Stage 1 starts
  from the teacher (`clone_rgb`: depth and flow are copies of its RGB branch; its skeleton-control
  branch is left out, the 4D model takes no control); eps 1e-6 as the teacher was trained with.
* Learning rates: the paper's stage ratios 2 : 5 : 1, scaled so that stage 1 runs at the teacher's
  own 4e-4 (the paper's 2e-5 is a fine-tuning rate for 5B weights; an 8M model barely moves at it);
  the joint-attention output projections at the release's ratios to its JA rate (stage 2 ½×,
  stage 3 2×) through `optim.joint_out_lr`. Warm-ups the release's (300 / 200 / 500).
* Constant rate after the warm-up and EMA 0.999, as the synthetic teacher: a run stopped at any
  step ends with usable EMA weights.
* `independent`: the "independent branches" ablation — no joint-attention modules, the same data
  and steps. Stage 1 has no joint attention in either variant, so both chains share it; the
  ablation's stage 2, having no joint attention to train, trains the branches at stage 1's rate.
* `control`: our teleop extension, not the paper's model — the joint model plus the teacher's
  skeleton-control branch (kept from the teacher with its statistics, shared by the three branches,
  trained in stages 1 and 3), so the arms' path comes from the operator's skeleton as in the teacher
  instead of being a guess from the task text. Its own chain of three stages (`_control` exports).
"""

import dataclasses

from configs import synthetic
from rynn_jax.models.dit4d import WanDiT4DConfig
from rynn_jax.sharding import MeshConfig
from rynn_jax.training.config import CheckpointConfig, DataConfig, LogConfig, OptimConfig, TrainConfig, World4DLossConfig
from rynn_jax.training.lora import LoraConfig

_STAGES = {  # stage → (lr, joint_out lr, warm-up, λ_flow, branch dropout, trained, steps)
    1: (4e-4, 0.0, 300, 0.5, 0.0, "all", 4000),
    2: (1e-3, 5e-4, 200, 1.0, 0.2, "joint", 1500),
    3: (2e-4, 4e-4, 500, 1.0, 0.05, "all", 3000),
}
VARIANTS = ("joint", "independent", "control")


def model(control: bool = False, **overrides) -> WanDiT4DConfig:
    """The teacher's DiT, three times, JA every 3rd block; without its control branch unless
    `control` (the `control` variant)."""
    base = synthetic.teacher_model(**({} if control else {"control": "none"}), **overrides)
    return WanDiT4DConfig(base=base, joint_layers=()).every(3)


def _suffix(n: int, variant: str) -> str:
    if variant == "control":
        return "_control"
    return "" if variant == "joint" or n == 1 else f"_{variant}"  # stage 1: one run for joint and independent


def export_dir(n: int, variant: str = "joint") -> str:
    return f"{synthetic.WORLD4D}_stage{n}{_suffix(n, variant)}"


def stage(n: int, variant: str = "joint", m: WanDiT4DConfig | None = None) -> TrainConfig:
    if n not in _STAGES or variant not in VARIANTS:
        raise ValueError(f"stage must be 1, 2 or 3 and variant one of {VARIANTS}; got {n}, {variant!r}")
    lr, joint_out_lr, warmup, flow_weight, dropout, trained, steps = _STAGES[n]
    m = m or model(control=variant == "control")
    if n == 1 or variant == "independent":
        m, joint_out_lr = dataclasses.replace(m, joint_layers=()), 0.0
        lr, trained = (_STAGES[1][0], "all") if trained == "joint" else (lr, trained)
    run = f"{synthetic.RUNS}/world4d_stage{n}{_suffix(n, variant)}"
    return TrainConfig(
        model=m,
        lora=LoraConfig(rank=0),
        optim=OptimConfig(lr=lr, joint_out_lr=joint_out_lr, warmup_steps=warmup, schedule="constant",
                          b1=0.9, b2=0.95, weight_decay=1e-4, grad_clip=1.0, ema_decay=0.999,
                          ema_warmup=True),  # stages of a few hundred steps: export what they trained
        loss=World4DLossConfig(shift=5.0, flow_weight=flow_weight, branch_dropout=dropout, train=trained),
        data=DataConfig(kind="latents", batch_size=16, sources={"robot": synthetic.LATENTS_4D},
                        weights={"robot": 1.0}, worker_count=8, text_len=synthetic.TEXT_LEN),
        mesh=MeshConfig(data=1, fsdp=-1, tensor=1, context=1),
        ckpt=CheckpointConfig(dir=run, every=250, keep=2,
                              init_from=synthetic.TEACHER if n == 1 else export_dir(n - 1, variant)),
        log=LogConfig(dir=f"{run}/logs", every=50),
        total_steps=steps,
        min_sharded_size=1 << 30,  # one GPU, nothing to shard
    )


def get_config(arg: str = "1") -> TrainConfig:
    """"N", "N,independent" or "N,control"."""
    n, _, variant = arg.partition(",")
    return stage(int(n), variant or "joint")
