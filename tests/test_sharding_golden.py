"""Golden sharding snapshot: the partition spec of every parameter of the 5B model (control branch +
rank-64 LoRA, i.e. configs/stage1_lora.py) under the default rules, from `jax.eval_shape` — no
allocation. A change to the rules table or to a parameter's axis names shows up as a diff of
tests/golden/sharding_5b.json. Regenerate deliberately with:

    UPDATE_GOLDEN=1 python -m pytest tests/test_sharding_golden.py
"""

from __future__ import annotations

import json
import math
import os

import jax
from flax import nnx

from rynn_jax import sharding
from rynn_jax.training import config as config_lib
from rynn_jax.training import state as state_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "golden", "sharding_5b.json")
WAN_5B_PARAMS = 4_999_787_712  # diffusers WanTransformer3DModel, TI2V-5B config


def _table() -> dict[str, dict]:
    cfg = config_lib.load_config(os.path.join(ROOT, "configs", "stage1_lora.py"))
    params = nnx.state(state_lib.abstract_model(cfg), nnx.Param)
    return sharding.spec_table(nnx.to_pure_dict(nnx.get_partition_spec(params)), nnx.to_pure_dict(params))


def test_golden_sharding_5b():
    table = _table()
    if os.environ.get("UPDATE_GOLDEN"):
        os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
        with open(GOLDEN, "w") as f:
            json.dump(table, f, indent=1, sort_keys=True)
            f.write("\n")
    with open(GOLDEN) as f:
        golden = json.load(f)
    assert sorted(table) == sorted(golden), set(table) ^ set(golden)
    for path in golden:
        assert table[path] == golden[path], path
    base = sum(math.prod(v["shape"]) for k, v in table.items() if "lora_" not in k and not k.startswith("control"))
    assert base == WAN_5B_PARAMS
    # the big matrices are sharded: every ≥ 1M-element parameter has a mesh axis somewhere
    for path, v in table.items():
        if math.prod(v["shape"]) >= 2 ** 20:
            assert any(a is not None for a in v["mesh"]), path


def test_resolve_rules():
    """A mesh axis shards one dimension only; size-1 mesh axes drop out of the spec."""
    P = jax.sharding.PartitionSpec
    assert sharding.resolve(("embed", "mlp")) == P("fsdp", "tensor")
    assert sharding.resolve(("embed", "embed")) == P("fsdp", None)  # text_embed_2, time_embed_2
    assert sharding.resolve(("patch", "patch", "in_channels", "embed")) == P(None, None, None, "fsdp")
    assert sharding.resolve(("act_batch", "act_len")) == P(("data", "fsdp"), "context")
    mesh = sharding.make_mesh(sharding.MeshConfig(fsdp=-1), jax.devices()[:1])
    assert sharding.resolve(("act_batch", "heads"), mesh=mesh) == P(None, None)
