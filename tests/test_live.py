"""serve.py live: the WebSocket server, its protocol and limits, the batched world model behind it.

Oracles: a live session's joint commands are `retarget_stream` of the same frames recorded as a
file (the offline path), its skeleton frames `render_video` of `hands_in_camera` (what `serve.py
generate` renders), its generated frames the offline `serving.clip.rollout` of those skeleton frames
through the same session with the same keys; a recording reads back through `RobotSource`. A sim
session's reference view, skeleton and MuJoCo replay frames are a sim episode's own (`render_frames`
of the settled scene, the skeleton video of `generate`'s hand skeleton, `render_frames` of `simulate`
through the same commands). One server (tiny random model, 2 slots) is compiled for the whole
module; loopback only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import time

import aiohttp
import jax
import numpy as np
import pyarrow.parquet as pq
import pytest

from rynn_jax.data import robot as robot_data
from rynn_jax.data.clips import ClipConfig, ClipRef
from rynn_jax.errors import UsageError
from rynn_jax.kinematics import retarget, streams
from rynn_jax.kinematics.retarget import retarget_stream
from rynn_jax.live import protocol, sim_start
from rynn_jax.live.client import LiveClient
from rynn_jax.live.operator import Kinematics, stream_of
from rynn_jax.live.server import LiveConfig, LiveServer, ServerThread, serve
from rynn_jax.live.world import LiveWorld, slot_keys
from rynn_jax.render import RenderConfig, default_intrinsics, render_video
from rynn_jax.serving.assemble import streaming_session
from rynn_jax.serving.clip import fit_image, rollout
from rynn_jax.serving.prompts import text_contexts
from rynn_jax.sim import episode, scenes
from rynn_jax.teleop.camera_hands import hands_in_camera, synthetic_stream
from tests._browser import needs_chromium, page_shots

H, W = 64, 96
SLOTS = 2
FIRST, LATER = 5, 8  # the tiny student's blocks: 1 + 4(F−1) frames, then 4F (F = 2)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)  # compile time dominates at this size
    try:
        session = streaming_session(None, None, 0)
        world = LiveWorld(session, SLOTS, H, W, seed=7, max_wait_s=5.0, admit_wait_s=2.0)
        world.compile()
        kin = Kinematics.build()
        kin.warm_up()
        contexts = text_contexts(None, None, session.dit_cfg.text_len, session.dit_cfg.text_dim)
        cfg = LiveConfig(port=0, max_fps=100.0, idle_timeout_s=20.0, record_dir=tmp_path_factory.mktemp("record"),
                         seed=7)
        server = LiveServer(world, kin, contexts, cfg)
        runner = ServerThread(server)
        url = runner.__enter__()
    finally:
        jax.config.update("jax_disable_most_optimizations", before)
    yield runner, url
    runner.stop()


@pytest.fixture
def config(live):
    """Swap the server's limits for one test (connections read them when they open)."""
    runner, _ = live
    original = runner.server.cfg

    def swap(**changes):
        runner.server.cfg = dataclasses.replace(original, **changes)

    yield swap
    runner.server.cfg = original


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def test_frame_messages_parse_and_bad_ones_name_the_problem():
    f = protocol.frames_at(synthetic_stream(9, seed=3), 30.0)[4]
    for back in (protocol.parse_text(json.dumps(protocol.frame_json(f))), protocol.parse_binary(protocol.pack_frame(f))):
        assert back.t == f.t
        np.testing.assert_allclose(back.tracker_pose, f.tracker_pose, rtol=1e-6)  # binary: float32
        np.testing.assert_allclose(back.hand_keypoints, f.hand_keypoints, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(back.tracker_valid, f.tracker_valid)
    lost = dataclasses.replace(f, tracker_valid=np.array([1, 0, 1, 1, 0], bool), hand_valid=np.array([0, 1], bool))
    np.testing.assert_array_equal(protocol.parse_binary(protocol.pack_frame(lost)).tracker_valid, lost.tracker_valid)
    good = protocol.frame_json(f)
    bad = {
        "bad_json": "{not json",
        "bad_message": json.dumps({"type": "dance"}),
        "non_finite": json.dumps(good).replace(str(good["tracker_pose"][0][0]), "NaN", 1),
        "bad_frame": json.dumps({**good, "tracker_pose": good["tracker_pose"][:4]}),
        "bad_schema": json.dumps({"type": "start", "schema": "rynn-teleop-stream/0"}),
        "bad_start": json.dumps({"type": "start", "schema": protocol.SCHEMA, "frames": "gif"}),
        "bad_image": json.dumps({"type": "start", "schema": protocol.SCHEMA, "image": "bm90IGFuIGltYWdl"}),
    }
    for code, text in bad.items():
        with pytest.raises(protocol.ProtocolError) as e:
            protocol.parse_text(text)
        assert e.value.code == code, (code, str(e.value))
    inf = json.dumps(good).replace(str(good["hand_keypoints"][1][2][0]), "1e999", 1)
    with pytest.raises(protocol.ProtocolError, match="hand_keypoints has NaN or infinite"):
        protocol.parse_text(inf)
    nan_binary = bytearray(protocol.pack_frame(f))
    nan_binary[12:16] = np.float32(np.nan).tobytes()  # tracker_pose[0, 0]
    with pytest.raises(protocol.ProtocolError, match="tracker_pose has NaN"):
        protocol.parse_binary(bytes(nan_binary))


def test_frames_go_out_raw_jpeg_or_webp_with_their_stamps():
    y, x = np.mgrid[0:H, 0:W]
    rgb = np.stack([4 * x % 256, 3 * y % 256, (x + y) % 256], -1).astype(np.uint8)  # smooth enough for JPEG
    for fmt, tol in (("raw", 0), ("jpeg", 12), ("webp", 12)):
        kind, index, t, back = protocol.decode_frame(protocol.encode_frame("G", rgb, fmt, 41, 2.5625))
        assert (kind, index, t, back.shape) == ("G", 41, 2.5625, rgb.shape)
        assert np.abs(back.astype(int) - rgb).mean() <= tol, fmt


def test_a_public_bind_needs_a_token(live):
    runner, _ = live
    s = runner.server
    with pytest.raises(UsageError, match="--host 0.0.0.0: binding beyond localhost needs a token"):
        LiveServer(s.world, s.kin, s.contexts, LiveConfig(host="0.0.0.0"))


def test_bad_messages_get_an_error_and_the_session_goes_on(live):
    _, url = live
    f = protocol.frames_at(synthetic_stream(9, seed=3), 16.0)

    async def go():
        async with LiveClient(url) as c:
            await c.frame(f[0])  # before start
            await c.start(frames="none")
            await c.until(lambda c: c.count("ready") == 1)
            await c.frame(f[0])
            await c.ws.send_str("{oops")
            await c.ws.send_str(json.dumps(protocol.frame_json(f[1])).replace("[[", "[[NaN, ", 1))
            await c.ws.send_str(json.dumps(protocol.frame_json(f[1])) + " " * 20000)  # > 16 KB
            await c.ws.send_bytes(b"F\x01 too short")
            await c.frame(f[0])  # t does not increase
            await c.start()  # twice
            await c.frame(f[1], binary=True)  # still served
            await c.until(lambda c: c.count("joints") == 2 and c.count("error") == 7)
            return [e["code"] for e in c.of("error")], c.of("joints")

    codes, joints = run(go())
    assert codes == ["not_started", "bad_json", "non_finite", "oversize", "bad_frame", "bad_time", "already_started"]
    assert [j["t"] for j in joints] == [f[0].t, f[1].t]


def test_a_message_over_the_size_limit_closes_with_1009(live, config):
    _, url = live
    config(max_message_bytes=64 << 10)

    async def go():
        async with LiveClient(url) as c:
            await c.ws.send_str(json.dumps({"type": "start", "schema": protocol.SCHEMA, "image": "A" * (100 << 10)}))
            await c.until(lambda c: c.closed)
            return c.close_code

    assert run(go()) == 1009


def test_frames_faster_than_the_limit_are_refused(live, config):
    _, url = live
    config(max_fps=5.0)
    frames = protocol.frames_at(synthetic_stream(17, seed=4), 30.0)[:30]

    async def go():
        async with LiveClient(url) as c:
            await c.start(frames="none")
            await c.until(lambda c: c.count("ready"))
            t0 = time.monotonic()
            for f in frames:  # 30 at once: one second's burst (5) passes, then 5 per second
                await c.frame(f, binary=True)
            await c.until(lambda c: c.count("joints") + c.count("error") >= 30)
            return c.count("joints"), [e["code"] for e in c.of("error")], time.monotonic() - t0

    joints, codes, seconds = run(go())
    assert 5 <= joints <= 5 + 5 * seconds + 1, (joints, seconds)
    assert set(codes) == {"too_fast"} and joints + len(codes) == 30


def test_a_token_is_checked_on_connect(live, config):
    _, url = live
    config(token="s3cret")

    async def go(query):
        try:
            async with LiveClient(url + query) as c:
                await c.start(frames="none")
                await c.until(lambda c: c.count("ready"))
                return "ready"
        except Exception as e:  # aiohttp's handshake error carries the HTTP status
            return getattr(e, "status", repr(e))

    assert run(go("")) == 401
    assert run(go("?token=wrong")) == 401
    assert run(go("?token=s3cret")) == "ready"


def test_more_sessions_than_slots_are_turned_away(live):
    _, url = live

    async def go():
        async with LiveClient(url) as a, LiveClient(url) as b:
            await asyncio.sleep(0.2)  # both registered
            async with LiveClient(url) as c:
                await c.until(lambda c: c.closed)
                return c.close_code, c.of("error"), a.closed or b.closed

    code, errors, others_closed = run(go())
    assert code == 1013 and errors[0]["code"] == "full" and not others_closed


def test_a_silent_session_is_closed(live, config):
    _, url = live
    config(idle_timeout_s=0.3)

    async def go():
        async with LiveClient(url) as c:
            await c.until(lambda c: c.closed, timeout=10)
            return c.close_code, c.close_reason, c.of("error")

    code, reason, errors = run(go())
    assert (code, reason, errors[0]["code"]) == (1000, "idle timeout", "idle")


# --------------------------------------------------------------------------------------------------
# Two concurrent sessions against the offline path
# --------------------------------------------------------------------------------------------------


def _stream_16hz(seed: int) -> streams.Stream:
    """A synthetic operator with both clocks on the video clock: each frame is one 16 fps tick."""
    s = synthetic_stream(17, seed=seed)
    return stream_of(protocol.frames_at(s, streams.VIDEO_FPS)[:FIRST + LATER], np.asarray(s.meta["T_world_camera"]))


@pytest.fixture(scope="module")
def two_sessions(live):
    _, url = live
    ops = [_stream_16hz(1), _stream_16hz(2)]
    frames = [protocol.frames_at(s, streams.VIDEO_FPS) for s in ops]

    async def session(c: LiveClient, k: int, barrier: asyncio.Barrier):
        await c.start(frames="raw", skeleton=True, record=k == 0, name="op-a" if k == 0 else None)
        await c.until(lambda c: c.count("ready"))
        for lo, hi, blocks in ((0, FIRST, 1), (FIRST, FIRST + LATER, 2)):  # lock step: a block, then its frames
            await barrier.wait()
            for f in frames[k][lo:hi]:
                await c.frame(f, binary=k == 1)
            await c.until(lambda c: c.count("block") == blocks)
        if k == 0:
            await c.stop()
            await c.until(lambda c: c.closed)

    async def go():
        barrier = asyncio.Barrier(2)
        async with LiveClient(url) as a, LiveClient(url) as b:
            await asyncio.gather(session(a, 0, barrier), session(b, 1, barrier))
            return a, b

    return ops, run(go())


def test_each_session_gets_the_offline_joint_commands_of_its_own_frames(two_sessions):
    ops, clients = two_sessions
    for stream, c in zip(ops, clients):
        want = retarget_stream(stream, hz=streams.VIDEO_FPS, cfg=retarget.realtime_config())["actions"]
        got = np.asarray([j["action"] for j in c.of("joints")])
        assert got.shape == (FIRST + LATER, 54)
        np.testing.assert_allclose(got, want, atol=2e-5)
    a, b = (np.asarray([j["action"] for j in c.of("joints")]) for c in clients)
    assert np.abs(a - b).max() > 0.05  # two operators, two different command streams


def test_each_session_gets_its_own_skeleton_and_generated_frames(live, two_sessions):
    runner, _ = live
    world = runner.server.world
    ops, clients = two_sessions
    blocks = [c.of("block") for c in clients]
    assert [b["slot"] for b, _ in blocks] == [0, 1] or [b["slot"] for b, _ in blocks] == [1, 0]
    assert all(b[0]["restart"] == blocks[0][0]["restart"] and b[1]["restart"] == b[0]["restart"] for b in blocks)
    assert all([x["frames"] for x in b] == [FIRST, LATER] and not any(x["held"] for x in b) for b in blocks)
    skeletons, videos = [], []
    for stream, c in zip(ops, clients):
        t = stream.span[0] + np.arange(FIRST + LATER) / streams.VIDEO_FPS
        joints, elbows, valid = hands_in_camera(stream, t)
        want = np.asarray(render_video(world.rcfg, joints, elbows, world.intrinsics, valid))
        got = {k: np.stack([im for kind, _, _, im in c.images if kind == k]) for k in "GS"}
        assert [ti for kind, _, ti, _ in c.images if kind == "G"] == list(t)  # stamped with the input time
        diff = np.abs(got["S"].astype(int) - want)  # rendered in one batch of 2 × n frames: rounding may differ
        assert diff.max() <= 1 and (diff > 0).mean() < 1e-4, (diff.max(), (diff > 0).mean())
        assert want.std() > 5  # hands in view, not a black frame
        skeletons.append(got["S"])
        videos.append(got["G"])
    # The offline rollout of both sessions' skeletons through the same executables, the same slots and keys.
    order = [b[0]["slot"] for b in blocks]
    ids = np.zeros(SLOTS, np.int32)
    for c, slot in zip(clients, order):
        ids[slot] = c.of("ready")[0]["session"]
    image = runner.server.sample_image
    images = np.stack([fit_image(image, H, W)] * SLOTS)
    skel = np.stack([skeletons[order.index(s)] for s in range(SLOTS)])
    ctx = np.zeros((SLOTS, *world.context_shape), np.float32)
    with world.cond:  # the world is idle (no session): the test thread may use its session
        want = rollout(world.session, images, skel, ctx, slot_keys(world.seed, ids, blocks[0][0]["restart"]))
    for k, slot in enumerate(order):
        np.testing.assert_array_equal(videos[k], want[slot])
    assert np.abs(videos[0].astype(int) - videos[1].astype(int)).mean() > 1  # not the same video twice


def test_a_recorded_session_reads_back_as_a_robot_episode(live, two_sessions):
    runner, _ = live
    ops, (a, b) = two_sessions
    saved = a.of("saved")
    assert len(saved) == 1 and saved[0]["frames"] == FIRST + LATER
    root = runner.server.cfg.record_dir
    assert os.path.basename(saved[0]["path"]) == "op-a"
    source = robot_data.RobotSource(root, ClipConfig(num_frames=FIRST + LATER, height=H, width=W), strict=True)
    assert source.episodes() == ["op-a"]
    sample = source.load(ClipRef("op-a", 0))
    live_actions = np.asarray([j["action"] for j in a.of("joints")], np.float32)  # one frame per tick here
    np.testing.assert_allclose(sample["actions"], live_actions, atol=1e-6)
    # H.264 keeps a noise-like 64×96 video's coarse structure only: compare 8×8 means, against the
    # frames this client received and, for scale, against the other session's.
    coarse = lambda v: np.asarray(v, np.float32).reshape(-1, H // 8, 8, W // 8, 8, 3).mean((2, 4))  # noqa: E731
    own, other = (coarse([im for kind, _, _, im in c.images if kind == "G"]) for c in (a, b))
    err, err_other = np.abs(coarse(sample["video"]) - own).mean(), np.abs(coarse(sample["video"]) - other).mean()
    assert err < 6 and err < 0.5 * err_other, (err, err_other)
    table = pq.read_table(root / "op-a" / robot_data.TIMESERIES_FILE).to_pydict()
    np.testing.assert_allclose(table["timestamp"], np.arange(FIRST + LATER) / streams.VIDEO_FPS, atol=1e-6)
    back = streams.read(root / "op-a" / "operator_stream.npz")
    np.testing.assert_allclose(back.tracker_pose, ops[0].tracker_pose, rtol=1e-6)
    assert json.loads((root / "op-a" / robot_data.METADATA_FILE).read_text())["session"] == a.of("ready")[0]["session"]


# --------------------------------------------------------------------------------------------------
# Sessions started from a sim task, with the MuJoCo replay
# --------------------------------------------------------------------------------------------------

TASK, SEED = "dual_pick", 3


def test_sim_start_fields_are_checked():
    base = {"type": "start", "schema": protocol.SCHEMA}
    good = protocol.parse_text(json.dumps({**base, "sim": {"task": TASK, "seed": SEED}, "replay": True}))
    assert good.sim == protocol.SimRef(TASK, SEED) and good.replay
    for bad in ({"sim": {"task": TASK, "seed": -1}}, {"sim": {"task": TASK, "seed": 1.5}}, {"sim": TASK},
                {"sim": {"task": TASK, "seed": True}}, {"sim": {"task": TASK, "colour": 1}}, {"replay": True},
                {"sim": {"task": TASK}, "T_world_camera": np.eye(4).tolist()},
                {"sim": {"task": TASK}, "replay": True, "frames": "none"}):
        with pytest.raises(protocol.ProtocolError) as e:
            protocol.parse_text(json.dumps({**base, **bad}))
        assert e.value.code == "bad_start", bad


def _get(runner, path: str) -> tuple[int, bytes]:
    async def go():
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{runner.server.port}{path}") as r:
                return r.status, await r.read()

    return run(go())


@pytest.fixture(scope="module")
def sim(live):
    runner, _ = live
    return runner.call(runner.server.sims.get(protocol.SimRef(TASK, SEED)), timeout=300)


def test_a_sim_task_gives_its_head_camera_view_and_intrinsics(sim):
    scene = scenes.build(TASK, SEED, width=W, height=H, shadows=False)  # an episode's own scene and render
    want = episode.render_frames(scene, episode.settle(scene).qpos[None], H, W)["rgb"][0]
    np.testing.assert_array_equal(sim.image, want)
    assert want.std() > 10
    np.testing.assert_allclose(sim.intrinsics, scenes.camera_intrinsics(scene.model, W, H))
    assert np.abs(sim.intrinsics - default_intrinsics(RenderConfig(height=H, width=W))).max() > 5  # not the sample's


def test_http_lists_the_sim_tasks_and_serves_their_scripted_operator(live, sim, monkeypatch):
    runner, _ = live
    status, body = _get(runner, "/sim.json")
    assert status == 200 and [t["task"] for t in json.loads(body)["tasks"]] == list(scenes.TASKS)
    built = []
    monkeypatch.setattr(runner.server.sims, "builder", lambda *a: built.append(a) or sim_start.build(*a))
    status, body = _get(runner, f"/sim/{TASK}.json?seed={SEED}")
    assert status == 200
    got = json.loads(body)
    assert (got["schema"], got["task"], got["seed"], got["prompt"]) == (protocol.SCHEMA, TASK, SEED,
                                                                        scenes.DESCRIPTIONS[TASK])
    np.testing.assert_allclose(got["T_world_camera"], sim.stream.meta["T_world_camera"])
    want = protocol.frames_at(sim.stream, sim_start.STREAM_HZ)
    assert len(got["frames"]) == len(want) > sim_start.STREAM_HZ * 6  # the whole script (7 s)
    for g, w in zip(got["frames"][::40], want[::40]):
        f = protocol.parse_text(json.dumps(g))  # what the page sends back is a valid frame
        assert f.t == pytest.approx(w.t - want[0].t)
        np.testing.assert_allclose(f.tracker_pose, w.tracker_pose)
        np.testing.assert_allclose(f.hand_keypoints, w.hand_keypoints)
    assert _get(runner, f"/sim/{TASK}.json?seed={SEED}") == (200, body) and not built  # cached per (task, seed)
    assert _get(runner, "/sim/juggling.json")[0] == 404
    assert _get(runner, f"/sim/{TASK}.json?seed=-1")[0] == 400


def test_a_bad_or_failing_sim_start_is_refused_and_other_sessions_go_on(live, monkeypatch):
    runner, url = live

    def builder(task, seed, *rest):
        if seed == 99:
            raise RuntimeError("the scene exploded")
        return sim_start.build(task, seed, *rest)

    monkeypatch.setattr(runner.server.sims, "builder", builder)
    f = protocol.frames_at(synthetic_stream(9, seed=3), 16.0)

    async def go():
        async with LiveClient(url) as a, LiveClient(url) as b:
            await b.start(frames="none")
            await b.until(lambda c: c.count("ready"))
            await a.start(sim={"task": "juggling"}, frames="none")
            await a.until(lambda c: c.count("error") == 1)
            await a.start(sim={"task": TASK, "seed": 99}, frames="none")
            await a.until(lambda c: c.count("error") == 2)
            await b.frame(f[0])
            await a.start(frames="none")  # the session goes on: a start that works
            await a.until(lambda c: c.count("ready"))
            await a.frame(f[0])
            await b.frame(f[1])
            await a.until(lambda c: c.count("joints") == 1)
            await b.until(lambda c: c.count("joints") == 2)
            return a, b

    a, b = run(go())
    assert [e["code"] for e in a.of("error")] == ["bad_start", "sim_failed"]
    assert "unknown sim task 'juggling'" in a.of("error")[0]["message"]
    assert "the scene exploded" in a.of("error")[1]["message"]
    assert not b.of("error") and (TASK, 99) not in runner.server.sims._built  # a failed build is not kept


@pytest.fixture(scope="module")
def sim_episode():
    """The task's episode for the seed (`sim.cli generate`'s), without its images."""
    return episode.generate(TASK, SEED, resolution=(H, W), render=False)


@pytest.fixture(scope="module")
def sim_session(live, sim):
    """One sim session with the replay: a burst of the scripted operator's first block (the replay
    falls behind and skips), then three blocks' worth at real time, each waited for (so a loaded
    machine skips no block: the later blocks carry the hands into view)."""
    _, url = live
    frames = protocol.frames_at(sim.stream, streams.VIDEO_FPS)[:FIRST + 3 * LATER]

    async def go():
        async with LiveClient(url) as c:
            await c.start(sim={"task": TASK, "seed": SEED}, replay=True, frames="raw", skeleton=True)
            await c.until(lambda c: c.count("ready"))
            for f in frames[:FIRST]:
                await c.frame(f)
            await c.until(lambda c: c.count("block") == 1)
            for k in range(3):
                for f in frames[FIRST + k * LATER:FIRST + (k + 1) * LATER]:
                    await c.frame(f)
                    await asyncio.sleep(1 / streams.VIDEO_FPS)
                await c.until(lambda c: c.count("block") >= k + 2)
            await c.until(lambda c: any(s["ticks"] == len(frames) and s["replay_frames"] + s["replay_skipped"]
                                        == len(frames) for s in c.of("stats")))
            return c

    return frames, run(go())


def test_a_sim_session_gets_the_offline_joint_commands_and_the_episode_s_skeleton(live, sim, sim_session,
                                                                                 sim_episode):
    runner, _ = live
    frames, c = sim_session
    ready = c.of("ready")[0]
    assert (ready["prompt"], ready["sim"], ready["replay"]) == (scenes.DESCRIPTIONS[TASK], {"task": TASK, "seed": SEED},
                                                                True)
    stream = stream_of(frames, sim.camera)
    want = retarget_stream(stream, hz=streams.VIDEO_FPS, cfg=retarget.realtime_config())["actions"]
    got = np.asarray([j["action"] for j in c.of("joints")])
    np.testing.assert_allclose(got, want, atol=2e-5)
    assert np.abs(got - got[0]).max() > 0.1  # the script moves the arms
    # The skeleton frames are the episode's skeleton video's (hands through the tracker chain into the
    # robot frame, the head camera's intrinsics), not the tracking world's rigid picture (1.5× hands).
    k = np.rint(np.asarray([ti for kind, _, ti, _ in c.images if kind == "S"]) * streams.VIDEO_FPS).astype(int)
    skeleton = np.stack([im for kind, _, _, im in c.images if kind == "S"]).astype(int)
    ep, rcfg = sim_episode, runner.server.world.rcfg
    assert rcfg == RenderConfig(width=W, height=H)  # the episode's skeleton video's renderer
    want = np.asarray(render_video(rcfg, ep.joints_cam[k], ep.elbows_cam[k], ep.intrinsics, ep.skeleton_valid[k]))
    rigid = np.asarray(render_video(rcfg, *hands_in_camera(stream, k / streams.VIDEO_FPS)[:2], sim.intrinsics,
                                    ep.skeleton_valid[k]))
    diff = np.abs(skeleton - want)
    assert diff.max() <= 1 and (diff > 0).mean() < 1e-4, (diff.max(), (diff > 0).mean())
    assert want.std() > 5 and np.abs(skeleton - rigid).mean() > 1


def test_the_replay_shows_the_sim_robot_following_the_joint_commands(sim, sim_session):
    frames, c = sim_session
    replay = [(i, t, im) for kind, i, t, im in c.images if kind == "M"]
    stats = next(s for s in c.of("stats") if s["ticks"] == len(frames) and s["replay_frames"] + s["replay_skipped"]
                 == len(frames))
    assert len(replay) == stats["replay_frames"] >= 8 and stats["replay_skipped"] >= 1, stats
    index = [i for i, _, _ in replay]
    assert index == sorted(set(index)) and index[-1] == len(frames) - 1
    assert [t for _, t, _ in replay] == [frames[i].t for i in index]  # stamped with the tick's input time
    # Oracle: a sim episode's own simulate() from the settled scene through the same commands (the
    # robot starts at home), rendered by the episode's renderer.
    scene = scenes.build(TASK, SEED, width=W, height=H, shadows=False)
    d = episode.settle(scene)
    actions = np.asarray([d.qpos[:54]] + [j["action"] for j in c.of("joints")])
    qpos = episode.simulate(scene, d, actions)["qpos"]
    want = episode.render_frames(scene, qpos[np.asarray(index) + 1], H, W)["rgb"]
    got = np.stack([im for _, _, im in replay])
    np.testing.assert_array_equal(got, want)
    assert got.std(axis=(1, 2, 3)).min() > 10  # not blank
    assert np.abs(got[-1].astype(int) - got[0]).mean() > 2  # the robot moved


# --------------------------------------------------------------------------------------------------
# The page in a real browser
# --------------------------------------------------------------------------------------------------

@needs_chromium
def test_the_page_plays_the_sample_and_shows_changing_generated_frames(live):
    runner, _ = live
    (early, late), text = page_shots(runner, "autostart=1", "shown", (6, 20), ("generated",),
                                     ("fps", "latency", "joints_rate", "status"))
    early, late = early["generated"], late["generated"]
    assert early.std() > 10 and late.std() > 10, "the generated panel is blank"
    assert np.abs(early - late).mean() > 3, "the generated panel does not change"
    assert text["status"].startswith("streaming") and float(text["latency"]) > 0 and int(text["joints_rate"]) > 10


@needs_chromium
def test_the_page_starts_a_sim_task_and_shows_changing_generated_and_replay_frames(live, sim):
    runner, _ = live
    (early, late), text = page_shots(runner, f"task={TASK}&seed={SEED}&replay=1&autostart=1", "shown", (6, 24),
                                     ("generated", "replay_view"), ("status", "replay_shown", "prompt"))
    for panel in ("generated", "replay_view"):
        assert early[panel].std() > 10 and late[panel].std() > 10, f"the {panel} panel is blank"
        assert np.abs(early[panel] - late[panel]).mean() > 1, f"the {panel} panel does not change"
    assert text["status"].startswith("streaming") and int(text["replay_shown"]) >= 10
    assert text["prompt"] == scenes.DESCRIPTIONS[TASK]


def test_sigterm_closes_every_session_and_writes_its_recording(live, tmp_path):
    """The module's last test: `serve` stops the shared world model on its way out."""
    runner, _ = live
    s = runner.server
    server = LiveServer(s.world, s.kin, s.contexts, dataclasses.replace(s.cfg, record_dir=tmp_path))
    frames = protocol.frames_at(synthetic_stream(17, seed=5), streams.VIDEO_FPS)

    async def go():
        task = asyncio.create_task(serve(server))  # SIGINT / SIGTERM handlers on this (main-thread) loop
        while server.port is None:
            await asyncio.sleep(0.05)
        async with LiveClient(f"ws://127.0.0.1:{server.port}/ws") as c:
            await c.start(frames="none", record=True, name="cut")
            await c.until(lambda c: c.count("ready"))
            for f in frames[:FIRST]:
                await c.frame(f)
            await c.until(lambda c: c.count("block") == 1)
            os.kill(os.getpid(), signal.SIGTERM)
            await c.until(lambda c: c.closed)
            await asyncio.wait_for(task, 60)
            return c

    c = run(go())
    assert (c.close_code, c.close_reason) == (1001, "server shutting down")
    meta = json.loads((tmp_path / "cut" / robot_data.METADATA_FILE).read_text())
    assert meta["total_frames"] == FIRST and not list(tmp_path.glob(".cut.*"))  # written whole, scratch gone
    sample = robot_data.RobotSource(tmp_path, ClipConfig(num_frames=FIRST, height=H, width=W)).load(ClipRef("cut", 0))
    np.testing.assert_allclose(sample["actions"], [j["action"] for j in c.of("joints")], atol=1e-6)
    assert not runner.server.world.thread.is_alive()
