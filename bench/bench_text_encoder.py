"""umT5-XXL encoder throughput (random weights, bf16): prompts per second at batch 1 and 32.

    python bench/bench_text_encoder.py --out bench/results/text_encoder_h200.json
    python bench/bench_text_encoder.py --small        # tiny config on CPU: checks the script runs

Times the jitted encoder forward (`models/umt5.py`; the tokenizer's share is negligible) at each
batch size × padded length: 64 tokens (the bucket `encode-prompts` runs a typical 30-60-token
prompt at) and 512 (what the reference pipeline always pads to). Checks: outputs finite, and a
prompt's states the same whichever bucket, batch size and batch neighbours it is encoded with
(the padding invariance `rynn_jax.text_encoder` relies on), to bf16 tolerance.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import Checks, time_ms, write_json  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", action="store_true", help="tiny random config (CPU smoke run)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    p.add_argument("--lengths", type=int, nargs="+", default=[64, 512], help="padded token lengths")
    p.add_argument("--prompt-tokens", type=int, default=48, help="true length of the timed prompts")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--attention", default="xla", choices=["xla", "cudnn"])
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--out", default=None, help="results JSON")
    a = p.parse_args()

    import jax
    import numpy as np
    from flax import nnx

    from rynn_jax.models import umt5

    base = umt5.UMT5Config.tiny() if a.small else umt5.UMT5Config.xxl()
    cfg = umt5.UMT5Config(**{**base.__dict__, "dtype": a.dtype, "param_dtype": a.dtype, "attention": a.attention})
    graphdef, state = nnx.split(umt5.init_umt5(cfg))
    n_params = sum(x.size for x in jax.tree.leaves(state))
    forward = jax.jit(lambda state, ids, lengths: nnx.merge(graphdef, state)(ids, lengths))
    rng = np.random.default_rng(0)
    tokens = min(a.prompt_tokens, *a.lengths)
    prompts_bl = rng.integers(0, cfg.vocab_size, (max(a.batches), tokens)).astype(np.int32)
    print(f"umT5 {'tiny' if a.small else 'XXL'}: {n_params / 1e9:.3f}B params, {a.dtype}, attention {a.attention}, "
          f"{jax.devices()[0].device_kind}", flush=True)

    checks, rows, states = Checks(), [], {}
    for length in a.lengths:
        for b in a.batches:
            ids = np.zeros((b, length), np.int32)
            ids[:, :tokens] = prompts_bl[:b]
            lengths = np.full((b,), tokens, np.int32)
            ids_d, lengths_d = jax.device_put(ids), jax.device_put(lengths)
            out = forward(state, ids_d, lengths_d)
            checks.finite(f"batch {b} × {length}", out)
            states[(b, length)] = np.asarray(out[:1, :tokens], np.float32)
            ms = time_ms(lambda: forward(state, ids_d, lengths_d).block_until_ready(), a.warmup, a.iters)
            med = statistics.median(ms)
            rows.append(dict(batch=b, length=length, prompt_tokens=tokens, ms_median=med, ms_min=min(ms),
                             prompts_per_s=b / med * 1e3))
            print(f"batch {b:3d} × {length:4d} tokens: {med:9.2f} ms  {b / med * 1e3:9.1f} prompts/s", flush=True)
    tol = 1e-4 if a.dtype == "float32" else 3e-2
    first, *others = states
    for key in others:
        checks.close(f"prompt 0 at batch {key[0]} × {key[1]} vs batch {first[0]} × {first[1]}",
                     states[key], states[first], tol)
    if a.out:
        write_json(a.out, dict(config=cfg.__dict__, params=n_params, device=jax.devices()[0].device_kind,
                               rows=rows, checks=checks.rows))
    return 0 if checks.ok else 1


if __name__ == "__main__":
    sys.exit(main())
