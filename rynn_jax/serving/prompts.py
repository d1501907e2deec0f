"""Prompts → the DiT's text context: one embedding for all, a pre-encoded embedding per prompt, a
umT5 encoder run on the fly, or the all-zero context.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from rynn_jax import errors
from rynn_jax.data.preencode import TextEmbeddingStore
from rynn_jax.text import empty_context, hashed_embedding, load_text_context, pad_context
from rynn_jax.text_encoder import TextEncoder


def text_contexts(text: str | None, text_embeddings: str | None, text_len: int,
                  text_dim: int, text_encoder: TextEncoder | None = None, *,
                  hashed: bool = False) -> Callable[[str], np.ndarray]:
    """Prompt → (text_len, text_dim) context: one embedding file for all (`text`), the prompt's
    `<sha256(prompt)>.safetensors` in a directory (`text_embeddings`, the pre-encoder's naming;
    a missing one fails that stream), the prompt encoded by `text_encoder` (once per prompt), or,
    with none of those, the prompt's hashed embedding when `hashed` (what the bundled synthetic
    weights were trained with: `Weights.bundled`) and else the all-zero context."""
    if text and text_embeddings:
        raise errors.UsageError("--text / --text-embeddings: give one, not both")
    if text_encoder is not None:
        if text or text_embeddings:
            raise errors.UsageError("--text-encoder: encodes the prompts itself, not with --text / --text-embeddings")
        if text_encoder.dim != text_dim:
            raise errors.UsageError(f"--text-encoder: its embeddings are {text_encoder.dim} wide, the DiT reads "
                                    f"{text_dim}")
        return functools.lru_cache(maxsize=None)(lambda prompt: pad_context(text_encoder(prompt), text_len))
    if text_embeddings:
        store = TextEmbeddingStore(text_embeddings, missing="error", text_dim=text_dim, text_len=text_len)
        return lambda prompt: pad_context(store(prompt), text_len)
    if hashed and not text:
        return functools.lru_cache(maxsize=None)(lambda prompt: hashed_embedding(prompt, text_len, text_dim))
    ctx = load_text_context(text, text_len, text_dim) if text else empty_context(text_len, text_dim)
    return lambda prompt: ctx
