"""The consumer's group membership and offsets against 3 real nodes (kafka_txn.md §4, KIP-447).

The clients here are the library's (``Consumer``, ``Producer``); the raw HTTP
contract is covered by ``test_groups_http.py``. Members are driven by
alternating short polls from the test thread: a sync ``Consumer`` keeps its
join and heartbeats running on its own loop thread between polls.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from clients.consumer import Consumer, ConsumerRebalanceListener
from clients.producer import Producer
from clients.protocol import BrokerError, ErrorCode
from clients.records import ConsumerGroupMetadata, ConsumerRecord, OffsetAndMetadata, TopicPartition
from tests.support.cluster import LocalCluster, http, wait_for

pytestmark = pytest.mark.integration

FAST_GROUP = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 200, "auto_offset_reset": "earliest"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(Path(tmp_path_factory.mktemp("consumer-groups")), 3, group_min_session_timeout_ms=1000)
    try:
        yield c.start()
    finally:
        c.close()


def fill(c: LocalCluster, topic: str, partitions: int, per_partition: int) -> dict[int, list[bytes]]:
    c.create_topic(topic, partitions=partitions, rf=3)
    values = {p: [f"{topic}-{p}-{i}".encode() for i in range(per_partition)] for p in range(partitions)}
    with Producer(c.urls[0]) as producer:
        futures = [producer.send(topic, value=v, partition=p) for p, vs in values.items() for v in vs]
        producer.flush()
        assert all(f.result().offset >= 0 for f in futures)
    return values


class Recorder(ConsumerRebalanceListener):
    """Remembers every callback, and the thread it ran in; optionally commits on revoke."""

    def __init__(self, commit_on_revoke: Consumer | None = None) -> None:
        self.events: list[tuple[str, set[TopicPartition]]] = []
        self.threads: set[str] = set()
        self.commit_on_revoke = commit_on_revoke

    def _note(self, kind: str, tps: set[TopicPartition]) -> None:
        self.events.append((kind, set(tps)))
        self.threads.add(threading.current_thread().name)

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self._note("revoked", revoked)
        if self.commit_on_revoke is not None:
            self.commit_on_revoke.commit()  # calls back into the consumer from inside its poll()

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._note("assigned", assigned)

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        self._note("lost", lost)


def drive(
    consumers: list[Consumer], until: Callable[[], bool], timeout: float, what: str
) -> list[list[ConsumerRecord]]:
    """Poll every consumer in turn (50 ms each) until ``until()``; return what each one polled."""
    got: list[list[ConsumerRecord]] = [[] for _ in consumers]

    def step() -> bool:
        for i, c in enumerate(consumers):
            got[i].extend(c.poll(50))
        return until()

    wait_for(step, timeout, what, interval=0)
    return got


def group_state(c: LocalCluster, group: str) -> dict[str, Any]:
    status, res = http("GET", c.url(1) + f"/v1/groups/{group}")
    assert status == 200, res
    return dict(res)


def test_members_split_partitions_and_take_over_when_one_leaves(cluster: LocalCluster) -> None:
    values = fill(cluster, "split", 4, 50)
    everything = {("split", p) for p in range(4)}
    a = Consumer(cluster.urls[0], group_id="g-split", enable_auto_commit=False, **FAST_GROUP)
    b = Consumer(cluster.urls[1], group_id="g-split", enable_auto_commit=False, **FAST_GROUP)
    try:
        rec_a = Recorder(commit_on_revoke=a)
        a.subscribe(["split"], listener=rec_a)
        first = drive([a], lambda: a.assignment() == everything, 30, "a owns every partition")
        assert rec_a.events == [("assigned", everything)]
        assert rec_a.threads == {threading.current_thread().name}, "callbacks must run in the polling thread"

        # When b joins, a revokes everything (and commits from inside the callback), then both get 2 partitions.
        b.subscribe(["split"])
        got = drive(
            [a, b],
            lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2 and not a.assignment() & b.assignment(),
            30,
            "a rebalance that splits the partitions",
        )
        assert rec_a.events[1][0] == "revoked" and rec_a.events[1][1] == everything
        assert rec_a.events[-1] == ("assigned", a.assignment())
        assert a.group_metadata().generation_id == b.group_metadata().generation_id >= 2
        # Range assignment by member id: contiguous halves.
        assert {p for _, p in a.assignment()} in ({0, 1}, {2, 3})
        # Nothing is read twice across the rebalance: a committed its positions while revoking.
        all_a = first[0] + got[0]
        seen = [(r.partition, r.value) for r in all_a + got[1]]
        assert len(seen) == len(set(seen))
        got_b = {(r.topic, r.partition) for r in got[1]}
        assert got_b <= b.assignment()

        # b leaves on close: a takes everything back without waiting for b's session timeout.
        b.close()
        drive([a], lambda: a.assignment() == everything, 10, "a owns every partition again")
        assert {(r.partition, r.value) for r in all_a} | {(r.partition, r.value) for r in got[1]} <= {
            (p, v) for p, vs in values.items() for v in vs
        }
    finally:
        a.close()
        b.close()


def test_a_new_member_resumes_from_the_committed_offsets(cluster: LocalCluster) -> None:
    values = fill(cluster, "resume", 2, 100)
    with Consumer(cluster.urls[0], group_id="g-resume", enable_auto_commit=False, **FAST_GROUP) as first:
        first.subscribe(["resume"])
        got: list[ConsumerRecord] = []
        wait_for(lambda: got.extend(first.poll(200, max_records=30)) or len(got) >= 60, 30, "60 records")
        consumed = {(r.topic, r.partition): r.offset + 1 for r in got}  # offsets rise: the last one wins
        first.commit(consumed)
        for tp, offset in consumed.items():
            assert first.committed(tp, metadata=True) == OffsetAndMetadata(offset)
    with Consumer(cluster.urls[2], group_id="g-resume", enable_auto_commit=False, **FAST_GROUP) as second:
        second.subscribe(["resume"])
        rest: list[ConsumerRecord] = []
        wait_for(lambda: rest.extend(second.poll(200)) or len(rest) >= 200 - len(got), 30, "the rest of the input")
    seen = {(r.partition, r.value) for r in got} | {(r.partition, r.value) for r in rest}
    assert seen == {(p, v) for p, vs in values.items() for v in vs}
    assert len(got) + len(rest) == 200, "a record was read twice or skipped"
    for r in rest:
        assert r.offset >= consumed.get((r.topic, r.partition), 0)


def test_auto_commit_commits_positions_while_polling_and_on_close(cluster: LocalCluster) -> None:
    fill(cluster, "auto", 1, 40)
    tp = ("auto", 0)
    c = Consumer(cluster.urls[0], group_id="g-auto", auto_commit_interval_ms=100, **FAST_GROUP)
    try:
        assert c._consumer.enable_auto_commit, "kafka-python's default: on when a group_id is given"
        c.subscribe(["auto"])
        got: list[ConsumerRecord] = []
        wait_for(lambda: got.extend(c.poll(100)) or len(got) >= 40, 30, "every record")
        assert c.position(tp) == 40
        wait_for(lambda: c.poll(20) == [] and c.committed(tp) == 40, 10, "an auto-commit from poll()")
        c.seek(tp, 7)
    finally:
        c.close()
    with Consumer(cluster.urls[1], group_id="g-auto", enable_auto_commit=False) as other:
        assert other.committed(tp) == 7, "close() must commit the current positions"


def test_member_that_stops_polling_loses_its_partitions(cluster: LocalCluster) -> None:
    fill(cluster, "lost", 2, 5)
    rec = Recorder()
    c = Consumer(cluster.urls[0], group_id="g-lost", max_poll_interval_ms=1500, enable_auto_commit=False, **FAST_GROUP)
    try:
        c.subscribe(["lost"], listener=rec)
        drive([c], lambda: len(c.assignment()) == 2, 30, "an assignment")
        generation = c.group_metadata().generation_id
        # No poll for max_poll_interval_ms: the heartbeat task leaves the group (Kafka's poll timeout).
        wait_for(lambda: not group_state(cluster, "g-lost")["members"], 15, "the member to leave")
        drive([c], lambda: c.group_metadata().generation_id > generation, 30, "a rejoin")
        kinds = [k for k, _ in rec.events]
        assert kinds == ["assigned", "lost", "assigned"], rec.events
    finally:
        c.close()


def test_silent_member_is_expelled_and_the_survivor_takes_its_partitions(cluster: LocalCluster) -> None:
    """A member that never heartbeats (a crashed process) is removed after its session timeout."""
    fill(cluster, "silent", 2, 5)
    everything = {("silent", 0), ("silent", 1)}
    c = Consumer(cluster.urls[0], group_id="g-silent", enable_auto_commit=False, **FAST_GROUP)
    answers: list[Any] = []
    try:
        c.subscribe(["silent"])
        drive([c], lambda: c.assignment() == everything, 30, "an assignment")
        body = {"member_id": "", "topics": ["silent"], "session_timeout_ms": 1500, "rebalance_timeout_ms": 10_000}
        joiner = threading.Thread(
            target=lambda: answers.append(http("POST", cluster.url(2) + "/v1/groups/g-silent/join", body, timeout=60))
        )
        joiner.start()
        drive([c], lambda: len(c.assignment()) == 1, 30, "a split with the silent member")
        joiner.join(30)
        assert answers and answers[0][0] == 200, answers
        # It never heartbeats: after 1.5 s it is expelled and c rebalances to own everything again.
        drive([c], lambda: c.assignment() == everything, 30, "the survivor to take over")
    finally:
        c.close()


def test_offsets_of_an_aborted_transaction_are_never_visible_and_pending_ones_are_unstable(
    cluster: LocalCluster,
) -> None:
    cluster.create_topic("tin", partitions=1, rf=3)
    cluster.create_topic("tout", partitions=1, rf=3)
    tp = ("tin", 0)
    stable = Consumer(cluster.urls[0], group_id="g-txn", isolation_level="read_committed", enable_auto_commit=False)
    loose = Consumer(cluster.urls[1], group_id="g-txn", enable_auto_commit=False)
    producer = Producer(cluster.urls[2], transactional_id="g-txn-writer", transaction_timeout_ms=10_000)
    try:
        stable.commit({tp: 5})  # a plain commit: the group has no members
        assert stable.committed(tp) == 5

        producer.init_transactions()
        producer.begin_transaction()
        producer.send("tout", value=b"x")
        producer.send_offsets_to_transaction({tp: 10}, "g-txn")
        # Pending: require_stable readers (read_committed) wait, then get UNSTABLE_OFFSET_COMMIT ...
        with pytest.raises(BrokerError) as err:
            stable.committed_offsets([tp], timeout_ms=300)
        assert err.value.error_code is ErrorCode.UNSTABLE_OFFSET_COMMIT
        # ... a read_uncommitted consumer does not ask for stability and sees the last committed one.
        assert loose.committed(tp) == 5
        producer.abort_transaction()
        assert stable.committed(tp) == 5, "offsets of an aborted transaction became visible"

        producer.begin_transaction()
        producer.send("tout", value=b"y")
        producer.send_offsets_to_transaction({tp: OffsetAndMetadata(20, "txn")}, "g-txn")
        producer.commit_transaction()
        assert stable.committed(tp, metadata=True) == OffsetAndMetadata(20, "txn")
    finally:
        producer.close()
        stable.close()
        loose.close()


def test_zombie_member_cannot_commit_transactional_offsets(cluster: LocalCluster) -> None:
    """KIP-447: a member whose generation ended gets ILLEGAL_GENERATION; its transaction must abort."""
    fill(cluster, "zin", 2, 3)
    cluster.create_topic("zout", partitions=1, rf=3)
    a = Consumer(cluster.urls[0], group_id="g-zombie", isolation_level="read_committed", enable_auto_commit=False,
                 **FAST_GROUP)  # fmt: skip
    b = Consumer(cluster.urls[1], group_id="g-zombie", isolation_level="read_committed", enable_auto_commit=False,
                 **FAST_GROUP)  # fmt: skip
    producer = Producer(cluster.urls[2], transactional_id="zombie-a", transaction_timeout_ms=10_000)
    try:
        a.subscribe(["zin"])
        drive([a], lambda: len(a.assignment()) == 2, 30, "a's assignment")
        zombie = a.group_metadata()
        assert zombie.generation_id >= 1 and zombie.member_id
        b.subscribe(["zin"])
        drive([a, b], lambda: len(a.assignment()) == len(b.assignment()) == 1, 30, "the next generation")
        assert a.group_metadata().generation_id > zombie.generation_id

        producer.init_transactions()
        for stale, code in (
            (zombie, ErrorCode.ILLEGAL_GENERATION),
            (ConsumerGroupMetadata("g-zombie", a.group_metadata().generation_id, "no-such-member"),
             ErrorCode.UNKNOWN_MEMBER_ID),
        ):  # fmt: skip
            producer.begin_transaction()
            producer.send("zout", value=b"zombie output")
            with pytest.raises(BrokerError) as err:
                producer.send_offsets_to_transaction({("zin", 0): 3}, stale)
            assert err.value.error_code is code
            producer.abort_transaction()
        assert a.committed(("zin", 0)) is None

        # The current generation commits.
        owner = a if ("zin", 0) in a.assignment() else b
        producer.begin_transaction()
        producer.send("zout", value=b"real output")
        producer.send_offsets_to_transaction({("zin", 0): 3}, owner.group_metadata())
        producer.commit_transaction()
        assert a.committed(("zin", 0)) == 3
    finally:
        producer.close()
        a.close()
        b.close()


def test_a_join_the_coordinator_refuses_is_raised_by_poll(cluster: LocalCluster) -> None:
    fill(cluster, "refused", 1, 1)
    # The cluster allows sessions of 1-300 s: a 500 ms session is INVALID_SESSION_TIMEOUT, not a hang.
    with Consumer(cluster.urls[0], group_id="g-refused", session_timeout_ms=500, heartbeat_interval_ms=100) as c:
        c.subscribe(["refused"])
        with pytest.raises(BrokerError) as err:
            c.poll(10_000)  # the join's answer ends the poll at once
        assert err.value.error_code is ErrorCode.INVALID_SESSION_TIMEOUT
        assert c.assignment() == set()
