"""Test helper: the live page in headless Chromium, inside a network namespace of its own where only
loopback is up (tests/test_live.py)."""

from __future__ import annotations

import io
import os
import shutil
import socket
import subprocess
import threading

import numpy as np
import pytest

from rynn_jax.live.server import ServerThread

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
needs_chromium = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="needs Debian's chromium and "
                                    "chromium-driver (apt-get install chromium chromium-driver)")


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
