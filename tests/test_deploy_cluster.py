"""The deploy recipe's cluster (deploy/cluster.sh, deploy/make_tls.sh) and replicas.sh's nginx folder:
the scheduler, a worker and its nanny, started as the recipe starts them, listen on the private
address only (nothing on 0.0.0.0), speak TLS with certificates from the recipe's CA, and refuse a
peer without one; replicas.sh keeps nginx's files in a private folder and refuses a symlink."""
import contextlib
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import distributed
import psutil
import pytest

from tests.browser import free_port

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
DASK = str(Path(sys.executable).with_name("dask"))


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tls") / "certs"
    subprocess.run(["sh", str(DEPLOY / "make_tls.sh"), str(folder)], check=True, capture_output=True, timeout=120)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    return folder


def security(certs, role="client"):
    return distributed.Security(tls_ca_file=str(certs / "ca.pem"), tls_client_cert=str(certs / f"{role}.pem"),
                                tls_client_key=str(certs / f"{role}-key.pem"), require_encryption=True)


@contextlib.contextmanager
def started(role, log, **env):
    full = dict(os.environ, DASK=DASK, PRIVATE_HOST="127.0.0.1", PYTHONPATH=str(ROOT), **env)
    with open(log, "w") as out:
        proc = subprocess.Popen(["sh", str(DEPLOY / "cluster.sh"), role], cwd=ROOT, env=full, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def listening(proc) -> set[tuple[str, int]]:
    """Every (address, port) the process and its children listen on."""
    found = set()
    for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            found |= {(c.laddr.ip, c.laddr.port) for c in p.net_connections(kind="inet")
                      if c.status == psutil.CONN_LISTEN}
    return found


def test_the_recipes_cluster_listens_on_the_private_address_only_and_speaks_tls(tmp_path, certs):
    port = free_port()
    tls = dict(DASK_TLS_DIR=str(certs), SCHEDULER_PORT=str(port), DASHBOARD_PORT=str(free_port()))
    with started("scheduler", tmp_path / "scheduler.log", **tls) as scheduler, \
            started("worker", tmp_path / "worker.log", SCHEDULER_HOST="127.0.0.1", NWORKERS="1", **tls) as worker:
        address = f"tls://127.0.0.1:{port}"
        with distributed.Client(address, security=security(certs), timeout=60) as client:
            client.wait_for_workers(1, timeout=90)
            assert client.submit(sum, [1, 2, 3]).result(timeout=60) == 6
        sockets = listening(scheduler) | listening(worker)
        assert ("127.0.0.1", port) in sockets and len(sockets) >= 3   # scheduler, nanny, worker
        assert {ip for ip, _ in sockets} == {"127.0.0.1"}, sockets    # nothing on 0.0.0.0 or ::
        stranger = tmp_path / "stranger"          # certificates of another CA: not the recipe's
        subprocess.run(["sh", str(DEPLOY / "make_tls.sh"), str(stranger)], check=True, capture_output=True,
                       timeout=120)
        for bad in (dict(address=f"tcp://127.0.0.1:{port}"), dict(address=address, security=security(stranger))):
            with pytest.raises((OSError, TimeoutError)):
                distributed.Client(**bad, timeout=5)


@pytest.mark.parametrize("env, says", [
    (dict(PRIVATE_HOST="0.0.0.0"), "one private address"),
    (dict(PRIVATE_HOST="10.0.0.5"), "needs TLS"),
])
def test_the_recipe_refuses_every_interface_and_a_cluster_across_machines_without_tls(env, says):
    got = subprocess.run(["sh", str(DEPLOY / "cluster.sh"), "scheduler"], env=dict(os.environ, DASK="false", **env),
                         capture_output=True, text=True, timeout=30)
    assert got.returncode == 2 and says in got.stderr


def replicas(tmp_path, **env):
    """replicas.sh with a stand-in `streamlit` (it only renders nginx's config and starts the replicas)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "streamlit").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "streamlit").chmod(0o755)
    full = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", HOME=str(tmp_path / "home"),
                ATTNVIZ_CACHE=str(tmp_path), ATTNVIZ_SCHEDULER="tcp://127.0.0.1:8786")
    full.pop("XDG_RUNTIME_DIR", None)
    full.update(env)
    return subprocess.run(["sh", str(DEPLOY / "replicas.sh")], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=60)


def test_replicas_keep_nginx_files_in_a_private_folder_never_through_a_symlink(tmp_path, certs):
    got = replicas(tmp_path)
    assert got.returncode == 0, got.stderr
    folder = tmp_path / "home" / ".cache" / "attnviz-nginx"
    assert (folder / "attnviz.conf").is_file() and stat.S_IMODE(folder.stat().st_mode) == 0o700
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "planted").symlink_to(victim)
    got = replicas(tmp_path, NGINX_DIR=str(tmp_path / "planted"))
    assert got.returncode == 2 and "symlink" in got.stderr and not list(victim.iterdir())
    got = replicas(tmp_path, ATTNVIZ_SCHEDULER="tcp://10.0.0.5:8786")
    assert got.returncode == 2 and "tls://" in got.stderr
    got = replicas(tmp_path, ATTNVIZ_SCHEDULER="tls://10.0.0.5:8786", DASK_TLS_DIR=str(certs))
    assert got.returncode == 0, got.stderr
