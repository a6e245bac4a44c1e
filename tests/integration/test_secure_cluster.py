"""A 3-node cluster started from what ``txbroker cluster init --secure`` writes serves HTTPS only."""

from __future__ import annotations

import base64
import os
import ssl
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.client import HTTPException
from pathlib import Path

import pytest

from tests.support.cluster import REPO, LocalCluster, cluster_init_secure, http, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def secure_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    d = tmp_path / "secure"
    res = cluster_init_secure(d)
    assert res.returncode == 0, res.stderr
    assert str(d / "admin.toml") in res.stdout
    cluster = LocalCluster.from_dir(d)
    try:
        yield cluster.start_live()
    finally:
        cluster.close()


def test_secure_cluster_serves_https_only(secure_cluster: LocalCluster) -> None:
    d = secure_cluster.dir
    assert secure_cluster.ssl_context is not None
    admin = tomllib.loads((d / "admin.toml").read_text())
    trusted = ssl.create_default_context(cafile=str(d / admin["ssl_cafile"]))
    urls = admin["bootstrap"].split(",")
    assert urls == secure_cluster.urls and all(u.startswith("https://") for u in urls)

    for url in urls:
        status, body = http("GET", url + "/livez", context=trusted, timeout=10)
        assert (status, body) == (200, {"status": "ok"})
        # the certificate also names the node "localhost"
        status, _ = http("GET", url.replace("127.0.0.1", "localhost") + "/livez", context=trusted, timeout=10)
        assert status == 200

        plain = url.replace("https://", "http://")
        with pytest.raises((OSError, HTTPException)):
            urllib.request.urlopen(plain + "/livez", timeout=10)

        untrusting = ssl.create_default_context()  # the system CAs only
        with pytest.raises(urllib.error.URLError) as err:
            urllib.request.urlopen(url + "/livez", timeout=10, context=untrusting)
        assert isinstance(err.value.reason, ssl.SSLCertVerificationError)

    for i in range(1, secure_cluster.n + 1):
        assert "node is open" not in secure_cluster.log_text(i)

    # private files stay private; the admin password is nowhere but admin.toml (node logs included)
    for name in ("admin.toml", "metrics.password", "certs/ca.key", "certs/node-1.key", "node-1.toml"):
        assert (d / name).stat().st_mode & 0o777 == 0o600, name
    password = admin["password"].encode()
    for p in d.rglob("*"):
        if p.is_file() and p.name != "admin.toml":
            assert password not in p.read_bytes(), p


def test_a_node_added_to_a_secure_cluster_gets_its_certificate_and_joins(secure_cluster: LocalCluster) -> None:
    d = secure_cluster.dir
    admin_cfg = tomllib.loads((d / "admin.toml").read_text())
    auth = "Basic " + base64.b64encode(f"admin:{admin_cfg['password']}".encode()).decode()

    def admin_known() -> bool:  # the controller leader records the bootstrap users once elected
        status, _ = http("GET", secure_cluster.url(1) + "/v1/whoami", headers={"Authorization": auth},
                         context=secure_cluster.ssl_context, timeout=10)  # fmt: skip
        return status == 200

    wait_for(admin_known, 60, "the bootstrap admin user")
    res = subprocess.run(
        [sys.executable, "-m", "cluster", "cluster", "add-node", "--dir", str(d), "--command-config",
         str(d / "admin.toml")],
        capture_output=True, text=True, timeout=60, cwd=str(REPO), check=False,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert secure_cluster.adopt(d / "node-4.toml") == 4
    assert (d / "certs" / "node-4.pem").is_file() and "https://" in res.stdout
    new = secure_cluster.configs[3]
    assert f'"{new.host}:{new.http_port}"' in (d / "prometheus.yml").read_text()  # scraped too
    secure_cluster.start_node(4)
    secure_cluster.wait_ready(timeout=60)

    def voter() -> bool:
        status, body = http("GET", secure_cluster.url(4) + "/v1/nodes/4", headers={"Authorization": auth},
                            context=secure_cluster.ssl_context, timeout=10)  # fmt: skip
        return status == 200 and body["controller_voter"] and body["alive"]

    wait_for(voter, 60, "node 4's controller vote over HTTPS")
    # registering needs ALTER on the cluster: an anonymous caller is refused, nothing changes
    node = {"host": "127.0.0.1", "http_port": 7, "raft_port": 8}
    status, body = http("POST", secure_cluster.url(1) + "/v1/nodes", node, context=secure_cluster.ssl_context)
    assert status == 401, body


def test_open_node_warns_at_start(tmp_path: Path) -> None:
    d = tmp_path / "open"
    cluster = LocalCluster(d, 1)
    try:
        cluster.start_node(1)
        cluster.wait_live()
        assert "node 1 is open: no [security] section" in cluster.log_text(1)
    finally:
        cluster.close()


def test_node_with_a_mismatched_key_refuses_to_start(tmp_path: Path) -> None:
    d = tmp_path / "bad"
    assert cluster_init_secure(d, n=1).returncode == 0
    config = d / "node-1.toml"
    config.write_text(config.read_text().replace('tls_key_file = "certs/node-1.key"', 'tls_key_file = "certs/ca.key"'))
    res = subprocess.run(
        [sys.executable, "-m", "cluster", "node", "start", "--config", str(config)],
        capture_output=True, text=True, timeout=60, check=False, cwd=str(REPO),
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )  # fmt: skip
    assert res.returncode == 2
    assert "cannot start: TLS certificate" in res.stderr and "do not load together" in res.stderr
    assert "Traceback" not in res.stderr
