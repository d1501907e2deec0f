"""Sharded == unsharded: the same train steps on 1 device and on data×fsdp×tensor(×context) meshes of
8 fake CPU devices give the same losses and parameters; a checkpoint saved on one mesh restores
onto another. The 8-device part runs in a subprocess (XLA_FLAGS must be set before jax starts).

Tolerance (float32 compute): losses rel 1e-5; params abs 1e-5 after 2 AdamW steps at lr 1e-3, i.e. 1%
of one step's update (measured: ≤ 4e-6). Different meshes sum partial products in different
orders, and Adam's m/√v turns a 1e-7 difference of a near-zero gradient into a visible one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile

import numpy as np

from tests._parallel import run_workers
from tests._trees import sorted_leaves
from tests._train_run import FAST_COMPILE  # fast compiles: the same program on every mesh either way

MESHES = {  # name: (data, fsdp, tensor, context); each compile costs ~10 s on 2 busy cores
    "1dev": (1, 1, 1, 1),
    "d2f2t2": (2, 2, 2, 1),
    "f2t2c2": (1, 2, 2, 2),
}


def _worker(part: str) -> dict:
    """part "sft": the SFT steps on every mesh and the checkpoint restores; "lora_accum": LoRA with
    gradient accumulation (two subprocesses, run side by side)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from rynn_jax import data as data_lib
    from rynn_jax import sharding
    from rynn_jax.training import checkpointing, optim
    from rynn_jax.training import config as config_lib
    from rynn_jax.training import input as input_lib
    from rynn_jax.training import state as state_lib
    from rynn_jax.training import step as step_lib

    assert jax.device_count() == 8, jax.devices()
    base = config_lib.load_config(os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.py"))
    base = config_lib.apply_overrides(base, ["optim.lr=1e-3", "optim.warmup_steps=0", "total_steps=10"])
    it = input_lib.make_iterator(base)
    batches = [next(it) for _ in range(2)]

    cache = {}

    def setup(cfg, mesh_sizes):
        key = (id(cfg), mesh_sizes)
        if key not in cache:
            cache[key] = _setup(cfg, mesh_sizes)
        return cache[key]

    def _setup(cfg, mesh_sizes):
        mc = sharding.MeshConfig(**dict(zip(sharding.MESH_AXES, mesh_sizes)))
        devices = jax.devices()[:int(np.prod(mesh_sizes))]
        mesh = sharding.make_mesh(mc, devices)
        tx = optim.make_optimizer(cfg.optim, cfg.total_steps)
        abstract, sh = state_lib.state_shardings(cfg, tx, mesh)
        graphdef, state = state_lib.create_train_state(cfg, tx, mesh)
        step = step_lib.jit_step(cfg, graphdef, tx, mesh, sh, dict.fromkeys(input_lib.TRAIN_KEYS))
        put = lambda b: data_lib.to_device(b, data_lib.batch_sharding(mesh))
        return mesh, abstract, sh, state, step, put

    def run(cfg, mesh_sizes):
        mesh, _, _, state, step, put = setup(cfg, mesh_sizes)
        state = jax.tree.map(jnp.copy, state)  # the step donates its input; keep the cached one
        sharding.check_sharded(state.params, 1000)  # startup check passes on every mesh
        if mesh.size > 1:  # ... and catches a big replicated array
            big = jax.device_put(jnp.zeros((64, 64)), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
            assert sharding.unsharded_large_arrays({"w": big}, 1000) == ["['w'] (64, 64)"]
        losses = []
        for b in batches:
            state, m = step(state, put(b))
            losses.append(float(m["loss"]))
        params = jax.tree.map(lambda x: np.asarray(x).tolist(), nnx.to_pure_dict(state.params))
        stats = jax.tree.map(lambda x: np.asarray(x).tolist(), nnx.to_pure_dict(state.stats))
        return {"losses": losses, "params": params, "stats": stats}

    if part == "lora_accum":
        lora_cfg = config_lib.apply_overrides(base, ["lora.rank=4", "lora.alpha=4.0", "grad_accum=2"])
        return {"lora_accum": {name: run(lora_cfg, MESHES[name]) for name in ("1dev", "d2f2t2")}}
    assert part == "sft", part
    out = {"sft": {name: run(base, sizes) for name, sizes in MESHES.items()}}

    # save on one mesh, restore onto two others, take one more step on each
    with tempfile.TemporaryDirectory() as d:
        cfg = base
        _, _, _, state, step, put = setup(cfg, MESHES["d2f2t2"])
        state = jax.tree.map(jnp.copy, state)
        for b in batches:
            state, _ = step(state, put(b))
        ckpt = checkpointing.Checkpointer(dataclasses.replace(cfg.ckpt, dir=d, async_save=True))
        ckpt.save(2, state, it)
        ckpt.wait()
        want = jax.tree.map(np.asarray, jax.device_get(state))
        _, m = step(state, put(batches[0]))
        restore = {"want_loss": float(m["loss"])}
        for name in ("f2t2c2", "1dev"):
            mesh, abstract, sh, _, step2, put2 = setup(cfg, MESHES[name])
            got = ckpt.restore_latest(checkpointing.abstract_with_shardings(abstract, sh), input_lib.make_iterator(cfg))
            same = jax.tree.all(jax.tree.map(lambda a, b: bool(np.array_equal(a, np.asarray(b))), want, got))
            on_mesh = all(x.sharding.mesh.shape == mesh.shape for x in jax.tree.leaves(got))
            _, m = step2(got, put2(batches[0]))
            restore[name] = {"same": same, "on_mesh": on_mesh, "loss": float(m["loss"])}
        ckpt.close()
    out["restore"] = restore
    return out


def test_sharded_equals_unsharded():
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count=8 {FAST_COMPILE}"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = {}
    for proc in run_workers([[sys.executable, "-m", "tests.test_train_sharding", part] for part in ("sft", "lora_accum")],
                            env=env, cwd=root, timeout=600):
        assert proc.returncode == 0, proc.stderr[-5000:]
        out.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert set(out) == {"sft", "lora_accum", "restore"}

    for group in ("sft", "lora_accum"):
        ref = out[group]["1dev"]
        for name, got in out[group].items():
            np.testing.assert_allclose(got["losses"], ref["losses"], rtol=1e-5, err_msg=f"{group}/{name}")
            for a, b in zip(sorted_leaves(got["params"]), sorted_leaves(ref["params"]), strict=True):
                np.testing.assert_allclose(a, b, atol=1e-5, rtol=0, err_msg=f"{group}/{name}")
            for a, b in zip(sorted_leaves(got["stats"]), sorted_leaves(ref["stats"]), strict=True):
                np.testing.assert_allclose(a, b, rtol=1e-5, err_msg=f"{group}/{name} stats")
        assert ref["losses"][1] != ref["losses"][0]

    restore = out["restore"]
    for name in ("f2t2c2", "1dev"):
        assert restore[name]["same"] and restore[name]["on_mesh"], restore
        np.testing.assert_allclose(restore[name]["loss"], restore["want_loss"], rtol=1e-5)


if __name__ == "__main__":
    print(json.dumps(_worker(sys.argv[1])))
