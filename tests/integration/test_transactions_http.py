"""Transactions over plain HTTP on 3 node processes (kafka_txn.md §14 cited per test)."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.cluster import LocalCluster, http, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One cluster for the tests that use their own topics and transactional ids and stop no node (each starting
    its own cluster cost a few seconds a test); abandoned transactions are found within 200 ms."""
    c = LocalCluster(tmp_path_factory.mktemp("txn-http"), 3, transaction_abort_scan_interval_ms=200)
    try:
        yield c.start()
    finally:
        c.close()


def _ok(status: int, body: Any, what: str) -> Any:
    assert status == 200, (what, status, body)
    return body


def call(c: LocalCluster, method: str, path: str, body: Any = None, via: int = 1, timeout: float = 30) -> Any:
    """Call ``path``, retrying the retriable answers a client library would retry."""

    def attempt() -> Any:
        status, res = http(method, c.url(via) + path, body)
        if status < 300:
            return res
        assert res.get("retriable"), (path, status, res)
        return None

    return wait_for(attempt, timeout, f"{method} {path}")


class TxnWriter:
    """A transactional producer written against the raw HTTP API (the contract, not the client)."""

    def __init__(self, c: LocalCluster, tid: str, timeout_ms: int = 60_000) -> None:
        self.c = c
        self.tid = tid
        init = call(c, "POST", "/v1/producers/init", {"transactional_id": tid, "transaction_timeout_ms": timeout_ms})
        self.pid = init["producer_id"]
        self.epoch = init["producer_epoch"]
        self.seq: dict[tuple[str, int], int] = {}

    def send(self, topic: str, partition: int, values: list[bytes], via: int | None = None) -> tuple[int, Any]:
        """One produce request to ``via``, or to the partition's leader (retried while it moves); (status, answer)."""
        seq = self.seq.get((topic, partition), 0)
        body = {
            "transactional_id": self.tid,
            "partitions": [
                {
                    "topic": topic,
                    "partition": partition,
                    "producer_id": self.pid,
                    "producer_epoch": self.epoch,
                    "base_sequence": seq,
                    "records": [{"value": base64.b64encode(v).decode()} for v in values],
                }
            ],
        }
        deadline = time.monotonic() + 30
        while True:
            leader = via if via is not None else self.c.wait_leaders(topic, partition + 1)[partition]
            status, res = http("POST", self.c.url(leader) + "/v1/produce", body)
            # No ``via``: the partition's leader, wherever it is now (the leader balancer moves leaders to
            # their preferred replicas in the first seconds of a topic). Nothing was written by a 421.
            if via is not None or status != 421 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if status == 200:
            self.seq[(topic, partition)] = seq + len(values)
        return status, res

    def end(self, commit: bool, wait_for_completion: bool | None = None, via: int = 1) -> Any:
        """EndTxn; it answers once the decision is durable unless ``wait_for_completion`` (then after the markers)."""
        body: dict[str, Any] = {"producer_id": self.pid, "producer_epoch": self.epoch, "commit": commit}
        if wait_for_completion is not None:
            body["wait_for_completion"] = wait_for_completion
        res = call(self.c, "POST", f"/v1/transactions/{self.tid}/end", body, via=via)
        self.pid, self.epoch = res["producer_id"], res["producer_epoch"]
        self.seq.clear()
        return res


def fetch(c: LocalCluster, topic: str, p: int, isolation: str, fmt: str = "json", via: int | None = None) -> Any:
    """Partition ``p`` from offset 0: a leader read, or ``via``'s own copy (a follower read)."""
    node = via if via is not None else c.wait_leaders(topic, p + 1)[p]
    url = f"/v1/topics/{topic}/partitions/{p}/records?offset=0&isolation={isolation}&format={fmt}"
    if via is not None:
        url += "&read_replica=any"
    return _ok(*http("GET", c.url(node) + url), url)


def values(res: Any) -> list[bytes]:
    return [base64.b64decode(r["value"]) for r in res["records"]]


def committed_values(c: LocalCluster, topic: str, p: int, expected: list[bytes], timeout: float = 15) -> Any:
    """Poll read_committed until it shows exactly ``expected`` (EndTxn answers before the markers land)."""

    def seen() -> Any:
        res = fetch(c, topic, p, "read_committed")
        return res if values(res) == expected else None

    return wait_for(seen, timeout, f"{topic}-{p} read_committed == {expected[:3]}...")


def control_batches(c: LocalCluster, topic: str, p: int, expected: list[str], timeout: float = 15) -> Any:
    """Poll until the partition's control batches are ``expected`` (types in log order); the batches."""

    def seen() -> Any:
        batches = fetch(c, topic, p, "read_uncommitted", fmt="batches")["batches"]
        return batches if [b["control_type"] for b in batches if b["is_control"]] == expected else None

    return wait_for(seen, timeout, f"{topic}-{p} control batches {expected}")


def test_commit_across_two_topics_is_atomic_and_abort_is_invisible(shared: LocalCluster) -> None:
    # §14 items 1-2: a committed txn becomes visible everywhere; an aborted one never to read_committed
    c = shared
    for t in ("a", "b"):
        c.create_topic(t, partitions=3, rf=3)
        c.wait_leaders(t, 3)
    w = TxnWriter(c, "tx-commit")
    for t in ("a", "b"):
        for p in range(3):
            status, res = w.send(t, p, [f"{t}{p}-{i}".encode() for i in range(5)])
            assert status == 200, res
    # While open: read_committed sees nothing and the LSO is pinned at the txn's first offset
    for t in ("a", "b"):
        for p in range(3):
            rc = fetch(c, t, p, "read_committed")
            assert rc["records"] == []
            assert rc["last_stable_offset"] == 0
            assert rc["high_watermark"] == 5
            assert len(values(fetch(c, t, p, "read_uncommitted"))) == 5
    w.end(commit=True)
    for t in ("a", "b"):
        for p in range(3):
            rc = committed_values(c, t, p, [f"{t}{p}-{i}".encode() for i in range(5)])
            assert rc["last_stable_offset"] == rc["high_watermark"] == 6  # 5 records + COMMIT marker
    # An aborted txn: invisible to read_committed by both paths, visible to read_uncommitted
    for p in range(3):
        assert w.send("a", p, [b"doomed"])[0] == 200
    w.end(commit=False)
    for p in range(3):
        control_batches(c, "a", p, ["COMMIT", "ABORT"])
        rc = fetch(c, "a", p, "read_committed")
        assert b"doomed" not in values(rc)
        batches = fetch(c, "a", p, "read_committed", fmt="batches")
        assert batches["aborted_transactions"] == [{"producer_id": w.pid, "first_offset": 6}]
        types = [b["control_type"] for b in batches["batches"] if b["is_control"]]
        assert types == ["COMMIT", "ABORT"]
        assert b"doomed" in values(fetch(c, "a", p, "read_uncommitted"))


def test_end_answers_once_the_decision_is_durable_and_wait_for_completion_once_it_is_visible(
    shared: LocalCluster,
) -> None:
    # DESIGN.md "Transaction": EndTxn answers after PrepareCommit; wait_for_completion keeps the old contract
    c = shared
    c.create_topic("vis", partitions=3, rf=3)
    c.wait_leaders("vis", 3)
    w = TxnWriter(c, "tx-visible")
    for n in range(3):
        sent = {p: [f"{n}-{p}".encode()] for p in range(3)}
        for p, vs in sent.items():
            assert w.send("vis", p, vs)[0] == 200
        ident = (w.pid, w.epoch)
        # Waiting: read_committed sees the whole transaction the moment the call returns
        res = w.end(commit=True, wait_for_completion=True)
        assert res["state"] == "CompleteCommit" and res["committed"] is True, res
        assert (res["producer_id"], res["producer_epoch"]) == (ident[0], ident[1] + 1), "TV2: the epoch bumps"
        for p in range(3):
            assert values(fetch(c, "vis", p, "read_committed"))[-1:] == sent[p]
        assert call(c, "GET", "/v1/transactions/tx-visible")["state"] == "CompleteCommit"
    # Not waiting (the default): the answer says whether the markers were already written; either way the
    # data becomes visible, and describe moves from PrepareCommit to CompleteCommit
    for n in range(3, 6):
        for p in range(3):
            assert w.send("vis", p, [f"{n}-{p}".encode()])[0] == 200
        res = w.end(commit=True)
        assert res["state"] in ("PrepareCommit", "CompleteCommit"), res
        assert call(c, "GET", "/v1/transactions/tx-visible")["state"] in ("PrepareCommit", "CompleteCommit")
        for p in range(3):
            committed_values(c, "vis", p, [f"{k}-{p}".encode() for k in range(n + 1)])
        wait_for(lambda: call(c, "GET", "/v1/transactions/tx-visible")["state"] == "CompleteCommit", 15, "Complete")
    # An abort answers the same way; waiting for it means its ABORT markers are all written
    for p in range(3):
        assert w.send("vis", p, [b"doomed"])[0] == 200
    res = w.end(commit=False, wait_for_completion=True)
    assert res["state"] == "CompleteAbort" and res["committed"] is False, res
    for p in range(3):
        batches = fetch(c, "vis", p, "read_uncommitted", fmt="batches")["batches"]
        assert batches[-1]["is_control"] and batches[-1]["control_type"] == "ABORT"


def test_next_transaction_begins_right_after_commit_and_lands_after_the_markers(shared: LocalCluster) -> None:
    # KIP-890 / TV2: the first produce of the next transaction is held by the coordinator until the previous
    # transaction's markers are written -- never answered CONCURRENT_TRANSACTIONS -- so at every partition the
    # previous COMMIT marker comes before the next transaction's first batch
    c = shared
    c.create_topic("nx", partitions=3, rf=3)
    c.create_topic("nx2", partitions=1, rf=3)
    c.wait_leaders("nx", 3)
    c.wait_leaders("nx2", 1)
    w = TxnWriter(c, "tx-next")
    tps = [("nx", 0), ("nx", 1), ("nx", 2), ("nx2", 0)]
    for n in range(5):
        for t, p in tps[:3] if n % 2 == 0 else tps:
            status, res = w.send(t, p, [f"{n}-{t}-{p}".encode()])
            assert status == 200, (n, t, p, res)  # the first attempt: no CONCURRENT_TRANSACTIONS
        w.end(commit=n != 3)
    for t, p in tps:
        expected = ["COMMIT", "COMMIT", "COMMIT", "ABORT", "COMMIT"] if t == "nx" else ["COMMIT", "ABORT"]
        batches = control_batches(c, t, p, expected)
        # Each data batch belongs to the transaction of its epoch; its marker (epoch + 1) follows it before any
        # batch of the next transaction
        open_epoch = None
        for b in batches:
            if b["is_control"]:
                assert open_epoch is not None and b["producer_epoch"] == open_epoch + 1, (t, p, b)
                open_epoch = None
            else:
                assert open_epoch in (None, b["producer_epoch"]), f"{t}-{p}: a batch of the next txn before the marker"
                open_epoch = b["producer_epoch"]
        assert open_epoch is None


def test_zombie_is_fenced_on_send_and_commit(shared: LocalCluster) -> None:
    # §14 item 5: a second InitProducerId fences the first producer's epoch
    c = shared
    c.create_topic("z", partitions=1, rf=3)
    c.wait_leaders("z", 1)
    old = TxnWriter(c, "tx-zombie")
    assert old.send("z", 0, [b"old"])[0] == 200
    new = TxnWriter(c, "tx-zombie")
    assert (new.pid, new.epoch) != (old.pid, old.epoch)
    status, res = old.send("z", 0, [b"zombie"])
    assert status == 409
    assert res["partitions"][0]["error_code"] in ("INVALID_PRODUCER_EPOCH", "PRODUCER_FENCED")
    status, res = http(
        "POST",
        c.url(1) + "/v1/transactions/tx-zombie/end",
        {"producer_id": old.pid, "producer_epoch": old.epoch, "commit": True},
    )
    assert status == 409
    assert res["error_code"] in ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH")
    assert new.send("z", 0, [b"new"])[0] == 200
    new.end(commit=True)
    # The zombie's open txn was aborted by the fencing InitProducerId; only "new" is visible
    committed_values(c, "z", 0, [b"new"])
    control_batches(c, "z", 0, ["ABORT", "COMMIT"])


def test_timed_out_transaction_is_aborted_by_the_coordinator(shared: LocalCluster) -> None:
    # §14 item 8 (transaction timeout): the coordinator fences and aborts, releasing the LSO
    c = shared
    c.create_topic("slow", partitions=1, rf=3)
    c.wait_leaders("slow", 1)
    w = TxnWriter(c, "tx-slow", timeout_ms=2000)
    assert w.send("slow", 0, [b"never"])[0] == 200
    assert fetch(c, "slow", 0, "read_committed")["last_stable_offset"] == 0
    wait_for(
        lambda: fetch(c, "slow", 0, "read_committed")["last_stable_offset"] == 2,
        15,
        "the coordinator aborted the timed-out txn (LSO past its ABORT marker)",
    )
    assert values(fetch(c, "slow", 0, "read_committed")) == []
    status, res = http(
        "POST",
        c.url(1) + "/v1/transactions/tx-slow/end",
        {"producer_id": w.pid, "producer_epoch": w.epoch, "commit": True},
    )
    assert status == 409, res
    assert res["error_code"] in ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "INVALID_TXN_STATE")


def test_transactional_batch_for_partition_not_in_txn_is_verified_and_added(make_cluster):
    # KIP-890: the first transactional produce adds the partition (TV2); listing shows it
    c = make_cluster()
    c.create_topic("v", partitions=2, rf=3)
    c.wait_leaders("v", 2)
    w = TxnWriter(c, "tx-verify")
    assert w.send("v", 1, [b"x"])[0] == 200
    desc = call(c, "GET", "/v1/transactions/tx-verify", via=2)
    assert desc["state"] == "Ongoing"
    assert desc["partitions"] == [{"topic": "v", "partition": 1}]
    listed = call(c, "GET", "/v1/transactions?state=Ongoing", via=3)
    assert [t["transactional_id"] for t in listed["transactions"]] == ["tx-verify"]
    coord = call(c, "GET", "/v1/coordinators/transaction/tx-verify", via=1)
    assert coord["url"] == c.url(coord["node_id"])
    w.end(commit=True)
    assert call(c, "GET", "/v1/transactions?state=Ongoing", via=2)["transactions"] == []


def test_prepared_group_commit_commits_every_member(shared: LocalCluster) -> None:
    # KIP-939-style prepare + atomic group commit
    c = shared
    c.create_topic("g", partitions=3, rf=3)
    c.wait_leaders("g", 3)
    writers = [TxnWriter(c, f"job-7-task-{i}") for i in range(3)]
    for i, w in enumerate(writers):
        assert w.send("g", i, [f"task-{i}".encode()])[0] == 200
        call(c, "POST", f"/v1/transactions/{w.tid}/prepare", {"producer_id": w.pid, "producer_epoch": w.epoch})
    for i in range(3):
        assert values(fetch(c, "g", i, "read_committed")) == []
    members = [{"transactional_id": w.tid, "producer_id": w.pid, "producer_epoch": w.epoch} for w in writers]
    res = call(c, "POST", "/v1/transaction-groups/job-7/end", {"commit": True, "members": members}, via=2)
    assert res["committed"] is True
    for i in range(3):
        wait_for(
            lambda i=i: values(fetch(c, "g", i, "read_committed")) == [f"task-{i}".encode()],
            15,
            f"member {i} committed",
        )


def test_bad_transaction_requests_get_4xx_and_change_nothing(make_cluster):
    c = make_cluster()
    c.create_topic("bad", partitions=1, rf=3)
    c.wait_leaders("bad", 1)
    w = TxnWriter(c, "tx-good")
    ident = {"producer_id": w.pid, "producer_epoch": w.epoch}
    cases: list[tuple[str, str, Any, str]] = [
        ("POST", "/v1/producers/init", {"transactional_id": "", "transaction_timeout_ms": 1000}, "INVALID_REQUEST"),
        (
            "POST",
            "/v1/producers/init",
            {"transactional_id": "x", "transaction_timeout_ms": 10**9},
            "INVALID_TRANSACTION_TIMEOUT",
        ),
        ("POST", "/v1/producers/init", {"transactional_id": 7}, "INVALID_REQUEST"),
        ("POST", "/v1/transactions/tx-good/end", {**ident}, "INVALID_REQUEST"),
        ("POST", "/v1/transactions/tx-good/end", {**ident, "commit": "yes"}, "INVALID_REQUEST"),
        (
            "POST",
            "/v1/transactions/tx-good/end",
            {**ident, "commit": True, "wait_for_completion": "yes"},
            "INVALID_REQUEST",
        ),
        (
            "POST",
            "/v1/transactions/tx-good/end",
            {**ident, "commit": False, "wait_for_completion": 1},
            "INVALID_REQUEST",
        ),
        ("POST", "/v1/transactions/tx-good/end", {"producer_id": w.pid, "commit": True}, "INVALID_REQUEST"),
        ("POST", "/v1/transactions/tx-good/end", {**ident, "producer_epoch": -5, "commit": True}, "INVALID_REQUEST"),
        (
            "POST",
            "/v1/transactions/tx-good/end",
            {"producer_id": w.pid + 999, "producer_epoch": 0, "commit": True},
            "INVALID_PRODUCER_ID_MAPPING",
        ),
        ("POST", "/v1/transactions/nobody/end", {**ident, "commit": True}, "INVALID_PRODUCER_ID_MAPPING"),
        ("POST", "/v1/transactions/tx-good/partitions", {**ident, "partitions": "bad-0"}, "INVALID_REQUEST"),
        (
            "POST",
            "/v1/transactions/tx-good/partitions",
            {**ident, "partitions": [{"topic": "nope", "partition": 0}]},
            "UNKNOWN_TOPIC_OR_PARTITION",
        ),
        (
            "POST",
            "/v1/transactions/tx-good/partitions",
            {**ident, "partitions": [{"topic": "bad", "partition": 9}]},
            "UNKNOWN_TOPIC_OR_PARTITION",
        ),
        ("POST", "/v1/transactions/tx-good/prepare", {"producer_id": "1", "producer_epoch": 0}, "INVALID_REQUEST"),
        ("GET", "/v1/transactions/never-seen", None, "TRANSACTIONAL_ID_NOT_FOUND"),
        ("GET", "/v1/transactions?state=Sleeping", None, "INVALID_REQUEST"),
        ("POST", "/v1/transaction-groups/g/end", {"commit": True, "members": []}, "INVALID_REQUEST"),
        (
            "POST",
            "/v1/transaction-groups/g/end",
            {"commit": True, "members": [{"transactional_id": "x"}]},
            "INVALID_REQUEST",
        ),
        ("POST", "/v1/transactions-by-prefix/abort", {"prefix": ""}, "INVALID_REQUEST"),
        (
            "POST",
            "/v1/internal/txn/marker",
            {
                "topic": "bad",
                "partition": 0,
                "producer_id": w.pid,
                "producer_epoch": 9,
                "coordinator_epoch": 99,
                "control_type": "COMMIT",
            },
            "CLUSTER_AUTHORIZATION_FAILED",
        ),
    ]
    for method, path, body, code in cases:
        for via in (1, 2, 3):
            status, res = http(method, c.url(via) + path, body)
            assert 400 <= status < 500, (path, body, status, res)
            assert res["error_code"] == code, (path, body, via, res)
    # Nothing changed: the good txn still works, the partition is empty, nothing else exists
    listed = call(c, "GET", "/v1/transactions", via=2)["transactions"]
    assert [(t["transactional_id"], t["state"]) for t in listed] == [("tx-good", "Empty")]
    assert w.send("bad", 0, [b"ok"])[0] == 200
    assert w.end(commit=True, wait_for_completion=True)["state"] == "CompleteCommit"
    assert values(fetch(c, "bad", 0, "read_committed")) == [b"ok"]


def test_txn_cli_lists_describes_and_aborts_a_hanging_transaction(shared: LocalCluster) -> None:
    # Hanging-transaction tooling (KIP-664): an open txn pins the LSO until an operator aborts it
    import subprocess
    import sys

    c = shared
    c.create_topic("hang", partitions=1, rf=3)
    c.wait_leaders("hang", 1)
    w = TxnWriter(c, "tx-hanging")
    assert w.send("hang", 0, [b"stuck"])[0] == 200

    def cli(*args: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "cluster", *args, "--bootstrap", c.url(2)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return out.stdout

    assert "tx-hanging" in cli("txn", "list", "--state", "Ongoing")
    assert '"state": "Ongoing"' in cli("txn", "describe", "tx-hanging")
    producers = cli("txn", "producers", "hang", "0")
    assert f'"producer_id": {w.pid}' in producers
    assert '"current_txn_start_offset": 0' in producers
    assert fetch(c, "hang", 0, "read_committed")["last_stable_offset"] == 0
    assert "aborted tx-hanging" in cli("txn", "abort", "tx-hanging")
    wait_for(lambda: fetch(c, "hang", 0, "read_committed")["last_stable_offset"] == 2, 15, "LSO released")
    assert values(fetch(c, "hang", 0, "read_committed")) == []
    assert "tx-hanging" not in cli("txn", "list", "--state", "Ongoing")


def test_bound_member_left_out_of_a_commit_decision_is_aborted_when_aborted(shared: LocalCluster) -> None:
    # A prepared txn bound to group G but not listed in G's COMMIT decision must not stay Prepared
    # (it would pin the LSO forever): aborting it resolves it by the recorded decision -> abort.
    c = shared
    c.create_topic("orphan", partitions=2, rf=3)
    c.wait_leaders("orphan", 2)
    a, b = TxnWriter(c, "job-9-a"), TxnWriter(c, "job-9-b")
    for i, w in enumerate((a, b)):
        assert w.send("orphan", i, [w.tid.encode()])[0] == 200
        body = {"producer_id": w.pid, "producer_epoch": w.epoch, "group_id": "job-9"}
        call(c, "POST", f"/v1/transactions/{w.tid}/prepare", body)
    members = [{"transactional_id": a.tid, "producer_id": a.pid, "producer_epoch": a.epoch}]
    assert call(c, "POST", "/v1/transaction-groups/job-9/end", {"commit": True, "members": members})["committed"]
    wait_for(lambda: values(fetch(c, "orphan", 0, "read_committed")) == [b"job-9-a"], 15, "member a committed")
    assert fetch(c, "orphan", 1, "read_committed")["last_stable_offset"] == 0  # b still prepared, pinning
    call(c, "POST", f"/v1/transactions/{b.tid}/abort", {}, via=3)
    wait_for(lambda: fetch(c, "orphan", 1, "read_committed")["last_stable_offset"] == 2, 15, "b aborted, LSO free")
    assert values(fetch(c, "orphan", 1, "read_committed")) == []
    assert call(c, "GET", f"/v1/transactions/{b.tid}")["state"] == "CompleteAbort"
