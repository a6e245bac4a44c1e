"""Consumer groups through the Kafka listener: kafka-python, confluent-kafka and aiokafka against a real cluster.

Kafka's classic group protocol with the assignment computed by the group's
leader member: groups form, rebalance when members join and leave (every
partition assigned exactly once), commit offsets that the HTTP offsets API
reads (and the other way round), and are listed, described and deleted by
the libraries' admin clients. One 3-node cluster per module (``kafka_cluster``),
which allows sessions from 1 s (``group_min_session_timeout_ms``), as the
broker of kafka-python's own integration suite does.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.consumer import JoinGroupRequest, JoinGroupResponse
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from tests.integration.kafka.conftest import unique
from tests.support.cluster import LocalCluster, http, wait_for

pytestmark = pytest.mark.integration

PARTITIONS = 4
#: small timeouts: a member that leaves or dies is noticed within seconds
SESSION_MS = 6000
HEARTBEAT_MS = 300
MAX_POLL_MS = 10_000
RECORDS_PER_PARTITION = 50
#: consume tests: at-least-once delivery through a rebalance, offsets auto-committed
AUTO_COMMIT_MS = 200
#: the shortest session the module's cluster allows (Kafka's default minimum is 6 s)
MIN_SESSION_MS = 1000
#: a kafka-python member's poll. kafka-python 3.0.12 drops a join whose poll() times out between SyncGroup's
#: answer and its handling when nothing asks it to rejoin: the member then waits without an assignment or
#: heartbeats until its session ends. One second covers a JoinGroup and SyncGroup round on a loaded machine.
POLL_MS = 1000


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The package's 3-node cluster, allowing sessions from ``MIN_SESSION_MS``."""
    directory: Path = tmp_path_factory.mktemp("kafka-groups")
    cluster = LocalCluster(directory, 3, group_min_session_timeout_ms=MIN_SESSION_MS)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


def _topic(cluster: LocalCluster, partitions: int = PARTITIONS) -> str:
    """A new topic every live node knows with its leaders: a group leader assigns only the partitions its
    client's metadata shows, and that metadata may come from any node."""
    name = unique("grp")
    cluster.create_topic(name, partitions=partitions)
    cluster.wait_leaders(name, partitions)
    live = [n for n, proc in cluster.procs.items() if proc.poll() is None]
    wait_for(lambda: all(cluster.leader(name, p, via=n) for n in live for p in range(partitions)), 30,
             f"every node to know {name}'s leaders")  # fmt: skip
    return name


def _raw(cluster: LocalCluster, node: int, request: Any, response: Any, version: int) -> Any:
    host, port = cluster.configs[node - 1].self_address.kafka_address.rsplit(":", 1)  # type: ignore[union-attr]
    request.with_header(correlation_id=7, client_id="groups-test")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(bytes(request.encode(header=True, framed=True)))
        (size,) = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))
        data = s.recv(size, socket.MSG_WAITALL)
    return response.decode(data, version=version, header=True)


def _http_coordinator(cluster: LocalCluster, kind: str, key: str) -> int:
    def found() -> int | None:
        status, body = http("GET", f"{cluster.url(1)}/v1/coordinators/{kind}/{key}")
        return int(body["node_id"]) if status == 200 else None

    return wait_for(found, 20, f"the {kind} coordinator of {key}")


def _http_offsets(cluster: LocalCluster, group: str) -> dict[tuple[str, int], int]:
    status, body = http("GET", f"{cluster.url(2)}/v1/groups/{group}/offsets")
    assert status == 200, body
    return {(o["topic"], o["partition"]): o["offset"] for o in body["offsets"]}


def _http_group(cluster: LocalCluster, group: str, state: str) -> dict[str, Any] | None:
    """The group as the HTTP API describes it, when it is in ``state``."""
    status, body = http("GET", f"{cluster.url(1)}/v1/groups/{group}")
    assert status == 200, body
    return body if body["state"] == state else None


def _produce(cluster: LocalCluster, topic: str, half: int) -> set[bytes]:
    """Half ``half`` (0 or 1) of every partition's records; their values."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 5})
    values = set()
    per_half = RECORDS_PER_PARTITION // 2
    for p in range(PARTITIONS):
        for i in range(half * per_half, (half + 1) * per_half):
            value = f"{p}-{i}".encode()
            producer.produce(topic, value=value, partition=p)
            values.add(value)
    assert producer.flush(20) == 0
    return values


def _all_committed(cluster: LocalCluster, group: str, topic: str, per_partition: int = RECORDS_PER_PARTITION) -> None:
    want = {(topic, p): per_partition for p in range(PARTITIONS)}
    wait_for(lambda: _http_offsets(cluster, group) == want, 30, "every partition's offset committed at its end")


def _exactly_once(assignments: list[set[tuple[str, int]]], topic: str, partitions: int = PARTITIONS) -> bool:
    """Every partition of ``topic`` is assigned to exactly one member, and every member has some."""
    every = [tp for a in assignments for tp in a]
    return len(every) == partitions and set(every) == {(topic, p) for p in range(partitions)} and all(assignments)


# ---- FindCoordinator ---------------------------------------------------------------------------------------


def test_find_coordinator_names_the_leader_of_the_group_and_transaction_partitions(kafka_cluster: LocalCluster) -> None:
    groups = [unique("fc-group") for _ in range(4)]
    tid = unique("fc-txn")
    expected = {g: _http_coordinator(kafka_cluster, "group", g) for g in groups}
    addresses = {c.node_id: c.self_address.kafka_address for c in kafka_cluster.configs}
    for g in groups:  # one key per request (versions 0-3), asked of any node
        resp = _raw(kafka_cluster, 3, FindCoordinatorRequest[3](key=g, key_type=0), FindCoordinatorResponse, 3)
        assert resp.error_code == 0, resp
        assert resp.node_id == expected[g] and f"{resp.host}:{resp.port}" == addresses[expected[g]]
    # version 4: a batch of keys, each answered on its own
    resp = _raw(kafka_cluster, 1, FindCoordinatorRequest[4](key_type=0, coordinator_keys=groups),
                FindCoordinatorResponse, 4)  # fmt: skip
    assert {c.key: (c.error_code, c.node_id) for c in resp.coordinators} == {g: (0, expected[g]) for g in groups}
    # key type 1: the transaction coordinator of a transactional id
    txn_node = _http_coordinator(kafka_cluster, "transaction", tid)
    resp = _raw(kafka_cluster, 2, FindCoordinatorRequest[4](key_type=1, coordinator_keys=[tid]),
                FindCoordinatorResponse, 4)  # fmt: skip
    assert (resp.coordinators[0].error_code, resp.coordinators[0].node_id) == (0, txn_node)
    # an unknown key type is refused, not guessed
    resp = _raw(kafka_cluster, 2, FindCoordinatorRequest[4](key_type=7, coordinator_keys=["x"]),
                FindCoordinatorResponse, 4)  # fmt: skip
    assert resp.coordinators[0].error_code == 42  # INVALID_REQUEST


# ---- kafka-python -------------------------------------------------------------------------------------------


class _Member:
    """A kafka-python consumer polled by its own thread; ``assigned`` is its current assignment."""

    def __init__(self, bootstrap: str, group: str, topic: str, **config: Any) -> None:
        from kafka import KafkaConsumer

        settings: dict[str, Any] = dict(
            bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False, auto_offset_reset="earliest",
            session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS, max_poll_interval_ms=MAX_POLL_MS,
            request_timeout_ms=MAX_POLL_MS + 5000,
        )  # fmt: skip
        self.consumer = KafkaConsumer(**(settings | config))
        self.consumer.subscribe([topic])
        self.records: list[Any] = []
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._calls: list[Callable[[Any], None]] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for batch in self.consumer.poll(timeout_ms=POLL_MS).values():
                    with self._lock:
                        self.records.extend(batch)
                with self._lock:
                    calls, self._calls = self._calls, []
                for call in calls:
                    call(self.consumer)
        except BaseException as exc:  # the test reads it
            self.error = exc

    def call(self, fn: Callable[[Any], Any], timeout: float = 15) -> Any:
        """Run ``fn(consumer)`` on the polling thread (kafka-python consumers are not thread-safe)."""
        done = threading.Event()
        out: list[Any] = []

        def run(c: Any) -> None:
            try:
                out.append(fn(c))
            except Exception as exc:
                out.append(exc)
            done.set()

        with self._lock:
            self._calls.append(run)
        assert done.wait(timeout), "the consumer's thread did not run the call"
        if isinstance(out[0], Exception):
            raise out[0]
        return out[0]

    @property
    def assigned(self) -> set[tuple[str, int]]:
        return {(tp.topic, tp.partition) for tp in self.consumer.assignment()}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(15)
        self.consumer.close()
        assert self.error is None, self.error


@pytest.fixture
def kafka_python_members(kafka_cluster: LocalCluster) -> Iterator[list[_Member]]:
    members: list[_Member] = []
    yield members
    for m in members:
        if not m._stop.is_set():
            m.close()


def _wait_exactly_once(members: list[_Member], topic: str, timeout: float = 30) -> list[set[tuple[str, int]]]:
    def settled() -> list[set[tuple[str, int]]] | None:
        for m in members:
            assert m.error is None, m.error
        got = [m.assigned for m in members]
        return got if _exactly_once(got, topic) else None

    return wait_for(settled, timeout, "every partition assigned exactly once", interval=0.1)


def test_kafka_python_group_rebalances_as_members_join_and_leave(
    kafka_cluster: LocalCluster, kafka_python_members: list[_Member]
) -> None:
    topic, group = _topic(kafka_cluster), unique("kp-group")
    bootstrap = kafka_cluster.bootstrap_servers
    kafka_python_members += [_Member(bootstrap, group, topic) for _ in range(2)]
    two = _wait_exactly_once(kafka_python_members, topic)
    assert sorted(len(a) for a in two) == [2, 2]
    # a third member joins: the group rebalances and the three share the four partitions
    kafka_python_members.append(_Member(bootstrap, group, topic))
    three = _wait_exactly_once(kafka_python_members, topic)
    assert sorted(len(a) for a in three) == [1, 1, 2]
    # the first leaves (LeaveGroup): the other two take everything over
    kafka_python_members.pop(0).close()
    _wait_exactly_once(kafka_python_members, topic)
    # a kafka-python member whose poll() times out between SyncGroup's answer and its handling drops that
    # answer and joins again (a further rebalance): the group is read once it is stable
    body = wait_for(lambda: _http_group(kafka_cluster, group, "Stable"), 20, "the group stable again")
    assert body["protocol_type"] == "consumer" and len(body["members"]) == 2
    shown = {(a["topic"], a["partition"]) for m in body["members"] for a in m["assignment"]}
    assert shown == {(topic, p) for p in range(PARTITIONS)}


def test_kafka_python_members_joining_at_once_settle_on_one_generation_and_keep_it(
    kafka_cluster: LocalCluster, kafka_python_members: list[_Member]
) -> None:
    """Four kafka-python consumers started together with 3 s sessions and 500 ms heartbeats (kafka-python's
    own ``test_group``): each ends STABLE on one generation, every partition assigned once, and their
    heartbeats go on being answered without a rebalance."""
    from kafka.structs import MemberState

    topic, group = _topic(kafka_cluster), unique("kp-burst")
    bootstrap = kafka_cluster.bootstrap_servers
    kafka_python_members += [_Member(bootstrap, group, topic, session_timeout_ms=3000, heartbeat_interval_ms=500)
                             for _ in range(4)]  # fmt: skip

    def one_generation() -> int | None:
        for m in kafka_python_members:
            assert m.error is None, m.error
        metas = [m.consumer.group_metadata() for m in kafka_python_members]
        if any(meta.state != MemberState.STABLE for meta in metas) or len({meta.generation_id for meta in metas}) > 1:
            return None
        return int(metas[0].generation_id) if _exactly_once([m.assigned for m in kafka_python_members], topic) else None

    generation = wait_for(one_generation, 20, "four members stable on one generation", interval=0.1)
    settled = time.monotonic()
    heartbeats = [m.consumer._coordinator.heartbeat for m in kafka_python_members]
    wait_for(lambda: all(h.last_receive > settled for h in heartbeats), 10, "a heartbeat of each member answered")
    assert not any(h.heartbeat_failed for h in heartbeats)
    assert one_generation() == generation


def test_a_session_below_the_minimum_is_refused_and_joins_nothing(kafka_cluster: LocalCluster) -> None:
    group = unique("short-session")
    coordinator = _http_coordinator(kafka_cluster, "group", group)
    protocol = JoinGroupRequest[7].JoinGroupRequestProtocol(name="range", metadata=b"")
    for version in (0, 7):  # before and after KIP-394's member id round trip
        join = JoinGroupRequest[version](group_id=group, session_timeout_ms=MIN_SESSION_MS - 1,
                                         rebalance_timeout_ms=10_000, member_id="", group_instance_id=None,
                                         protocol_type="consumer", protocols=[protocol])  # fmt: skip
        answer = _raw(kafka_cluster, coordinator, join, JoinGroupResponse, version)
        assert (answer.error_code, answer.member_id) == (26, "")  # INVALID_SESSION_TIMEOUT
    status, body = http("GET", f"{kafka_cluster.url(1)}/v1/groups/{group}")
    assert status == 200 and (body["state"], body["members"]) == ("Dead", []), body


def test_kafka_python_commits_are_read_by_the_http_api_and_back(
    kafka_cluster: LocalCluster, kafka_python_members: list[_Member]
) -> None:
    from kafka import TopicPartition
    from kafka.structs import OffsetAndMetadata

    topic, group = _topic(kafka_cluster), unique("kp-offsets")
    member = _Member(kafka_cluster.bootstrap_servers, group, topic)
    kafka_python_members.append(member)
    _wait_exactly_once(kafka_python_members, topic)
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    # committed leader epochs (-1: none) are kept with the offsets and answered back
    member.call(lambda c: c.commit({tp: OffsetAndMetadata(10 + tp.partition, "m", tp.partition - 1) for tp in tps}))
    assert _http_offsets(kafka_cluster, group) == {(topic, p): 10 + p for p in range(PARTITIONS)}
    assert member.call(lambda c: c.committed(tps[3])) == 13
    # a commit of the wrong generation is fenced and changes nothing
    status, body = http("POST", f"{kafka_cluster.url(1)}/v1/groups/{group}/offsets",
                        {"offsets": [{"topic": topic, "partition": 0, "offset": 99}], "generation_id": 999,
                         "member_id": "nobody"})  # fmt: skip
    assert status == 409 and body["error_code"] == "UNKNOWN_MEMBER_ID", body
    member.close()
    kafka_python_members.clear()
    # kafka-python's LeaveGroup is one attempt, skipped while the member is unjoined or knows no
    # coordinator: without it, the member's session ends it
    wait_for(lambda: _http_group(kafka_cluster, group, "Empty"), SESSION_MS / 1000 + 10, "the group empty")
    # with no member left, an HTTP commit without identity is allowed; Kafka clients read it
    status, body = http("POST", f"{kafka_cluster.url(3)}/v1/groups/{group}/offsets",
                        {"offsets": [{"topic": topic, "partition": 1, "offset": 42}]})  # fmt: skip
    assert status == 200, body
    from kafka import KafkaConsumer

    reader = KafkaConsumer(bootstrap_servers=kafka_cluster.bootstrap_servers, group_id=group,
                           enable_auto_commit=False)  # fmt: skip
    try:
        assert reader.committed(tps[1]) == 42 and reader.committed(tps[0]) == 10
        assert [reader.committed(tp, metadata=True) for tp in tps] == [
            OffsetAndMetadata(10, "m", -1), OffsetAndMetadata(42, "", -1),  # the HTTP commit carries no epoch
            OffsetAndMetadata(12, "m", 1), OffsetAndMetadata(13, "m", 2)]  # fmt: skip
    finally:
        reader.close()


def test_kafka_python_admin_lists_describes_and_deletes_groups(
    kafka_cluster: LocalCluster, kafka_python_members: list[_Member]
) -> None:
    from kafka import KafkaAdminClient, TopicPartition
    from kafka.structs import OffsetAndMetadata

    topic, group = _topic(kafka_cluster), unique("kp-admin")
    kafka_python_members.append(_Member(kafka_cluster.bootstrap_servers, group, topic))
    _wait_exactly_once(kafka_python_members, topic)
    kafka_python_members[0].call(lambda c: c.commit())
    admin = KafkaAdminClient(bootstrap_servers=kafka_cluster.bootstrap_servers, request_timeout_ms=10_000)
    try:
        listed = {g["group_id"]: g for g in admin.list_groups()}
        assert listed[group]["protocol_type"] == "consumer", listed[group]
        described = admin.describe_groups([group])[group]
        assert described["error"] is None, described
        assert described["group_state"] == "Stable" and described["protocol_type"] == "consumer", described
        (member,) = described["members"]
        assert member["member_metadata"]["topics"] == [topic], member
        assigned = {(t["topic"], p) for t in member["member_assignment"]["assigned_partitions"]
                    for p in t["partitions"]}  # fmt: skip
        assert assigned == {(topic, p) for p in range(PARTITIONS)}
        # a group with a member is not deleted
        assert dict(admin.delete_groups([group]))[group] == "NonEmptyGroupError"
        # OffsetDelete keeps the offsets of a subscribed topic and deletes the others
        other = _topic(kafka_cluster, 1)
        kafka_python_members[0].call(lambda c: c.commit({TopicPartition(other, 0): OffsetAndMetadata(0, "", -1)}))
        assert (other, 0) in _http_offsets(kafka_cluster, group)
        result = admin.delete_group_offsets(group, [TopicPartition(topic, 0), TopicPartition(other, 0)])
        assert {(tp.topic, tp.partition): err.__name__ for tp, err in result.items()} == {
            (topic, 0): "GroupSubscribedToTopicError",
            (other, 0): "NoError",
        }
        assert (other, 0) not in _http_offsets(kafka_cluster, group) and (topic, 0) in _http_offsets(
            kafka_cluster, group
        )
        kafka_python_members.pop().close()
        assert dict(admin.delete_groups([group]))[group] == "OK"
        assert _http_offsets(kafka_cluster, group) == {}
        gone = admin.describe_groups([group])[group]
        assert gone["group_state"] == "Dead" and not gone["members"], gone
    finally:
        admin.close()


# ---- confluent-kafka ----------------------------------------------------------------------------------------


def _confluent(bootstrap: str, group: str, topic: str, events: list[str]) -> Any:
    from confluent_kafka import Consumer

    c = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": HEARTBEAT_MS,
        "max.poll.interval.ms": MAX_POLL_MS, "partition.assignment.strategy": "range",
    })  # fmt: skip
    c.subscribe([topic], on_assign=lambda _c, ps: events.append(f"assign {len(ps)}"),
                on_revoke=lambda _c, ps: events.append(f"revoke {len(ps)}"))  # fmt: skip
    return c


def _confluent_settle(consumers: list[Any], topic: str, timeout: float = 30) -> list[set[tuple[str, int]]]:
    def settled() -> list[set[tuple[str, int]]] | None:
        for c in consumers:
            msg = c.poll(0.05)
            assert msg is None or msg.error() is None or msg.error().retriable(), msg.error()
        got = [{(tp.topic, tp.partition) for tp in c.assignment()} for c in consumers]
        return got if _exactly_once(got, topic) else None

    return wait_for(settled, timeout, "every partition assigned exactly once", interval=0.01)


def test_confluent_group_rebalances_and_commits(kafka_cluster: LocalCluster) -> None:
    from confluent_kafka import TopicPartition

    topic, group = _topic(kafka_cluster), unique("ck-group")
    events: list[str] = []
    consumers = [_confluent(kafka_cluster.bootstrap_servers, group, topic, events) for _ in range(2)]
    try:
        assert sorted(len(a) for a in _confluent_settle(consumers, topic)) == [2, 2]
        consumers.append(_confluent(kafka_cluster.bootstrap_servers, group, topic, events))
        assert sorted(len(a) for a in _confluent_settle(consumers, topic)) == [1, 1, 2]
        consumers.pop(0).close()
        _confluent_settle(consumers, topic)
        assert any(e.startswith("revoke") for e in events)
        # commit what each member owns; the HTTP API and the client read the same offsets
        for i, c in enumerate(consumers):
            owned = [TopicPartition(tp.topic, tp.partition, 100 + i) for tp in c.assignment()]
            c.commit(offsets=owned, asynchronous=False)
        committed = _http_offsets(kafka_cluster, group)
        assert sorted(committed) == [(topic, p) for p in range(PARTITIONS)]
        back = consumers[0].committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
        assert {tp.partition: tp.offset for tp in back} == {p: o for (_t, p), o in committed.items()}
    finally:
        for c in consumers:
            c.close()


def test_confluent_admin_lists_describes_and_deletes_groups(kafka_cluster: LocalCluster) -> None:
    from confluent_kafka import ConsumerGroupState, TopicPartition
    from confluent_kafka.admin import AdminClient

    topic, group = _topic(kafka_cluster), unique("ck-admin")
    consumer = _confluent(kafka_cluster.bootstrap_servers, group, topic, [])
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap_servers})
    try:
        _confluent_settle([consumer], topic)
        consumer.commit(offsets=[TopicPartition(topic, 2, 7)], asynchronous=False)
        listed = admin.list_consumer_groups(request_timeout=10).result()
        assert group in {g.group_id for g in listed.valid}
        described = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
        assert described.state == ConsumerGroupState.STABLE and len(described.members) == 1
        assigned = {(tp.topic, tp.partition) for tp in described.members[0].assignment.topic_partitions}
        assert assigned == {(topic, p) for p in range(PARTITIONS)}
        consumer.close()
        consumer = None
        wait_for(lambda: admin.describe_consumer_groups([group], request_timeout=10)[group].result().state
                 == ConsumerGroupState.EMPTY, 20, "the group to be empty")  # fmt: skip
        admin.delete_consumer_groups([group], request_timeout=10)[group].result()
        assert _http_offsets(kafka_cluster, group) == {}
    finally:
        if consumer is not None:
            consumer.close()


# ---- aiokafka ------------------------------------------------------------------------------------------------


def test_aiokafka_group_rebalances_and_commits(kafka_cluster: LocalCluster) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    topic, group = _topic(kafka_cluster), unique("aio-group")

    def member() -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            topic, bootstrap_servers=kafka_cluster.bootstrap_servers, group_id=group, enable_auto_commit=False,
            auto_offset_reset="earliest", session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS,
            max_poll_interval_ms=MAX_POLL_MS, request_timeout_ms=MAX_POLL_MS + 5000,
        )  # fmt: skip

    async def settle(consumers: list[AIOKafkaConsumer], timeout: float = 30) -> list[set[tuple[str, int]]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            await asyncio.gather(*(c.getmany(timeout_ms=50) for c in consumers))
            got = [{(tp.topic, tp.partition) for tp in c.assignment()} for c in consumers]
            if _exactly_once(got, topic):
                return got
        raise AssertionError(f"not every partition assigned exactly once: {got}")

    async def scenario() -> None:
        consumers = [member(), member()]
        try:
            await asyncio.gather(*(c.start() for c in consumers))
            assert sorted(len(a) for a in await settle(consumers)) == [2, 2]
            third = member()
            await third.start()
            consumers.append(third)
            assert sorted(len(a) for a in await settle(consumers)) == [1, 1, 2]
            await consumers.pop(0).stop()
            await settle(consumers)
            owned = {tp: 5 for c in consumers[:1] for tp in c.assignment()}
            await consumers[0].commit(owned)
            for tp in owned:
                assert await consumers[0].committed(tp) == 5
            assert {k: v for k, v in _http_offsets(kafka_cluster, group).items()} == {
                (tp.topic, tp.partition): 5 for tp in owned
            }
            assert await consumers[1].committed(TopicPartition(topic, 0)) in (None, 5)
        finally:
            await asyncio.gather(*(c.stop() for c in consumers), return_exceptions=True)

    asyncio.run(scenario())


# ---- consuming through a rebalance (one test per library) ---------------------------------------------------


def test_kafka_python_consumes_everything_through_a_rebalance(
    kafka_cluster: LocalCluster, kafka_python_members: list[_Member]
) -> None:
    topic, group = _topic(kafka_cluster), unique("kp-consume")
    produced = _produce(kafka_cluster, topic, 0)
    auto = {"enable_auto_commit": True, "auto_commit_interval_ms": AUTO_COMMIT_MS, "max_poll_records": 20}
    first = _Member(kafka_cluster.bootstrap_servers, group, topic, **auto)
    kafka_python_members.append(first)

    def consumed() -> set[bytes]:
        return {r.value for m in kafka_python_members for r in list(m.records)}

    wait_for(lambda: consumed() == produced, 30, "the first member to consume the first half")
    # a second member joins: the group rebalances, then the second half is produced and split between them
    second = _Member(kafka_cluster.bootstrap_servers, group, topic, **auto)
    kafka_python_members.append(second)
    _wait_exactly_once(kafka_python_members, topic)
    produced |= _produce(kafka_cluster, topic, 1)
    wait_for(lambda: consumed() == produced, 30, "every record consumed")
    assert second.records, "the second member consumed its partitions"
    _all_committed(kafka_cluster, group, topic)


def test_confluent_consumes_everything_through_a_rebalance(kafka_cluster: LocalCluster) -> None:
    from confluent_kafka import Consumer, KafkaError, KafkaException

    topic, group = _topic(kafka_cluster), unique("ck-consume")
    produced = _produce(kafka_cluster, topic, 0)

    def member() -> Any:
        c = Consumer({
            "bootstrap.servers": kafka_cluster.bootstrap_servers, "group.id": group, "auto.offset.reset": "earliest",
            "enable.auto.commit": True, "auto.commit.interval.ms": AUTO_COMMIT_MS, "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": HEARTBEAT_MS, "max.poll.interval.ms": MAX_POLL_MS,
        })  # fmt: skip
        c.subscribe([topic])
        return c

    got: list[list[bytes]] = [[], []]
    consumers = [member()]
    try:

        def poll_all() -> None:
            for i, c in enumerate(consumers):
                for msg in c.consume(50, 0.05):
                    assert msg.error() is None, msg.error()
                    got[i].append(msg.value())

        def rebalanced() -> bool:
            return _exactly_once([{(tp.topic, tp.partition) for tp in c.assignment()} for c in consumers], topic)

        wait_for(lambda: poll_all() or set(got[0]) == produced, 30, "the first member to consume the first half", 0.01)
        consumers.append(member())
        wait_for(lambda: poll_all() or rebalanced(), 30, "the rebalance", 0.01)
        produced |= _produce(kafka_cluster, topic, 1)
        wait_for(lambda: poll_all() or set(got[0]) | set(got[1]) == produced, 30, "every record consumed", 0.01)
        assert got[1], "the second member consumed its partitions"
        for c in consumers:
            try:
                c.commit(asynchronous=False)
            except KafkaException as e:
                # Auto-commit got there first: librdkafka has nothing new to commit (the broker's offsets are
                # checked next either way).
                if e.args[0].code() != KafkaError._NO_OFFSET:
                    raise
        _all_committed(kafka_cluster, group, topic)
    finally:
        for c in consumers:
            c.close()


def test_aiokafka_consumes_everything_through_a_rebalance(kafka_cluster: LocalCluster) -> None:
    from aiokafka import AIOKafkaConsumer

    topic, group = _topic(kafka_cluster), unique("aio-consume")
    produced = _produce(kafka_cluster, topic, 0)

    def member() -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            topic, bootstrap_servers=kafka_cluster.bootstrap_servers, group_id=group, auto_offset_reset="earliest",
            enable_auto_commit=True, auto_commit_interval_ms=AUTO_COMMIT_MS, session_timeout_ms=SESSION_MS,
            heartbeat_interval_ms=HEARTBEAT_MS, max_poll_interval_ms=MAX_POLL_MS, max_poll_records=20,
        )  # fmt: skip

    async def scenario() -> None:
        nonlocal produced
        got: list[list[bytes]] = [[], []]
        consumers = [member()]

        async def poll_until(done: Callable[[], bool], what: str) -> None:
            deadline = time.monotonic() + 30
            while not done():
                assert time.monotonic() < deadline, f"{what} did not happen"
                for i, polled in enumerate(await asyncio.gather(*(c.getmany(timeout_ms=50) for c in consumers))):
                    for batch in polled.values():
                        got[i].extend(r.value for r in batch)

        def rebalanced() -> bool:
            return _exactly_once([{(tp.topic, tp.partition) for tp in c.assignment()} for c in consumers], topic)

        try:
            await consumers[0].start()
            await poll_until(lambda: set(got[0]) == produced, "the first member consuming the first half")
            second = member()
            await second.start()
            consumers.append(second)
            await poll_until(rebalanced, "the rebalance")
            produced |= _produce(kafka_cluster, topic, 1)
            await poll_until(lambda: set(got[0]) | set(got[1]) == produced, "consuming every record")
            assert got[1], "the second member consumed its partitions"
            for c in consumers:
                await c.commit()
        finally:
            await asyncio.gather(*(c.stop() for c in consumers), return_exceptions=True)

    asyncio.run(scenario())
    _all_committed(kafka_cluster, group, topic)


def test_a_restarted_static_member_replaces_its_old_incarnation(kafka_cluster: LocalCluster) -> None:
    """KIP-345: a consumer with group.instance.id that restarts without leaving takes its place back at once,
    not after its old incarnation's session timeout (30 s here)."""
    from confluent_kafka import Consumer

    topic, group = _topic(kafka_cluster), unique("ck-static")

    def member(instance: str) -> Any:
        c = Consumer({
            "bootstrap.servers": kafka_cluster.bootstrap_servers, "group.id": group, "group.instance.id": instance,
            "session.timeout.ms": 30_000, "heartbeat.interval.ms": HEARTBEAT_MS, "max.poll.interval.ms": 30_000,
        })  # fmt: skip
        c.subscribe([topic])
        return c

    consumers = [member("a"), member("b")]
    try:
        _confluent_settle(consumers, topic)
        consumers.pop(0).close()  # a static member does not leave its group when it closes
        consumers.insert(0, member("a"))
        _confluent_settle(consumers, topic, timeout=15)
        status, body = http("GET", f"{kafka_cluster.url(1)}/v1/groups/{group}")
        assert status == 200 and sorted(m["group_instance_id"] for m in body["members"]) == ["a", "b"], body
    finally:
        for c in consumers:
            c.close()


# ---- transactional offsets: OffsetFetch require_stable (KIP-447) ----------------------------------------------


def test_offset_fetch_require_stable_waits_for_the_transactions_marker(kafka_cluster: LocalCluster) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from kafka.protocol.consumer import OffsetFetchRequest, OffsetFetchResponse

    topic, group, tid = _topic(kafka_cluster, 1), unique("stable-group"), unique("stable-txn")
    coordinator = _http_coordinator(kafka_cluster, "group", group)
    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap_servers, "group.id": group})
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers, "transactional.id": tid})

    def fetch(stable: bool) -> tuple[int, int]:
        T = OffsetFetchRequest.OffsetFetchRequestTopic
        req = OffsetFetchRequest[7](group_id=group, topics=[T(name=topic, partition_indexes=[0])],
                                    require_stable=stable)  # fmt: skip
        p = _raw(kafka_cluster, coordinator, req, OffsetFetchResponse, 7).topics[0].partitions[0]
        return p.committed_offset, p.error_code

    try:
        producer.init_transactions(20)
        producer.begin_transaction()
        producer.send_offsets_to_transaction([TopicPartition(topic, 0, 17)], consumer.consumer_group_metadata(), 20)
        # pending: invisible, and UNSTABLE_OFFSET_COMMIT (88) for a consumer that requires stable offsets
        assert fetch(False) == (-1, 0)
        assert fetch(True) == (-1, 88)
        producer.commit_transaction(20)
        wait_for(lambda: fetch(True) == (17, 0), 20, "the committed offset to be stable")
        assert _http_offsets(kafka_cluster, group) == {(topic, 0): 17}
    finally:
        consumer.close()


# ---- coordinator failover (last: it restarts a node of the module's cluster) --------------------------------


def test_a_kafka_group_survives_its_coordinators_death(kafka_cluster: LocalCluster) -> None:
    """The stored generation and offsets move with the coordinator: the members carry on and commit."""
    from confluent_kafka import TopicPartition

    topic, group = _topic(kafka_cluster), unique("ck-failover")
    consumers = [_confluent(kafka_cluster.bootstrap_servers, group, topic, []) for _ in range(2)]
    victim = _http_coordinator(kafka_cluster, "group", group)
    try:
        _confluent_settle(consumers, topic)
        for i, c in enumerate(consumers):
            c.commit(offsets=[TopicPartition(tp.topic, tp.partition, 10 + i) for tp in c.assignment()],
                     asynchronous=False)  # fmt: skip
        committed = {(topic, p): o for (_t, p), o in _http_offsets(kafka_cluster, group).items()}
        kafka_cluster.kill(victim)
        alive = next(n for n in (1, 2, 3) if n != victim)

        def new_coordinator() -> int | None:
            status, body = http("GET", f"{kafka_cluster.url(alive)}/v1/coordinators/group/{group}")
            return body["node_id"] if status == 200 and body["node_id"] != victim else None

        wait_for(new_coordinator, 30, "a new group coordinator")

        def committed_through_the_new_coordinator() -> bool:
            _confluent_settle(consumers, topic)
            for i, c in enumerate(consumers):
                try:
                    c.commit(offsets=[TopicPartition(tp.topic, tp.partition, 20 + i) for tp in c.assignment()],
                             asynchronous=False)  # fmt: skip
                except Exception:  # the coordinator moves: the members find it and rejoin or carry on
                    return False
            return True

        wait_for(committed_through_the_new_coordinator, 60, "commits through the new coordinator", interval=0.2)
        status, body = http("GET", f"{kafka_cluster.url(alive)}/v1/groups/{group}/offsets")
        assert status == 200, body
        now = {(o["topic"], o["partition"]): o["offset"] for o in body["offsets"]}
        assert sorted(now) == sorted(committed) and set(now.values()) <= {20, 21}
        status, body = http("GET", f"{kafka_cluster.url(alive)}/v1/groups/{group}")
        assert status == 200 and body["state"] == "Stable" and len(body["members"]) == 2, body
    finally:
        for c in consumers:
            c.close()
        if kafka_cluster.procs[victim].poll() is not None:
            kafka_cluster.start_node(victim)
            kafka_cluster.wait_ready([victim])
