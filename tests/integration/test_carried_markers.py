"""The partition leader's side of carried markers on 3 node processes (docs/carried-markers.md).

The coordinator does not hand out tokens yet, so the test plays it: it signs tokens with the cluster
secret, as the coordinator will, and sends them with real produce requests over HTTP.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import pytest

from bench.measure import sum_samples
from clients import Producer
from clients.protocol import (
    PRODUCE_CONTENT_TYPE,
    ControlType,
    ProducePartition,
    ProduceRequest,
    Record,
    decode_token,
    encode_batch,
    encode_produce_request,
    encode_token,
)
from cluster.health import scrape
from cluster.txn import CarriedMarker, TxnTokens
from tests.integration.test_transactions_http import TxnWriter, committed_values, control_batches, fetch, values
from tests.support.cluster import LocalCluster, http, node_call
from tests.support.txn_reads import consume_all, http_read, leader_url, wait_settled

pytestmark = pytest.mark.integration

TOPIC = "carried"


def carried_send(
    w: TxnWriter, tokens: TxnTokens, partition: int, epoch: int, value: bytes, control: ControlType, *,
    token: bytes | None = None,
) -> tuple[int, Any]:  # fmt: skip
    """The first batch of ``w``'s transaction at ``epoch`` on ``partition``, carrying the previous one's marker."""
    tok = token or tokens.token(w.tid, w.pid, epoch, TOPIC, partition, CarriedMarker(control, 0))
    body = {
        "transactional_id": w.tid,
        "partitions": [{
            "topic": TOPIC, "partition": partition, "producer_id": w.pid, "producer_epoch": epoch,
            "base_sequence": 0, "records": [{"value": base64.b64encode(value).decode()}],
            "txn_token": encode_token(tok),
        }],
    }  # fmt: skip
    leader = w.c.wait_leaders(TOPIC, 3)[partition]
    return http("POST", w.c.url(leader) + "/v1/produce", body)


def revoke(c: LocalCluster, via: int, pid: int, epoch: int, partition: int) -> Any:
    path = "/v1/internal/txn/marker"
    body = {"topic": TOPIC, "partition": partition, "producer_id": pid, "producer_epoch": epoch,
            "coordinator_epoch": 0, "control_type": "COMMIT", "revoke": True}  # fmt: skip
    status, res = http("POST", c.url(via) + path, body, headers=node_call(c.configs[0], via, "POST", path, body))
    assert status == 200, res
    return res


def test_a_token_carries_the_previous_marker_into_the_next_transactions_first_batch(make_cluster: Any) -> None:
    c = make_cluster(txn_carried_markers=True)
    c.create_topic(TOPIC, partitions=3, rf=3)
    c.wait_leaders(TOPIC, 3)
    tokens = TxnTokens(c.configs[0].cluster_secret)
    w = TxnWriter(c, "carried-1")
    epoch = w.epoch
    status, res = w.send(TOPIC, 0, [b"t0-a", b"t0-b"])
    assert status == 200, res
    # The leader's receipt names exactly this producer, epoch and partition.
    receipt = decode_token(res["partitions"][0]["txn_receipt"], "receipt")
    assert tokens.check_receipt(receipt, w.tid, w.pid, epoch, TOPIC, 0)
    assert not tokens.check_receipt(receipt, w.tid, w.pid, epoch + 1, TOPIC, 0)
    assert fetch(c, TOPIC, 0, "read_committed")["records"] == []
    # Only the transaction's first batch on a partition (sequence 0) is signed, and its resend after a lost
    # answer (a duplicate) is signed again; later batches carry no receipt.
    status, first = w.send(TOPIC, 2, [b"p2-a"])
    assert status == 200 and first["partitions"][0].get("txn_receipt"), first
    status, second = w.send(TOPIC, 2, [b"p2-b"])
    assert status == 200 and "txn_receipt" not in second["partitions"][0], second
    w.seq[(TOPIC, 2)] = 0
    status, again = w.send(TOPIC, 2, [b"p2-a"])
    assert status == 200 and again["partitions"][0]["base_offset"] == first["partitions"][0]["base_offset"], again
    assert again["partitions"][0]["txn_receipt"] == first["partitions"][0]["txn_receipt"]

    # Transaction epoch+1 begins on partition 0 with a token: the COMMIT of the first lands with it.
    status, res = carried_send(w, tokens, 0, epoch + 1, b"t1-a", ControlType.COMMIT)
    assert status == 200, res
    assert res["partitions"][0]["base_offset"] == 3  # the control batch took offset 2
    assert tokens.check_receipt(decode_token(res["partitions"][0]["txn_receipt"], "r"), w.tid, w.pid, epoch + 1,
                                TOPIC, 0)  # fmt: skip
    committed_values(c, TOPIC, 0, [b"t0-a", b"t0-b"])
    control_batches(c, TOPIC, 0, ["COMMIT"])
    assert values(fetch(c, TOPIC, 0, "read_uncommitted")) == [b"t0-a", b"t0-b", b"t1-a"]

    # A token for another partition, epoch or producer is refused and writes nothing.
    hw = fetch(c, TOPIC, 1, "read_uncommitted")["high_watermark"]
    wrong = tokens.token(w.tid, w.pid, epoch + 1, TOPIC, 0, CarriedMarker(ControlType.COMMIT, 0))
    status, res = carried_send(w, tokens, 1, epoch + 1, b"x", ControlType.COMMIT, token=wrong)
    assert (status, res["error_code"]) == (400, "INVALID_REQUEST"), res
    assert fetch(c, TOPIC, 1, "read_uncommitted")["high_watermark"] == hw

    # The coordinator settles partition 0's reservation: the token was used, so nothing is written.
    led = c.wait_leaders(TOPIC, 3)
    other = next(n for n in (1, 2, 3) if n != led[0])
    assert revoke(c, other, w.pid, epoch + 1, 0) == {"used": True}  # forwarded to the leader
    control_batches(c, TOPIC, 0, ["COMMIT"])

    # Partition 1 had nothing of this producer: its reservation is revoked, and a late token is refused
    # (retriable: the producer resends through verification).
    res = revoke(c, led[1], w.pid, epoch + 1, 1)
    assert res["used"] is False and res["offset"] is None
    status, res = carried_send(w, tokens, 1, epoch + 1, b"late", ControlType.COMMIT)
    assert (status, res["error_code"], res["retriable"]) == (409, "TRANSACTION_RESERVATION_REVOKED", True), res
    assert fetch(c, TOPIC, 1, "read_uncommitted")["high_watermark"] == hw


def test_the_binary_produce_form_carries_tokens(make_cluster: Any) -> None:
    c = make_cluster(txn_carried_markers=True)
    c.create_topic(TOPIC, partitions=3, rf=3)
    leaders = c.wait_leaders(TOPIC, 3)
    tokens = TxnTokens(c.configs[0].cluster_secret)
    w = TxnWriter(c, "carried-bin")
    status, res = w.send(TOPIC, 2, [b"old"])
    assert status == 200, res
    token = tokens.token(w.tid, w.pid, w.epoch + 1, TOPIC, 2, CarriedMarker(ControlType.ABORT, 0))
    batch = encode_batch([Record(value=b"new")], producer_id=w.pid, producer_epoch=w.epoch + 1, base_sequence=0,
                         transactional=True)  # fmt: skip
    req = ProduceRequest((ProducePartition(TOPIC, 2, batch, token),), transactional_id=w.tid)
    status, res = http("POST", c.url(leaders[2]) + "/v1/produce", raw=encode_produce_request(req),
                       content_type=PRODUCE_CONTENT_TYPE)  # fmt: skip
    assert status == 200, res
    # The first transaction was aborted by the carried marker: read_committed never shows "old".
    control_batches(c, TOPIC, 2, ["ABORT"])
    rc = fetch(c, TOPIC, 2, "read_committed")
    assert rc["records"] == [] and rc["last_stable_offset"] == 2  # the new transaction, open at offset 2
    assert values(fetch(c, TOPIC, 2, "read_uncommitted")) == [b"old", b"new"]


# ---- end to end: the client and the coordinator carry the markers ---------------------------------------


def _pipeline(c: LocalCluster, t: str, tid: str, plan: list[bool]) -> tuple[dict[int, list[tuple[int, bytes]]], int]:
    """Run one transaction per entry of ``plan`` (True: commit) on 3 partitions; the committed records, and the
    coordinator's Raft writes from the second transaction on (the first one pays for the producer's start)."""
    from tests.integration.test_txn_client import _coordinator_writes

    expected: dict[int, list[tuple[int, bytes]]] = {q: [] for q in range(3)}
    writes = 0
    with Producer(c.urls, transactional_id=tid, linger_ms=0) as p:
        p.init_transactions()
        for n, commit in enumerate(plan):
            if n == 1:
                writes = -_coordinator_writes(c, tid)
            p.begin_transaction()
            futs = [(q, f"{n}-{q}".encode(), p.send(t, value=f"{n}-{q}".encode(), partition=q)) for q in range(3)]
            acked = [(q, v, f.result(timeout=30).offset) for q, v, f in futs]
            if commit:
                p.commit_transaction()
                for q, v, off in acked:
                    expected[q].append((off, v))
            else:
                p.abort_transaction()
        writes += _coordinator_writes(c, tid)
    return expected, writes


def test_a_steady_pipeline_costs_the_coordinator_one_write_per_transaction(make_cluster: Any) -> None:
    # docs/carried-markers.md: EndTxn settles the previous transaction with the receipts and completes it in the
    # same write; the markers ride on the next transaction's first batches. Aborts are carried the same way.
    c = make_cluster(txn_carried_markers=True, txn_reservation_ms=3000)
    t = "pipeline"
    c.create_topic(t, partitions=3, rf=3)
    c.wait_leaders(t, 3)
    plan = [True, True, False, True, True, False, True]
    expected, writes = _pipeline(c, t, "carried-pipeline", plan)
    assert writes == len(plan) - 1, f"{writes} coordinator writes for {len(plan) - 1} transactions"
    # The partition leaders admitted each later transaction's first batch by its token, not by asking the
    # coordinator: only the first transaction's 3 partitions were checked with it (a resend after a leader
    # move may add a check; without carried markers there would be 21).
    scrapes = [scrape(u) or {} for u in c.urls]
    checks = "txbroker_transaction_partition_checks_total"
    assert sum_samples(scrapes, checks, how="token") >= 3 * (len(plan) - 1)
    assert 3 <= sum_samples(scrapes, checks, how="coordinator") <= 6
    # The last transaction's markers have no next transaction to ride on: the reservation timer settles them.
    wait_settled(c, t, range(3), timeout=30)
    for q in range(3):
        assert http_read(leader_url(c, t, q), t, q, "read_committed") == expected[q]
    by_consumer = consume_all(c.urls, [(t, q) for q in range(3)], "read_committed")
    assert {q: by_consumer[(t, q)] for q in range(3)} == expected
    # Every partition holds one control batch per transaction, in order (COMMIT/ABORT as decided).
    for q in range(3):
        batches = fetch(c, t, q, "read_uncommitted", fmt="batches")["batches"]
        kinds = [b["control_type"] for b in batches if b["is_control"]]
        assert kinds == ["COMMIT" if commit else "ABORT" for commit in plan], (q, kinds)


def test_revoked_reservations_send_the_batches_through_verification(make_cluster: Any) -> None:
    # A reservation of 0 ms is revoked at once, before the next transaction's first batches arrive: each is
    # refused (TRANSACTION_RESERVATION_REVOKED), resent without its token and verified as before; nothing is
    # lost or doubled.
    c = make_cluster(txn_carried_markers=True, txn_reservation_ms=0)
    t = "revoked"
    c.create_topic(t, partitions=3, rf=3)
    c.wait_leaders(t, 3)
    plan = [True, False, True, True]
    expected, _ = _pipeline(c, t, "carried-revoked", plan)
    wait_settled(c, t, range(3), timeout=30)
    for q in range(3):
        assert http_read(leader_url(c, t, q), t, q, "read_committed") == expected[q]
        batches = fetch(c, t, q, "read_uncommitted", fmt="batches")["batches"]
        assert [b["control_type"] for b in batches if b["is_control"]] == ["COMMIT" if x else "ABORT" for x in plan]


def test_tokens_the_next_transaction_does_not_use_are_released_at_once(make_cluster: Any) -> None:
    # The reservation timer is a minute here: only the client's release (txn_token_release_ms after a commit,
    # and at close) can settle the partitions a transaction skips, or the last transaction of an idle producer.
    c = make_cluster(txn_carried_markers=True, txn_reservation_ms=60_000)
    t = "released"
    c.create_topic(t, partitions=3, rf=3)
    c.wait_leaders(t, 3)
    with Producer(c.urls, transactional_id="carried-release", linger_ms=0) as p:
        p.init_transactions()
        p.begin_transaction()
        for q in range(3):
            p.send(t, value=f"a-{q}".encode(), partition=q).result(timeout=30)
        p.commit_transaction()
        p.begin_transaction()
        p.send(t, value=b"b-0", partition=0).result(timeout=30)  # partitions 1 and 2 are skipped
        started = time.monotonic()
        wait_settled(c, t, [1, 2], timeout=20)  # released after ~20 ms, not after a minute
        assert time.monotonic() - started < 15
        p.commit_transaction()
        # Idle but open: the last commit's tokens are released too, so partition 0 settles.
        wait_settled(c, t, [0], timeout=20)
    expected = {0: [b"a-0", b"b-0"], 1: [b"a-1"], 2: [b"a-2"]}
    for q in range(3):
        assert [v for _, v in http_read(leader_url(c, t, q), t, q, "read_committed")] == expected[q]
