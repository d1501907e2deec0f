"""Test helper: a live server on loopback (tiny random model, 2 slots) and the page in headless Chromium
inside a network namespace of its own (tests/test_live.py, tests/test_live_sim.py)."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import socket
import subprocess
import threading

import jax
import numpy as np
import pytest

from rynn_jax.live.operator import Kinematics
from rynn_jax.live.server import LiveConfig, LiveServer, ServerThread
from rynn_jax.live.world import LiveWorld
from rynn_jax.teleop.demo import streaming_session
from rynn_jax.teleop.generate import text_contexts

H, W = 64, 96
SLOTS = 2
FIRST, LATER = 5, 8  # the tiny student's blocks: 1 + 4(F−1) frames, then 4F (F = 2)
CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
needs_chromium = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="needs Debian's chromium and "
                                    "chromium-driver (apt-get install chromium chromium-driver)")


def start_server(record_dir) -> ServerThread:
    """The tiny model compiled for `SLOTS` sessions at H×W, served on 127.0.0.1 (any free port)."""
    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)  # compile time dominates at this size
    try:
        session = streaming_session(None, None, 0)
        world = LiveWorld(session, SLOTS, H, W, seed=7, max_wait_s=5.0, admit_wait_s=2.0)
        world.compile()
        kin = Kinematics.build()
        kin.warm_up()
        contexts = text_contexts(None, None, session.dit_cfg.text_len, session.dit_cfg.text_dim)
        cfg = LiveConfig(port=0, max_fps=100.0, idle_timeout_s=20.0, record_dir=record_dir, seed=7)
        runner = ServerThread(LiveServer(world, kin, contexts, cfg))
        runner.url = runner.__enter__()
    finally:
        jax.config.update("jax_disable_most_optimizations", before)
    return runner


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def in_own_netns(fn):
    """Run `fn` on a thread in a new network namespace with only loopback up (sockets it opens and
    processes it starts stay there); skip when the kernel or our privileges do not allow it."""
    import ctypes

    result: dict = {}

    def target():
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(0x40000000) != 0:  # CLONE_NEWNET, this thread only
            result["skip"] = f"unshare(CLONE_NEWNET) failed: {os.strerror(ctypes.get_errno())} (needs root)"
            return
        up = subprocess.run(["ip", "link", "set", "lo", "up"], capture_output=True, text=True)
        if up.returncode:
            result["skip"] = f"ip link set lo up failed: {up.stderr.strip()}"
            return
        try:
            result["value"] = fn()
        except BaseException as e:
            result["error"] = e

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "skip" in result:
        pytest.skip(result["skip"])
    if "error" in result:
        raise result["error"]
    return result["value"]


def page_shots(runner: ServerThread, query: str, counter: str, counts: tuple[int, ...], panels: tuple[str, ...],
               readouts: tuple[str, ...]) -> tuple[list[dict[str, np.ndarray]], dict[str, str]]:
    """Open the page at `/?query` in headless Chromium (only loopback reachable), and each time the
    readout `counter` reaches the next of `counts`, screenshot the canvases `panels` (float32 RGB);
    then read the text of `readouts`."""
    from PIL import Image

    selenium = pytest.importorskip("selenium.webdriver")

    def browse():
        sock = socket.socket()  # bound inside the namespace: the browser there reaches it, nothing else can
        sock.bind(("127.0.0.1", 0))
        port = runner.call(runner.server.add_socket(sock))
        opts = selenium.ChromeOptions()
        opts.binary_location = CHROMIUM
        for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-extensions", "--disable-sync",
                  '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1', "--window-size=1400,900"):
            opts.add_argument(a)
        driver = selenium.Chrome(options=opts, service=selenium.ChromeService(executable_path=CHROMEDRIVER))
        try:
            driver.get(f"http://127.0.0.1:{port}/?{query}")
            wait = lambda n: driver.execute_async_script(  # noqa: E731
                "const [id, n, done] = arguments; const t0 = Date.now();"
                "const v = () => +document.getElementById(id).textContent;"
                "const tick = () => (v() >= n || Date.now() - t0 > 60000) ? done(v()) : setTimeout(tick, 100);"
                "tick();", counter, n)
            driver.set_script_timeout(90)
            shots = []
            for n in counts:
                assert wait(n) >= n, driver.find_element("id", "log").text
                shots.append({p: np.asarray(Image.open(io.BytesIO(driver.find_element("id", p).screenshot_as_png))
                                            .convert("RGB"), np.float32) for p in panels})
            text = {k: driver.find_element("id", k).text for k in readouts}
        finally:
            driver.quit()
        return shots, text

    return in_own_netns(browse)
