"""What ``txbroker cluster init --secure`` writes: certificates, [security] sections, admin.toml, prometheus.yml."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml

from cluster.cli import main
from cluster.config import load_config
from cluster.health import Access
from cluster.prometheus_config import render_prometheus_config
from cluster.security.certs import certificate_covers
from cluster.security.scram import ScramCredential, check_password


def init(d: Path, *extra: str) -> int:
    return main(["cluster", "init", "--secure", "--dir", str(d), "--base-port", "29091", *extra])


def files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_secure_init_writes_certificates_sections_and_client_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "c"
    assert init(d) == 0
    out = capsys.readouterr().out
    assert str(d / "admin.toml") in out and "https://127.0.0.1:29091" in out
    assert "kafka bootstrap servers: 127.0.0.1:29097,127.0.0.1:29098,127.0.0.1:29099  (SASL_SSL;" in out
    for name in ("ca.pem", "ca.key", "node-1.pem", "node-1.key", "node-2.pem", "node-3.key"):
        assert (d / "certs" / name).is_file(), name
    for name in ("admin.toml", "metrics.password", "certs/ca.key", "certs/node-2.key", "node-1.toml"):
        assert (d / name).stat().st_mode & 0o777 == 0o600, name

    admin = tomllib.loads((d / "admin.toml").read_text())
    assert set(admin) == {"bootstrap", "username", "password", "ssl_cafile"}
    assert admin["username"] == "admin" and len(admin["password"]) >= 24
    assert admin["bootstrap"] == ",".join(f"https://127.0.0.1:{p}" for p in (29091, 29092, 29093))
    assert (d / admin["ssl_cafile"]).resolve() == (d / "certs" / "ca.pem").resolve()
    metrics_password = (d / "metrics.password").read_text()

    raw = tomllib.loads((d / "node-2.toml").read_text())["security"]
    assert raw["tls_cert_file"] == "certs/node-2.pem"  # relative to the config's folder
    cfg = load_config(d / "node-2.toml")
    sec = cfg.security
    assert sec is not None and sec.tls
    assert sec.tls_cert_file == (d / "certs" / "node-2.pem").resolve()
    assert sec.tls_ca_file == (d / "certs" / "ca.pem").resolve()
    assert (sec.tls_client_auth, sec.authentication, sec.authorizer) == ("none", ("basic",), True)
    assert (sec.super_users, sec.allow_everyone_if_no_acl_found, sec.metrics_public) == (("User:admin",), False, False)
    assert cfg.url == "https://127.0.0.1:29092" and all(n.url.startswith("https://") for n in cfg.nodes)
    users = {u.name: ScramCredential.from_bootstrap(u) for u in sec.bootstrap_users}
    assert set(users) == {"admin", "metrics"}
    assert check_password(users["admin"], admin["password"])
    assert check_password(users["metrics"], metrics_password)
    assert not check_password(users["admin"], metrics_password)
    assert sec.bootstrap_acls == ({
        "principal": "User:metrics", "host": "*", "resource_type": "CLUSTER", "resource_name": "kafka-cluster",
        "pattern_type": "LITERAL", "operation": "DESCRIBE", "permission": "ALLOW",
    },)  # fmt: skip
    assert certificate_covers(sec.tls_cert_file, d / "certs" / "ca.pem", "127.0.0.1")

    # no plain password in any file but the two that exist to hold one
    for name, data in files(d).items():
        if name != "admin.toml":
            assert admin["password"].encode() not in data, name
        if name != "metrics.password":
            assert metrics_password.encode() not in data, name

    prom = yaml.safe_load((d / "prometheus.yml").read_text())
    job = prom["scrape_configs"][0]
    assert job["scheme"] == "https"
    assert job["basic_auth"] == {"username": "metrics", "password_file": "metrics.password"}
    assert job["tls_config"] == {"ca_file": "certs/ca.pem"}
    assert job["static_configs"][0]["targets"] == [f"127.0.0.1:{p}" for p in (29091, 29092, 29093)]


def test_init_again_keeps_every_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "c"
    assert init(d) == 0
    before = files(d)
    assert init(d) == 1  # configs there: refused, nothing touched
    assert files(d) == before
    assert init(d, "--force") == 0
    after = files(d)
    for name in ("admin.toml", "metrics.password", "certs/ca.pem", "certs/ca.key", "certs/node-1.pem",
                 "certs/node-3.key"):  # fmt: skip
        assert after[name] == before[name], name
    admin = tomllib.loads((d / "admin.toml").read_text())
    sec = load_config(d / "node-1.toml").security
    assert sec is not None
    assert check_password(ScramCredential.from_bootstrap(sec.bootstrap_users[0]), admin["password"])
    # a node whose host changed gets a certificate naming the new host, from the same CA
    assert main(["cluster", "init", "--secure", "--dir", str(d), "--force", "--host", "broker.example"]) == 0
    assert files(d)["certs/ca.pem"] == before["certs/ca.pem"]
    assert files(d)["certs/node-1.pem"] != before["certs/node-1.pem"]
    assert certificate_covers(d / "certs" / "node-1.pem", d / "certs" / "ca.pem", "broker.example")
    capsys.readouterr()


def test_plain_init_stays_plain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "c"
    assert main(["cluster", "init", "--dir", str(d), "--base-port", "29091"]) == 0
    out = capsys.readouterr().out
    assert (
        "kafka 127.0.0.1:29097" in out
        and "kafka bootstrap servers: 127.0.0.1:29097,127.0.0.1:29098,127.0.0.1:29099\n" in out
    )
    assert load_config(d / "node-1.toml").security is None
    assert not (d / "certs").exists() and not (d / "admin.toml").exists()
    job = yaml.safe_load((d / "prometheus.yml").read_text())["scrape_configs"][0]
    assert "scheme" not in job and "basic_auth" not in job and "tls_config" not in job


def test_up_secure_refuses_plain_configs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "c"
    assert main(["cluster", "init", "--dir", str(d), "--base-port", "29091"]) == 0
    assert main(["cluster", "up", "--secure", "--dir", str(d), "--timeout", "1"]) == 2
    assert "without TLS" in capsys.readouterr().err


def test_prometheus_config_without_tls_for_http_urls() -> None:
    text = render_prometheus_config(["http://a:1"], basic_auth=("m", "pw"))
    job = yaml.safe_load(text)["scrape_configs"][0]
    assert "scheme" not in job and job["basic_auth"]["password_file"] == "pw"


def test_health_access_sends_basic_credentials() -> None:
    assert Access().headers() == {}
    assert Access(auth=("admin", "s3cret:x")).headers() == {"Authorization": "Basic YWRtaW46czNjcmV0Ong="}
