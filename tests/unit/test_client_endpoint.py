"""HOST:PORT parsing and the CLI's user errors (no server)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ftcluster.client.endpoint import Endpoint
from ftcluster.errors import UserError


@pytest.mark.parametrize("url,want", [
    ("localhost:8000", "localhost:8000"), ("http://node-1:8001/", "node-1:8001"),
    ("grpc://10.0.0.2:8001", "10.0.0.2:8001"), ("[::1]:8000", "[::1]:8000"),
])
def test_parse_ok(url: str, want: str) -> None:
    assert Endpoint.parse(url).url == want


@pytest.mark.parametrize("url", ["localhost", "host:0", "host:99999", "a b:1", ":8000", "h:p"])
def test_parse_bad(url: str) -> None:
    with pytest.raises(UserError, match="HOST:PORT"):
        Endpoint.parse(url)


def test_bad_protocol() -> None:
    with pytest.raises(UserError, match="unknown protocol"):
        Endpoint.parse("h:1", "tcp")


def test_cli_bad_options_exit_3() -> None:
    r = subprocess.run([sys.executable, "-m", "ftcluster.client", "bench", "--url", "nohostport",
                        "--concurrency", "1"], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 3 and "error: --url" in r.stderr
    r = subprocess.run([sys.executable, "-m", "ftcluster", "client", "bench", "--url", "h:1",
                        "--concurrency", "1,x"], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 3 and "--concurrency" in r.stderr
