"""The world model shared by every live session: one batched `StreamingSession`, one slot per session.

The session is compiled once for (B, H, W) and runs in lock step on one thread; slot b is one
operator's video. Between blocks the scheduler

  * admits waiting sessions whose first block of ticks is ready (all that are ready within
    `admit_wait_s` when the batch is idle): the batch restarts (`StreamingSession.start`) with each
    joiner's reference image and text, and every continuing slot re-anchored on its own last
    generated frame (what the session does at a chunk boundary; its previous skeleton frame stands
    for the anchor's, and its repeated anchor frame is not sent). Same executables: no recompile.
  * frees the slots of sessions that left (their inputs become black frames, their outputs are
    dropped; slots never mix, so an idle slot changes no other slot's frames).
  * takes each active slot's newest ticks (`TickQueue.take`: older ones are dropped when the model
    is behind), waiting up to `max_wait_s` for slots that have fewer; a slot still short then holds
    its last pose for the missing frames (counted as held).

The skeleton frames of all slots are rendered in one call (each slot through its session's camera
intrinsics: a sim task's head camera is not the sample's), the step runs, and each slot's frames go
to its `Member.deliver` (called on this thread; members hand them to their event loop).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np

from rynn_jax.live.operator import Tick, TickQueue
from rynn_jax.render import RenderConfig, default_intrinsics, render_video
from rynn_jax.serving.session import BlockFrames, StreamingSession


class Member(Protocol):
    """What the scheduler needs of a session."""
    id: int
    queue: TickQueue
    image: np.ndarray  # (H, W, 3) float32 in [-1, 1], the reference view
    context: np.ndarray  # (text_len, text_dim) float32
    intrinsics: np.ndarray  # (3, 3) the skeleton camera's K at (H, W): the view's own (a sim task's differs)

    def deliver(self, block: Block) -> None: ...


@dataclasses.dataclass(frozen=True)
class Block:
    """One slot's share of a block: its new frames and the ticks they answer."""
    index: int  # the batch's block counter
    slot: int  # the session's place on the batch axis
    restart: int  # the batch restarts so far (`session_key`'s third part)
    ticks: list[Tick]
    video: np.ndarray  # (n, H, W, 3) uint8, generated
    skeleton: np.ndarray  # (n, H, W, 3) uint8, what drove it
    held: int  # frames at the end that repeat the last pose (the operator's ticks were late)
    restarted: bool  # the batch restarted before this block (a session joined)
    seconds: float  # the block's wall time (render + step)


def session_key(seed: int, session_id: int, restart: int) -> jax.Array:
    """Slot noise: the server's seed, the session's id and the batch restart it runs since."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), session_id), restart)


def slot_keys(seed: int, ids_b: jax.Array, restart: int) -> jax.Array:
    """(B,) keys: `session_key` of each slot's session id."""
    return _slot_keys(seed, jnp.asarray(ids_b, jnp.int32), np.int32(restart))


_slot_keys = jax.jit(jax.vmap(session_key, in_axes=(None, 0, None)), static_argnums=0)


@jax.jit
def _restart_images(join_b: jax.Array, images_bhw3: jax.Array, last_bhw3: jax.Array) -> jax.Array:
    return jnp.where(join_b[:, None, None, None], images_bhw3, last_bhw3)


class LiveWorld:
    def __init__(self, session: StreamingSession, batch: int, height: int, width: int, *, seed: int = 0,
                 max_wait_s: float = 0.5, admit_wait_s: float = 0.05):
        self.session, self.batch, self.seed = session, batch, seed
        self.height, self.width = height, width
        self.rcfg = RenderConfig(height=height, width=width)
        self.intrinsics = np.asarray(default_intrinsics(self.rcfg), np.float32)
        self.max_wait_s, self.admit_wait_s = max_wait_s, admit_wait_s
        self.frames = BlockFrames.of(session.ccfg.frames_per_block)
        text = (session.dit_cfg.text_len, session.dit_cfg.text_dim)
        self.context_shape = text
        self.slots: list[Member | None] = [None] * batch
        self.pending: list[Member] = []
        self.cond = threading.Condition()
        self.restarts, self.blocks = 0, 0
        self._images = np.zeros((batch, height, width, 3), np.float32)
        self._contexts = np.zeros((batch, *text), np.float32)
        self._ids = np.zeros(batch, np.int32)
        self._k = np.repeat(self.intrinsics[None], batch, 0)  # each slot's skeleton camera
        self._last: list[Tick | None] = [None] * batch  # each slot's newest tick (holds, the anchor's skeleton)
        self._stop = False
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    # -- setup -------------------------------------------------------------------------------------

    def compile(self) -> None:
        """Every program a live block runs, compiled and run once: the session's (`compile`), the
        restart's, and the skeleton render for both block lengths."""
        b = self.batch
        keys = slot_keys(self.seed, np.zeros(b, np.int32), 0)
        self.session.compile((b, self.height, self.width, 3), (b, *self.context_shape), keys)
        _restart_images(jnp.zeros(b, bool), self._images, self._images).block_until_ready()
        for n in (self.frames.session_first, self.frames.later):
            self._render([[None] * n] * b, self._k)

    def start(self) -> None:
        if self.thread is not None:
            return
        self.thread = threading.Thread(target=self._run, name="rynn-live-world", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        with self.cond:
            self._stop = True
            self.cond.notify_all()
        if self.thread is not None:
            self.thread.join()

    # -- membership (event-loop thread) ------------------------------------------------------------

    @property
    def members(self) -> int:
        return sum(m is not None for m in self.slots) + len(self.pending)

    def join(self, member: Member) -> bool:
        """Queue `member` for the next restart; False when all B slots are taken."""
        with self.cond:
            if self.members >= self.batch:
                return False
            self.pending.append(member)
            self.cond.notify_all()
            return True

    def leave(self, member: Member) -> None:
        with self.cond:
            if member in self.pending:
                self.pending.remove(member)
            self.slots = [None if m is member else m for m in self.slots]
            self.cond.notify_all()

    def poke(self) -> None:
        """New ticks arrived."""
        with self.cond:
            self.cond.notify_all()

    # -- the model thread --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._next_block():
                pass
        except BaseException as e:  # a broken model stops every session: they are told, the server exits
            self.error = e
            for m in [*self.slots, *self.pending]:
                if m is not None:
                    m.deliver(None)

    def _ready(self, m: Member, need: int) -> bool:
        return len(m.queue) >= need

    def _next_block(self) -> bool:
        first = self.frames.session_first
        with self.cond:
            # Wait for work: a joiner with its first block of ticks, or an active slot with any tick.
            while not self._stop and not (any(self._ready(m, first) for m in self.pending)
                                          or any(m is not None and len(m.queue) for m in self.slots)):
                self.cond.wait(0.5)
            if self._stop:
                return False
            idle = all(m is None for m in self.slots)
            if idle and self.admit_wait_s > 0:  # gather the sessions that start together
                deadline = time.monotonic() + self.admit_wait_s
                while not self._stop and time.monotonic() < deadline and not all(
                        self._ready(m, first) for m in self.pending):
                    self.cond.wait(deadline - time.monotonic())
            joiners = [m for m in self.pending if self._ready(m, first)]
            for m in joiners:
                self.pending.remove(m)
                slot = self.slots.index(None)
                self.slots[slot] = m
                self._k[slot] = m.intrinsics
            restart = bool(joiners) or self.session.state is None
            if not any(m is not None for m in self.slots):
                return True
            joined = {id(m) for m in joiners}
            # Per slot: new ticks wanted (a continuing slot's first frame at a restart is its last one).
            n = first if restart else self.session.frames_needed
            need = [0 if m is None else n if (id(m) in joined or not restart) else n - 1 for m in self.slots]
            deadline = time.monotonic() + self.max_wait_s
            while not self._stop and time.monotonic() < deadline and not all(
                    m is None or len(m.queue) >= k for m, k in zip(self.slots, need)):
                self.cond.wait(deadline - time.monotonic())
            members = list(self.slots)
        t_block = time.perf_counter()
        plan, held = [], []
        for b, (m, k) in enumerate(zip(members, need)):
            if m is None:
                plan.append([None] * n)
                held.append(0)
                continue
            ticks = m.queue.take(k)
            short = k - len(ticks)
            last = ticks[-1] if ticks else self._last[b] if id(m) not in joined else None
            if last is None:  # a joiner is admitted only with a full block, so this is a continuing slot
                last = self._last[b]
            ticks = ticks + [last] * short
            if restart and id(m) not in joined:
                ticks = [self._last[b]] + ticks  # the anchor's skeleton
            plan.append(ticks)
            held.append(short)
            self._last[b] = ticks[-1]
        skeleton = self._render(plan, self._k)
        if restart:
            self._restart(members, joiners)
        video = self.session.step(skeleton.astype(np.float32) / np.float32(127.5) - np.float32(1.0))
        video = np.clip(np.round((np.asarray(video) + 1.0) * 127.5), 0, 255).astype(np.uint8)
        seconds = time.perf_counter() - t_block
        for b, m in enumerate(members):
            if m is None:
                continue
            skip = 1 if restart and id(m) not in joined else 0  # the re-anchored frame, already sent
            m.deliver(Block(self.blocks, b, self.restarts, plan[b][skip:], video[b, skip:], skeleton[b, skip:], held[b], restart,
                            seconds))
        self.blocks += 1
        return True

    def _restart(self, members: list[Member | None], joiners: list[Member]) -> None:
        join = np.zeros(self.batch, bool)
        for b, m in enumerate(members):
            if m is not None and m in joiners:
                join[b] = True
                self._images[b], self._contexts[b], self._ids[b] = m.image, m.context, m.id
        last = self.session.state["last_rgb"] if self.session.state is not None else self._images
        images = _restart_images(jnp.asarray(join), self._images, last)
        self.restarts += 1
        self.session.start(images, self._contexts, slot_keys(self.seed, self._ids, self.restarts))

    def _render(self, plan: list[list[Tick | None]], k_b33: np.ndarray) -> np.ndarray:
        """(B, n, H, W, 3) uint8 skeleton frames of every slot's ticks (None: a black frame), slot b
        seen through its camera `k_b33[b]`."""
        b, n = len(plan), len(plan[0])
        nan = np.full((2, 21, 3), np.nan, np.float32)
        flat = [t for row in plan for t in row]
        joints = np.stack([nan if t is None else t.joints for t in flat])
        elbows = np.stack([nan[:, 0] if t is None else t.elbows for t in flat])
        valid = np.stack([np.zeros((2, 22), bool) if t is None else t.valid for t in flat])
        frames = render_video(self.rcfg, joints, elbows, np.repeat(k_b33, n, 0), valid)
        return np.asarray(frames).reshape(b, n, self.height, self.width, 3)

