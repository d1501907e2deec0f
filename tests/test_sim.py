"""Synthetic MuJoCo world: scripted success rates, sanity checks, determinism, depth/flow ground
truth against the rendered RGB, shard export read back through the robot pipeline, CLI resume.

Tiny resolution (64×112) and few episodes: the whole file runs in ~2 minutes on 2 cores, most of
it the one-off compile of the retargeting.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rynn_jax.data import clips
from rynn_jax.data.robot import RobotSource, read_ground_truth
from rynn_jax.sim import episode, robot_shards, scenes
from rynn_jax.sim.resolutions import RESOLUTIONS

N_PER_TASK = 5


@pytest.fixture(scope="module")
def rendered():
    return episode.generate("push_block", 1, resolution="tiny")


@pytest.mark.parametrize("task", scenes.TASKS)
def test_scripted_operator_success_rate(task):
    eps = [episode.generate(task, seed, render=False) for seed in range(N_PER_TASK)]
    rate = np.mean([e.success for e in eps])
    assert rate >= 0.8, [(e.seed, e.failures) for e in eps]
    for e in eps:
        if not e.success:
            continue
        lo, hi = scenes.build(task, e.seed).model.jnt_range[:54].T
        assert np.all(e.actions >= lo - 1e-6) and np.all(e.actions <= hi + 1e-6)
        assert np.all(e.states >= lo - 1e-6) and np.all(e.states <= hi + 1e-6)
        assert e.info["max_penetration_m"]["rigid"] <= episode.PENETRATION_TOL
        assert e.info["ik_pos_err_mm_max"] < 10.0
        gap = np.abs(e.states - e.actions)                 # the servo follows the commands (≈25 ms lag)
        assert np.median(gap) < 0.02 and gap.max() < 1.0


def test_failed_episode_is_detected(monkeypatch):
    """A grasp that never closes (the operator forgets to squeeze) must be reported, not kept."""
    assert episode.generate("dual_pick", 0, render=False).success
    monkeypatch.setattr(episode, "ATTACH_CLOSURE", 2.0)     # hands can never close enough to attach
    bad = episode.generate("dual_pick", 0, render=False)
    assert not bad.success
    assert "goal not reached" in bad.failures and any("never grasped" in f for f in bad.failures)


def test_deterministic_per_seed(rendered):
    again = episode.generate("push_block", 1, resolution="tiny")
    for name in ("actions", "states", "rgb", "depth", "segmentation", "flow", "skeleton_rgb", "joints_cam"):
        np.testing.assert_array_equal(getattr(rendered, name), getattr(again, name), err_msg=name)
    other = episode.generate("push_block", 2, render=False)
    assert np.abs(other.actions - rendered.actions).max() > 1e-3


def test_episode_shapes_and_skeleton(rendered):
    T, (H, W) = episode.DEFAULT_FRAMES, RESOLUTIONS["tiny"]
    ep = rendered
    assert ep.success, ep.failures
    assert ep.rgb.shape == (T, H, W, 3) and ep.depth.shape == (T, H, W) and ep.flow.shape == (T - 1, H, W, 2)
    assert ep.actions.shape == (T, 54) and ep.states.shape == (T, 54) and ep.skeleton_rgb.shape == (T, H, W, 3)
    # The skeleton (operator hands retargeted into the head camera) sits in front of the camera,
    # and its wrists project near where the robot's palms are seen (segmentation robot labels).
    assert (ep.joints_cam[..., 2] > 0.2).all()
    k = T // 2
    uv = ep.joints_cam[k, :, 0] @ ep.intrinsics.T
    uv = uv[:, :2] / uv[:, 2:]
    for h, label in ((0, 1), (1, 2)):
        if 0 <= uv[h, 0] < W and 0 <= uv[h, 1] < H:
            v, u = np.nonzero(ep.segmentation[k] == label)
            assert np.min(np.hypot(u - uv[h, 0], v - uv[h, 1])) < 6.0


def test_depth_matches_scene_geometry(rendered):
    ep = rendered
    k = 0
    pts = episode.backproject(ep.depth[k], ep.intrinsics)
    world = pts @ ep.camera_pose[:3, :3].T + ep.camera_pose[:3, 3]
    seg = ep.segmentation[k]
    m = scenes.build("push_block", 1).model
    table_geom = m.geom("table_top").id
    # background pixels whose 3-D point is on the table's top face lie on the plane z = TABLE_Z
    on_table = (seg == 0) & (np.abs(world[..., 0] - scenes.TABLE_CENTER[0]) < 0.3) & \
               (np.abs(world[..., 2] - scenes.TABLE_Z) < 0.05)
    assert on_table.sum() > 100 and table_geom >= 0
    assert np.abs(world[on_table, 2] - scenes.TABLE_Z).max() < 3e-3
    # the block's pixels back-project onto the block: within its half-diagonal of its centre
    block = seg == ep.labels.index("block")
    assert block.sum() > 5
    centre = ep.object_poses[k, 0, :3]
    half = scenes.build("push_block", 1).object("block").half_height
    assert np.linalg.norm(world[block] - centre, axis=-1).max() < np.sqrt(3) * half + 3e-3


def _bilinear(img, u, v):
    h, w = img.shape[:2]
    u0, v0 = np.clip(np.floor(u).astype(int), 0, w - 2), np.clip(np.floor(v).astype(int), 0, h - 2)
    a, b = (u - u0)[..., None], (v - v0)[..., None]
    return ((1 - a) * (1 - b) * img[v0, u0] + a * (1 - b) * img[v0, u0 + 1]
            + (1 - a) * b * img[v0 + 1, u0] + a * b * img[v0 + 1, u0 + 1])


def _interior(seg):
    """Pixels whose 3×3 neighbourhood has one label (no edge blending in the comparison)."""
    h, w = seg.shape
    p = np.pad(seg, 1, mode="edge")
    ok = np.ones_like(seg, bool)
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            ok &= p[1 + dy:1 + dy + h, 1 + dx:1 + dx + w] == seg
    return ok


def test_flow_warps_rgb_onto_next_frame(rendered):
    """Frame t's pixels moved by the ground-truth flow land on the same body in frame t+1 with
    the same color: tightly on the rigid textured object, clearly better than no motion on the
    robot (whose shading changes as links rotate); static background: zero flow, same color."""
    ep = rendered
    H, W = ep.depth.shape[1:]
    v, u = np.mgrid[0:H, 0:W].astype(np.float64)
    err = {"object": ([], []), "robot": ([], [])}
    same_label, static_diff = [], []
    for k in range(len(ep.flow)):
        f = ep.flow[k].astype(np.float64)
        u1, v1 = u + f[..., 0], v + f[..., 1]
        inside = (u1 >= 0) & (u1 <= W - 1) & (v1 >= 0) & (v1 <= H - 1)
        seg0, seg1 = ep.segmentation[k], ep.segmentation[k + 1]
        ri, ci = np.clip(np.round(v1).astype(int), 0, H - 1), np.clip(np.round(u1).astype(int), 0, W - 1)
        moving = (np.hypot(f[..., 0], f[..., 1]) > 0.5) & inside & (seg0 > 0)
        if moving.sum():
            same_label.append(np.mean(seg1[ri, ci][moving] == seg0[moving]))
        rgb0, rgb1 = ep.rgb[k].astype(np.float64), ep.rgb[k + 1].astype(np.float64)
        clean = moving & _interior(seg0) & _interior(seg1)[ri, ci] & (seg1[ri, ci] == seg0)
        for name, mask in (("object", clean & (seg0 >= 3)), ("robot", clean & (seg0 < 3))):
            if mask.sum() >= 5:
                err[name][0].append(np.abs(_bilinear(rgb1, u1, v1) - rgb0)[mask].mean())
                err[name][1].append(np.abs(rgb1 - rgb0)[mask].mean())
        static = (seg0 == 0) & (seg1 == 0)
        assert np.abs(f[static]).max() < 1e-6
        static_diff.append(np.abs(rgb1 - rgb0)[static].mean())
    assert np.mean(same_label) > 0.85
    gt, zero = (np.mean(x) for x in err["object"])
    assert len(err["object"][0]) >= 10 and gt < 4.0 and gt < 0.2 * zero, (gt, zero)
    gt, zero = (np.mean(x) for x in err["robot"])
    assert gt < 0.4 * zero, (gt, zero)
    assert np.mean(static_diff) < 0.5          # no shadows at tiny resolution: static = identical


def test_shard_reads_back_through_robot_pipeline(rendered, tmp_path):
    import grain  # noqa: F401  (the pipeline's dependency)
    from rynn_jax.data.pipeline import LoaderConfig, pixel_dataset

    ep = rendered
    d = robot_shards.write_episode(ep, robot_shards.episode_dir(tmp_path, ep.task, 7))
    robot_shards.write_action_stats(tmp_path)
    H, W = ep.rgb.shape[1:3]
    cfg = clips.ClipConfig(num_frames=33, height=H, width=W)
    src = RobotSource(tmp_path, cfg, strict=True, action_norm="meanstd")
    raw = RobotSource(tmp_path, cfg, strict=True)
    refs = raw.index()
    assert [r.start for r in refs] == [0, 33, 66] and refs[0].episode == "push_block/episode_000007"
    for ref in refs:
        s = raw.load_or_none(ref)
        idx = np.arange(ref.start, ref.start + 33)
        np.testing.assert_array_equal(s["actions"], ep.actions[idx])
        assert np.abs(s["video"].astype(int) - ep.rgb[idx].astype(int)).mean() < 8.0   # H.264
        assert str(s["text"]) == scenes.DESCRIPTIONS["push_block"]
    stats = json.loads((tmp_path / "action_stats.json").read_text())
    s = src.load_or_none(refs[0])
    np.testing.assert_allclose(s["actions"], (ep.actions[:33] - np.asarray(stats["mean"]))
                               / np.maximum(np.asarray(stats["std"]), 1e-6), rtol=1e-4, atol=1e-4)
    batch = next(iter(pixel_dataset(raw, LoaderConfig(batch_size=1, num_epochs=1, read_threads=1, read_buffer=1))))
    assert batch["actions"].shape == (1, 33, 54) and batch["video"].shape == (1, 33, H, W, 3)
    assert any(np.array_equal(batch["actions"][0], ep.actions[r.start:r.start + 33]) for r in refs)
    gt = read_ground_truth(d)
    np.testing.assert_allclose(gt["depth"], ep.depth, atol=6e-4)
    np.testing.assert_allclose(gt["flow"], ep.flow, atol=0.02, rtol=2e-3)
    np.testing.assert_array_equal(gt["labels"], ep.segmentation)
    meta = json.loads((d / "metadata.json").read_text())
    assert meta["total_frames"] == len(ep.t) and meta["fps"] == 16.0 and meta["success"]


def test_cli_generate_interleaves_tasks(tmp_path, monkeypatch):
    """Attempts go to the task furthest behind, so a generation stopped early is balanced."""
    from rynn_jax.sim import cli, robot_shards

    order = []

    def fake_attempt(task, attempt, seed, out, *rest):
        order.append((task, attempt))
        (Path(out) / task).mkdir(parents=True, exist_ok=True)
        return {"task": task, "attempt": attempt, "seed": seed, "success": task != "b" or attempt % 2 == 1,
                "failures": [], "seconds": 0.0, "timings_s": {}}

    monkeypatch.setattr(cli, "run_attempt", fake_attempt)
    monkeypatch.setattr(robot_shards, "write_action_stats", lambda root: {"episodes": 0})
    s = cli.generate(["a", "b", "c"], 2, str(tmp_path / "sim"), workers=0, progress=False)
    # b fails its even attempts: it gets the next turn until it catches up, never a whole task at once.
    assert order == [("a", 0), ("b", 0), ("c", 0), ("b", 1), ("a", 1), ("c", 1), ("b", 2), ("b", 3)]
    assert {t: v["successes"] for t, v in s["tasks"].items()} == {"a": 2, "b": 2, "c": 2}


def test_cli_generate_is_resumable(tmp_path):
    from rynn_jax.sim import cli

    out = str(tmp_path / "sim")
    s1 = cli.generate(["lid_placement"], 1, out, workers=0, progress=False)
    assert s1["tasks"]["lid_placement"]["successes"] == 1 and s1["new_attempts"] >= 1
    s2 = cli.generate(["lid_placement"], 1, out, workers=0, progress=False)
    assert s2["new_attempts"] == 0 and s2["tasks"]["lid_placement"]["successes"] == 1
    assert (tmp_path / "sim" / "action_stats.json").exists()
    assert len(RobotSource(out, clips.ClipConfig(num_frames=81, height=64, width=112)).episodes()) == 1


def _children(pid: int) -> set[int]:
    """Live child processes of `pid` (from /proc; zombies excluded)."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.add(int(stat.parent.name))
    return out


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc")
def test_cli_generate_workers_exit_when_the_parent_is_killed(tmp_path):
    """SIGTERM to `generate` (a job killed by its scheduler) must not leave its workers simulating."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out, workers = tmp_path / "sim", set()
    proc = subprocess.Popen([sys.executable, "-m", "rynn_jax.sim.cli", "generate", "--task", "dual_pick",
                             "--n", "20", "--workers", "2", "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while not list(out.glob("dual_pick/.attempts/*.json")):  # workers are past their start-up
            assert proc.poll() is None and time.time() < deadline, "no attempt finished"
            time.sleep(0.5)
        workers = _children(proc.pid)
        assert len(workers) >= 2
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        deadline = time.time() + 30
        while (alive := {p for p in workers if Path(f"/proc/{p}").exists() and _is_live(p)}) and time.time() < deadline:
            time.sleep(0.5)
        assert not alive, f"workers still running after their parent was killed: {sorted(alive)}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in workers | _children(proc.pid):  # orphans belong to init by now: kill what was seen
            if _is_live(p):
                os.kill(p, signal.SIGKILL)


def _is_live(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
