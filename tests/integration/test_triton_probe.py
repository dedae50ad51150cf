"""`triton_probe` against a real CPU tritonserver: ours, ready, and the busy-port trap."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ftcluster.service.triton_local import find_tritonserver
from ftcluster.client.ready import ours_ready, server_id
from tests.triton_server import TritonServer, free_ports, require_tritonserver, running_tritonserver

pytestmark = pytest.mark.triton

DEMO_REPO = Path(__file__).resolve().parents[2] / "ftcluster" / "demo" / "model_repository"
MODEL = "fastertransformer"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    require_tritonserver()
    with running_tritonserver([DEMO_REPO], log_dir=tmp_path_factory.mktemp("probe"),
                              extra_args=["--model-control-mode=explicit", f"--load-model={MODEL}"]) as s:
        yield s


def test_ours_and_ready(server: TritonServer) -> None:
    host, port = "127.0.0.1", server.http_port
    assert server_id(host, port) == server.server_id
    assert ours_ready(host, port, server.server_id)
    assert ours_ready(host, port, server.server_id, MODEL)
    assert not ours_ready(host, port, server.server_id, "not_in_the_repository")
    assert not ours_ready(host, port, "someone-else", MODEL)


def test_nothing_or_no_triton_answering() -> None:
    (port,) = free_ports(1)
    assert server_id("127.0.0.1", port, timeout=1) is None
    assert not ours_ready("127.0.0.1", port, "x", timeout=1)

    class NotTriton(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html>hello</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), NotTriton)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        other = httpd.server_address[1]
        assert server_id("127.0.0.1", other, timeout=1) is None   # 200, but not Triton's JSON
        assert not ours_ready("127.0.0.1", other, "x", timeout=1)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_second_server_on_a_busy_port_is_not_ours(server: TritonServer, tmp_path: Path) -> None:
    """TESTBED.md's trap: the newcomer logs "Started HTTPService" while the OTHER server answers."""
    grpc, metrics = free_ports(2)
    log = tmp_path / "second.log"
    with open(log, "wb") as out:
        second = subprocess.Popen(
            [str(find_tritonserver()), f"--model-repository={DEMO_REPO}", "--id=second",
             "--model-control-mode=explicit", f"--http-port={server.http_port}", "--http-address=127.0.0.1",
             f"--grpc-port={grpc}", f"--metrics-port={metrics}", "--grpc-address=127.0.0.1"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while second.poll() is None and time.monotonic() < deadline:
            # Health answers 200 all along, from the first server: never "ours" for the second.
            assert not ours_ready("127.0.0.1", server.http_port, "second", timeout=1)
            time.sleep(0.05)
        assert second.poll() is not None, "the second server did not exit on the busy port"
    finally:
        if second.poll() is None:
            second.kill()
        second.wait(timeout=10)
    assert ours_ready("127.0.0.1", server.http_port, server.server_id, MODEL)
