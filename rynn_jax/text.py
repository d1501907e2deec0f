"""Text conditioning: umT5-XXL embeddings in, a fixed 512-slot context out.

Prompts arrive as embeddings saved to safetensors, one file per prompt named
`<sha256(prompt)>.safetensors` (as the released RynnWorld examples ship them). The DiT always sees
`text_len` slots: the embedding is trimmed to its true length and zero-padded, as the reference
pipelines do. With no embedding at all we use an all-zero context.

Making embeddings from a umT5 checkpoint (Wan's `models_t5_umt5-xxl-enc-bf16.pth` with its
`google/umt5-xxl/spiece.model`, or a Hugging Face / diffusers `text_encoder/` + `tokenizer/`),
in JAX (`rynn_jax.text_encoder`, no PyTorch):

    python serve.py encode-prompts --checkpoint CKPT --prompts prompts.txt --out text_embeddings
    python serve.py encode-prompts --checkpoint CKPT --episodes data/robot --out text_embeddings

`--prompts` takes a text file (one prompt a line) or JSONL (strings, or objects with a "prompt",
"text" or "task_description" field); `--episodes` the task descriptions of the episodes
(`*/metadata.json`) and operator streams (`operator_stream.npz`) under a directory. The output
directory is what `serve.py generate --text-embeddings` and `rynn_jax.data.preencode
--text-embeddings` read; it always holds umT5("") as well, so an episode without a description
gets what Wan means by "no prompt" (the all-zero context is not that: the empty prompt still
has its end-of-sequence token). `serve.py generate --text-encoder CKPT` encodes on the fly instead.

Without a checkpoint, `python -m rynn_jax.text` writes *hashed* embeddings (below): a fixed,
distinct context per task, which is all the synthetic world needs.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile

import numpy as np
from safetensors import SafetensorError, safe_open

# Keys we recognise when a file holds several tensors (first found wins).
KNOWN_KEYS = ("prompt_embeds", "context", "text_embedding", "encoder_hidden_states")


def load_text_context(path: str | os.PathLike[str], text_len: int = 512, text_dim: int = 4096,
                      key: str | None = None) -> np.ndarray:
    """Read an embedding (S, D) or (1, S, D) from safetensors → float32 (text_len, text_dim)."""
    path = os.fspath(path)
    try:
        with safe_open(path, framework="numpy") as f:
            keys = list(f.keys())
            if key is None:
                found = [k for k in KNOWN_KEYS if k in keys]
                if len(keys) == 1:
                    key = keys[0]
                elif found:
                    key = found[0]
                else:
                    raise ValueError(f"{path} holds tensors {keys}; say which with key=")
            elif key not in keys:
                raise ValueError(f"{path} has no tensor {key!r} (has {keys})")
            emb = np.asarray(f.get_tensor(key), np.float32)
    except (OSError, SafetensorError) as e:
        raise ValueError(f"cannot read text embedding {path}: {e}") from e
    if emb.ndim == 3 and emb.shape[0] == 1:
        emb = emb[0]
    if emb.ndim != 2 or emb.shape[1] != text_dim:
        raise ValueError(f"text embedding {key!r} in {path} has shape {emb.shape}; expected (S, {text_dim})")
    if not np.isfinite(emb).all():
        raise ValueError(f"text embedding {key!r} in {path} contains NaN or inf")
    return pad_context(emb, text_len)


def pad_context(emb_sd: np.ndarray, text_len: int) -> np.ndarray:
    out = np.zeros((text_len, emb_sd.shape[1]), np.float32)
    n = min(text_len, emb_sd.shape[0])
    out[:n] = emb_sd[:n]
    return out


def empty_context(text_len: int = 512, text_dim: int = 4096) -> np.ndarray:
    """The all-zero context used when no prompt embedding is given (see module doc)."""
    return np.zeros((text_len, text_dim), np.float32)


# --------------------------------------------------------------------------------------------------
# Hashed prompt embeddings: a fixed, distinct context per prompt when no text encoder is at hand
# --------------------------------------------------------------------------------------------------


def prompt_file_name(prompt: str) -> str:
    """`<sha256(prompt)>.safetensors`: the released code's prompt-embedding cache naming."""
    return hashlib.sha256(prompt.encode()).hexdigest() + ".safetensors"


def hashed_embedding(prompt: str, length: int, dim: int) -> np.ndarray:
    """(length, dim) float32 N(0, 1) values seeded by sha256(prompt): the same prompt always gives
    the same context and different prompts almost orthogonal ones. It carries no meaning beyond
    identity — a model trained with it learns one context per task, which is all the synthetic
    world needs (its tasks are fixed); umT5 embeddings replace it for real prompts."""
    seed = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:8], "little")
    return np.random.default_rng(seed).standard_normal((length, dim)).astype(np.float32)


def write_embedding(out: str, prompt: str, emb_sd: np.ndarray) -> str:
    """Save one prompt's (S, D) embedding as `<out>/<sha256(prompt)>.safetensors` (whole or not at
    all); returns the path."""
    from safetensors.numpy import save_file

    path = os.path.join(out, prompt_file_name(prompt))
    tmp = path + ".tmp"
    save_file({"text_embedding": np.ascontiguousarray(emb_sd, np.float32)}, tmp)
    os.replace(tmp, path)
    return path


def write_hashed_embeddings(prompts: list[str], out: str, length: int, dim: int) -> list[str]:
    """Write each prompt's hashed embedding as `<out>/<sha256(prompt)>.safetensors`; returns paths."""
    os.makedirs(out, exist_ok=True)
    return [write_embedding(out, prompt, hashed_embedding(prompt, length, dim)) for prompt in sorted(set(prompts))]


STREAM_FILE = "operator_stream.npz"  # a recorded operator stream (rynn_jax.kinematics.streams)


def episode_prompts(root: str) -> list[str]:
    """Distinct `task_description`s of the episodes (`*/metadata.json`) and operator streams
    (`operator_stream.npz`, in their meta) under `root`."""
    found = set()
    for dirpath, _, files in os.walk(root, followlinks=True):
        if "metadata.json" in files:
            with open(os.path.join(dirpath, "metadata.json")) as f:
                found.add(json.load(f).get("task_description"))
        if STREAM_FILE in files:
            path = os.path.join(dirpath, STREAM_FILE)
            try:
                with np.load(path, allow_pickle=False) as z:
                    found.add(json.loads(str(z["meta"])).get("task_description") if "meta" in z else None)
            except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
                from rynn_jax import errors

                raise errors.InputError(f"{path}: cannot read its meta ({e})") from None
    return sorted(p for p in found if p)


def main(argv: list[str] | None = None) -> int:
    from rynn_jax import errors

    p = errors.ArgumentParser(prog="python -m rynn_jax.text",
                              description="Write hashed prompt embeddings (a stand-in for umT5) for "
                                          "the task descriptions of the episodes under a directory.")
    p.add_argument("--episodes", required=True, help="directory searched for */metadata.json")
    p.add_argument("--out", required=True, help="output directory of <sha256(prompt)>.safetensors")
    p.add_argument("--dim", type=int, required=True, help="embedding width (the DiT's text_dim)")
    p.add_argument("--len", type=int, default=4, help="tokens per prompt (≤ the DiT's text_len)")
    a = p.parse_args(argv)
    errors.existing(a.episodes, "--episodes", kind="directory")
    errors.writable_dir(a.out, "--out")
    prompts = episode_prompts(a.episodes)
    if not prompts:
        raise errors.InputError(f"--episodes {a.episodes}: no */metadata.json with a task_description under it")
    for prompt, path in zip(sorted(prompts), write_hashed_embeddings(prompts, a.out, a.len, a.dim)):
        print(f"{os.path.basename(path)}  {prompt}")
    return 0


if __name__ == "__main__":
    from rynn_jax import errors

    raise SystemExit(errors.run(main))
