"""Distillation of the synthetic teacher (configs/synthetic_teacher.py, exported to
synthetic.TEACHER) into the 4-step causal student that serving streams (configs/synthetic.py has
the data and paths; docs/distill.md the method).

    python distill.py --config configs/synthetic_distill.py:warmup   # phase A: causal warm-up
    python distill.py --config configs/synthetic_distill.py:dmd      # phase B: DMD with the critic
    python -m rynn_jax.distill.export --config configs/synthetic_distill.py:dmd --out weights/synthetic/student

    # phase B's ground-truth regression instead of DMD (a CPU-sized budget, see below):
    python distill.py --config configs/synthetic_distill.py:regression

Student = the teacher's architecture and weights to start, streamed exactly as
`serving.session.StreamingSession` serves by default: blocks of 3 latent frames, a full cache of 21
frames (1 sink + 20), re-anchored every 21-frame (81-video-frame) chunk; 4 x0-Euler steps, shift 5.
Both phases read the pre-encoded latent shards the teacher trained on (21-frame clips = 7 blocks):
phase A needs no teacher samples (its targets are the clips' own velocities under block-wise
teacher forcing), phase B only the clips' reference latent, text and control.

Sizing (one H200, ≈ 8 + ≈ 10 minutes). Measured for phase B: 8.2 iterations/s at batch 16 on one
H200 after a 58 s compile (weights revision 4: 1,863 iterations in 300 s). Estimated from the
teacher's 17.9 steps/s at batch 32 before that: a phase-A step is one forward + backward over the
[clean; noisy] chunk, twice the teacher's tokens, ≈ 2–2.5 teacher steps at equal batch → ≈ 7–9
steps/s at batch 32, ≈ 3,400–4,300 steps in 8 minutes. A phase-B iteration at batch 16 is a critic
update (a gradient-free 7-block rollout ≈ one teacher step, plus one flow-matching step ≈ one more,
at half the batch) and every 5th also a generator update (rollout with gradient + teacher and
critic forwards ≈ 4 teacher steps): ≈ 1.4 batch-32 teacher steps per iteration on average → ≈ 12
iterations/s if the 7-block rollout is not latency-bound, ≈ 7,000 in 10 minutes. total_steps is
set above both: the chain stops each phase after DISTILL_A_SECONDS / DISTILL_B_SECONDS with SIGINT
(saves, exits 0), and the schedules are constant, so any stopping step ends with usable EMA weights.

`:regression` is phase B with `dmd.objective="regression"`: the same self-forcing rollout from
phase A's student, each block regressed onto the clip's ground-truth latents (no teacher, no
critic; gradients stop at the cache, cheaper than DMD's path through it). It fixes what phase A
leaves (teacher forcing never shows the student its own blocks, so its errors compound over a
chunk) at a cost a 2-core CPU can pay: the first bundled student (revision 3) was made this way on CPU
with `--set data.batch_size=2 --set data.worker_count=0`; DMD on a GPU then took it 1.2 dB further
(revision 4; docs/FIDELITY.md, "Student").

Learning rates are the paper's ×10 (phase A 1e-4; phase B generator and critic 2e-5, Adam β=(0,
0.999)): an 8M-parameter model distilled in minutes, not a 5B one over days.
"""

from configs import synthetic
from rynn_jax.distill.config import DistillConfig, DMDConfig, WarmupConfig
from rynn_jax.models.causal import CausalConfig
from rynn_jax.serving.block_step import SERVING_STEPS, StepConfig
from rynn_jax.sharding import MeshConfig
from rynn_jax.training.config import CheckpointConfig, DataConfig, LogConfig, OptimConfig

RUNS = {"warmup": f"{synthetic.RUNS}/distill_a", "dmd": f"{synthetic.RUNS}/distill_b",
        "regression": f"{synthetic.RUNS}/distill_r"}
# What StreamingSession serves with by default: the student is trained for exactly this.
CAUSAL = CausalConfig()  # blocks of 3 latent frames, 1 sink + 20 cached frames, full cache
STEPS = StepConfig(num_steps=SERVING_STEPS.num_steps, shift=SERVING_STEPS.shift, solver=SERVING_STEPS.solver)


def get_config(phase: str = "warmup") -> DistillConfig:
    if phase not in RUNS:
        raise ValueError(f"phase must be one of {sorted(RUNS)}, got {phase!r}")
    warm, regression = phase == "warmup", phase == "regression"
    run = RUNS[phase]
    return DistillConfig(
        phase="warmup" if warm else "dmd",
        model=synthetic.teacher_model(),
        causal=CAUSAL,
        student_steps=STEPS,
        warmup=WarmupConfig(shift=5.0),
        dmd=DMDConfig(shift=5.0, min_sigma=0.02, max_sigma=0.98, guidance_scale=0.0, critic_updates=5,
                      cache_grad=not regression, grad_blocks=0, last_step_only=False, remat_blocks=False,  # small: no remat
                      objective="regression" if regression else "dmd"),
        optim=OptimConfig(lr=1e-4 if warm else 2e-5, b1=0.9 if warm else 0.0, b2=0.999, warmup_steps=0,
                          schedule="constant", weight_decay=0.0, grad_clip=10.0, ema_decay=0.99),
        critic_optim=OptimConfig(lr=2e-5, b1=0.0, b2=0.999, warmup_steps=0, schedule="constant",
                                 weight_decay=0.0, grad_clip=10.0, ema_decay=0.0),
        data=DataConfig(kind="latents", batch_size=32 if warm else 16, sources={"robot": synthetic.LATENTS},
                        weights={"robot": 1.0}, worker_count=8, text_len=synthetic.TEXT_LEN),
        mesh=MeshConfig(data=1, fsdp=-1, tensor=1, context=1),
        ckpt=CheckpointConfig(dir=f"{run}/ckpt", every=250, keep=2, init_from=synthetic.TEACHER),
        log=LogConfig(dir=f"{run}/logs", every=50, sample_every=0),
        student_from="" if warm else f"{RUNS['warmup']}/ckpt",
        teacher_dtype="float32",
        critic_dtype="float32",
        total_steps=6000 if warm else 12000,  # upper bounds: the lease's time limit stops each phase
        eval_every=0,
        min_sharded_size=1 << 30,  # one GPU, nothing to shard
    )
