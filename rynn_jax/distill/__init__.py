"""Distillation of the bidirectional teacher into the 4-step causal student (paper §3.5):
phase A causal flow-matching warm-up (`warmup.py`), phase B DMD with a learned critic (`dmd.py`,
`rollout.py`), state and jitted updates (`state.py`, `step.py`), recipe fields (`config.py`)."""
