"""deploy/nginx.conf, rendered for the replicas' ports as replicas.sh renders it (deploy/nginx_conf.sh),
passes `nginx -t` (Debian's nginx-light, which `make test` installs), a broken one does not, and the
rendered proxy really forwards, keeping one client on one replica (ip_hash)."""
from __future__ import annotations

import contextlib
import http.server
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path


from tests.browser import free_port

ROOT = Path(__file__).resolve().parents[1]
RENDER = ROOT / "deploy" / "nginx_conf.sh"


def nginx() -> str:
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)
    assert found, "nginx is not installed: `make test` installs Debian's nginx-light (make nginx)"
    return found


def render(tmp_path: Path, ports, listen: int) -> Path:
    out = subprocess.run(["sh", str(RENDER), " ".join(map(str, ports)), str(listen)], capture_output=True,
                         text=True, timeout=30, check=True)
    conf = tmp_path / "attnviz.conf"
    conf.write_text(out.stdout)
    return conf


def check(tmp_path: Path, conf: Path) -> subprocess.CompletedProcess:
    return subprocess.run([nginx(), "-e", str(tmp_path / "startup.log"), "-t", "-p", str(tmp_path), "-c", str(conf)],
                          capture_output=True, text=True, timeout=30)


def test_rendered_config_passes_nginx_t(tmp_path):
    conf = render(tmp_path, (9101, 9102, 9103), 9180)
    text = conf.read_text()
    assert [line.strip() for line in text.splitlines() if line.strip().startswith("server 127.")] == [
        "server 127.0.0.1:9101;", "server 127.0.0.1:9102;", "server 127.0.0.1:9103;"]
    assert "listen 9180;" in text and "ip_hash;" in text
    got = check(tmp_path, conf)
    assert got.returncode == 0, got.stderr
    assert "syntax is ok" in got.stderr and "test is successful" in got.stderr


def test_a_broken_config_fails_the_check_and_bad_ports_are_refused(tmp_path):
    conf = render(tmp_path, (9101,), 9180)
    conf.write_text(conf.read_text().replace("ip_hash;", "ip_hash_sticky_please;"))
    got = check(tmp_path, conf)
    assert got.returncode != 0 and "ip_hash_sticky_please" in got.stderr
    for ports, listen in (("8501 eighty", "8080"), ("8501", "70000"), ("", "8080")):
        bad = subprocess.run(["sh", str(RENDER), ports, listen], capture_output=True, text=True, timeout=30)
        assert bad.returncode != 0 and bad.stdout == "", (ports, listen)


class Named(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = self.server.name.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def backend(name: str, port: int):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Named)
    server.name = name
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def get(url: str, deadline: float) -> str:
    """GET through nginx once it listens (polled, no fixed sleep)."""
    while True:
        try:
            return urllib.request.urlopen(url, timeout=5).read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_the_rendered_proxy_forwards_and_keeps_a_client_on_one_replica(tmp_path):
    ports, listen = (free_port(), free_port()), free_port()
    conf = render(tmp_path, ports, listen)
    conf.write_text(conf.read_text().replace("worker_processes auto;", "worker_processes 1;"))
    with backend("replica-1", ports[0]), backend("replica-2", ports[1]):
        proc = subprocess.Popen([nginx(), "-e", str(tmp_path / "startup.log"), "-p", str(tmp_path), "-c", str(conf),
                                 "-g", "daemon off;"], stderr=subprocess.PIPE, text=True)
        try:
            answers = [get(f"http://127.0.0.1:{listen}/_stcore/health", time.monotonic() + 30) for _ in range(6)]
        finally:
            proc.terminate()
            proc.wait(15)
    assert answers[0] in ("replica-1", "replica-2") and set(answers) == {answers[0]}, answers
