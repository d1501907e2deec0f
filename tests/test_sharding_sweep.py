"""bench/sharding_sweep.py on 8 fake CPU devices with the tiny recipe: three meshes (pure FSDP, pure
data parallel, FSDP × context) run the real train step; their first-step losses agree (float32
compute: rel 1e-4; measured ≤ 1e-7), the compiled memory analysis is filled in, FSDP holds ~1/8 of
the state per device where data parallel replicates it, and impossible points are skipped with a
reason instead of crashing the sweep. One subprocess (XLA_FLAGS must be set before jax starts),
all points in it (`--in-process`); ~30 s on 2 idle cores, most of it three compiles.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from tests._train_run import FAST_COMPILE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_sharding_sweep_tiny(tmp_path):
    out = tmp_path / "sweep.json"
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count=8 {FAST_COMPILE}"}
    cmd = [sys.executable, "bench/sharding_sweep.py", "--config", "tiny", "--in-process", "--batch", "8",
           "--steps", "1", "--profile", "1", "--out", str(out),
           "--meshes", "fsdp=8", "data=8", "fsdp=2,context=4", "fsdp=16", "data=3"]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["mesh"]: r for r in json.loads(out.read_text())["rows"]}

    ran = [rows[m] for m in ("fsdp=8", "data=8", "fsdp=2,context=4")]
    for r in ran:
        assert r["status"] == "ok", r
        ma = r["memory_analysis"]
        assert ma["argument"] > 0 and ma["output"] > 0 and ma["temp"] > 0, ma
        assert r["state_bytes_per_device"] <= ma["argument"], r  # the state is part of the arguments
        assert r["step_s"] > 0 and r["tokens_per_s"] > 0 and r["compile_s"] > 0, r
        assert r["loss_ok"] and r["loss_ref_mesh"] == "fsdp=8", r
    np.testing.assert_allclose([r["loss"] for r in ran], ran[0]["loss"], rtol=1e-4)

    # FSDP shards params + Adam + EMA 8 ways; data parallel keeps a full copy on every device
    fsdp, data = rows["fsdp=8"]["memory_analysis"], rows["data=8"]["memory_analysis"]
    assert 4 * fsdp["argument"] < data["argument"], (fsdp, data)

    assert rows["fsdp=16"]["status"] == "skipped" and "16 devices" in rows["fsdp=16"]["reason"]
    assert rows["data=3"]["status"] == "skipped" and "does not split" in rows["data=3"]["reason"]
    # --profile: kernel time of one more step, by category; the categories add up to the busy time
    prof = rows["fsdp=8"]["profile"]
    assert prof["busy_ms"] > 0 and prof["kernels_per_call"] > 0 and prof["top_ops"], prof
    assert abs(sum(prof["by_category"].values()) - prof["busy_ms"]) < 1e-2 * prof["busy_ms"] + 0.01, prof
    assert "matmul" in prof["by_category"], prof
    assert "Δloss" in proc.stdout and "fsdp=2,context=4" in proc.stdout  # the printed table
