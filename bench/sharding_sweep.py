"""Sharding-strategy sweep of the real training step: one row per mesh over (data, fsdp, tensor, context).

    # CPU check, 8 fake devices, tiny model (docs/SHARDING.md has the GPU commands)
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python bench/sharding_sweep.py --config tiny \
        --meshes fsdp=8 data=8 fsdp=4,tensor=2 data=2,fsdp=4 fsdp=2,context=4 --steps 2
    # 5B teacher (configs/stage1_sft.py), 21 latent frames = 8190 tokens, one point per process
    python bench/sharding_sweep.py --meshes fsdp=2 tensor=2 context=2 data=2 fsdp=1 --steps 5

Per mesh point: the step of train.py (`training.step.jitted_step`: bf16 compute, fp32 master
weights, per-block remat, clip → AdamW, EMA, as the recipe says) is lowered from abstract sharded
inputs and compiled ahead of time (compile time, `compiled.memory_analysis()` per device); the state
is then built by the sharded init (each device makes only its shards), one untimed step runs (its
loss is the correctness check), and `--steps` timed steps give the median step time, tokens/s, MFU
and the allocator's peak bytes per device (`device.memory_stats()`, GPU only).

A mesh is `axis=size,...` (axes not named are 1; one size may be -1 = the remaining devices), with
an optional `@rules` suffix naming an entry of rule_variants() (e.g. `context=2@zero_context`). By
default each point runs in its own process (`--in-process` for one): the allocator's peak is then the
point's own, and a crash or out-of-memory abort costs that row only. Points that need more devices
than there are, whose batch does not split over data×fsdp, or that run out of memory (at compile,
init or run) are recorded with the reason and skipped. The batch is host-made from `--seed`, the same
on every mesh, so the first step's loss must agree across meshes of the same batch size: the
`Δloss` column is the relative difference to the first such point (tolerance 2e-2 in bf16 compute,
1e-4 in fp32; `loss ok` says which).

`--compile-only` stops after the memory analysis (predicts per-device memory of any mesh on fake
CPU devices); `--model-only` prints only the computed columns (exact state bytes per device from
the rules table, a ring-collective traffic model, a compute floor) for `--devices` devices.

MFU counts model FLOPs only (training.metrics.model_flops_per_token: matmuls + attention, forward ×
3 for forward + backward; remat's recomputed forward is not counted) against `--peak-tflops` per
device (default the recipe's log.peak_tflops_per_device, 989 = H100/H200 dense bf16 datasheet).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# NVLink multicast stays off (device KINDS.md: it can take the host's shared GPUs down); set here
# too, before anything can start NCCL, and inherited by every worker process.
os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
# The 5B state alone is ~80 GB on one device: JAX's default 75% pool would refuse points that fit.
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")

CONFIGS = {"5b": "configs/stage1_sft.py", "tiny": "configs/tiny.py"}  # or any recipe path
AXES = ("data", "fsdp", "tensor", "context")
LOSS_RTOL = {"bfloat16": 2e-2, "float16": 2e-2, "float32": 1e-4}


def rule_variants() -> dict[str, tuple]:
    """Named rules tables a mesh point may ask for with `@name` (docs/SHARDING.md: writing one)."""
    from rynn_jax import sharding

    def replace(rules, name, target):
        return tuple((n, target if n == name else t) for n, t in rules)

    base = sharding.LOGICAL_AXIS_RULES
    return {
        "default": base,
        # context parallel with ZeRO-3 over the context axis too: params/optimizer sharded on
        # (fsdp, context) instead of replicated along context (MaxText's choice)
        "zero_context": replace(base, "embed", ("fsdp", "context")),
        # pure data-parallel axis that also shards params/optimizer (data behaves like fsdp)
        "zero_data": replace(base, "embed", ("data", "fsdp")),
    }


# --------------------------------------------------------------------------------------------------
# Mesh points
# --------------------------------------------------------------------------------------------------


def parse_mesh(spec: str) -> tuple[dict[str, int], str]:
    """'fsdp=4,tensor=2@zero_context' → ({data:1, fsdp:4, tensor:2, context:1}, 'zero_context')."""
    from rynn_jax.sharding import parse_mesh_sizes

    body, _, rules = spec.partition("@")
    return parse_mesh_sizes(body), rules or "default"


def load_cfg(args: argparse.Namespace, sizes: dict[str, int], rules_name: str):
    from rynn_jax.sharding import MeshConfig
    from rynn_jax.training import config as config_lib

    path = CONFIGS.get(args.config, args.config)
    cfg = config_lib.apply_overrides(config_lib.load_config(os.path.join(ROOT, path)), args.set)
    if args.layers:
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, num_layers=args.layers))
    rules = rule_variants()[rules_name]
    return dataclasses.replace(cfg, mesh=MeshConfig(**sizes, rules=rules))


def latent_shape(args: argparse.Namespace, cfg) -> tuple[int, int, int]:
    """(T, H, W) of the latent clip: the synthetic shape for synthetic recipes, else 21 × 30 × 52
    (81 frames at 480×832 → 21·15·26 = 8190 tokens); --frames / --hw override."""
    t, h, w = cfg.data.synthetic_shape if cfg.data.kind == "synthetic" else (21, 30, 52)
    if args.hw:
        h, w = args.hw
    return (args.frames or t), h, w


def make_batch(cfg, batch: int, thw: tuple[int, int, int], seed: int) -> dict:
    """Host batch, float32; row i depends on (seed, i) only, so batches of any size share rows."""
    import numpy as np

    m = cfg.model
    rows = []
    for i in range(batch):
        rng = np.random.default_rng((seed, i))
        video = rng.standard_normal((*thw, m.in_channels), np.float32)
        row = {"video_latents": video, "img_latent": video[:1].copy(),
               "text_embedding": rng.standard_normal((m.text_len, m.text_dim), np.float32)}
        if cfg.loss.use_control:
            row["control_video_latents"] = rng.standard_normal((*thw, m.control_channels), np.float32)
        rows.append(row)
    return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


def work_per_step(cfg, batch: int, thw: tuple[int, int, int]) -> tuple[int, float]:
    """(video tokens, model FLOPs) of one step: 3 × forward (forward + backward), as train.py counts."""
    from rynn_jax.training import metrics

    pt, ph, pw = cfg.model.patch_size
    tokens = (thw[0] // pt) * (thw[1] // ph) * (thw[2] // pw)
    return batch * tokens, 3.0 * batch * tokens * metrics.model_flops_per_token(cfg.model, tokens)


def predict(cfg, tx, abstract, sizes: dict[str, int], batch: int, thw: tuple[int, int, int],
            peak_tflops: float, link_gbps: float) -> dict:
    """Computed, not measured: per-device bytes of the train state (exact, from the rules table) and
    of communication per step (ring collectives: all-gather / reduce-scatter move (g−1)/g of the
    full array per device, all-reduce twice that), a compute floor and a communication time.

    Traffic model (docs/SHARDING.md): parameters are gathered twice per step (forward, and the
    remat forward + backward) in their storage dtype and gradients reduce-scattered over the
    axes that shard them (FSDP); gradients are all-reduced over the axes that replicate them
    (data, and context under the default rules); tensor parallelism all-reduces 9 bf16 (B, L, D)
    activations per block (o-proj, cross o-proj, FFN down: forward, remat forward, backward);
    context parallelism all-gathers K and V in the forward and remat forward and reduce-scatters
    their gradients (3 × K,V per block). Not modelled: small replicated params, the per-frame
    reshapes when a context shard is not whole frames, overlap of communication with compute."""
    import jax
    import numpy as np
    from jax.sharding import AbstractMesh

    from rynn_jax import sharding
    from rynn_jax.training import state as state_lib

    specs = state_lib.logical_specs(abstract, tx)

    def per_device(tree_abstract, tree_specs, mesh_sizes) -> int:
        mesh = AbstractMesh(tuple(mesh_sizes[a] for a in AXES), AXES)
        sh = sharding.named_shardings(tree_specs, mesh, cfg.mesh.rules)
        return int(sum(math.prod(s.shard_shape(a.shape)) * np.dtype(a.dtype).itemsize
                       for a, s in zip(jax.tree.leaves(tree_abstract), jax.tree.leaves(sh), strict=True)))

    t, c = sizes["tensor"], sizes["context"]
    n = math.prod(sizes.values())
    params_mesh = per_device(abstract.params, specs.params, sizes)
    params_t = per_device(abstract.params, specs.params, {**dict.fromkeys(AXES, 1), "tensor": t})
    g = params_t / params_mesh  # ways the params are sharded besides tensor (FSDP group)
    r = n / (t * g)  # devices holding the same param shard besides tensor (gradient all-reduce group)
    m = cfg.model
    pt, ph, pw = m.patch_size
    tokens = (thw[0] // pt) * (thw[1] // ph) * (thw[2] // pw)
    b_local = batch / (sizes["data"] * sizes["fsdp"])
    act = b_local * tokens * m.dim * 2  # one bf16 (B, L, D) activation of a data-parallel rank
    comm = {
        "fsdp_gather": 2 * params_t * (g - 1) / g,
        "fsdp_reduce_scatter": params_t * (g - 1) / g,
        "grad_all_reduce": 2 * params_mesh * (r - 1) / r,
        "tensor_all_reduce": m.num_layers * 9 * 2 * act * (t - 1) / t,
        "context_kv": m.num_layers * 3 * 2 * act * (c - 1) / c,
    }
    _, flops = work_per_step(cfg, batch, thw)
    compute_s = flops * 4 / 3 / (n * peak_tflops * 1e12)  # remat: one more forward than the model FLOPs
    total = sum(comm.values())
    return {"state_bytes_per_device": per_device(abstract, specs, sizes), "param_shard_ways": g,
            "grad_replicas": r, "comm_bytes_per_device": {k: int(v) for k, v in comm.items()},
            "comm_bytes_total": int(total), "compute_floor_s": compute_s, "comm_s": total / (link_gbps * 1e9),
            "assumptions": f"peak {peak_tflops:g} TFLOP/s/device, {link_gbps:g} GB/s collective bandwidth/device, "
                           f"params gathered in {m.param_dtype}"}


def _classify(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    oom = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "OOM")
    return "oom" if any(s in text for s in oom) else "error"


def _short(exc: BaseException, n: int = 400) -> str:
    """Head and tail of the message: XLA wraps the real error (the last line) in a long traceback."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= 2 * n else f"{text[:n // 2]} … {text[-3 * n // 2:]}"


def plan_point(args: argparse.Namespace, spec: str, n_avail: int) -> tuple[dict, object | None]:
    """The row header of a mesh point and its recipe, or (row with status 'skipped', None)."""
    sizes, rules_name = parse_mesh(spec)
    row: dict = {"mesh": spec, "rules": rules_name, "status": "skipped"}
    known = math.prod(s for s in sizes.values() if s != -1)
    if -1 in sizes.values():
        sizes[next(a for a, s in sizes.items() if s == -1)] = max(n_avail // known, 1)
    n = math.prod(sizes.values())
    row.update(sizes=sizes, devices=n)
    if n > n_avail:
        row["reason"] = f"needs {n} devices, {n_avail} present"
        return row, None
    cfg = load_cfg(args, sizes, rules_name)
    thw = latent_shape(args, cfg)
    dp = sizes["data"] * sizes["fsdp"]
    batch_size = args.batch or dp
    row.update(batch=batch_size, latent_thw=list(thw), layers=cfg.model.num_layers,
               compute_dtype=cfg.model.dtype, param_dtype=cfg.model.param_dtype, remat=cfg.model.remat)
    if batch_size % dp:
        row["reason"] = f"batch {batch_size} does not split over data×fsdp = {dp}"
        return row, None
    tokens, flops = work_per_step(cfg, batch_size, thw)
    row.update(tokens_per_step=tokens, model_flops_per_step=flops)
    return row, cfg


def model_point(args: argparse.Namespace, spec: str) -> dict:
    """--model-only: the computed columns of a point for `--devices` devices, nothing compiled."""
    from jax.sharding import AbstractMesh

    from rynn_jax.training import optim
    from rynn_jax.training import state as state_lib

    row, cfg = plan_point(args, spec, args.devices)
    if cfg is None:
        return row
    sizes = row["sizes"]
    tx = optim.make_optimizer(cfg.optim, cfg.total_steps)
    abstract, _ = state_lib.state_shardings(cfg, tx, AbstractMesh(tuple(sizes[a] for a in AXES), AXES))
    row["predicted"] = predict(cfg, tx, abstract, sizes, row["batch"], tuple(row["latent_thw"]),
                               args.peak_tflops, args.link_gbps)
    row.update(status="model", state_bytes_per_device=row["predicted"]["state_bytes_per_device"])
    return row


def run_point(args: argparse.Namespace, spec: str) -> dict:
    """Compile, init and time the train step on one mesh; a row (status 'ok', 'skipped', 'oom',
    'error'). Never raises for a failed point."""
    import jax

    from rynn_jax import sharding
    from rynn_jax.training import optim
    from rynn_jax.training import state as state_lib
    from rynn_jax.training import step as step_lib

    row, cfg = plan_point(args, spec, jax.device_count())
    row.update(platform=jax.default_backend(), device_kind=jax.devices()[0].device_kind,
               device_count=jax.device_count())
    if cfg is None:
        return row
    sizes, n, batch_size, thw = row["sizes"], row["devices"], row["batch"], tuple(row["latent_thw"])
    tokens, flops = row["tokens_per_step"], row["model_flops_per_step"]

    phase = "setup"
    state = compiled = None
    try:
        mesh = sharding.make_mesh(cfg.mesh, jax.devices()[:n])
        tx = optim.make_optimizer(cfg.optim, cfg.total_steps)
        abstract, shardings = state_lib.state_shardings(cfg, tx, mesh)
        graphdef = state_lib.split_model(state_lib.abstract_model(cfg), cfg)[0]
        host_batch = make_batch(cfg, batch_size, thw, args.seed)
        batch_sh = step_lib.batch_shardings(mesh, host_batch)
        row["predicted"] = predict(cfg, tx, abstract, sizes, batch_size, thw, args.peak_tflops, args.link_gbps)
        row["state_bytes_per_device"] = row["predicted"]["state_bytes_per_device"]

        phase = "compile"
        abs_state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
        abs_batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sh[k]) for k, v in host_batch.items()}
        jitted = step_lib.jitted_step(cfg, graphdef, tx, mesh, shardings, host_batch)
        t0 = time.perf_counter()
        with sharding.axis_rules(mesh, cfg.mesh.rules):
            lowered = jitted.lower(abs_state, abs_batch)
        row["lower_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        compiled = lowered.compile()
        row["compile_s"] = time.perf_counter() - t0
        ma = compiled.memory_analysis()
        mem = {k: int(getattr(ma, f"{k}_size_in_bytes")) for k in ("argument", "output", "alias", "temp", "generated_code")}
        mem["total"] = mem["argument"] + mem["output"] - mem["alias"] + mem["temp"]
        row["memory_analysis"] = mem
        stats = mesh.devices.flat[0].memory_stats() or {}
        if stats.get("bytes_limit"):
            row["bytes_limit"] = int(stats["bytes_limit"])
            if mem["total"] > stats["bytes_limit"] and not args.no_predict_oom:
                row.update(status="oom", phase="compile",
                           reason=f"predicted {mem['total'] / 1e9:.1f} GB > limit {stats['bytes_limit'] / 1e9:.1f} GB")
                return row
        if args.compile_only:
            row["status"] = "compiled"
            return row

        phase = "init"
        t0 = time.perf_counter()
        _, state = state_lib.create_train_state(cfg, tx, mesh)
        batch = {k: jax.device_put(v, batch_sh[k]) for k, v in host_batch.items()}
        jax.block_until_ready((state, batch))
        row["init_s"] = time.perf_counter() - t0

        phase = "run"
        t0 = time.perf_counter()
        state, m = compiled(state, batch)
        row["loss"] = float(m["loss"])
        row["first_step_s"] = time.perf_counter() - t0
        if not int(m["finite"]):
            raise FloatingPointError(f"first step not finite: {jax.device_get(m)}")
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            state, m = compiled(state, batch)
            jax.block_until_ready((state, m))
            times.append(time.perf_counter() - t0)
        step_s = statistics.median(times) if times else row["first_step_s"]
        row.update(step_times_s=times, step_s=step_s, tokens_per_s=tokens / step_s,
                   mfu=flops / step_s / (n * args.peak_tflops * 1e12))
        peaks = [d.memory_stats().get("peak_bytes_in_use") for d in mesh.devices.flat if d.memory_stats()]
        if peaks and all(p is not None for p in peaks):
            row["peak_bytes_per_device"] = int(max(peaks))
        if args.profile:  # per-kernel breakdown of further steps (bench/profile_ops.py's parser)
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from profile_ops import kernel_breakdown

            holder = [state]

            def one_step(step=compiled):
                holder[0], metrics = step(holder[0], batch)
                return holder[0], metrics

            row["profile"] = kernel_breakdown(one_step, iters=args.profile, top=30)
            state = holder[0]
        row["status"] = "ok"
    except Exception as exc:  # noqa: BLE001 — a point's failure is a row, not a crash of the sweep
        row.update(status=_classify(exc), phase=phase, reason=_short(exc))
    finally:
        del state, compiled
        jax.clear_caches()
        gc.collect()
    return row


# --------------------------------------------------------------------------------------------------
# Driver: one process per point (default) or all in this one
# --------------------------------------------------------------------------------------------------


def _worker_argv(args: argparse.Namespace, spec: str) -> list[str]:
    argv = [sys.executable, os.path.abspath(__file__), "--worker", spec, "--config", args.config,
            "--steps", str(args.steps), "--seed", str(args.seed), "--peak-tflops", str(args.peak_tflops)]
    for flag, value in (("--batch", args.batch), ("--frames", args.frames), ("--layers", args.layers),
                        ("--profile", args.profile)):
        if value:
            argv += [flag, str(value)]
    if args.hw:
        argv += ["--hw", *map(str, args.hw)]
    for item in args.set:
        argv += ["--set", item]
    argv += ["--link-gbps", str(args.link_gbps)]
    argv += ["--compile-only"] * args.compile_only + ["--no-predict-oom"] * args.no_predict_oom
    return argv


def run_in_subprocess(args: argparse.Namespace, spec: str, timeout: float) -> dict:
    """The point in a fresh process: its own allocator peak, and a hard crash or hang costs one row."""
    proc = subprocess.Popen(_worker_argv(args, spec), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=ROOT)
    killed = threading.Event()

    def kill() -> None:
        killed.set()
        proc.kill()

    timer = threading.Timer(timeout, kill)
    timer.start()
    tail: list[str] = []
    result = None
    for line in proc.stdout:
        if line.startswith("RESULT "):
            result = json.loads(line[7:])
        else:
            tail = (tail + [line.rstrip()])[-20:]
    proc.wait()
    timer.cancel()
    if result is not None:
        return result
    sizes, rules = parse_mesh(spec)
    status = "timeout" if killed.is_set() else ("oom" if any("RESOURCE_EXHAUSTED" in t or "out of memory" in t.lower()
                                                            for t in tail) else "error")
    reason = f"worker killed after {timeout:.0f} s" if killed.is_set() else f"worker exit {proc.returncode}"
    return {"mesh": spec, "rules": rules, "sizes": sizes, "devices": math.prod(sizes.values()), "status": status,
            "reason": reason + ": " + " | ".join(t for t in tail[-4:] if t)[-600:]}


def check_losses(rows: list[dict]) -> None:
    """Δloss of each run point against the first run point with the same batch and clip."""
    refs: dict[tuple, dict] = {}
    for r in rows:
        if "loss" not in r:
            continue
        key = (r["batch"], tuple(r["latent_thw"]), r["layers"])
        ref = refs.setdefault(key, r)
        r["loss_ref_mesh"] = ref["mesh"]
        r["loss_rel_diff"] = abs(r["loss"] - ref["loss"]) / max(abs(ref["loss"]), 1e-12)
        r["loss_ok"] = r["loss_rel_diff"] <= LOSS_RTOL.get(r["compute_dtype"], 1e-4)


def _gb(x) -> str:
    if not isinstance(x, int | float):
        return "–"
    return f"{x / 1e9:.2f}" if x >= 1e7 or x == 0 else f"{x / 1e9:.1e}"


def format_row(r: dict) -> str:
    ma = r.get("memory_analysis", {})
    num = lambda k, f: f.format(r[k]) if k in r else "–"
    dloss = "ref" if r.get("loss_ref_mesh") == r["mesh"] else num("loss_rel_diff", "{:.1e}")
    ok = {True: "ok", False: "FAIL"}.get(r.get("loss_ok"), "–")
    step_ms = "{:.1f}".format(r["step_s"] * 1e3) if "step_s" in r else "–"
    mfu = "{:.1f}%".format(r["mfu"] * 100) if "mfu" in r else "–"
    cells = [f"{r['mesh']:30s}", f"{r.get('devices', '–'):>3}", f"{r.get('batch', '–'):>5}", f"{r['status']:>8s}",
             f"{num('compile_s', '{:.1f}'):>8s}", f"{step_ms:>9s}", f"{num('tokens_per_s', '{:.0f}'):>8s}", f"{mfu:>6s}",
             f"{_gb(ma.get('argument')):>7s}", f"{_gb(ma.get('temp')):>7s}", f"{_gb(ma.get('total')):>7s}",
             f"{_gb(r.get('peak_bytes_per_device')):>7s}", f"{num('loss', '{:.5f}'):>9s}", f"{dloss:>8s}", f"{ok:>4s}"]
    return " ".join(cells)


HEADER = (f"{'mesh':30s} {'dev':>3s} {'batch':>5s} {'status':>8s} {'compile':>8s} {'step ms':>9s} {'tok/s':>8s} "
          f"{'MFU':>6s} {'arg GB':>7s} {'tmp GB':>7s} {'tot GB':>7s} {'peak GB':>7s} {'loss':>9s} {'Δloss':>8s} {'ok':>4s}")


PREDICTED_HEADER = (f"{'mesh':30s} {'dev':>3s} {'batch':>5s} {'state GB':>8s} {'p-shard':>7s} {'g-repl':>6s} "
                    f"{'gather':>7s} {'red-sc':>7s} {'all-red':>7s} {'tensor':>7s} {'ctx kv':>7s} {'comm GB':>7s} "
                    f"{'compute s':>9s} {'comm s':>7s}")


def format_predicted(r: dict) -> str:
    p = r.get("predicted")
    if p is None:
        return f"{r['mesh']:30s} {r.get('devices', '–'):>3} {r.get('batch', '–'):>5}  {r['status']}: {r.get('reason', '')}"
    c = p["comm_bytes_per_device"]
    cells = [f"{r['mesh']:30s}", f"{r['devices']:>3}", f"{r['batch']:>5}", f"{_gb(p['state_bytes_per_device']):>8s}",
             f"{p['param_shard_ways']:7.0f}", f"{p['grad_replicas']:6.0f}"]
    cells += [f"{_gb(c[k]):>7s}" for k in ("fsdp_gather", "fsdp_reduce_scatter", "grad_all_reduce",
                                             "tensor_all_reduce", "context_kv")]
    cells += [f"{_gb(p['comm_bytes_total']):>7s}", f"{p['compute_floor_s']:9.3f}", f"{p['comm_s']:7.3f}"]
    return " ".join(cells)


def environment() -> dict:
    import flax
    import jax
    import optax

    env = {"jax": jax.__version__, "flax": flax.__version__, "optax": optax.__version__, "python": sys.version.split()[0]}
    env.update({k: os.environ[k] for k in ("XLA_FLAGS", "XLA_PYTHON_CLIENT_MEM_FRACTION", "NCCL_NVLS_ENABLE",
                                           "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS") if k in os.environ})
    return env


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--meshes", nargs="+", default=["fsdp=-1"], help="mesh points, e.g. fsdp=8 fsdp=4,tensor=2 "
                   "data=2,fsdp=4 fsdp=2,context=4 context=2@zero_context")
    p.add_argument("--config", default="5b", help=f"{sorted(CONFIGS)} or a recipe file (default 5b = {CONFIGS['5b']})")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="recipe override (repeatable)")
    p.add_argument("--batch", type=int, default=0, help="global batch; 0 = one clip per data×fsdp rank")
    p.add_argument("--frames", type=int, default=0, help="latent frames (default 21, or the synthetic shape)")
    p.add_argument("--hw", type=int, nargs=2, default=None, help="latent H W (default 30 52 = 480×832 video)")
    p.add_argument("--layers", type=int, default=0, help="cut the DiT to this many blocks (quick points)")
    p.add_argument("--steps", type=int, default=5, help="timed steps after one untimed step")
    p.add_argument("--seed", type=int, default=0, help="host batch seed")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="after timing, profile N more steps: kernel time per step by category and op")
    p.add_argument("--peak-tflops", type=float, default=0.0, help="per device, for MFU (0 = recipe's log value)")
    p.add_argument("--compile-only", action="store_true", help="compile + memory analysis, no init or run")
    p.add_argument("--model-only", action="store_true", help="computed columns only (state bytes, traffic "
                   "model), for --devices devices; no compile, no accelerator")
    p.add_argument("--devices", type=int, default=8, help="device count for --model-only")
    p.add_argument("--link-gbps", type=float, default=370.0, help="collective bandwidth per device for the traffic "
                   "model, GB/s (default: a typical NCCL bus bandwidth on NVLink 4; an assumption)")
    p.add_argument("--no-predict-oom", action="store_true", help="run even if the memory analysis exceeds the limit")
    p.add_argument("--in-process", action="store_true", help="all points in this process (CPU tests; the "
                   "allocator peak is then the maximum so far)")
    p.add_argument("--point-timeout", type=float, default=900.0, help="seconds per point (subprocess mode)")
    p.add_argument("--time-budget", type=float, default=0.0, help="stop starting points after this many seconds")
    p.add_argument("--out", default="", help="JSON path (default bench/results/sharding_<config>.json)")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.peak_tflops:
        from rynn_jax.training import config as config_lib
        args.peak_tflops = config_lib.load_config(os.path.join(ROOT, CONFIGS.get(args.config, args.config))
                                                  ).log.peak_tflops_per_device
    return args


def main(argv: list[str] | None = None) -> dict:
    warnings.filterwarnings("ignore", message=".*[Dd]onat.*")
    args = parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(run_point(args, args.worker)), flush=True)
        return {}
    for spec in args.meshes:
        parse_mesh(spec)  # fail on a typo before any work
        if parse_mesh(spec)[1] not in rule_variants():
            raise SystemExit(f"mesh {spec!r}: unknown rules {parse_mesh(spec)[1]!r} (have {sorted(rule_variants())})")
    out = args.out or os.path.join(ROOT, "bench", "results", f"sharding_{os.path.basename(args.config).removesuffix('.py')}.json")
    report = {"argv": sys.argv[1:] if argv is None else argv, "environment": environment(), "rows": []}
    start = time.perf_counter()
    print(HEADER, flush=True)
    for i, spec in enumerate(args.meshes):
        left = args.time_budget - (time.perf_counter() - start) if args.time_budget else args.point_timeout
        if left < 30:
            sizes, rules = parse_mesh(spec)
            row = {"mesh": spec, "rules": rules, "sizes": sizes, "status": "not run", "reason": "time budget spent"}
        elif args.model_only:
            row = model_point(args, spec)
        elif args.in_process:
            row = run_point(args, spec)
        else:
            row = run_in_subprocess(args, spec, min(left, args.point_timeout))
        report["rows"].append(row)
        check_losses(report["rows"])
        print(f"[{i + 1}/{len(args.meshes)}] " + (format_predicted(row) if args.model_only else format_row(row)) + (f"  ({row['reason']})" if "reason" in row else ""),
              flush=True)
        if "profile" in row:
            prof = row["profile"]
            print(f"    kernels per step: busy {prof['busy_ms']:.1f} ms of {prof['wall_ms']:.1f} ms wall; "
                  + ", ".join(f"{k} {v:.1f}" for k, v in prof["by_category"].items()), flush=True)
            for op in prof["top_ops"][:12]:
                print(f"    {op['ms']:9.2f} ms x{op['calls']:<5d} {op['op'][:100]}", flush=True)
        if "device_kind" not in report:
            report.update({k: row[k] for k in ("device_kind", "platform", "device_count") if k in row})
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        with open(out, "w") as f:  # after every point: a killed sweep keeps what it measured
            json.dump(report, f, indent=1)
    if not args.model_only:
        print("\n" + HEADER)
        for r in report["rows"]:
            print(format_row(r) + (f"  ({r['reason'][:70]})" if "reason" in r else ""))
        print(f"(GB = 1e9 bytes per device; arg/tmp/tot from compiled.memory_analysis(); peak from the allocator; "
              f"MFU at {args.peak_tflops:g} TFLOP/s per device)")
    print("\nComputed, not measured (per device, per step; traffic model in predict()):\n" + PREDICTED_HEADER)
    for r in report["rows"]:
        print(format_predicted(r))
    print(f"(compute s = model FLOPs × 4/3 (remat) at {args.peak_tflops:g} TFLOP/s; comm s = comm GB at "
          f"{args.link_gbps:g} GB/s, no overlap) → {out}")
    return report


if __name__ == "__main__":
    main()
