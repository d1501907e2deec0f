"""Rows (a) / (b) of docs/POLICY.md on the synthetic world's own RynnWorld-4D (configs/world4d_synthetic.py:
three 256-wide, 8-block branches, joint attention at blocks 0, 3, 6; trained at 128×224 on 81-frame
clips = 21 latent frames; text = the hashed per-task embedding, 4 × 64). Every size below is read
from configs/synthetic.py and configs/world4d_synthetic.py, so the two cannot drift apart.

The backbone is scaled from SPEC_4D §4 to this model: features after block 3 (blocks 0–3 run, the
two joint-attention blocks 0 and 3 included: 4 of 8 blocks, as 16 of 30 at full size), t = 500,
21 latent frames (frame 0 observed, the rest noise), the observation resized to the training
resolution. Head and Flow Former at SPEC width (384) over 21 × 16 queries; the goal is the backbone's own text
(hashed task embedding, goal_dim 64 × 4 tokens). Optimiser and schedule shape as configs/policy.py, at 3e-4 with EMA 0.999 (below).

    python -m rynn_jax.policy.train --config configs/policy_world4d_synthetic.py:world4d \\
        --set policy.backbone.dit=weights/synthetic/world4d_stage3 \\
        --set policy.backbone.vae=weights/synthetic/autoencoder \\
        --set "data.train_dirs=('data/sim/*/episode_*',)"
    # (b): configs/policy_world4d_synthetic.py:world4d_rgb; sim episodes at --resolution 128x224
    # (c): configs/policy_world4d_synthetic.py:cnn (no backbone: the SPEC-size CNN from scratch)

Row (c) of the same table is `cnn`: the same head, Flow Former width, data, optimiser and step
budget, with the vision features from the SPEC-size CNN (32–256 channels) trained from scratch on
the same 128×224 RGB + depth instead of the frozen 4D backbone: the three rows differ only in
where the vision tokens come from.
"""

import dataclasses

from configs import synthetic, world4d_synthetic
from rynn_jax.policy.config import BackboneConfig, CnnConfig, CompressorConfig, HeadConfig, PolicyConfig
from rynn_jax.policy.train import PolicyDataConfig, PolicyTrainConfig

LATENT_FRAMES = (synthetic.CLIP_FRAMES - 1) // 4 + 1  # the clips it was trained on (causal 4× in time)


def get_config(encoder: str = "world4d") -> PolicyTrainConfig:
    if encoder not in ("world4d", "world4d_rgb", "cnn"):
        raise ValueError(f"encoder must be world4d, world4d_rgb or cnn, got {encoder!r}")
    base = world4d_synthetic.model().base
    image = (synthetic.HEIGHT, synthetic.WIDTH)
    if encoder == "cnn":  # one frame, as many vision tokens as the 4D rows (21 × 16 = 336 queries)
        cnn = CnnConfig(image_size=image)
        compressor = CompressorConfig(in_dim=cnn.channels[-1], num_frames=1,
                                      queries_per_frame=LATENT_FRAMES * CompressorConfig().queries_per_frame)
    else:
        cnn = CnnConfig()
        compressor = CompressorConfig(in_dim=(3 if encoder == "world4d" else 1) * base.dim, num_frames=LATENT_FRAMES)
    policy = PolicyConfig(
        encoder=encoder,
        # blocks 0 … num_layers/2 − 1 (0–3 of 8), as blocks 0–15 of the 5B model's 30
        backbone=BackboneConfig(layer=base.num_layers // 2 - 1, timestep=500.0, latent_frames=LATENT_FRAMES,
                                image_size=image),
        cnn=cnn, compressor=compressor,
        head=HeadConfig(goal_dim=synthetic.TEXT_DIM, goal_len=synthetic.TEXT_LEN))
    cfg = PolicyTrainConfig(policy=policy, total_steps=2_000,
                            data=PolicyDataConfig(train_dirs=("data/sim/*/episode_*",), cache_episodes=1024))
    steps = cfg.total_steps
    # 2k steps (what a lease's few minutes hold), not the SPEC's 100k: a higher rate, an EMA whose
    # horizon (1k steps, ramped in from step 0) fits the run, and the schedule of the CPU recipe that
    # trained row (c) (2 % warm-up, 40 % hold, decay to 1 %) rather than the SPEC's decay to 1e-6,
    # which leaves a short run at ≲ 1e-5 · lr for its second half
    return dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, lr=3e-4, ema_decay=0.999, end_lr_factor=0.01,
                                                              warmup_steps=steps // 50, hold_steps=steps * 2 // 5),
                               ckpt=dataclasses.replace(cfg.ckpt, every=500))
