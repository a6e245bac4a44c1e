"""Consumer groups and offsets over plain HTTP on 3 node processes (kafka_txn.md §4, §14 item 21).

Members here are written against the raw HTTP API (the contract, not the client library).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_transactions_http import TxnWriter, call
from tests.support.cluster import LocalCluster, http, wait_for

pytestmark = pytest.mark.integration

TOPIC = "in"
PARTITIONS = 4
ALL = {(TOPIC, p) for p in range(PARTITIONS)}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One cluster for the tests that kill nothing (short session timeouts allowed for speed)."""
    c = LocalCluster(Path(tmp_path_factory.mktemp("groups")), 3, group_min_session_timeout_ms=1000)
    try:
        c.start()
        c.create_topic(TOPIC, partitions=PARTITIONS, rf=3)
        yield c
    finally:
        c.close()


def coordinator(c: LocalCluster, group: str, alive: list[int] | None = None) -> int:
    nodes = alive or [1, 2, 3]

    def ask() -> int | None:
        for n in nodes:
            status, res = http("GET", c.url(n) + f"/v1/coordinators/group/{group}", timeout=5)
            if status == 200 and res["node_id"] in nodes:
                return int(res["node_id"])
        return None

    return wait_for(ask, 60, f"a live coordinator for {group}")


def assigned(answer: dict[str, Any]) -> set[tuple[str, int]]:
    return {(a["topic"], a["partition"]) for a in answer["assignment"]}


class Member:
    """A group member over raw HTTP: join (long-poll), heartbeat, commit."""

    def __init__(self, c: LocalCluster, group: str, via: int, session_ms: int = 2000) -> None:
        self.c, self.group, self.via, self.session_ms = c, group, via, session_ms
        self.member_id = ""
        self.answer: dict[str, Any] = {}

    def url(self, suffix: str) -> str:
        return self.c.url(self.via) + f"/v1/groups/{self.group}/{suffix}"

    def join(self) -> dict[str, Any]:
        body = {"member_id": self.member_id, "topics": [TOPIC], "session_timeout_ms": self.session_ms,
                "rebalance_timeout_ms": 20_000}  # fmt: skip
        status, res = http("POST", self.url("join"), body, timeout=60)
        assert status == 200, res
        self.member_id, self.answer = res["member_id"], res
        return res

    @property
    def generation(self) -> int:
        return int(self.answer["generation_id"])

    def heartbeat(self) -> tuple[int, Any]:
        return http("POST", self.url("heartbeat"), {"member_id": self.member_id, "generation_id": self.generation})

    def commit(self, offsets: dict[int, int], generation: int | None = None, **txn: Any) -> tuple[int, Any]:
        body = {
            "offsets": [{"topic": TOPIC, "partition": p, "offset": o, "metadata": "m"} for p, o in offsets.items()],
            "member_id": self.member_id,
            "generation_id": self.generation if generation is None else generation,
            **txn,
        }
        return http("POST", self.url("offsets"), body)

    def join_in_background(self) -> threading.Thread:
        t = threading.Thread(target=self.join, daemon=True)
        t.start()
        return t


def rejoin_when_asked(m: Member, timeout: float = 30) -> dict[str, Any]:
    """Heartbeat until the coordinator says REBALANCE_IN_PROGRESS, then rejoin (what a consumer does)."""

    def asked() -> bool:
        status, res = m.heartbeat()
        if status == 200:
            return False
        assert res["error_code"] == "REBALANCE_IN_PROGRESS", res
        return True

    wait_for(asked, timeout, "a rebalance to start", interval=0.2)
    return m.join()


def offsets_of(c: LocalCluster, group: str, via: int = 1, stable: bool = False) -> tuple[int, Any]:
    return http("GET", c.url(via) + f"/v1/groups/{group}/offsets?require_stable={'true' if stable else 'false'}")


def test_two_members_get_disjoint_assignments_covering_every_partition(cluster: LocalCluster) -> None:
    c = cluster
    coord = coordinator(c, "g-two")
    other = next(n for n in (1, 2, 3) if n != coord)
    a, b = Member(c, "g-two", via=coord), Member(c, "g-two", via=other)  # b's requests are proxied
    first = a.join()
    assert assigned(first) == ALL and first["members"] == [a.member_id]
    thread = b.join_in_background()
    second = rejoin_when_asked(a)
    thread.join(60)
    assert b.answer["generation_id"] == second["generation_id"] == first["generation_id"] + 1
    assert assigned(second).isdisjoint(assigned(b.answer))
    assert assigned(second) | assigned(b.answer) == ALL
    assert len(assigned(second)) == len(assigned(b.answer)) == 2  # range: 4 partitions over 2 members
    assert sorted(second["members"]) == sorted([a.member_id, b.member_id])
    # A retried join of a Stable member answers the same generation at once, without a rebalance
    again = a.join()
    assert again["generation_id"] == second["generation_id"] and assigned(again) == assigned(second)
    status, desc = http("GET", c.url(other) + "/v1/groups/g-two")
    assert status == 200 and desc["state"] == "Stable" and desc["generation_id"] == second["generation_id"]
    assert {m["member_id"] for m in desc["members"]} == {a.member_id, b.member_id}
    status, listed = http("GET", c.url(other) + "/v1/groups")
    assert status == 200 and any(g["group_id"] == "g-two" and g["members"] == 2 for g in listed["groups"])


def test_silent_member_is_expelled_after_its_session_timeout(cluster: LocalCluster) -> None:
    c = cluster
    coord = coordinator(c, "g-silent")
    a, b = Member(c, "g-silent", via=coord, session_ms=1500), Member(c, "g-silent", via=coord, session_ms=1500)
    a.join()
    thread = b.join_in_background()
    rejoin_when_asked(a)
    thread.join(60)
    gen = a.generation
    assert a.generation == b.generation and len(assigned(a.answer)) == 2
    # b stops heartbeating; a keeps going and is told to rejoin once b's session expired
    started = time.monotonic()
    survivor = rejoin_when_asked(a, timeout=30)
    assert time.monotonic() - started >= 1.0  # not before b's session timeout (1.5 s, minus polling slack)
    assert survivor["generation_id"] == gen + 1
    assert assigned(survivor) == ALL and survivor["members"] == [a.member_id]
    status, res = b.heartbeat()
    assert status == 409 and res["error_code"] == "UNKNOWN_MEMBER_ID", res
    # the expelled member's commit is refused too (it may no longer own its partitions)
    status, res = b.commit({2: 7})
    assert status == 409 and res["error_code"] == "UNKNOWN_MEMBER_ID", res
    # leaving empties the group; the generation still counts up
    assert http("POST", a.url("leave"), {"member_id": a.member_id})[0] == 200
    desc = wait_for(lambda: (d := http("GET", c.url(coord) + "/v1/groups/g-silent")[1])["state"] == "Empty" and d,
                    30, "the group to become Empty")  # fmt: skip
    assert desc["generation_id"] == gen + 2 and desc["members"] == []


def test_stale_generation_and_unknown_member_commits_are_rejected(cluster: LocalCluster) -> None:
    # KIP-447: commits carry the group identity; only the current generation's members may commit
    c = cluster
    coord = coordinator(c, "g-fence")
    a, b = Member(c, "g-fence", via=coord), Member(c, "g-fence", via=coord)
    a.join()
    stale = a.generation
    thread = b.join_in_background()
    rejoin_when_asked(a)
    thread.join(60)
    assert a.generation == stale + 1
    status, res = a.commit({0: 5}, generation=stale)
    assert status == 409 and res["error_code"] == "ILLEGAL_GENERATION", res
    status, res = http("POST", a.url("offsets"), {"offsets": [{"topic": TOPIC, "partition": 0, "offset": 5}]})
    assert status == 409 and res["error_code"] == "UNKNOWN_MEMBER_ID", res  # the group has members
    status, res = http("POST", a.url("offsets"), {"offsets": [{"topic": TOPIC, "partition": 0, "offset": 5}],
                                                  "member_id": "nobody", "generation_id": a.generation})  # fmt: skip
    assert status == 409 and res["error_code"] == "UNKNOWN_MEMBER_ID", res
    # a zombie's transactional commit with the old generation is fenced the same way
    w = TxnWriter(c, "tx-g-fence")
    status, res = a.commit({0: 6}, generation=stale, transactional_id=w.tid, producer_id=w.pid,
                           producer_epoch=w.epoch)  # fmt: skip
    assert status == 409 and res["error_code"] == "ILLEGAL_GENERATION", res
    assert offsets_of(c, "g-fence")[1]["offsets"] == []  # nothing of the refused commits landed
    status, res = a.commit({0: 5, 1: 9})
    assert status == 200 and res["pending"] is False, res
    status, res = offsets_of(c, "g-fence", via=next(n for n in (1, 2, 3) if n != coord), stable=True)
    assert status == 200
    assert [(o["partition"], o["offset"], o["metadata"]) for o in res["offsets"]] == [(0, 5, "m"), (1, 9, "m")]
    heartbeat_status, hb = b.heartbeat()
    assert heartbeat_status == 200 and hb == {}


def test_transactional_offsets_appear_only_when_their_transaction_commits(cluster: LocalCluster) -> None:
    # kafka_txn.md §14 item 21: pending until the marker; require_stable -> UNSTABLE_OFFSET_COMMIT; abort drops
    c = cluster
    group = "g-txn"
    w = TxnWriter(c, "tx-offsets")
    added = call(c, "POST", f"/v1/transactions/{w.tid}/offsets",
                 {"producer_id": w.pid, "producer_epoch": w.epoch, "group_id": group})  # fmt: skip
    assert added["partition"] == coordinator_partition_of(c, group)

    def txn_commit(offset: int) -> Any:
        body = {"offsets": [{"topic": TOPIC, "partition": 1, "offset": offset}], "transactional_id": w.tid,
                "producer_id": w.pid, "producer_epoch": w.epoch}  # fmt: skip
        status, res = http("POST", c.url(1) + f"/v1/groups/{group}/offsets", body)
        assert status == 200 and res["pending"] is True, res
        return res

    txn_commit(10)
    status, res = offsets_of(c, group)
    assert status == 200 and res["offsets"] == []  # pending: not visible
    status, res = offsets_of(c, group, stable=True)
    assert status == 503 and res["error_code"] == "UNSTABLE_OFFSET_COMMIT" and res["retriable"], res
    assert res["partitions"] == [{"topic": TOPIC, "partition": 1}]
    # the owner of another partition is not held up by it
    status, res = http("GET", c.url(2) + f"/v1/groups/{group}/offsets?require_stable=true&partitions={TOPIC}:3")
    assert status == 200 and res["offsets"] == [], res
    w.end(commit=False, wait_for_completion=True)  # answers once the markers are written: read at once
    status, res = offsets_of(c, group, stable=True)
    assert status == 200 and res["offsets"] == []  # the abort dropped them
    # Next transaction: no AddOffsetsToTxn this time -- the commit adds the partition itself (KIP-890)
    txn_commit(20)
    assert offsets_of(c, group, stable=True)[0] == 503
    w.end(commit=True, wait_for_completion=True)
    status, res = offsets_of(c, group, stable=True)
    assert status == 200 and [(o["partition"], o["offset"]) for o in res["offsets"]] == [(1, 20)], res
    # a late commit from the finished transaction's epoch is fenced, and changes nothing
    body = {"offsets": [{"topic": TOPIC, "partition": 1, "offset": 99}], "transactional_id": w.tid,
            "producer_id": w.pid, "producer_epoch": w.epoch - 1}  # fmt: skip
    status, res = http("POST", c.url(1) + f"/v1/groups/{group}/offsets", body)
    assert status == 409 and res["error_code"] in ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH"), res
    assert [o["offset"] for o in offsets_of(c, group, stable=True)[1]["offsets"]] == [20]
    # A raw-HTTP TxnOffsetCommit straight after EndTxn answered (before the markers), with no AddOffsetsToTxn:
    # the coordinator holds it until the previous transaction's offsets are resolved, instead of 409
    for offset in (30, 40):
        txn_commit(offset)
        w.end(commit=True, wait_for_completion=False)
    wait_for(lambda: [o["offset"] for o in offsets_of(c, group, stable=True)[1].get("offsets", [])] == [40], 30,
             "the last committed offset")  # fmt: skip


def coordinator_partition_of(c: LocalCluster, group: str) -> int:
    status, res = http("GET", c.url(1) + f"/v1/coordinators/group/{group}")
    assert status == 200, res
    return int(res["partition"])


def test_metrics_show_members_committed_offsets_and_lag(cluster: LocalCluster) -> None:
    c = cluster
    group = "g-metrics"
    coord = coordinator(c, group)
    a = Member(c, group, via=coord)
    a.join()
    status, res = http("POST", c.url(1) + f"/v1/topics/{TOPIC}/records",
                       {"records": [{"value": "eA==", "partition": 3}] * 5})  # fmt: skip
    assert status == 200, res
    assert a.commit({3: 2})[0] == 200

    def scraped() -> str | None:
        status, body = http("GET", c.url(coord) + "/metrics")
        text = body.decode() if isinstance(body, bytes) else str(body)
        lines = set(text.splitlines())
        want = {
            f'txbroker_consumer_group_members{{group="{group}"}} 1.0',
            f'txbroker_consumer_group_committed_offset{{group="{group}",partition="3",topic="{TOPIC}"}} 2.0',
            f'txbroker_consumer_group_rebalances_total{{group="{group}"}} 1.0',
        }
        lag = [ln for ln in lines if ln.startswith(f'txbroker_consumer_group_lag_records{{group="{group}"')]
        return text if status == 200 and want <= lines and lag and float(lag[0].split()[-1]) >= 3 else None

    wait_for(scraped, 30, "group gauges on the coordinator's /metrics")


def test_bad_group_requests_get_4xx_and_change_nothing(cluster: LocalCluster) -> None:
    c = cluster
    url = c.url(1) + "/v1/groups/g-bad"
    cases: list[tuple[str, str, Any, str]] = [
        ("POST", "/join", {"topics": "in"}, "INVALID_REQUEST"),
        ("POST", "/join", {"topics": ["in"], "session_timeout_ms": 10}, "INVALID_SESSION_TIMEOUT"),
        ("POST", "/join", {"topics": ["in"], "protocol": "sticky"}, "INVALID_REQUEST"),
        ("POST", "/join", {"topics": ["bad name"]}, "INVALID_TOPIC"),
        ("POST", "/join", {"topics": ["in"], "member_id": "ghost"}, "UNKNOWN_MEMBER_ID"),
        ("POST", "/heartbeat", {"member_id": "ghost", "generation_id": 1}, "UNKNOWN_MEMBER_ID"),
        ("POST", "/heartbeat", {"generation_id": 1}, "INVALID_REQUEST"),
        ("POST", "/leave", {"member_id": "ghost"}, "UNKNOWN_MEMBER_ID"),
        ("POST", "/offsets", {"offsets": []}, "INVALID_REQUEST"),
        ("POST", "/offsets", {"offsets": [{"topic": "in", "partition": 0, "offset": -1}]}, "INVALID_REQUEST"),
        ("POST", "/offsets", {"offsets": [{"topic": "in", "partition": 0, "offset": 1}] * 2}, "INVALID_REQUEST"),
        (
            "POST",
            "/offsets",
            {"offsets": [{"topic": "in", "partition": 0, "offset": 1}], "producer_id": 1},
            "INVALID_REQUEST",
        ),
        ("GET", "/offsets?require_stable=maybe", None, "INVALID_REQUEST"),
        ("GET", "/offsets?partitions=in", None, "INVALID_REQUEST"),
        ("GET", "/offsets?partitions=in:x", None, "INVALID_REQUEST"),
    ]
    for method, suffix, body, code in cases:
        status, res = http(method, url + suffix, body)
        assert 400 <= status < 500 and res["error_code"] == code, (suffix, body, status, res)
    status, res = http("POST", url + "/offsets", raw=b"{not json", content_type="application/json")
    assert status == 400 and res["error_code"] == "INVALID_REQUEST"
    status, res = http("GET", url)
    assert status == 200 and res["state"] == "Dead" and res["offsets"] == [], res


def test_new_coordinator_serves_offsets_and_generation_after_sigkill(make_cluster: Any) -> None:
    # DESIGN rule 3 + Raft: the group's offsets and its last generation are replicated; a pending
    # transactional offset survives too and is made visible by the marker sent to the new leader
    c = make_cluster(group_min_session_timeout_ms=1000)
    c.create_topic(TOPIC, partitions=PARTITIONS, rf=3)
    group = "g-failover"
    coord = coordinator(c, group)
    survivors = [n for n in (1, 2, 3) if n != coord]
    a = Member(c, group, via=coord, session_ms=15_000)
    a.join()
    assert a.commit({0: 42})[0] == 200
    # a transactional id coordinated by another node (once the leader balancer has spread the groups)
    tid = wait_for(lambda: next((t for t in (f"tx-failover-{i}" for i in range(100))
                                 if call(c, "GET", f"/v1/coordinators/transaction/{t}")["node_id"] != coord), None),
                   30, "a transaction coordinator other than the group's")  # fmt: skip
    w = TxnWriter(c, tid)
    status, res = a.commit({1: 7}, transactional_id=w.tid, producer_id=w.pid, producer_epoch=w.epoch)
    assert status == 200 and res["pending"] is True, res

    c.kill(coord)
    new = coordinator(c, group, alive=survivors)
    assert new != coord
    a.via = new

    def described() -> dict[str, Any] | None:
        # The new coordinator may still be loading the group (COORDINATOR_LOAD_IN_PROGRESS, retriable).
        status, body = http("GET", c.url(new) + f"/v1/groups/{group}")
        return body if status == 200 else None

    desc = wait_for(described, 30, f"{group} described by its new coordinator")
    assert desc["state"] == "Stable", desc
    assert desc["generation_id"] == a.generation and [m["member_id"] for m in desc["members"]] == [a.member_id]
    assert a.heartbeat() == (200, {})  # the generation it holds is still the group's
    assert [(o["partition"], o["offset"]) for o in offsets_of(c, group, via=new)[1]["offsets"]] == [(0, 42)]
    assert offsets_of(c, group, via=new, stable=True)[0] == 503  # the transactional offset is still pending
    call(c, "POST", f"/v1/transactions/{w.tid}/end", {"producer_id": w.pid, "producer_epoch": w.epoch, "commit": True},
         via=survivors[0])  # fmt: skip
    # EndTxn answers once the commit is decided; the marker reaches the offsets partition right after
    status, res = wait_for(lambda: (r := offsets_of(c, group, via=new, stable=True))[0] == 200 and r, 30, "stable")
    assert [(o["partition"], o["offset"]) for o in res["offsets"]] == [(0, 42), (1, 7)], res
