"""Spark on a secured cluster: a limited user reads and writes exactly once over HTTPS.

The cluster comes from ``txbroker cluster init --secure``; the admin creates
the user ``spark`` with these ACLs (and no others):

=========================  ==============================  ==============================================
ACL (User:spark, ALLOW)    resource                        needed by
=========================  ==============================  ==============================================
READ                       TOPIC in                        the read: metadata, offsets, fetch
WRITE                      TOPIC out2                      each task's produce and AddPartitionsToTxn
READ                       TOPIC out2                      reading the written records back
WRITE (PREFIXED)           TRANSACTIONAL_ID spark-e2e:w:   every task attempt's transaction (ids
                                                           ``<writeId>:w:<partition>:<attempt>:<random>``):
                                                           init, add partitions, prepare; the driver's
                                                           commit group (WRITE on every member) and its
                                                           sweep (lists and aborts the job's other ids)
=========================  ==============================  ==============================================

The options are ``username``, ``password`` and ``ssl.cafile``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from clients import Admin, Consumer, Producer
from cluster.client_config import load_client_config
from tests.support.cluster import LocalCluster, cluster_init_secure

pytestmark = pytest.mark.spark

PASSWORD = "spark-pa55"
WRITE_ID = "spark-e2e"
COMMITTED = 4 * 50


@dataclass
class SecureSpark:
    cluster: LocalCluster
    bootstrap: str
    cafile: str
    admin_options: dict[str, Any]

    def options(self, password: str = PASSWORD) -> dict[str, str]:
        return {"bootstrap": self.bootstrap, "username": "spark", "password": password, "ssl.cafile": self.cafile}


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureSpark]:
    d = tmp_path_factory.mktemp("spark-secure") / "cluster"
    res = cluster_init_secure(d)
    assert res.returncode == 0, res.stderr
    cluster = LocalCluster.from_dir(d)
    try:
        cluster.start()
        cfg = load_client_config(d / "admin.toml")
        assert cfg.bootstrap is not None and cfg.security.get("ssl_cafile")
        s = SecureSpark(cluster, cfg.bootstrap, str(cfg.security["ssl_cafile"]), dict(cfg.security))
        admin = Admin(s.bootstrap, **s.admin_options)
        for topic in ("in", "out2"):
            admin.create_topic(topic, partitions=3, replication_factor=3)
            admin.wait_for_leaders(topic)
        admin.upsert_user("spark", PASSWORD)
        acl = {"principal": "User:spark", "permission": "ALLOW"}
        admin.create_acls(
            [
                {**acl, "resource_type": "TOPIC", "resource_name": "in", "operation": "READ"},
                {**acl, "resource_type": "TOPIC", "resource_name": "out2", "operation": "WRITE"},
                {**acl, "resource_type": "TOPIC", "resource_name": "out2", "operation": "READ"},
                {**acl, "resource_type": "TRANSACTIONAL_ID", "resource_name": f"{WRITE_ID}:w:",
                 "pattern_type": "PREFIXED", "operation": "WRITE"},
            ]
        )  # fmt: skip
        # the input, written by the admin: 4 committed transactions and one aborted
        with Producer(bootstrap=s.bootstrap, transactional_id="feeder", **s.admin_options) as p:
            p.init_transactions()
            for t in range(4):
                p.begin_transaction()
                for i in range(50):
                    p.send("in", value=f"v-{t}-{i}".encode(), key=str(i).encode())
                p.commit_transaction()
            p.begin_transaction()
            for i in range(30):
                p.send("in", value=f"aborted-{i}".encode(), key=str(i).encode())
            p.flush()
            p.abort_transaction()
        yield s
    finally:
        cluster.close()


def committed_out(s: SecureSpark, expect: int) -> list[bytes]:
    c = Consumer(bootstrap=s.bootstrap, isolation_level="read_committed", auto_offset_reset="earliest",
                 **s.admin_options)  # fmt: skip
    try:
        tps = [("out2", p) for p in range(3)]
        c.assign(tps)
        out: list[bytes] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out += [r.value or b"" for r in c.poll(timeout_ms=300)]
            ends = c.end_offsets(tps)
            if len(out) >= expect and all(c.position(tp) >= ends[tp] for tp in tps):
                break
        return out
    finally:
        c.close()


def _read(spark: Any, options: dict[str, str], topic: str) -> Any:
    reader = spark.read.format("txbroker").option("subscribe", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_limited_user_reads_and_writes_exactly_once_over_https(spark: Any, secure: SecureSpark) -> None:
    s = secure
    df = _read(spark, s.options(), "in")
    values = sorted(bytes(r.value) for r in df.select("value").collect())
    assert values == sorted(f"v-{t}-{i}".encode() for t in range(4) for i in range(50))  # committed only

    w = df.selectExpr("key", "upper(cast(value as string)) as value").write.format("txbroker")
    for k, v in {**s.options(), "topic": "out2", "writeId": WRITE_ID}.items():
        w = w.option(k, v)
    w.mode("append").save()

    written = committed_out(s, COMMITTED)
    assert sorted(written) == sorted(v.upper() for v in values)
    assert _read(spark, s.options(), "out2").count() == COMMITTED
    # every task's transaction was committed by the group decision: none is left open
    listed = Admin(s.bootstrap, **s.admin_options).list_transactions(prefix=f"{WRITE_ID}:")
    assert listed and {t["state"] for t in listed} == {"CompleteCommit"}


def test_a_wrong_password_fails_the_job(spark: Any, secure: SecureSpark) -> None:
    with pytest.raises(Exception, match="SASL_AUTHENTICATION_FAILED"):
        _read(spark, secure.options("wrong"), "in").count()
    df = spark.range(0, 10).selectExpr("CAST(id AS STRING) AS value")
    w = df.write.format("txbroker")
    for k, v in {**secure.options("wrong"), "topic": "out2", "writeId": f"{WRITE_ID}-wrong"}.items():
        w = w.option(k, v)
    with pytest.raises(Exception, match="SASL_AUTHENTICATION_FAILED"):
        w.mode("append").save()
