"""Stage 1 (human egocentric), SFT: EgoDex (81-frame clips) + VITRA (25-frame clips) with the
skeleton control branch, lr 2e-5 (paper Sec. 3.4/5.1). Starts from the stage-0 weights exported with
`python -m rynn_jax.training.export_weights` (rynn_jax.converted_weights layout). The paper gives neither the step count nor the EgoDex:VITRA ratio: batches
are mixed by clip count (0.91M : 1.23M) and total_steps is a placeholder to set per run."""

from configs import base_5b


def get_config():
    return base_5b.config(control="add-plus", lora_rank=0, lr=2e-5, total_steps=20000,
                          **base_5b.STAGE1_MIX,
                          init_from="checkpoints/stage0_export", ckpt_dir="runs/stage1_sft")
