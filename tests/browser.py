"""A real Streamlit server and Debian's Chromium driven by Playwright (see shared TESTING.md)."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run", "--disable-sync", "--disable-quic"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def streamlit_server(timeout: float = 90.0):
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    log = open(ARTIFACTS / f"server-{port}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
                             "--server.port", str(port), "--server.address", "127.0.0.1",
                             "--browser.gatherUsageStats", "false"], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # poll the health endpoint, not a fixed sleep
            if proc.poll() is not None:
                raise RuntimeError(f"streamlit exited early; see {log.name}")
            with contextlib.suppress(OSError):
                import urllib.request
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).status == 200:
                    break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"streamlit did not answer within {timeout:.0f} s; see {log.name}")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.poll() is None:
            proc.kill()
        log.close()


def wait_idle(page, timeout_ms: int = 120_000):
    """Wait until Streamlit has finished the rerun (the running-man status widget is gone)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    with contextlib.suppress(PlaywrightTimeout):  # a fast rerun may finish before it is seen
        page.wait_for_selector('[data-testid="stStatusWidget"]', state="attached", timeout=1500)
    page.wait_for_selector('[data-testid="stStatusWidget"]', state="detached", timeout=timeout_ms)
