"""umT5's tokenizer: Wan's prompt cleaning, then the checkpoint's SentencePiece model.

What the reference pipeline feeds its text encoder, step by step:
  1. clean (Wan's "whitespace" rule): `ftfy.fix_text` (mojibake, odd quotes), HTML entities
     unescaped twice, every whitespace run → one space, stripped;
  2. SentencePiece ids of the cleaned text, cut to `max_len - 1`, then the end-of-sequence id
     (Hugging Face's T5 tokenizer with `add_special_tokens=True, truncation=True`);
  3. right-padded with the pad id; the true lengths mask the padding.

The model file is `spiece.model` of the checkpoint's tokenizer folder (Wan ships it in
`google/umt5-xxl/`, diffusers pipelines in `tokenizer/`).
"""

from __future__ import annotations

import html
import os

import ftfy
import numpy as np
import regex
import sentencepiece

from rynn_jax.errors import InputError

MODEL_FILE = "spiece.model"
# Where a checkpoint keeps its tokenizer, relative to the checkpoint's directory.
_TOKENIZER_DIRS = ("", "tokenizer", os.path.join("google", "umt5-xxl"))


def clean_prompt(text: str) -> str:
    """Wan's prompt cleaning ("whitespace"): fix the text, unescape HTML twice, squeeze whitespace."""
    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return regex.sub(r"\s+", " ", text).strip()


def find_tokenizer(path: str | os.PathLike[str]) -> str:
    """The SentencePiece model at `path`: the file itself, or `spiece.model` in the directory, its
    `tokenizer/` or its `google/umt5-xxl/` (for a checkpoint file: beside it)."""
    path = os.fspath(path)
    if os.path.isfile(path) and not path.endswith((".pth", ".pt", ".bin", ".safetensors", ".json")):
        return path
    root = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    for sub in _TOKENIZER_DIRS:
        candidate = os.path.join(root, sub, MODEL_FILE)
        if os.path.isfile(candidate):
            return candidate
    raise InputError(f"{path}: no {MODEL_FILE} there (looked in {', '.join(s or '.' for s in _TOKENIZER_DIRS)})",
                     fix="pass --tokenizer with the checkpoint's spiece.model")


class UMT5Tokenizer:
    """Cleaned prompts → right-padded ids and lengths, as the reference pipeline makes them."""

    def __init__(self, model_file: str | os.PathLike[str], max_len: int = 512):
        model_file = os.fspath(model_file)
        try:
            self.sp = sentencepiece.SentencePieceProcessor(model_file=model_file)
        except (OSError, RuntimeError) as e:
            raise InputError(f"{model_file}: not a SentencePiece model ({e})") from None
        if self.sp.eos_id() < 0:
            raise InputError(f"{model_file}: the SentencePiece model has no end-of-sequence piece")
        if max_len < 1:
            raise ValueError(f"max_len must be ≥ 1, got {max_len}")
        self.max_len = max_len
        self.eos_id = self.sp.eos_id()
        self.pad_id = max(self.sp.pad_id(), 0)  # masked out: any id serves

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, prompt: str) -> list[int]:
        """One prompt's ids: ≤ max_len, always ending with the end-of-sequence id."""
        return self.sp.encode(clean_prompt(prompt))[: self.max_len - 1] + [self.eos_id]

    def __call__(self, prompts: list[str], length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids (B, length) int32 right-padded, lengths (B,) int32); `length` defaults to the longest."""
        encoded = [self.encode(p) for p in prompts]
        lengths = np.asarray([len(e) for e in encoded], np.int32)
        length = int(lengths.max(initial=1)) if length is None else length
        if lengths.size and lengths.max() > length:
            raise ValueError(f"a prompt has {lengths.max()} tokens, more than length={length}")
        ids = np.full((len(prompts), length), self.pad_id, np.int32)
        for row, e in zip(ids, encoded):
            row[: len(e)] = e
        return ids, lengths
