"""A small asyncio client of the live server (tests, the load benchmark, scripted operators).

    async with LiveClient("ws://127.0.0.1:8765/ws") as c:
        await c.start(frames="raw")
        for f in protocol.frames_at(stream, 60.0):
            await c.frame(f)
        await c.until(lambda c: c.count("block") >= 2)

Every message is kept: `messages` (the JSON ones, in order, each with `_rx`, its arrival on
`time.monotonic()`) and `images` (decoded frames: kind, index, input time, (H, W, 3) uint8);
`sent` maps an input time to when it was sent.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import aiohttp

from rynn_jax.live import protocol


class LiveClient:
    def __init__(self, url: str, *, decode: bool = True):
        self.url, self.decode = url, decode
        self.messages: list[dict] = []
        self.images: list[tuple[str, int, float, object]] = []
        self.sent: dict[float, float] = {}
        self.close_code: int | None = None
        self.close_reason = ""
        self._changed = asyncio.Event()

    async def __aenter__(self) -> LiveClient:
        self.http = aiohttp.ClientSession()
        try:
            self.ws = await self.http.ws_connect(self.url, max_msg_size=0)
        except BaseException:
            await self.http.close()
            raise
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc) -> None:
        await self.ws.close()
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
        await self.http.close()

    async def _read(self) -> None:
        while True:
            msg = await self.ws.receive()
            if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED,
                            aiohttp.WSMsgType.ERROR):
                if msg.type == aiohttp.WSMsgType.CLOSE:
                    self.close_code, self.close_reason = msg.data, msg.extra or ""
                break
            if msg.type == aiohttp.WSMsgType.TEXT:
                m = json.loads(msg.data)
                m["_rx"] = time.monotonic()  # when it came (latency measurements)
                self.messages.append(m)
            elif msg.type == aiohttp.WSMsgType.BINARY:
                self.images.append(protocol.decode_frame(msg.data) if self.decode else (chr(msg.data[0]), 0, 0.0, None))
            self._changed.set()
        if self.close_code is None:
            self.close_code = self.ws.close_code
        self._changed.set()

    @property
    def closed(self) -> bool:
        return self._reader.done()

    def of(self, kind: str) -> list[dict]:
        return [m for m in self.messages if m["type"] == kind]

    def count(self, kind: str) -> int:
        return sum(m["type"] == kind for m in self.messages)

    async def until(self, done: Callable[[LiveClient], bool], timeout: float = 30.0) -> None:
        """Wait until `done(self)` (checked on every message); TimeoutError naming the wait otherwise."""
        deadline = time.monotonic() + timeout
        while not done(self):
            if self.closed and not done(self):
                raise ConnectionError(f"closed ({self.close_code}) before the condition held; last: "
                                      f"{self.messages[-3:]}")
            self._changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no such message within {timeout} s; last: {self.messages[-3:]}")
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except asyncio.TimeoutError:
                pass

    async def send_json(self, message: dict) -> None:
        await self.ws.send_str(json.dumps(message))

    async def start(self, **fields) -> None:
        await self.send_json({"type": "start", "schema": protocol.SCHEMA, **fields})

    async def frame(self, f: protocol.Frame, *, binary: bool = False) -> None:
        self.sent[f.t] = time.monotonic()
        if binary:
            await self.ws.send_bytes(protocol.pack_frame(f))
        else:
            await self.send_json(protocol.frame_json(f))

    async def stop(self) -> None:
        await self.send_json({"type": "stop"})
