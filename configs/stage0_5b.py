"""Stage 0: TI2V domain warm-up of Wan2.2-TI2V-5B on the human egocentric videos — no control
branch, full fine-tuning, 2,000 steps at lr 2e-5 (paper Sec. 5.1)."""

from configs import base_5b


def get_config():
    return base_5b.config(control="none", lora_rank=0, lr=2e-5, total_steps=2000,
                          sources={"egodex": base_5b.EGODEX, "vitra": base_5b.VITRA},
                          weights={"egodex": 0.5, "vitra": 0.5},
                          init_from="checkpoints/wan22_ti2v_5b", ckpt_dir="runs/stage0")
