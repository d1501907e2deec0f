"""Shared facts of the synthetic-world recipes (imported by configs/synthetic_*.py; not a recipe).

The data split lives here and nowhere else: training episodes are attempts 0, 1, 2, ... of
`python -m rynn_jax.sim.cli generate --seed TRAIN_SEED`, held-out episodes attempts of
`--seed HELDOUT_SEED`; attempt k uses seed `--seed + k`, and TRAIN_SEED + (attempts ever made) stays
far below HELDOUT_SEED, so no held-out seed is ever trained on.

Resolution 128×224 (H×W): the aspect of the 480×832 model, the smallest size at which the robot
fingers and the skeleton's finger bones are a few pixels wide, and with the autoencoder's 8× spatial
stride a 16×28 latent = 8×14 tokens per latent frame at patch 2 (81 frames → 21 latent frames →
2,352 tokens: a small DiT trains thousands of steps in minutes on one H200).
"""

from rynn_jax.models.dit import WanDiTConfig
from rynn_jax.sim import recipe

TRAIN_SEED, HELDOUT_SEED = recipe.TRAIN_SEED, recipe.HELDOUT_SEED
TRAIN_PER_TASK = 400  # successful training episodes per task (4 tasks)
HELDOUT_PER_TASK = 12  # successful held-out episodes per task (48 in all)
HEIGHT, WIDTH = recipe.RESOLUTION
CLIP_FRAMES = 81  # 21 latent frames; the paper's clip length
CLIP_STRIDE = 32  # clip starts 0 and 32 of a 113-frame episode
TEXT_DIM, TEXT_LEN = 64, 4  # hashed per-task prompt embeddings (python -m rynn_jax.text)
# Latent channels of the autoencoder (and so the teacher's in/out/control channels). 32, not 16: the
# scenes' procedural noise textures are high-entropy detail that the reference frame carries and every
# generated frame must reproduce; with 16 channels (48× compression) the autoencoder's own round trip
# stayed ≈ 23 dB on held-out video after its first 1k steps, capping any teacher below that.
LATENT_CHANNELS = 32

# Where the recipe puts things, relative to the working directory (scripts/synthetic_world_model.sh).
DATA_TRAIN = "data/synthetic/train"
DATA_HELDOUT = "data/synthetic/heldout"
TEXT_EMBEDDINGS = "data/synthetic/text_embeddings"
LATENTS = "data/synthetic/latents/robot-*.array_record"
AUTOENCODER = "weights/synthetic/autoencoder"
AUTOENCODER_WIDE_JOINT = "weights/synthetic/autoencoder_wide_joint"  # synthetic_ae.py:wide (new latents: not the teacher's)
AUTOENCODER_4D = "weights/synthetic/autoencoder4d"  # the autoencoder fine-tuned on depth and flow too (synthetic_ae4d.py)
TINY_DECODER = "weights/synthetic/tiny_decoder"  # real-time decoder of its latents (configs/synthetic_decoder.py:tae)
TEACHER = "weights/synthetic/teacher"  # exported EMA teacher (distillation's ckpt.init_from)
STUDENT = "weights/synthetic/student"  # exported causal student (what serving loads by default)
LATENTS_4D = "data/synthetic/latents4d/robot-*.array_record"  # + depth and flow latents (preencode --geometry)
WORLD4D = "weights/synthetic/world4d"  # RynnWorld-4D exports: <WORLD4D>_stage<n>[_independent]
RUNS = "runs/synthetic"


def teacher_model(**overrides) -> WanDiTConfig:
    """The synthetic teacher: the 5B's architecture (control branch included) at 256 wide, 8 deep.
    8.06M parameters (16.1 MB in bf16), so the teacher, its student and the autoencoder fit the
    repository's 40 MB together."""
    base = dict(dim=256, num_layers=8, num_heads=4, ffn_dim=768, freq_dim=128,
                in_channels=LATENT_CHANNELS, out_channels=LATENT_CHANNELS, control_channels=LATENT_CHANNELS, text_dim=TEXT_DIM, text_len=TEXT_LEN,
                control="add-plus", dtype="bfloat16", param_dtype="float32")
    return WanDiTConfig(**{**base, **overrides})
