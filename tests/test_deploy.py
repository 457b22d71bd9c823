"""The shared deployment recipe (README, "The app on more than one machine"): two `streamlit run`
replicas on two loopback ports, one Dask scheduler and one worker, all real processes. Each replica
answers its health endpoint, and a corpus run started in each replica's Heads page (a real browser)
runs on the shared cluster's worker, not in the replica."""
from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.browser import ARGS, ARTIFACTS, CHROMIUM, ROOT, free_port, wait_idle

DASK = Path(sys.executable).with_name("dask")
# two replicas, a scheduler, a worker and a browser keep both cores busy: never beside another test that does
pytestmark = [pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (apt-get install chromium)"),
              pytest.mark.xdist_group("whole_machine")]


@contextlib.contextmanager
def process(args, log: Path, **env_extra):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT), **env_extra)
    with open(log, "w") as out:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(15)
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)


def replica(port: int, log: Path, **env):
    """One `streamlit run app.py` replica on a loopback port, as deploy/replicas.sh starts them."""
    return process([sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
                    "--server.port", str(port), "--server.address", "127.0.0.1",
                    "--browser.gatherUsageStats", "false"], log, PYTHONUNBUFFERED="1", **env)


def wait_healthy(procs, urls, timeout: float = 90.0):
    """Poll every replica's health endpoint (no fixed sleep) until all answer "ok"."""
    import urllib.request
    waiting, deadline = set(urls), time.monotonic() + timeout
    while waiting and time.monotonic() < deadline:
        for proc, url in zip(procs, urls):
            assert proc.poll() is None, f"the replica at {url} exited early"
            if url in waiting:
                with contextlib.suppress(OSError):
                    if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                        waiting.discard(url)
        time.sleep(0.2)
    assert not waiting, f"no health answer from {sorted(waiting)} within {timeout:.0f} s"


def wait_for_worker(address: str, timeout: float = 60.0):
    import distributed
    with distributed.Client(address, timeout=30) as client:
        client.wait_for_workers(1, timeout=timeout)
        return list(client.scheduler_info()["workers"])


def scored_tasks(address: str) -> int:
    """How many of the corpus runs' per-text tasks ("scored-...") the scheduler has seen."""
    import distributed

    def count(dask_scheduler):
        prefix = dask_scheduler.task_prefixes.get("scored")
        return 0 if prefix is None else sum(prefix.state_counts.values())
    with distributed.Client(address, timeout=30) as client:
        return client.run_on_scheduler(count)


def run_corpus_tool(browser, url: str) -> str:
    """Open the Heads page, pick the Corpus tool, run it (the editor's mask on 10 texts); returns
    the caption naming where it ran."""
    from playwright.sync_api import expect
    page = browser.new_page(viewport={"width": 1300, "height": 2400})
    try:
        page.set_default_timeout(90_000)
        page.goto(f"{url}/Heads?model=minilm")
        page.locator('[data-testid="stMetricValue"]').first.wait_for()
        wait_idle(page)
        page.get_by_role("radio", name="Corpus", exact=True).click()
        wait_idle(page)
        expect(page.get_by_text("on the Dask cluster at tcp://127.0.0.1", exact=False)).to_be_visible(timeout=60_000)
        page.get_by_role("button", name="Run on the corpus").click()
        try:
            expect(page.get_by_role("button", name="Summary CSV")).to_be_visible(timeout=150_000)
        except AssertionError:
            page.screenshot(path=str(ARTIFACTS / "deploy-corpus-run.png"))
            raise
        return page.get_by_text(re.compile(r"texts' steps done")).first.inner_text()
    finally:
        page.close()


def test_two_replicas_send_their_corpus_runs_to_one_scheduler(tmp_path):
    from playwright.sync_api import sync_playwright
    ARTIFACTS.mkdir(exist_ok=True)
    port, ports = free_port(), (free_port(), free_port())
    address = f"tcp://127.0.0.1:{port}"
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    scheduler = [str(DASK), "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"]
    worker = [str(DASK), "worker", address, "--nworkers", "1", "--nthreads", "1", "--no-dashboard",
              "--host", "127.0.0.1", "--name", "shared-worker"]
    # everything starts at once, as on separate machines; the replicas share the cache and the scheduler
    with process(scheduler, tmp_path / "scheduler.log"), process(worker, tmp_path / "worker.log"), \
            replica(ports[0], tmp_path / "replica-1.log", ATTNVIZ_SCHEDULER=address) as one, \
            replica(ports[1], tmp_path / "replica-2.log", ATTNVIZ_SCHEDULER=address) as two, \
            sync_playwright() as p:
        wait_healthy([one, two], urls)
        workers = wait_for_worker(address)
        assert len(workers) == 1
        seen = [scored_tasks(address)]
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            for url in urls:
                caption = run_corpus_tool(browser, url)
                assert workers[0] in caption and "in-process" not in caption, caption
                seen.append(scored_tasks(address))
        finally:
            browser.close()
        # each replica's run put its ten per-text tasks on the shared scheduler
        assert seen[0] == 0 and seen[1] >= 10 and seen[2] >= seen[1] + 10, seen
