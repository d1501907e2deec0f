"""Prompts → umT5 embeddings, in JAX: the tokenizer and encoder as one batched, jitted callable,
and the `serve.py encode-prompts` command that writes the files the rest of the project reads.

    python serve.py encode-prompts --checkpoint CKPT --out DIR (--prompts FILE | --episodes DIR)...
        [--tokenizer spiece.model] [--batch 32] [--text-len 512] [--dtype bfloat16]

CKPT: Wan's `models_t5_umt5-xxl-enc-bf16.pth` (its tokenizer is found in `google/umt5-xxl/` beside
it), a Hugging Face UMT5EncoderModel safetensors file / directory, or a diffusers pipeline
directory (`text_encoder/` + `tokenizer/`). Output: `DIR/<sha256(prompt)>.safetensors`, one
`text_embedding` (S, D) float32 per prompt — S its token count (≤ --text-len, with the end token),
the DiT's zero padding left to the reader — plus the empty prompt's, and `prompts.jsonl` naming
which file holds which prompt.

Batches are sorted by token count and run at a length bucket (the next power of two ≥ 16), not
at 512: padded keys are masked and positions are relative, so the real tokens' states do not
depend on the padding. With several devices the weights are sharded by the project's logical
axis rules (FSDP over all devices) and the batch split across them.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from tqdm import tqdm

from rynn_jax import errors, sharding, text
from rynn_jax.models.umt5 import UMT5Encoder
from rynn_jax.tokenizer import UMT5Tokenizer, find_tokenizer

MIN_BUCKET = 16  # shortest padded length a batch runs at
INDEX_FILE = "prompts.jsonl"
_JSONL_FIELDS = ("prompt", "text", "task_description")


def bucket(n: int, cap: int, minimum: int = MIN_BUCKET) -> int:
    """The padded size for `n`: the next power of two ≥ max(n, minimum), at most `cap`."""
    return min(cap, max(minimum, 1 << max(n - 1, 0).bit_length()))


class TextEncoder:
    """Prompt strings → their umT5 embeddings, each (tokens, D) float32."""

    def __init__(self, model: UMT5Encoder, tokenizer: UMT5Tokenizer, *, batch_size: int = 32,
                 mesh: Mesh | None = None):
        if tokenizer.vocab_size > model.cfg.vocab_size:
            raise errors.InputError(f"the tokenizer has {tokenizer.vocab_size} pieces, more than the encoder's "
                                    f"{model.cfg.vocab_size} embeddings: not this checkpoint's tokenizer")
        self.tokenizer, self.cfg, self.mesh = tokenizer, model.cfg, mesh
        # The batch is split over the mesh's data-parallel axes: a multiple of their size.
        self.batch_multiple = 1 if mesh is None else mesh.shape["data"] * mesh.shape["fsdp"]
        self.batch_size = -(-batch_size // self.batch_multiple) * self.batch_multiple
        graphdef, state = nnx.split(model)
        if mesh is not None:
            state = jax.device_put(state, sharding.named_shardings(nnx.get_partition_spec(state), mesh))
        self._state = state
        self._forward = jax.jit(lambda state, ids, lengths: nnx.merge(graphdef, state)(ids, lengths))
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        return self.cfg.dim

    def _run(self, ids_bl: np.ndarray, lengths_b: np.ndarray) -> np.ndarray:
        if self.mesh is None:
            return np.asarray(self._forward(self._state, ids_bl, lengths_b))
        with sharding.axis_rules(self.mesh):
            return np.asarray(self._forward(self._state, ids_bl, lengths_b))

    def encode(self, prompts: Sequence[str], progress: Callable[[int], None] | None = None) -> list[np.ndarray]:
        """Each prompt's embedding (its token count, D), in the order given. Batches of similar
        length run together, padded to a bucketed (batch, length) so few shapes are compiled;
        `progress(n)` is told of each finished batch's n prompts."""
        tokens = [self.tokenizer.encode(p) for p in prompts]
        order = sorted(range(len(prompts)), key=lambda i: len(tokens[i]))
        out: list[np.ndarray | None] = [None] * len(prompts)
        for start in range(0, len(order), self.batch_size):
            rows = order[start:start + self.batch_size]
            b = bucket(len(rows), self.batch_size, minimum=self.batch_multiple)
            b = -(-b // self.batch_multiple) * self.batch_multiple
            length = bucket(max(len(tokens[i]) for i in rows), self.tokenizer.max_len)
            ids = np.full((b, length), self.tokenizer.pad_id, np.int32)
            lengths = np.ones((b,), np.int32)  # padding rows: one token, dropped below
            for r, i in enumerate(rows):
                ids[r, : len(tokens[i])] = tokens[i]
                lengths[r] = len(tokens[i])
            with self._lock:  # one batch on the device at a time (generate calls from threads)
                states = self._run(ids, lengths)
            for r, i in enumerate(rows):
                out[i] = states[r, : lengths[r]].astype(np.float32)
            if progress is not None:
                progress(len(rows))
        return out

    def __call__(self, prompt: str) -> np.ndarray:
        return self.encode([prompt])[0]


def load_text_encoder(checkpoint: str, tokenizer: str | None = None, *, max_len: int = 512,
                      dtype: str = "bfloat16", batch_size: int = 32, attention: str = "xla") -> TextEncoder:
    """A `TextEncoder` from a umT5 checkpoint (models/umt5_weights.py) and its SentencePiece model
    (default: the one shipped beside the checkpoint). Sharded over all devices when there are several."""
    from rynn_jax.models.umt5_weights import load_umt5

    tok = UMT5Tokenizer(find_tokenizer(tokenizer or checkpoint), max_len=max_len)
    mesh = sharding.make_mesh(sharding.MeshConfig()) if jax.device_count() > 1 else None
    return TextEncoder(load_umt5(checkpoint, dtype=dtype, attention=attention), tok, batch_size=batch_size, mesh=mesh)


# --------------------------------------------------------------------------------------------------
# Prompt files and output
# --------------------------------------------------------------------------------------------------


def read_prompts(path: str) -> list[str]:
    """Prompts of a text file (one a line, blank lines skipped) or a `.jsonl` file (a JSON string
    per line, or an object with a "prompt", "text" or "task_description" field)."""
    errors.existing(path, "--prompts", kind="file")
    prompts = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            if not path.endswith(".jsonl"):
                prompts.append(line.strip())
                continue
            try:
                item = json.loads(line)
            except ValueError as e:
                raise errors.InputError(f"--prompts {path}:{n}: not JSON ({e})") from None
            if isinstance(item, dict):
                item = next((item[k] for k in _JSONL_FIELDS if k in item), None)
            if not isinstance(item, str):
                raise errors.InputError(f"--prompts {path}:{n}: expected a string or an object with one of "
                                        f"{', '.join(_JSONL_FIELDS)}")
            prompts.append(item)
    return prompts


def write_embeddings(encoder: TextEncoder, prompts: Sequence[str], out: str) -> list[str]:
    """Encode the distinct prompts and the empty one; write `out/<sha256(prompt)>.safetensors`
    each and the index `out/prompts.jsonl`. Returns the written paths (the empty prompt's first)."""
    unique = [""] + sorted(set(prompts) - {""})
    os.makedirs(out, exist_ok=True)
    with tqdm(total=len(unique), desc="encode-prompts", unit="prompt") as bar:
        embeddings = encoder.encode(unique, progress=bar.update)
    paths = [text.write_embedding(out, p, e) for p, e in zip(unique, embeddings)]
    index = os.path.join(out, INDEX_FILE)
    with open(index + ".tmp", "w", encoding="utf-8") as f:
        for p, e, path in zip(unique, embeddings, paths):
            f.write(json.dumps({"file": os.path.basename(path), "tokens": len(e), "prompt": p}, ensure_ascii=False)
                    + "\n")
    os.replace(index + ".tmp", index)
    return paths


def main(argv: list[str] | None = None) -> int:
    p = errors.ArgumentParser(prog="python serve.py encode-prompts", description=__doc__)
    p.add_argument("--checkpoint", required=True, help="umT5 encoder: Wan .pth, HF safetensors/dir, or a "
                                                       "diffusers pipeline dir")
    p.add_argument("--tokenizer", default=None, help="SentencePiece model (default: spiece.model beside the "
                                                     "checkpoint, in google/umt5-xxl/ or tokenizer/)")
    p.add_argument("--prompts", action="append", default=[], metavar="FILE", help=".txt (a prompt a line) or "
                   ".jsonl; repeatable")
    p.add_argument("--episodes", action="append", default=[], metavar="DIR",
                   help="task descriptions of the episodes and operator streams under DIR; repeatable")
    p.add_argument("--out", required=True, help="output directory of <sha256(prompt)>.safetensors")
    p.add_argument("--batch", type=int, default=32, help="prompts per encoder call")
    p.add_argument("--text-len", type=int, default=512, help="tokens kept per prompt (the DiT's text slots)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="encoder weights and matmuls")
    p.add_argument("--attention", default="xla", choices=["xla", "cudnn"], help="attention implementation")
    a = p.parse_args(argv)
    if a.batch < 1 or a.text_len < 1:
        raise errors.UsageError(f"--batch {a.batch} / --text-len {a.text_len}: must be ≥ 1")
    if not a.prompts and not a.episodes:
        raise errors.UsageError("no prompts: give --prompts FILE and/or --episodes DIR")
    errors.existing(a.checkpoint, "--checkpoint")
    tokenizer = find_tokenizer(errors.existing(a.tokenizer, "--tokenizer") if a.tokenizer else a.checkpoint)
    prompts = [q for f in a.prompts for q in read_prompts(f)]
    for d in a.episodes:
        prompts += text.episode_prompts(errors.existing(d, "--episodes", kind="directory"))
    errors.writable_dir(a.out, "--out")
    encoder = load_text_encoder(a.checkpoint, tokenizer, max_len=a.text_len, dtype=a.dtype, batch_size=a.batch,
                                attention=a.attention)
    paths = write_embeddings(encoder, prompts, a.out)
    print(f"{len(paths)} embeddings (the empty prompt's included, width {encoder.dim}) in {a.out}; "
          f"index: {os.path.join(a.out, INDEX_FILE)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(errors.run(main))
