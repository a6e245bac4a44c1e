"""The CLI with ``--command-config`` over HTTPS: subprocesses against a fake TLS broker (throwaway CA).

What the commands send is checked on the server side; the node's own
handling of ACLs and users is tested with the node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import REPO
from tests.support.fake_https_broker import FakeHttpsBroker

pytestmark = pytest.mark.integration


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[FakeHttpsBroker]:
    d = tmp_path / "broker"
    d.mkdir()
    b = FakeHttpsBroker(d).start()
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def config(broker: FakeHttpsBroker, tmp_path: Path) -> Path:
    """A client config in its own folder, naming the CA by a path relative to that folder."""
    d = tmp_path / "client"
    (d / "certs").mkdir(parents=True)
    (d / "certs" / "ca.pem").write_bytes(broker.ca.ca_file.read_bytes())
    f = d / "admin.toml"
    f.write_text(f'bootstrap = "{broker.url}"\nusername = "{broker.username}"\npassword = "{broker.password}"\n'
                 'ssl_cafile = "certs/ca.pem"\n')  # fmt: skip
    f.chmod(0o600)
    return f


def txbroker(*args: str, stdin: bytes = b"", cwd: Path = REPO) -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "cluster", *args], input=stdin, capture_output=True, timeout=120,
                          env=env, cwd=cwd)  # fmt: skip


def test_topic_list_and_whoami_use_the_config_files_url_ca_and_credentials(
    broker: FakeHttpsBroker, config: Path
) -> None:
    res = txbroker("topic", "list", "--bootstrap", "http://127.0.0.1:1", "--command-config", str(config))
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(b"t\tpartitions=1")
    res = txbroker("whoami", "--command-config", str(config))
    assert (res.returncode, res.stdout) == (0, b"User:alice\n"), res.stderr
    assert all(s.tls and s.authorization == broker.expected_authorization() for s in broker.requests())


def test_acl_and_user_commands(broker: FakeHttpsBroker, config: Path) -> None:
    cc = ("--command-config", str(config))
    res = txbroker("acl", "add", "--allow-principal", "User:bob", "--operation", "Read", "--operation", "Describe",
                   "--topic", "t", "--group", "g", *cc)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert b"added 4 ACLs" in res.stdout
    posted = json.loads(broker.requests("/v1/acls")[0].body)["acls"]
    assert {(a["resource_type"], a["operation"]) for a in posted} == {
        ("TOPIC", "READ"),
        ("TOPIC", "DESCRIBE"),
        ("GROUP", "READ"),
        ("GROUP", "DESCRIBE"),
    }
    res = txbroker("acl", "list", "--topic", "t", *cc)
    assert res.returncode == 0, res.stderr
    assert b"principal=User:bob, host=*, operation=READ, permissionType=ALLOW" in res.stdout
    before = len(broker.requests("/v1/acls"))
    res = txbroker("acl", "remove", "--topic", "t", *cc)
    assert res.returncode == 0 and b"nothing removed" in res.stderr
    assert [s.method for s in broker.requests("/v1/acls")[before:]] == ["GET"]
    res = txbroker("acl", "remove", "--topic", "t", "--force", *cc)
    assert res.returncode == 0, res.stderr
    assert broker.requests("/v1/acls")[-1].method == "DELETE"
    assert json.loads(broker.requests("/v1/acls")[-1].body) == {"resource_type": "TOPIC", "resource_name": "t"}

    res = txbroker("user", "create", "carol", "--password-stdin", "--mechanism", "SCRAM-SHA-512", *cc,
                   stdin=b"pa ss\n")  # fmt: skip
    assert res.returncode == 0, res.stderr
    put = broker.requests("/v1/users/carol")[0]
    assert json.loads(put.body) == {"password": "pa ss", "mechanism": "SCRAM-SHA-512"}
    res = txbroker("user", "list", *cc)
    assert (res.returncode, res.stdout) == (0, b"bob\tSCRAM-SHA-256\n")
    res = txbroker("user", "delete", "carol", *cc)
    assert res.returncode == 0 and broker.requests("/v1/users/carol")[-1].method == "DELETE"


def test_bad_config_files_exit_2_with_one_line(tmp_path: Path, broker: FakeHttpsBroker) -> None:
    res = txbroker("topic", "list", "--command-config", str(tmp_path / "absent.toml"))
    assert res.returncode == 2
    assert res.stderr.decode().strip().count("\n") == 0 and "no such file" in res.stderr.decode()
    bad = tmp_path / "bad.toml"
    bad.write_text("bootstrap = [")
    res = txbroker("whoami", "--command-config", str(bad))
    assert res.returncode == 2 and b"not valid TOML" in res.stderr
    wrong = tmp_path / "wrong.toml"
    wrong.write_text(f'bootstrap = "{broker.url}"\nusername = "alice"\npassword = "nope"\n'
                     f'ssl_cafile = "{broker.ca.ca_file}"\n')  # fmt: skip
    res = txbroker("whoami", "--command-config", str(wrong))
    assert res.returncode == 1 and b"SASL_AUTHENTICATION_FAILED" in res.stderr
    assert len(broker.requests()) == 1


def test_health_and_status_urllib_calls_trust_the_ca_and_carry_credentials_only_inside_the_block(
    broker: FakeHttpsBroker, config: Path
) -> None:
    import ssl
    import urllib.error
    import urllib.request

    from cluster.cli import build_parser
    from cluster.client_config import apply_command_config, urllib_security

    args = build_parser().parse_args(["cluster", "status", "--command-config", str(config)])
    apply_command_config(args)
    with urllib_security(args), urllib.request.urlopen(broker.url + "/v1/whoami", timeout=10) as resp:
        assert json.loads(resp.read()) == {"principal": "User:alice"}
    assert broker.requests()[-1].authorization == broker.expected_authorization()
    with pytest.raises(urllib.error.URLError) as info:
        urllib.request.urlopen(broker.url + "/v1/whoami", timeout=10)
    assert isinstance(info.value.reason, ssl.SSLCertVerificationError)
