"""Stage 2 (robot), LORA: 1,800 paired teleop clips (81 frames), lr 1e-5 (paper Sec. 3.4/5.1), from
the stage-1 weights (exported by `python -m rynn_jax.training.export_weights`). total_steps is a placeholder (not in the paper)."""

from configs import base_5b


def get_config():
    return base_5b.config(control="add-plus", lora_rank=64, lr=1e-5, total_steps=5000,
                          sources={"robot": base_5b.ROBOT}, weights={"robot": 1.0},
                          init_from="checkpoints/stage1_lora_export", ckpt_dir="runs/stage2_lora")
