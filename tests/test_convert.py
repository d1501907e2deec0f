"""Converter engine and CLI: safetensors (single, sharded, pipeline dir) → orbax dir → same model."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import save_file

from rynn_jax import converted_weights
from rynn_jax.convert import main
from rynn_jax.models.dit import WanDiTConfig, init_dit
from rynn_jax.models.dit_weights import load_dit
from rynn_jax.weights import ConversionError, Rule, convert_state_dict, open_safetensors


def _tiny_diffusers_state_dict(cfg: WanDiTConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """A diffusers-layout state dict for `cfg`, built from our own tiny model (inverse mapping)."""
    params = nnx.to_pure_dict(nnx.state(init_dit(cfg, seed), nnx.Param))
    p = jax.tree.map(np.asarray, params)
    sd = {
        "patch_embedding.weight": p["patch_embed"].transpose(4, 3, 0, 1, 2),
        "patch_embedding.bias": p["patch_embed_bias"],
        "scale_shift_table": p["head_modulation"][None],
    }
    lin = {"text_embed_1": "condition_embedder.text_embedder.linear_1",
           "text_embed_2": "condition_embedder.text_embedder.linear_2",
           "time_embed_1": "condition_embedder.time_embedder.linear_1",
           "time_embed_2": "condition_embedder.time_embedder.linear_2",
           "time_proj": "condition_embedder.time_proj", "head": "proj_out"}
    for ours, name in lin.items():
        sd[f"{name}.weight"] = p[ours]["kernel"].T
        sd[f"{name}.bias"] = p[ours]["bias"]
    b = p["blocks"]
    for i in range(cfg.num_layers):
        for ours, attn in (("self_attn", "attn1"), ("cross_attn", "attn2")):
            for proj, name in (("q", "to_q"), ("k", "to_k"), ("v", "to_v"), ("o", "to_out.0")):
                sd[f"blocks.{i}.{attn}.{name}.weight"] = b[ours][proj]["kernel"][i].T
                sd[f"blocks.{i}.{attn}.{name}.bias"] = b[ours][proj]["bias"][i]
            for n in ("norm_q", "norm_k"):
                sd[f"blocks.{i}.{attn}.{n}.weight"] = b[ours][n][i]
        sd[f"blocks.{i}.norm2.weight"] = b["norm_cross_scale"][i]
        sd[f"blocks.{i}.norm2.bias"] = b["norm_cross_bias"][i]
        for ours, name in (("ffn_up", "ffn.net.0.proj"), ("ffn_down", "ffn.net.2")):
            sd[f"blocks.{i}.{name}.weight"] = b[ours]["kernel"][i].T
            sd[f"blocks.{i}.{name}.bias"] = b[ours]["bias"][i]
        sd[f"blocks.{i}.scale_shift_table"] = b["modulation"][i][None]
    return {k: np.ascontiguousarray(v) for k, v in sd.items()}, params


def _write_sharded(sd: dict, root: str) -> None:
    os.makedirs(root, exist_ok=True)
    keys = sorted(sd)
    halves = {"diffusion_pytorch_model-00001-of-00002.safetensors": keys[: len(keys) // 2],
              "diffusion_pytorch_model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    weight_map = {}
    for fname, ks in halves.items():
        save_file({k: sd[k] for k in ks}, os.path.join(root, fname))
        weight_map.update({k: fname for k in ks})
    with open(os.path.join(root, "diffusion_pytorch_model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def _outputs(model, cfg):
    z = jnp.asarray(np.random.default_rng(1).standard_normal((1, 3, 4, 6, cfg.in_channels)), jnp.float32)
    t = jnp.array([[0.0, 700.0, 700.0]])
    ctx = jnp.asarray(np.random.default_rng(2).standard_normal((1, cfg.text_len, cfg.text_dim)), jnp.float32)
    return np.asarray(model(z, t, ctx))


def test_sharded_pipeline_dir_and_cli_roundtrip(tmp_path):
    cfg = WanDiTConfig.tiny()
    sd, params = _tiny_diffusers_state_dict(cfg)
    pipeline = tmp_path / "Wan2.2-TI2V-5B-Diffusers"
    _write_sharded(sd, str(pipeline / "transformer"))
    want = _outputs(init_dit(cfg, 0), cfg)

    direct = load_dit(str(pipeline), cfg)  # finds transformer/ and the index
    np.testing.assert_allclose(_outputs(direct, cfg), want, rtol=1e-6, atol=1e-6)

    out = tmp_path / "converted"
    main(["dit", str(pipeline), str(out), "--config", "tiny"])
    assert converted_weights.is_converted_dir(out)
    restored = load_dit(str(out))
    np.testing.assert_array_equal(_outputs(restored, cfg), _outputs(direct, cfg))

    main(["dit", str(pipeline), str(tmp_path / "bf16"), "--config", "tiny", "--dtype", "bfloat16"])
    bf16 = load_dit(str(tmp_path / "bf16"))
    assert bf16.blocks.self_attn.q.kernel[...].dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="was converted for"):
        load_dit(str(out), WanDiTConfig.tiny(num_layers=3))


def test_single_file_and_missing_shard(tmp_path):
    cfg = WanDiTConfig.tiny()
    sd, _ = _tiny_diffusers_state_dict(cfg)
    save_file(sd, str(tmp_path / "model.safetensors"))
    assert set(open_safetensors(tmp_path / "model.safetensors")) == set(sd)
    _write_sharded(sd, str(tmp_path / "sharded"))
    os.remove(tmp_path / "sharded" / "diffusion_pytorch_model-00002-of-00002.safetensors")
    with pytest.raises(ConversionError, match="00002-of-00002.safetensors"):
        open_safetensors(tmp_path / "sharded")
    (tmp_path / "garbage.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ConversionError, match="garbage.safetensors"):
        open_safetensors(tmp_path / "garbage.safetensors")


def test_engine_checks_layer_count_and_unfilled_params():
    abstract = {"w": jax.ShapeDtypeStruct((2, 3), jnp.float32), "b": jax.ShapeDtypeStruct((3,), jnp.float32)}
    sd = {"l0": np.ones(3, np.float32), "l1": np.ones(3, np.float32), "l2": np.ones(3, np.float32)}
    with pytest.raises(ConversionError, match="stacks 2 layers but the rule has 3"):
        convert_state_dict(sd, [Rule(("w",), ("l0", "l1", "l2"), stacked=True), Rule(("b",), ("l0",))], abstract)
    with pytest.raises(ConversionError, match=r"no checkpoint tensor maps to our parameter\(s\): \['b'\]"):
        convert_state_dict(sd, [Rule(("w",), ("l0", "l1"), stacked=True)], abstract)
    out = convert_state_dict({"l0": sd["l0"], "l1": sd["l1"]},
                             [Rule(("w",), ("l0", "l1"), stacked=True), Rule(("b",), ("l0",))],
                             abstract, dtype=jnp.bfloat16)
    assert out["w"].shape == (2, 3) and out["w"].dtype == jnp.bfloat16
