"""Sharded == unsharded for the distillation updates: phase A (two warm-up steps) and phase B (a
critic-only iteration, then a generator + critic iteration, so the generator sees a critic that
differs from the teacher and its DMD gradient is not zero) on 1 device and on a data×fsdp×tensor
mesh of 8 fake CPU devices. Teacher, student and critic are sharded by the one rules table on
the one mesh. The 8-device part runs in a subprocess (XLA_FLAGS must be set before jax starts).

Tolerance (float32 compute; different meshes sum partial products in different orders): metrics
rel 1e-5, parameters abs 2e-6 (measured: ≤ 5e-7 rel and ≤ 1.2e-7 abs, with Adam's ε raised, below).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from tests._trees import sorted_leaves
from tests._train_run import FAST_COMPILE

MESHES = {"1dev": (1, 1, 1, 1), "d2f2t2": (2, 2, 2, 1)}  # (data, fsdp, tensor, context)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _worker() -> dict:
    import dataclasses

    import jax
    from flax import nnx

    from rynn_jax import data as data_lib
    from rynn_jax import sharding
    from rynn_jax.distill import config as config_lib
    from rynn_jax.distill import state as state_lib
    from rynn_jax.distill import step as step_lib
    from rynn_jax.training import input as input_lib
    from rynn_jax.training.config import TrainConfig

    assert jax.device_count() == 8, jax.devices()
    base = config_lib.load_config(os.path.join(ROOT, "configs", "distill_tiny.py"))
    # Adam's ε raised from 1e-8 to 1e-3: the first Adam step is ≈ lr·sign(g), which turns a 1e-9
    # mesh-order difference of a near-zero gradient into a visible update difference; with a
    # larger ε small gradients update linearly and the comparison stays sharp.
    base = dataclasses.replace(base, optim=dataclasses.replace(base.optim, eps=1e-3),
                               critic_optim=dataclasses.replace(base.critic_optim, eps=1e-3))
    it = input_lib.make_iterator(TrainConfig(model=base.model, data=base.data))
    batches = [next(it) for _ in range(2)]

    def host(tree: nnx.State) -> dict:
        return jax.tree.map(lambda x: np.asarray(x).tolist(), nnx.to_pure_dict(tree))

    def run(phase: str, sizes: tuple[int, ...], steps: tuple[int, ...]) -> dict:
        cfg = dataclasses.replace(base, phase=phase)
        mesh = sharding.make_mesh(sharding.MeshConfig(**dict(zip(sharding.MESH_AXES, sizes))),
                                  jax.devices()[:int(np.prod(sizes))])
        tx_s, tx_c = state_lib.make_optimizers(cfg)
        _, shardings = state_lib.state_shardings(cfg, tx_s, tx_c, mesh)
        _, teacher, state = state_lib.create(cfg, tx_s, tx_c, mesh)
        if mesh.size > 1:  # the teacher is sharded like the student (same rules, same mesh)
            for tree in (teacher, state.student, state.critic):
                assert not sharding.unsharded_large_arrays(tree, 1000)
        update = step_lib.jit_updates(cfg, state_lib.graphdef_of(cfg.model), tx_s, tx_c, mesh, shardings,
                                      input_lib.TRAIN_KEYS)
        metrics = []
        for s, b in zip(steps, batches, strict=True):
            state, m = update(s, state, teacher, data_lib.to_device(b, data_lib.batch_sharding(mesh)))
            metrics.append({k: float(v) for k, v in jax.device_get(m).items()})
        return {"metrics": metrics, "student": host(state.student), "ema": host(state.ema),
                "critic": host(state.critic) if len(state.critic) else {}}

    # phase B: iteration 2 is critic-only, iteration 1 generator + critic (the step argument picks)
    return {name: {"warmup": run("warmup", sizes, (1, 2)), "dmd": run("dmd", sizes, (2, 1))}
            for name, sizes in MESHES.items()}


def test_distill_sharded_equals_unsharded():
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count=8 {FAST_COMPILE}"}
    proc = subprocess.run([sys.executable, "-m", "tests.test_distill_sharding"], env=env, cwd=ROOT,
                          capture_output=True, text=True, check=False, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    ref, got = out["1dev"], out["d2f2t2"]
    dmd = ref["dmd"]["metrics"]
    assert "gen_loss" in dmd[1] and "gen_loss" not in dmd[0]
    assert dmd[1]["gen_grad_norm"] > 0 and dmd[1]["real_fake_gap"] > 0  # the generator really moved
    for phase in ("warmup", "dmd"):
        for m_ref, m_got in zip(ref[phase]["metrics"], got[phase]["metrics"], strict=True):
            assert m_ref.keys() == m_got.keys()
            for k in m_ref:
                np.testing.assert_allclose(m_got[k], m_ref[k], rtol=1e-5, atol=1e-8, err_msg=f"{phase}/{k}")
        for tree in ("student", "ema", "critic"):
            a, b = sorted_leaves(got[phase][tree]), sorted_leaves(ref[phase][tree])
            assert len(a) == len(b) and (len(a) > 0 or (tree, phase) == ("critic", "warmup"))
            for x, y in zip(a, b, strict=True):
                np.testing.assert_allclose(x, y, atol=2e-6, rtol=0, err_msg=f"{phase}/{tree}")
    # the updates changed the student (else equality would be vacuous)
    assert ref["warmup"]["metrics"][1]["update_norm"] > 0 and ref["dmd"]["metrics"][1]["gen_update_norm"] > 0


if __name__ == "__main__":
    print(json.dumps(_worker()))
