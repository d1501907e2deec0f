"""Precomputed text embeddings: trimming, zero-padding, and clear errors."""

import numpy as np
import pytest
from safetensors.numpy import save_file

from rynn_jax.text import empty_context, load_text_context


def test_pads_and_trims(tmp_path):
    emb = np.random.default_rng(0).standard_normal((1, 7, 32)).astype(np.float32)
    save_file({"prompt_embeds": emb}, str(tmp_path / "p.safetensors"))
    ctx = load_text_context(tmp_path / "p.safetensors", text_len=10, text_dim=32)
    assert ctx.shape == (10, 32)
    np.testing.assert_array_equal(ctx[:7], emb[0])
    assert not ctx[7:].any()
    ctx = load_text_context(tmp_path / "p.safetensors", text_len=4, text_dim=32)
    np.testing.assert_array_equal(ctx, emb[0, :4])
    assert not empty_context(5, 3).any()


def test_errors_name_the_problem(tmp_path):
    save_file({"a": np.zeros((3, 32), np.float32), "b": np.zeros((3, 32), np.float32)},
              str(tmp_path / "two.safetensors"))
    with pytest.raises(ValueError, match="say which with key="):
        load_text_context(tmp_path / "two.safetensors", text_dim=32)
    with pytest.raises(ValueError, match="no tensor 'c'"):
        load_text_context(tmp_path / "two.safetensors", text_dim=32, key="c")
    save_file({"x": np.zeros((3, 31), np.float32)}, str(tmp_path / "dim.safetensors"))
    with pytest.raises(ValueError, match=r"shape \(3, 31\); expected \(S, 32\)"):
        load_text_context(tmp_path / "dim.safetensors", text_dim=32)
    save_file({"x": np.full((3, 32), np.nan, np.float32)}, str(tmp_path / "nan.safetensors"))
    with pytest.raises(ValueError, match="NaN"):
        load_text_context(tmp_path / "nan.safetensors", text_dim=32)
    (tmp_path / "bad.safetensors").write_bytes(b"\x07" * 20)
    with pytest.raises(ValueError, match="cannot read text embedding"):
        load_text_context(tmp_path / "bad.safetensors", text_dim=32)


def test_text_contexts_give_bundled_weights_their_hashed_prompts():
    """Commands serving the bundled synthetic weights (trained on hashed task prompts) give each
    stream its prompt's hashed context; other weights keep the all-zero context by default."""
    from rynn_jax.serving.prompts import text_contexts
    from rynn_jax.text import hashed_embedding

    a, b = "Place the lid onto the box.", "Pick up both blocks."
    hashed = text_contexts(None, None, 4, 64, hashed=True)
    np.testing.assert_array_equal(hashed(a), hashed_embedding(a, 4, 64))
    assert hashed(a).shape == (4, 64) and not np.allclose(hashed(a), hashed(b))
    assert not text_contexts(None, None, 4, 64)(a).any()
