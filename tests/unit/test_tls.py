"""TLS from the user's certificate (proxy.tls_cert/tls_key): what the proxy and a replica set's
front serve, what clients trust, and the spec's refusals. On real certificates made by openssl."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ftcluster.client.endpoint import Endpoint
from ftcluster.plan.endpoint import access_problems, caddy_config, loopback_ports, tls_name
from ftcluster.plan.replicas import front_config, member_cluster
from ftcluster.access.run_access import tls_cert_of
from tests.helpers_specs import cluster


def _cert(folder: Path, subject: str, san: str | None) -> tuple[str, str]:
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", subject,
                    *(["-addext", f"subjectAltName={san}"] if san else [])], check=True, capture_output=True)
    return str(cert), str(key)


def test_the_certificate_s_first_name(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert tls_name(_cert(tmp_path / "a", "/CN=ignored", "DNS:serve.example,DNS:node1")[0]) == "serve.example"
    assert tls_name(_cert(tmp_path / "b", "/CN=only-cn", None)[0]) == "only-cn"
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    assert tls_name(str(tmp_path / "junk.pem")) is None
    assert tls_name(str(tmp_path / "missing.pem")) is None


def _policies(cfg: dict) -> list[dict]:  # type: ignore[type-arg]
    return [s.get("tls_connection_policies") for s in cfg["apps"]["http"]["servers"].values()]


def test_the_proxy_and_the_front_serve_the_certificate_whatever_name_is_asked(tmp_path: Path) -> None:
    cert, key = _cert(tmp_path, "/CN=x", "DNS:node1")
    c = cluster(scheduler="slurm", access="private", proxy={"tls_cert": cert, "tls_key": key})
    policy = [{"default_sni": "node1", "fallback_sni": "node1"}]
    proxy = caddy_config(c.ports, loopback_ports(c.ports, c.proxy), c.proxy)
    assert _policies(proxy) == [policy, policy]
    assert proxy["apps"]["tls"]["certificates"]["load_files"] == [{"certificate": cert, "key": key}]
    assert all(s["protocols"] == ["h1", "h2"] for s in proxy["apps"]["http"]["servers"].values())
    front = front_config(c.model_copy(update={"replicas": 2}), "")
    assert _policies(front) == [policy, policy]
    assert front["apps"]["tls"]["certificates"]["load_files"] == [{"certificate": cert, "key": key}]
    # TLS ends at the front: its members' doors are plain, with the set's token.
    member = member_cluster(c.model_copy(update={"replicas": 2}), 0)
    assert member.proxy.tls_cert is None and member.proxy.tls_key is None
    plain = front_config(cluster(scheduler="slurm", replicas=2), "")
    assert _policies(plain) == [None, None] and "tls" not in plain["apps"]


def test_a_certificate_that_cannot_serve_is_refused_naming_the_field(tmp_path: Path) -> None:
    (tmp_path / "junk.pem").write_text("junk\n")
    bad = cluster(scheduler="slurm", access="private",
                  proxy={"tls_cert": str(tmp_path / "junk.pem"), "tls_key": str(tmp_path / "junk.pem")})
    assert any(p.startswith("proxy.tls_cert:") and "PEM certificate" in p for p in access_problems(bad))
    cert, key = _cert(tmp_path, "/CN=x", "DNS:node1")
    unproxied = cluster(scheduler="slurm", access="cluster", proxy={"tls_cert": cert, "tls_key": key})
    assert any(p.startswith("proxy.tls_cert:") and "access: private" in p for p in access_problems(unproxied))
    assert access_problems(cluster(scheduler="slurm", access="private", proxy={"tls_cert": cert, "tls_key": key})) == []


@pytest.mark.parametrize(("url", "tls"), [("node1:8000", False), ("http://node1:8000", False),
                                          ("https://node1:8000/", True), ("grpcs://node1:8001", True)])
def test_an_https_or_grpcs_url_asks_for_tls(url: str, tls: bool) -> None:
    e = Endpoint.parse(url, token="secret")
    assert (e.url, e.tls) == (url.split("://")[-1].rstrip("/"), tls)
    assert "secret" not in repr(e)


def test_a_run_s_certificate_is_found_for_its_clients(tmp_path: Path) -> None:
    """--run trusts what the run serves: a run's proxy (its rendered scripts/job.json), a set's
    front (scripts/front.json); nothing for a plain run."""
    from ftcluster.run.replica_files import FRONT_SETTINGS
    from tests.unit.test_render import render_style

    cert, key = _cert(tmp_path, "/CN=x", "DNS:node1")
    run, front, plain = (tmp_path / n for n in ("run", "front", "plain"))
    render_style("none", run_dir=run, access="private", proxy={"tls_cert": cert, "tls_key": key}).materialize(
        run / "scripts")
    render_style("none", run_dir=plain, access="private").materialize(plain / "scripts")
    (front / "scripts").mkdir(parents=True)
    (front / "scripts" / FRONT_SETTINGS).write_text(json.dumps({"tls_cert": "/front.pem"}))
    assert tls_cert_of(run) == cert
    assert tls_cert_of(front) == "/front.pem"
    assert tls_cert_of(plain) is None
