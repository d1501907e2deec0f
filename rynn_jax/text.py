"""Text conditioning: precomputed umT5-XXL embeddings in, a fixed 512-slot context out.

rynn-jax does not run umT5 itself; prompts arrive as embeddings saved to safetensors (as the
released RynnWorld examples ship them). The DiT always sees `text_len` slots: the embedding is
trimmed to its true length and zero-padded, as the reference pipelines do. With no embedding at all
we use an all-zero context. NOTE: for official weights that is *not* the same as umT5("") — the
empty prompt still yields non-zero embeddings for its end-of-sequence token — so results differ
slightly from the reference's "empty prompt"; save umT5("") once and pass it for exact behaviour.
"""

from __future__ import annotations

import os

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
