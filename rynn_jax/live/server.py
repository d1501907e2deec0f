"""`serve.py live`: the live digital-teleoperation server (aiohttp: HTTP, WebSocket and the page).

    python serve.py live [--host 127.0.0.1] [--port 8765] [--max-sessions 2] [--dit DIR --vae DIR]

then open http://127.0.0.1:8765/ . One WebSocket (`/ws`) per operator session: operator frames in
(`rynn-teleop-stream/1` samples, JSON or packed), 54-D joint commands out per frame and generated
frames out per block, each stamped with the input time it answers (docs/LIVE.md). All sessions share
one compiled batched `StreamingSession` (`live.world`); per-frame IK runs on the event loop
(`live.operator`, ≈ 1 ms on the CPU), the world model on its own thread, frame encoding and episode
writing on worker threads. A session may start from a sim task's scene and scripted operator
(`live.sim_start`) and get the task's robot replaying its joint commands (`live.replay`, MuJoCo thread).

Limits: the server binds to localhost unless `--host` says otherwise, and any other bind needs a
token (`--token` or RYNN_LIVE_TOKEN), checked on connect (`?token=`); at most `--max-sessions`
connections; messages over `--max-message-bytes` close the connection (1009), operator frames over
`--max-frame-bytes` or faster than `--max-fps` are refused with an error message; a session silent
for `--idle-timeout` s is closed. A bad message gets an `error` message and the session goes on.
SIGINT / SIGTERM: every session is closed (1001), its recording written, then the server exits.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hmac
import ipaddress
import json
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from aiohttp import WSCloseCode, WSMsgType, web

from rynn_jax import compile_cache, errors
from rynn_jax.errors import height_width
from rynn_jax.kinematics import streams
from rynn_jax.live import protocol
from rynn_jax.live.operator import Kinematics, Operator, TickQueue
from rynn_jax.live.recorder import Recorder
from rynn_jax.live.replay import Replay
from rynn_jax.live.sim_start import SimCatalog
from rynn_jax.live.world import Block, LiveWorld
from rynn_jax.serving.assemble import (TINY_SIM_RESOLUTION, check_model_flags, check_resolution, choose_weights,
                                       session_for)
from rynn_jax.serving.clip import fit_image
from rynn_jax.serving.prompts import text_contexts
from rynn_jax.teleop.camera_hands import camera_pose
from rynn_jax.teleop.inputs import IMAGE_FILE, SAMPLE_DIR, STREAM_FILE, read_reference

STATIC_DIR = Path(__file__).with_name("static")
TOKEN_ENV = "RYNN_LIVE_TOKEN"
LOOPBACK_NAMES = ("localhost",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LiveConfig:
    host: str = "127.0.0.1"
    port: int = 8765  # 0: any free port (tests)
    token: str | None = None  # required on connect when set; must be set for a non-loopback host
    max_message_bytes: int = 8 << 20  # any message (a start carries a reference picture); more closes (1009)
    max_frame_bytes: int = 16 << 10  # one operator frame (JSON ≈ 4 KB, binary 656 B)
    max_fps: float = 250.0  # operator frames per second per session (bursts up to one second's worth)
    idle_timeout_s: float = 30.0  # a session with no message for this long is closed
    stats_every_s: float = 1.0
    out_queue: int = 1024  # messages waiting for a slow client; more are dropped (counted)
    record_dir: Path = Path("outputs/live")
    record_max_frames: int = 4800  # 5 minutes at 16 fps; recording stops there (the session goes on)
    replay_fps: float = 16.0  # MuJoCo replay frames per second per session, at most (behind: skip to the newest)
    weights: str = "tiny random (demo)"
    seed: int = 0


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class LiveServer:
    def __init__(self, world: LiveWorld, kin: Kinematics, contexts, cfg: LiveConfig = LiveConfig(),
                 sample_dir: Path = SAMPLE_DIR):
        if not is_loopback(cfg.host) and not cfg.token:
            raise errors.UsageError(f"--host {cfg.host}: binding beyond localhost needs a token",
                                    fix=f"pass --token or set {TOKEN_ENV}")
        self.world, self.kin, self.contexts, self.cfg = world, kin, contexts, cfg
        sample = streams.read(sample_dir / STREAM_FILE)
        self.sample_camera = camera_pose(sample)
        self.sample_image = read_reference(sample_dir / IMAGE_FILE)
        self.sample_stream = sample
        self.connections: set[Connection] = set()
        self.next_id = 1
        self.writes: set[asyncio.Future] = set()
        self.pool = ThreadPoolExecutor(4, thread_name_prefix="rynn-live-io")
        self.sims = SimCatalog(world.height, world.width, self.pool)  # sessions started from a sim task
        self.app = web.Application(client_max_size=1 << 20)
        self.app.add_routes([web.get("/", self._index), web.get("/ws", self._ws), web.get("/stats", self._stats),
                             web.get("/sample.json", self._sample), web.static("/static", STATIC_DIR),
                             *self.sims.routes(self.authorized)])
        self.app.on_shutdown.append(self._on_shutdown)
        self.runner: web.AppRunner | None = None
        self.port: int | None = None

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self, sock=None) -> int:
        """Serve (on `sock` if given, a bound socket, else cfg.host:cfg.port); returns the port."""
        self.loop = asyncio.get_running_loop()
        self.world.start()
        self.runner = web.AppRunner(self.app, handle_signals=False, shutdown_timeout=5.0)
        await self.runner.setup()
        site = web.SockSite(self.runner, sock) if sock is not None else web.TCPSite(
            self.runner, self.cfg.host, self.cfg.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self.port

    async def add_socket(self, sock) -> int:
        """Also serve on `sock`, a bound socket (e.g. one made in another network namespace)."""
        site = web.SockSite(self.runner, sock)
        await site.start()
        return sock.getsockname()[1]

    async def shutdown(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()  # on_shutdown: sessions closed, recordings written
        await asyncio.get_running_loop().run_in_executor(None, self.world.stop)
        self.pool.shutdown(wait=True)
        self.sims.close()

    async def _on_shutdown(self, app) -> None:
        conns = list(self.connections)
        await asyncio.gather(*(c.close(WSCloseCode.GOING_AWAY, "server shutting down") for c in conns),
                             return_exceptions=True)
        if conns:  # each session's handler saves its recording on the way out
            await asyncio.wait([asyncio.ensure_future(c.finished.wait()) for c in conns], timeout=60)
        if self.writes:
            await asyncio.gather(*self.writes, return_exceptions=True)

    # -- HTTP ----------------------------------------------------------------------------------------

    def authorized(self, request: web.Request) -> bool:
        if not self.cfg.token:
            return True
        given = request.query.get("token", "")
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            given = header[7:]
        return hmac.compare_digest(given.encode(), self.cfg.token.encode())

    async def _index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC_DIR / "index.html")

    async def _sample(self, request: web.Request) -> web.Response:
        """The bundled operator sample as live frames at 60 Hz (what the page plays)."""
        frames = protocol.frames_at(self.sample_stream, 60.0)
        frames = [{**protocol.frame_json(f), "t": f.t - frames[0].t} for f in frames]
        return web.json_response({"schema": protocol.SCHEMA, "T_world_camera": self.sample_camera.tolist(),
                                  "frames": frames})

    async def _stats(self, request: web.Request) -> web.Response:
        if not self.authorized(request):
            return web.Response(status=401, text="a valid token is needed (?token=)")
        return web.json_response(self.stats())

    def stats(self) -> dict:
        return {"sessions": [c.stats() for c in self.connections], "connections": len(self.connections),
                "slots": self.world.batch, "blocks": self.world.blocks, "restarts": self.world.restarts,
                "tasks": len(asyncio.all_tasks()), "rss_mb": _rss_mb()}

    async def _ws(self, request: web.Request) -> web.StreamResponse:
        if not self.authorized(request):
            return web.Response(status=401, text="a valid token is needed (?token=)")
        ws = web.WebSocketResponse(max_msg_size=self.cfg.max_message_bytes)
        await ws.prepare(request)
        if len(self.connections) >= self.world.batch:
            await ws.send_json({"type": "error", "code": "full",
                                "message": f"the server is full ({self.world.batch} sessions); try later"})
            await ws.close(code=WSCloseCode.TRY_AGAIN_LATER, message=b"server full")
            return ws
        conn = Connection(self, ws, self.next_id)
        self.next_id += 1
        self.connections.add(conn)
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)
        return ws


class Connection:
    """One operator session: its WebSocket, its operator, its slot in the world model."""

    def __init__(self, server: LiveServer, ws: web.WebSocketResponse, session_id: int):
        self.server, self.ws, self.id = server, ws, session_id
        self.cfg = server.cfg
        self.queue = TickQueue(server.world.frames.later)
        self.operator: Operator | None = None
        self.start_msg: protocol.Start | None = None
        self.recorder: Recorder | None = None
        self.image = self.context = None
        self.intrinsics = server.world.intrinsics  # the skeleton camera's (a sim task's own)
        self.replay: Replay | None = None
        self.out: asyncio.Queue = asyncio.Queue(self.cfg.out_queue)
        self.blocks: asyncio.Queue = asyncio.Queue()
        self.counts = collections.Counter()
        self.latency_ms: collections.deque[float] = collections.deque(maxlen=64)
        self.sent_at: collections.deque[tuple[float, int]] = collections.deque(maxlen=64)
        self.frame_index = 0
        self.bucket, self.bucket_t = self.cfg.max_fps, time.monotonic()
        self.closing = False
        self.saved: Path | None = None
        self._adding: asyncio.Future | None = None  # a block being written to the recording
        self.finished = asyncio.Event()  # set when the session is over and its recording written

    # -- the scheduler's side (model thread) -------------------------------------------------------

    def deliver(self, block: Block | None) -> None:
        try:
            self.server.loop.call_soon_threadsafe(self.blocks.put_nowait, block)
        except RuntimeError:  # the event loop is gone (the server stopped): nobody to tell
            pass

    # -- the event loop's side ---------------------------------------------------------------------

    def send(self, message: dict | bytes) -> None:
        try:
            self.out.put_nowait(message)
        except asyncio.QueueFull:
            self.counts["dropped_out"] += 1

    def error(self, code: str, message: str) -> None:
        self.counts["errors"] += 1
        self.send({"type": "error", "code": code, "message": message})

    async def run(self) -> None:
        tasks = [asyncio.create_task(self._writer()), asyncio.create_task(self._frames()),
                 asyncio.create_task(self._stats_loop())]
        try:
            await self._reader()
        finally:
            self.server.world.leave(self)
            if self.replay is not None:
                await self.replay.close()
            await self._save()
            await self._flush()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if not self.ws.closed:
                await self.ws.close()
            self.finished.set()

    async def _flush(self, timeout_s: float = 5.0) -> None:
        """Wait (a bounded time: a client may have stopped reading) for queued messages to go out."""
        try:
            await asyncio.wait_for(self.out.join(), timeout_s)
        except asyncio.TimeoutError:
            pass

    async def close(self, code: int, reason: str) -> None:
        self.closing = True
        await self.ws.close(code=code, message=reason.encode())

    async def _reader(self) -> None:
        while not self.ws.closed:
            try:
                msg = await self.ws.receive(timeout=self.cfg.idle_timeout_s)
            except asyncio.TimeoutError:
                self.error("idle", f"no message for {self.cfg.idle_timeout_s:g} s; closing")
                await self._flush()
                await self.ws.close(code=WSCloseCode.OK, message=b"idle timeout")
                return
            if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
                return
            try:
                if msg.type == WSMsgType.BINARY:
                    self._check_frame_size(len(msg.data))
                    self._on_frame(protocol.parse_binary(msg.data))
                    continue
                parsed = protocol.parse_text(msg.data)
                if isinstance(parsed, protocol.Frame):
                    self._check_frame_size(len(msg.data))
                    self._on_frame(parsed)
                elif isinstance(parsed, protocol.Start):
                    await self._on_start(parsed)
                else:  # stop: save, say so, close
                    await self._save()
                    await self._flush()
                    await self.ws.close(code=WSCloseCode.OK, message=b"stopped")
                    return
            except protocol.ProtocolError as e:
                if e.code == "non_finite" or e.code.startswith("bad"):
                    self.counts["frames_rejected"] += 1
                self.error(e.code, str(e))

    def _check_frame_size(self, size: int) -> None:
        if size > self.cfg.max_frame_bytes:
            raise protocol.ProtocolError("oversize", f"an operator frame is at most {self.cfg.max_frame_bytes} "
                                         f"bytes, got {size}")

    def _on_frame(self, f: protocol.Frame) -> None:
        if self.operator is None:
            raise protocol.ProtocolError("not_started", "send a start message first")
        now = time.monotonic()
        self.bucket = min(self.cfg.max_fps, self.bucket + (now - self.bucket_t) * self.cfg.max_fps)
        self.bucket_t = now
        if self.bucket < 1.0:
            self.counts["too_fast"] += 1
            raise protocol.ProtocolError("too_fast", f"more than {self.cfg.max_fps:g} frames per second; "
                                         "frame dropped")
        self.bucket -= 1.0
        joints, ticks = self.operator.add(f)
        self.counts["frames_in"] += 1
        self.counts["ticks"] += len(ticks)
        self.send(joints)
        if ticks:
            self.server.world.poke()
            if self.replay is not None:
                self.replay.put(ticks)

    async def _on_start(self, start: protocol.Start) -> None:
        if self.operator is not None:
            raise protocol.ProtocolError("already_started", "this session has started already")
        world, server = self.server.world, self.server
        sim = await server.sims.get(start.sim) if start.sim is not None else None  # bad_start / sim_failed
        image = sim.image if sim else start.image if start.image is not None else server.sample_image
        prompt = start.prompt or (sim.prompt if sim else "")
        try:
            self.context = server.contexts(prompt)
        except (ValueError, OSError) as e:
            raise protocol.ProtocolError("bad_prompt", f"start: no text context for this prompt ({e})") from None
        loop = asyncio.get_running_loop()
        fitted = await loop.run_in_executor(server.pool, fit_image, image, world.height, world.width)
        self.image = fitted.astype(np.float32) / np.float32(127.5) - np.float32(1.0)
        camera = sim.camera if sim else start.camera if start.camera is not None else server.sample_camera
        self.intrinsics = sim.intrinsics if sim else world.intrinsics
        if start.replay:
            replay = Replay(sim, server.sims.gl, self.send, start.frames, self.cfg.replay_fps, self.error)
            await replay.open()  # sim_failed
            self.replay = replay
        self.operator = Operator(server.kin, camera, self.queue, sim.robot_camera if sim else None)
        self.start_msg = start
        if start.record:
            name = start.name or f"{time.strftime('%Y%m%d-%H%M%S')}-{self.id}"
            meta = {"task_description": prompt, "source": "rynn_jax.live (world model, live session)",
                    "sim": dataclasses.asdict(start.sim) if sim else None,
                    "intrinsics": self.intrinsics, "weights": self.cfg.weights, "seed": self.cfg.seed,
                    "session": self.id, "observation.state": "the previous step's command (generated: no robot "
                                                             "measured it)"}
            self.recorder = Recorder(Path(self.cfg.record_dir), name, fitted, prompt, self.context, meta,
                                     self.cfg.record_max_frames)
            self.operator.keep_frames = True
        world.join(self)  # never full: connections ≤ slots
        self.send({"type": "ready", "protocol": "rynn-live/1", "session": self.id, "height": world.height,
                   "width": world.width, "fps": streams.VIDEO_FPS, "frames": start.frames,
                   "first_block": world.frames.session_first, "block": world.frames.later,
                   "recording": self.recorder is not None, "prompt": prompt,
                   "sim": dataclasses.asdict(start.sim) if sim else None, "replay": self.replay is not None})

    async def _frames(self) -> None:
        """Blocks from the world model → messages (frames encoded on a worker thread, in order)."""
        loop = asyncio.get_running_loop()
        while True:
            block = await self.blocks.get()
            if block is None:
                self.error("world_model", f"the world model stopped: {self.server.world.error!r}")
                await self.close(WSCloseCode.INTERNAL_ERROR, "world model failed")
                return
            rec = self.recorder  # recorded before the client hears of the block (it may stop right after)
            if rec is not None and not rec.full:
                self._adding = loop.run_in_executor(self.server.pool, rec.add, block)
                await self._adding
                if rec.full:
                    self.error("recording_full", f"recording stopped at {rec.frames} frames")
            first, n = self.frame_index, len(block.ticks)
            self.frame_index += n
            latency = 1e3 * (time.monotonic() - max(t.arrival for t in block.ticks))
            self.latency_ms.append(latency)
            self.sent_at.append((time.monotonic(), n))
            self.counts["frames_out"] += n
            self.counts["held"] += block.held
            self.send({"type": "block", "index": block.index, "slot": block.slot, "restart": block.restart,
                       "first_frame": first, "frames": n,
                       "t": [t.t for t in block.ticks], "held": block.held, "restarted": block.restarted,
                       "latency_ms": round(latency, 2), "block_ms": round(1e3 * block.seconds, 2)})
            fmt = self.start_msg.frames
            panels = ([("G", block.video)] if fmt != "none" else []) + (
                [("S", block.skeleton)] if self.start_msg.skeleton and fmt != "none" else [])
            if panels and self.blocks.qsize() >= 2:  # encoding is behind: send the newer blocks' frames
                self.counts["frames_skipped"] += n
            elif panels:
                messages = await loop.run_in_executor(self.server.pool, _encode, panels, fmt, first, block)
                for m in messages:
                    self.send(m)

    async def _writer(self) -> None:
        while True:
            m = await self.out.get()
            try:
                if not self.ws.closed:
                    await (self.ws.send_bytes(m) if isinstance(m, bytes) else self.ws.send_str(json.dumps(m)))
            except (ConnectionError, RuntimeError):
                pass  # the client went away: the reader sees the close
            finally:
                self.out.task_done()

    async def _stats_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.stats_every_s)
            if self.operator is not None:
                self.send({"type": "stats", **self.stats()})

    def stats(self) -> dict:
        now = time.monotonic()
        recent = [n for t, n in self.sent_at if now - t <= 2.0]
        lat = np.asarray(self.latency_ms) if self.latency_ms else np.zeros(1)
        return {"session": self.id, "frames_in": self.counts["frames_in"], "ticks": self.counts["ticks"],
                "frames_out": self.counts["frames_out"], "fps_out": round(sum(recent) / 2.0, 2),
                "latency_ms": {"p50": round(float(np.percentile(lat, 50)), 2),
                               "p95": round(float(np.percentile(lat, 95)), 2)},
                "dropped": self.queue.dropped, "held": self.counts["held"], "too_fast": self.counts["too_fast"],
                "rejected": self.counts["frames_rejected"], "errors": self.counts["errors"],
                "dropped_out": self.counts["dropped_out"], "frames_skipped": self.counts["frames_skipped"],
                "replay_frames": self.replay.frames if self.replay else None,
                "replay_skipped": self.replay.skipped if self.replay else None,
                "recording": self.recorder.frames if self.recorder is not None else None}

    async def _save(self) -> None:
        """Write the recording (once); the server waits for it on shutdown."""
        rec, self.recorder = self.recorder, None
        if rec is None:
            return
        loop = asyncio.get_running_loop()
        if self._adding is not None:  # the block in flight goes in before the ones still queued
            await asyncio.gather(asyncio.shield(self._adding), return_exceptions=True)
        while not self.blocks.empty():  # blocks already generated belong in the episode
            block = self.blocks.get_nowait()
            if block is not None and not rec.full:
                rec.add(block)
        extra = {"frames_dropped": self.queue.dropped, "stats": self.stats()}
        job = loop.run_in_executor(self.server.pool, rec.finish, self.operator.stream(), extra)
        self.server.writes.add(job)
        try:
            self.saved = await job
        finally:
            self.server.writes.discard(job)
        if self.saved is not None and not self.ws.closed:
            self.send({"type": "saved", "path": str(self.saved), "frames": rec.frames})


class ServerThread:
    """A `LiveServer` on an event loop of its own thread (tests, benchmarks):
    `with ServerThread(server) as url: ...` serves at `url` (ws://…/ws) and shuts down after."""

    def __init__(self, server: LiveServer, sock=None):
        self.server, self.sock = server, sock
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="rynn-live-http", daemon=True)
        self.stopped = False

    def __enter__(self) -> str:
        self.thread.start()
        port = self.call(self.server.start(self.sock))
        return f"ws://127.0.0.1:{port}/ws"

    def call(self, coro, timeout: float | None = 60.0):
        """Run `coro` on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.call(self.server.shutdown())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()

    def __exit__(self, *exc) -> None:
        self.stop()


def _encode(panels: list[tuple[str, np.ndarray]], fmt: str, first: int, block: Block) -> list[bytes]:
    return [protocol.encode_frame(kind, frames[i], fmt, first + i, block.ticks[i].t)
            for kind, frames in panels for i in range(len(frames))]


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return round(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)
    except OSError:
        return float("nan")


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def build(a) -> LiveServer:
    """The world model (compiled, warmed up), the IK and the server for parsed flags."""
    weights = choose_weights(a.dit, a.vae).with_student_steps(a.steps)
    session = session_for(weights, a.seed, tae=a.tae)
    height, width = a.resolution or weights.resolution(TINY_SIM_RESOLUTION)
    world = LiveWorld(session, a.max_sessions, height, width, seed=a.seed, max_wait_s=a.max_wait)
    print(f"compiling the world model for {a.max_sessions} sessions at {height}x{width} ...", flush=True)
    t = time.perf_counter()
    world.compile()
    kin = Kinematics.build()
    kin.warm_up()
    print(f"compiled in {time.perf_counter() - t:.0f} s", flush=True)
    dit = session.dit_cfg
    contexts = text_contexts(a.text, a.text_embeddings, dit.text_len, dit.text_dim, hashed=weights.bundled)
    cfg = LiveConfig(host=a.host, port=a.port, token=a.token, max_message_bytes=a.max_message_bytes,
                     max_frame_bytes=a.max_frame_bytes, max_fps=a.max_fps, idle_timeout_s=a.idle_timeout,
                     record_dir=Path(a.record_dir), seed=a.seed, replay_fps=a.replay_fps, weights=weights.label)
    return LiveServer(world, kin, contexts, cfg)


async def serve(server: LiveServer) -> None:
    """Run until SIGINT or SIGTERM, then close every session and write its recording."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    port = await server.start()
    host = server.cfg.host if ":" not in server.cfg.host else f"[{server.cfg.host}]"
    token = f"?token={server.cfg.token}" if server.cfg.token else ""
    print(f"live: open http://{host}:{port}/{token} (WebSocket /ws, stats /stats); Ctrl-C stops", flush=True)
    await stop.wait()
    print("live: stopping (finishing recordings) ...", flush=True)
    await server.shutdown()
    print("live: stopped", flush=True)


def parser() -> errors.ArgumentParser:
    p = errors.ArgumentParser(prog="python serve.py live", description=__doc__)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (anything but loopback needs a token)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--token", default=os.environ.get(TOKEN_ENV), help=f"required on connect (default: ${TOKEN_ENV})")
    p.add_argument("--max-sessions", type=int, default=2, help="concurrent sessions = the world model's batch")
    p.add_argument("--resolution", default=None, type=height_width,
                   help="HxW of the generated video (default: the student's training size, else "
                        f"{TINY_SIM_RESOLUTION[0]}x{TINY_SIM_RESOLUTION[1]}; 480x832 for the released models)")
    p.add_argument("--dit", default=None, help="converted DiT directory (with a control branch)")
    p.add_argument("--vae", default=None, help="converted VAE directory")
    p.add_argument("--tae", default=None, metavar="CKPT", help="decode with this official tiny autoencoder")
    p.add_argument("--steps", type=int, default=None, help="a student's denoising passes per block (default: its "
                   "own; 2: a CPU's real-time setting, same held-out PSNR, docs/PERFORMANCE.md)")
    p.add_argument("--text", default=None, help="one precomputed umT5 embedding (.safetensors) for every prompt")
    p.add_argument("--text-embeddings", default=None, metavar="DIR",
                   help="prompts → DIR/<sha256(prompt)>.safetensors (data/README.md)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--record-dir", default="outputs/live", help="where recorded sessions become robot episodes")
    p.add_argument("--max-fps", type=float, default=250.0, help="operator frames per second per session")
    p.add_argument("--max-frame-bytes", type=int, default=16 << 10, help="largest operator frame message")
    p.add_argument("--max-message-bytes", type=int, default=8 << 20, help="largest message (a start with a picture)")
    p.add_argument("--idle-timeout", type=float, default=30.0, help="seconds without a message before closing")
    p.add_argument("--max-wait", type=float, default=0.5, help="seconds a block waits for a late operator's pose")
    p.add_argument("--replay-fps", type=float, default=16.0, help="MuJoCo replays per second and session (at most)")
    p.add_argument("--compile-cache", default=None, metavar="DIR", help="persistent XLA compilation cache")
    return p


def check(a) -> None:
    """Every flag and file checked before anything is built."""
    if not is_loopback(a.host) and not a.token:
        raise errors.UsageError(f"--host {a.host}: binding beyond localhost needs a token",
                                fix=f"pass --token or set {TOKEN_ENV}")
    if (a.max_sessions < 1 or not 0 <= a.port < 65536 or not a.max_fps > 0 or not a.idle_timeout > 0
            or not a.replay_fps > 0 or (a.steps is not None and a.steps < 1)):
        raise errors.UsageError("--max-sessions and --steps ≥ 1, --port in 0..65535 (0: any free one), --max-fps, "
                                "--idle-timeout and --replay-fps > 0")
    if a.resolution is not None:
        check_resolution(*a.resolution)
    check_model_flags(dit=a.dit, vae=a.vae, tae=a.tae, text=a.text)
    if a.text_embeddings:
        errors.existing(a.text_embeddings, "--text-embeddings", kind="directory")
    errors.writable_dir(Path(a.record_dir), "--record-dir")
    if a.compile_cache:
        compile_cache.enable(a.compile_cache)


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    check(a)
    asyncio.run(serve(build(a)))
    return 0


if __name__ == "__main__":
    sys.exit(errors.run(main))
