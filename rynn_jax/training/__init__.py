"""Training of the world model (train.py reads these top to bottom).

  config.py         TrainConfig dataclasses, recipe loading, `--set a.b=v` overrides
  loss.py           conditional flow matching loss (TI2V frame 0, shifted sigmas)
  lora.py           LoRA by module surgery, merge for serving, the trainable-parameter filter
  optim.py          clip → AdamW on warm-up + cosine, EMA
  state.py          TrainState, sharded init, loading converted base weights
  step.py           the jitted step (grad accumulation, finiteness guard, norms)
  input.py          grain iterators: latent shard mixture or synthetic clips
  checkpointing.py  orbax CheckpointManager: state + data iterator, fallback on corrupt steps
  metrics.py        TensorBoard / metrics.jsonl writer, throughput and MFU
  samples.py        sample videos (skeleton | generated | truth MP4s) every log.sample_every steps
  loop.py           the host side of the step loop (train.py and distill.py): metrics one step
                    late, finiteness check, checkpoint, sample hooks
"""
