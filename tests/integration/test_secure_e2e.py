"""End to end on a secured cluster: a limited user runs an exactly-once copy pipeline over HTTPS.

The cluster comes from ``txbroker cluster init --secure`` (certificates, node
configs, ``admin.toml``). The admin (a super user) creates the user ``app``
and grants it exactly the ACLs the pipeline needs -- partly with the
``txbroker acl add --command-config admin.toml`` CLI, partly with
``Admin.create_acls`` -- and nothing else:

==========================  ==========================  =================================================
ACL (User:app, ALLOW)        resource                    needed by
==========================  ==========================  =================================================
WRITE                       TOPIC in                    the feeder's produce and AddPartitionsToTxn
WRITE                       TRANSACTIONAL_ID feeder-1   the feeder's InitProducerId, add partitions, end
READ                        TOPIC in                    fetch (consumers, copier); the copier's
                                                        transactional offset commit; implies DESCRIBE
                                                        (metadata, list offsets, offset fetch)
READ                        GROUP copier                join/heartbeat/leave, AddOffsetsToTxn, offset
                                                        commits; implies DESCRIBE (offset fetch)
WRITE                       TOPIC out                   the copier's produce and AddPartitionsToTxn
WRITE (PREFIXED)            TRANSACTIONAL_ID copier-    the copier's InitProducerId, add partitions,
                                                        add offsets, end; implies DESCRIBE (coordinator)
==========================  ==========================  =================================================

No IDEMPOTENT_WRITE on the cluster is needed: a transactional producer's
InitProducerId is authorized by WRITE on its transactional id. The output is
checked by the admin (``app`` may not read ``out``).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time
import tomllib
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from clients import Admin, Consumer, Producer
from clients.protocol import BrokerError, ErrorCode
from clients.security import basic_authorization
from cluster.client_config import load_client_config
from tests.support.cluster import REPO, LocalCluster, cluster_init_secure, http, wait_for

pytestmark = pytest.mark.integration

APP_PASSWORD = "app-pa55word"
COMMITTED = 3 * 100  # three committed feeder transactions of 100 records
ABORTED = 50


@dataclass
class Secure:
    cluster: LocalCluster
    admin_toml: Path
    app_toml: Path
    bootstrap: str
    cafile: str
    admin_options: dict[str, Any]

    def app(self, password: str = APP_PASSWORD) -> dict[str, Any]:
        """The clients' security keyword arguments of the user ``app``."""
        return {"sasl_plain_username": "app", "sasl_plain_password": password, "ssl_cafile": self.cafile}

    def admin(self) -> Admin:
        return Admin(self.bootstrap, **self.admin_options)


def txbroker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cluster", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=str(REPO), env=dict(os.environ, PYTHONPATH=str(REPO)), check=False)  # fmt: skip


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    d = tmp_path_factory.mktemp("secure-e2e") / "cluster"
    res = cluster_init_secure(d)
    assert res.returncode == 0, res.stderr
    cluster = LocalCluster.from_dir(d)
    try:
        cluster.start()  # waits for /readyz over HTTPS
        admin_toml = d / "admin.toml"
        cfg = load_client_config(admin_toml)
        assert cfg.bootstrap is not None
        cafile = cfg.security["ssl_cafile"]
        assert cafile is not None
        app_toml = d / "app.toml"
        app_toml.write_text(f'bootstrap = "{cfg.bootstrap}"\nusername = "app"\npassword = "{APP_PASSWORD}"\n'
                            f'ssl_cafile = "{cafile}"\n')  # fmt: skip
        app_toml.chmod(0o600)
        s = Secure(cluster, admin_toml, app_toml, cfg.bootstrap, cafile, dict(cfg.security))
        admin = s.admin()
        assert admin.whoami() == "User:admin"
        for topic in ("in", "out", "forbidden"):
            admin.create_topic(topic, partitions=3, replication_factor=3)
            admin.wait_for_leaders(topic)
        admin.upsert_user("app", APP_PASSWORD)
        assert "app" in {u["name"] for u in admin.list_users()}
        yield s
    finally:
        cluster.close()


def acl_add(s: Secure, *flags: str) -> None:
    res = txbroker("acl", "add", "--command-config", str(s.admin_toml), "--allow-principal", "User:app", *flags)
    assert res.returncode == 0, res.stderr
    assert "added" in res.stdout


@pytest.fixture(scope="module")
def granted(secure: Secure) -> Secure:
    """The pipeline's ACLs (module docstring), no more."""
    s = secure
    s.admin().create_acls(
        [
            {"principal": "User:app", "resource_type": "TOPIC", "resource_name": "in", "operation": "WRITE",
             "permission": "ALLOW"},
            {"principal": "User:app", "resource_type": "TRANSACTIONAL_ID", "resource_name": "feeder-1",
             "operation": "WRITE", "permission": "ALLOW"},
        ]
    )  # fmt: skip
    acl_add(s, "--operation", "Read", "--topic", "in", "--group", "copier")
    acl_add(s, "--operation", "Write", "--topic", "out")
    acl_add(s, "--operation", "Write", "--transactional-id", "copier-", "--resource-pattern-type", "prefixed")
    listed = s.admin().describe_acls(principal="User:app")
    assert {(a["resource_type"], a["resource_name"], a["pattern_type"], a["operation"]) for a in listed} == {
        ("TOPIC", "in", "LITERAL", "WRITE"),
        ("TRANSACTIONAL_ID", "feeder-1", "LITERAL", "WRITE"),
        ("TOPIC", "in", "LITERAL", "READ"),
        ("GROUP", "copier", "LITERAL", "READ"),
        ("TOPIC", "out", "LITERAL", "WRITE"),
        ("TRANSACTIONAL_ID", "copier-", "PREFIXED", "WRITE"),
    }
    return s


def read_committed(bootstrap: str, topic: str, expect: int, timeout_s: float = 60, **security: Any) -> list[bytes]:
    """Every record ``read_committed`` shows in ``topic`` once the positions reach the end offsets."""
    c = Consumer(bootstrap=bootstrap, isolation_level="read_committed", auto_offset_reset="earliest", **security)
    try:
        tps = [(topic, p) for p in range(3)]
        c.assign(tps)
        out: list[bytes] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            out += [r.value or b"" for r in c.poll(timeout_ms=300)]
            ends = c.end_offsets(tps)
            if len(out) >= expect and all(c.position(tp) >= ends[tp] for tp in tps):
                break
        return out
    finally:
        c.close()


def progress(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text(errors="replace").splitlines() if line.startswith("{")]


def no_connection_left_open() -> None:
    """A client that left a connection open is found by the collection (ResourceWarning: unraisable, fails)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        gc.collect()


def test_limited_user_copies_exactly_once_over_https(granted: Secure, tmp_path: Path) -> None:
    s = granted
    assert all(u.startswith("https://") for u in s.bootstrap.split(","))

    # the feeder: WRITE on topic in + WRITE on transactional id feeder-1
    sent = [f"rec-{i}".encode() for i in range(COMMITTED)]
    with Producer(bootstrap=s.bootstrap, transactional_id="feeder-1", **s.app()) as p:
        p.init_transactions()
        for t in range(3):
            p.begin_transaction()
            for v in sent[t * 100 : (t + 1) * 100]:
                p.send("in", value=v, key=v)  # keyed: spread over the partitions
            p.commit_transaction()
        p.begin_transaction()
        for i in range(ABORTED):
            p.send("in", value=f"aborted-{i}".encode())
        p.flush()
        p.abort_transaction()

    # read_committed consumer as app: READ on topic in
    got = read_committed(s.bootstrap, "in", COMMITTED, **s.app())
    assert sorted(got) == sorted(sent)

    # the copier as app: READ on in and group copier, WRITE on out and transactional ids copier-*
    log = tmp_path / "copier.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cluster", "copy", "--command-config", str(s.app_toml), "--from", "in",
             "--to", "out", "--group", "copier", "--transactional-id", "copier-1", "--commit-every", "100",
             "--progress-interval-ms", "0"],
            stdout=out, stderr=subprocess.STDOUT, cwd=str(REPO), env=dict(os.environ, PYTHONPATH=str(REPO)),
        )  # fmt: skip
    try:

        def copied_all() -> bool:
            assert proc.poll() is None, "the copier exited: " + log.read_text(errors="replace")[-3000:]
            return any(line.get("copied", 0) >= COMMITTED for line in progress(log))

        wait_for(copied_all, 90, "the copier to copy every committed input record")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text(errors="replace")[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    last = progress(log)[-1]
    assert last["stage"] == "ShutdownComplete" and last["copied"] == COMMITTED, last
    assert "AUTHORIZATION_FAILED" not in log.read_text(errors="replace")

    # the output, read by the admin (app has no READ on out): every committed input record exactly once
    copied = read_committed(s.bootstrap, "out", COMMITTED, **s.admin_options)
    assert Counter(copied) == Counter(sent)

    # the group's offsets were committed inside the copier's transactions: nothing is left to copy
    committed = Consumer(bootstrap=s.bootstrap, group_id="copier", **s.app())
    try:
        tps = [("in", p) for p in range(3)]
        ends = committed.end_offsets(tps)
        offsets = committed.committed_offsets(tps)
        assert all(ends[tp] > 0 for tp in tps), ends
        assert {tp: om.offset if om is not None else None for tp, om in offsets.items()} == ends
    finally:
        committed.close()


def test_app_is_refused_a_topic_it_has_no_acl_on(granted: Secure) -> None:
    s = granted
    with Producer(bootstrap=s.bootstrap, **s.app()) as p, pytest.raises(BrokerError) as info:
        p.send("forbidden", value=b"x").result(timeout=30)
    assert info.value.error_code is ErrorCode.TOPIC_AUTHORIZATION_FAILED
    with Producer(bootstrap=s.bootstrap, transactional_id="copier-x", **s.app()) as p:
        p.init_transactions()
        p.begin_transaction()
        with pytest.raises(BrokerError) as info:
            p.send("forbidden", value=b"x").result(timeout=30)
        assert info.value.error_code is ErrorCode.TOPIC_AUTHORIZATION_FAILED

    # over plain HTTP requests too: 403, and a topic that does not exist is no different
    headers = {"Authorization": basic_authorization("app", APP_PASSWORD)}
    url = s.cluster.url(1)
    for topic in ("forbidden", "no-such-topic"):
        status, res = http("POST", f"{url}/v1/topics/{topic}/records", {"records": [{"value": "eA=="}]},
                           headers=headers, context=s.cluster.ssl_context)  # fmt: skip
        assert (status, res["error_code"]) == (403, "TOPIC_AUTHORIZATION_FAILED"), res
    status, res = http("GET", f"{url}/v1/topics/forbidden/partitions/0/records?offset=0", headers=headers,
                       context=s.cluster.ssl_context)  # fmt: skip
    assert (status, res["error_code"]) == (403, "TOPIC_AUTHORIZATION_FAILED"), res
    admin_topics = {t["name"] for t in s.admin().list_topics()}
    assert {"in", "out", "forbidden"} <= admin_topics
    assert {t["name"] for t in Admin(s.bootstrap, **s.app()).list_topics()} == {"in", "out"}
    no_connection_left_open()


def test_a_wrong_password_fails_at_once_without_retries(granted: Secure) -> None:
    s = granted
    wrong = s.app("wrong")

    def produce() -> None:
        with Producer(bootstrap=s.bootstrap, **wrong) as p:
            p.send("in", value=b"x").result(timeout=30)

    def produce_transactional() -> None:
        with Producer(bootstrap=s.bootstrap, transactional_id="copier-2", **wrong) as p:
            p.init_transactions()

    def consume() -> None:
        c = Consumer(bootstrap=s.bootstrap, **wrong)
        try:
            c.end_offsets([("in", 0)])
        finally:
            c.close()

    # The idempotent producer closes while its producer-id request may still be in its TLS handshake: the
    # repeats (and the collection at the end) show that no connection is left open by the close.
    calls = [lambda: Admin(s.bootstrap, **wrong).list_topics(), produce_transactional, consume, *[produce] * 5]
    for call in calls:
        t0 = time.monotonic()
        with pytest.raises(BrokerError) as info:
            call()
        # one refused request (each waits ~0.1 s on the node); a retrying client would run into its 30 s timeout
        assert time.monotonic() - t0 < 5
        assert info.value.error_code is ErrorCode.SASL_AUTHENTICATION_FAILED
        assert not info.value.retriable
    no_connection_left_open()


def test_whoami_cli_names_the_user_of_the_command_config(granted: Secure) -> None:
    res = txbroker("whoami", "--command-config", str(granted.app_toml))
    assert (res.returncode, res.stdout) == (0, "User:app\n"), res.stderr
    wrong = granted.app_toml.with_name("wrong.toml")
    wrong.write_text(granted.app_toml.read_text().replace(APP_PASSWORD, "nope"))
    res = txbroker("whoami", "--command-config", str(wrong))
    assert res.returncode == 1 and "SASL_AUTHENTICATION_FAILED" in res.stderr
    assert tomllib.loads(granted.admin_toml.read_text())["username"] == "admin"
