"""Facts the synthetic-world recipes (configs/synthetic.py) and the weights they produce share: the
size they train at and the seeds of the train / held-out split. Attempt k of
`python -m rynn_jax.sim.cli generate --seed S` uses seed S + k; training attempts start at
TRAIN_SEED and never reach HELDOUT_SEED, so an episode from HELDOUT_SEED upwards was never trained on."""

from __future__ import annotations

RESOLUTION = (128, 224)  # (height, width)
TRAIN_SEED = 0
HELDOUT_SEED = 1_000_000
