"""The fast serving path of the world model: what a command builds from weights and streams.

assemble.py        weights → modules → the served world model (student session or teacher)
student.py         an exported student's serving layout (`student.json`) and the bundled weights
block_step.py      the one block step: few-step x0-Euler denoise + the clean cache-writing pass
cached_passes.py   its served forward passes: working KV cache per block, merged clean pass
codecs.py          the VAE / tiny-autoencoder streaming codecs behind `StreamingCodec`
stream_step.py     skeleton frames → control latents → block step → decoded frames (pure functions)
session.py         `StreamingSession`: frame bookkeeping, re-anchoring, programs compiled ahead
clip.py            a whole clip through a session; reference fitting; per-episode noise keys
prompts.py         prompts → the DiT's text context
bidirectional.py   the bidirectional teacher world model (whole-clip flow-matching sampling)
"""
