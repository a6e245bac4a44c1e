"""Transactional ``Producer``/``AsyncProducer`` against three real node processes.

Each test cites the rule it guards (kafka_txn.md). Reads go both ways a
read_committed reader can (``tests.support.txn_reads``): the ``Consumer``
filtering fetched batches itself (§7.4) and the server-filtered HTTP fetch.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from concurrent.futures import Future

import pytest

from clients import Consumer, Producer
from clients.aio import AsyncProducer
from clients.aio._transactions import TransactionAbortedError
from clients.protocol import BrokerError, ErrorCode
from clients.records import ConsumerGroupMetadata, PreparedTransaction, RecordMetadata
from tests.support.cluster import LocalCluster, http, node_call, wait_for
from tests.support.txn_reads import consume_all, fetch_page, http_read, leader_url, wait_settled

pytestmark = pytest.mark.integration

FENCED = (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("txn-client"), 3)
    try:
        yield c.start()
    finally:
        c.close()


_names = iter(range(1_000_000))


def topic(c: LocalCluster, partitions: int = 1, **config: object) -> str:
    name = f"tx{next(_names)}"
    c.create_topic(name, partitions=partitions, **config)
    return name


def acked(futs: list[tuple[bytes, Future[RecordMetadata]]]) -> list[tuple[int, bytes]]:
    return [(f.result(timeout=30).offset, v) for v, f in futs]


def read_committed_both_ways(
    c: LocalCluster, t: str, partitions: int, *, settle: bool = True
) -> dict[int, list[tuple[int, bytes]]]:
    """read_committed by the Consumer and by the server-filtered fetch; asserts both agree.

    ``settle``: first wait until no transaction is open on the topic (a commit
    answers before its markers are written); False reads at once.
    """
    if settle:
        wait_settled(c, t, range(partitions))
    by_consumer = consume_all(c.urls, [(t, p) for p in range(partitions)], "read_committed")
    out = {}
    for p in range(partitions):
        by_server = http_read(leader_url(c, t, p), t, p, "read_committed")
        assert by_consumer[(t, p)] == by_server, f"{t}-{p}: consumer and server-side filtering disagree"
        out[p] = by_server
    return out


# ---- commit and abort ------------------------------------------------------------------------------------


def test_commit_across_two_topics_becomes_visible_at_once_and_abort_never(cluster):
    # §14 item 15 and the "commit across 2 topics x 3 partitions visible atomically"
    a, b = topic(cluster, 3), topic(cluster, 3)
    with Producer(cluster.urls, transactional_id="client-commit") as p:
        p.init_transactions()
        p.begin_transaction()
        futs = {(t, q): [(v, p.send(t, value=v, partition=q)) for v in (f"{t}{q}-{i}".encode() for i in range(4))]
                for t in (a, b) for q in range(3)}  # fmt: skip
        p.flush()
        for (t, q), sent in futs.items():
            assert len(acked(sent)) == 4
            page = fetch_page(leader_url(cluster, t, q), t, q, 0, "read_committed")
            assert page["records"] == [] and page["last_stable_offset"] == 0, "an open txn is invisible"
        p.commit_transaction()
        for t in (a, b):
            seen = read_committed_both_ways(cluster, t, 3)
            assert all(seen[q] == acked(futs[(t, q)]) for q in range(3))

        # An aborted (flushed) transaction: invisible to read_committed both ways, visible to read_uncommitted
        p.begin_transaction()
        doomed = [(b"doomed", p.send(a, value=b"doomed", partition=q)) for q in range(3)]
        p.flush()
        p.abort_transaction()
        assert all(f.result().offset >= 0 for _, f in doomed), "acknowledged, then aborted"
        seen = read_committed_both_ways(cluster, a, 3)
        for q in range(3):
            assert seen[q] == acked(futs[(a, q)])
            assert b"doomed" in [v for _, v in http_read(leader_url(cluster, a, q), a, q, "read_uncommitted")]
        assert p.metrics()["transactions_committed"] == 1
        assert p.metrics()["transactions_aborted"] == 1


def test_async_producer_commits_and_aborts(cluster):
    t = topic(cluster, 2)

    async def run() -> tuple[list[tuple[int, bytes]], int]:
        async with AsyncProducer(cluster.urls, transactional_id="client-async") as p:
            await p.init_transactions()
            first_epoch = p.producer_epoch
            p.begin_transaction()
            kept = [await p.send(t, value=f"k{i}".encode(), partition=0) for i in range(5)]
            await p.commit_transaction()
            p.begin_transaction()
            gone = [await p.send(t, value=b"gone", partition=1) for _ in range(5)]
            await p.flush()
            await p.abort_transaction()
            assert all(f.result().offset >= 0 for f in gone)
            assert p.producer_epoch == first_epoch + 2, "TV2: every EndTxn hands out the next epoch"
            return [(f.result().offset, f"k{i}".encode()) for i, f in enumerate(kept)], p.producer_id

    kept, _ = asyncio.run(run())
    seen = read_committed_both_ways(cluster, t, 2)
    assert seen == {0: kept, 1: []}


def test_send_batch_belongs_to_the_open_transaction(cluster):
    """A caller-built batch commits and aborts with its transaction, and needs one to be sent."""
    t = topic(cluster, 1)

    def batch_of(p: AsyncProducer, tag: str) -> object:
        b = p.create_batch()
        for i in range(20):
            b.append(value=f"{tag}{i}".encode())
        return b

    async def run() -> None:
        async with AsyncProducer(cluster.urls, transactional_id="client-batch") as p:
            await p.init_transactions()
            outside = batch_of(p, "x")  # building needs no transaction, sending does
            with pytest.raises(BrokerError):
                await p.send_batch(outside, t, partition=0)
            p.begin_transaction()
            await p.send_batch(batch_of(p, "gone"), t, partition=0)
            await p.abort_transaction()
            p.begin_transaction()
            await p.send(t, value=b"first", partition=0)
            await p.send_batch(batch_of(p, "kept"), t, partition=0)
            await p.commit_transaction()

    asyncio.run(run())
    seen = [v for _, v in read_committed_both_ways(cluster, t, 1)[0]]
    assert seen == [b"first"] + [f"kept{i}".encode() for i in range(20)]


def test_abort_fails_unsent_records_with_a_clear_error(cluster):
    # Records still waiting for linger when the txn aborts are never sent (Kafka's TransactionAbortedException)
    t = topic(cluster)
    with Producer(cluster.urls, transactional_id="client-unsent", linger_ms=60_000) as p:
        p.init_transactions()
        p.begin_transaction()
        fut = p.send(t, value=b"never sent")
        p.abort_transaction()
        with pytest.raises(TransactionAbortedError) as ei:
            fut.result(timeout=10)
        assert ei.value.error_code is ErrorCode.TRANSACTION_ABORTABLE
        p.begin_transaction()
        fut2 = p.send(t, value=b"next")
        p.commit_transaction()
        assert fut2.result().offset == 0, "nothing of the aborted txn reached the log"
    assert read_committed_both_ways(cluster, t, 1) == {0: [(0, b"next")]}


def test_failed_record_makes_the_transaction_abortable_then_the_producer_goes_on(cluster):
    # §4.3 client side: a failed send inside a txn -> the txn can only abort; abort, and the next txn commits
    t = topic(cluster, **{"max.message.bytes": 2048})
    with Producer(cluster.urls, transactional_id="client-abortable") as p:
        p.init_transactions()
        p.begin_transaction()
        ok = p.send(t, value=b"small")
        p.flush()
        big = p.send(t, value=b"x" * 4096)  # the broker rejects the batch: MESSAGE_TOO_LARGE
        with pytest.raises(BrokerError) as ei:
            big.result(timeout=30)
        assert ei.value.error_code is ErrorCode.MESSAGE_TOO_LARGE
        for call in (p.commit_transaction, lambda: p.send(t, value=b"more")):
            with pytest.raises(BrokerError) as ei:
                call()
            assert ei.value.error_code is ErrorCode.TRANSACTION_ABORTABLE
        p.abort_transaction()
        p.begin_transaction()
        good = p.send(t, value=b"good")
        p.commit_transaction()
    assert ok.result().offset == 0
    assert read_committed_both_ways(cluster, t, 1) == {0: [(good.result().offset, b"good")]}


def test_empty_transactions_commit_and_abort_locally(cluster):
    with Producer(cluster.urls, transactional_id="client-empty") as p:
        p.init_transactions()
        ident = (p.producer_id, p.producer_epoch)
        for end in (p.commit_transaction, p.abort_transaction):
            p.begin_transaction()
            end()
        assert (p.producer_id, p.producer_epoch) == ident, "the coordinator never heard of these"


# ---- fencing (§14 item 18) -----------------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["sync", "async"])
def test_zombie_is_fenced_on_send_and_its_data_never_visible(cluster, api):
    t = topic(cluster)
    tid = f"client-zombie-send-{api}"
    if api == "sync":
        zombie = Producer(cluster.urls, transactional_id=tid)
        successor = Producer(cluster.urls, transactional_id=tid)
        try:
            zombie.init_transactions()
            zombie.begin_transaction()
            zombie.send(t, value=b"zombie-1").result(timeout=30)
            successor.init_transactions()  # fences the zombie and aborts its open txn
            late = zombie.send(t, value=b"zombie-2")
            with pytest.raises(BrokerError) as ei:
                late.result(timeout=30)
            assert ei.value.error_code in FENCED
            for call in (zombie.commit_transaction, zombie.begin_transaction, lambda: zombie.send(t, value=b"z")):
                with pytest.raises(BrokerError) as ei:
                    call()
                assert ei.value.error_code is ErrorCode.PRODUCER_FENCED
            successor.begin_transaction()
            good = successor.send(t, value=b"successor")
            successor.commit_transaction()
        finally:
            zombie.close()
            successor.close()
        expected = [(good.result().offset, b"successor")]
    else:

        async def run() -> list[tuple[int, bytes]]:
            async with AsyncProducer(cluster.urls, transactional_id=tid) as z, \
                    AsyncProducer(cluster.urls, transactional_id=tid) as s:  # fmt: skip
                await z.init_transactions()
                z.begin_transaction()
                await z.send_and_wait(t, value=b"zombie-1")
                await s.init_transactions()
                with pytest.raises(BrokerError) as ei:
                    await z.send_and_wait(t, value=b"zombie-2")
                assert ei.value.error_code in FENCED
                with pytest.raises(BrokerError) as ei:
                    await z.commit_transaction()
                assert ei.value.error_code is ErrorCode.PRODUCER_FENCED
                s.begin_transaction()
                md = await s.send_and_wait(t, value=b"successor")
                await s.commit_transaction()
                return [(md.offset, b"successor")]

        expected = asyncio.run(run())
    assert read_committed_both_ways(cluster, t, 1) == {0: expected}


@pytest.mark.parametrize("api", ["sync", "async"])
def test_zombie_is_fenced_on_commit(cluster, api):
    # Its batches were all acknowledged before the successor's init aborted them; only the commit is left
    t = topic(cluster)
    tid = f"client-zombie-commit-{api}"

    async def run_async() -> None:
        async with AsyncProducer(cluster.urls, transactional_id=tid) as z, \
                AsyncProducer(cluster.urls, transactional_id=tid) as s:  # fmt: skip
            await z.init_transactions()
            z.begin_transaction()
            await z.send_and_wait(t, value=b"zombie")
            await s.init_transactions()
            with pytest.raises(BrokerError) as ei:
                await z.commit_transaction()
            assert ei.value.error_code is ErrorCode.PRODUCER_FENCED
            with pytest.raises(BrokerError) as ei:
                z.begin_transaction()
            assert ei.value.error_code is ErrorCode.PRODUCER_FENCED

    if api == "async":
        asyncio.run(run_async())
    else:
        with Producer(cluster.urls, transactional_id=tid) as z, Producer(cluster.urls, transactional_id=tid) as s:
            z.init_transactions()
            z.begin_transaction()
            z.send(t, value=b"zombie").result(timeout=30)
            s.init_transactions()
            with pytest.raises(BrokerError) as ei:
                z.commit_transaction()
            assert ei.value.error_code is ErrorCode.PRODUCER_FENCED
    assert read_committed_both_ways(cluster, t, 1) == {0: []}
    assert b"zombie" in [v for _, v in http_read(leader_url(cluster, t, 0), t, 0, "read_uncommitted")]


def test_zombie_is_fenced_on_offset_commit(cluster):
    # §14 item 18 (testFencingOnSendOffsets): AddOffsetsToTxn/TxnOffsetCommit of a fenced producer fail, fatally
    t = topic(cluster)
    with Producer(cluster.urls, transactional_id="client-zombie-offsets") as z, \
            Producer(cluster.urls, transactional_id="client-zombie-offsets") as s:  # fmt: skip
        z.init_transactions()
        z.begin_transaction()
        z.send(t, value=b"zombie").result(timeout=30)
        s.init_transactions()
        with pytest.raises(BrokerError) as ei:
            z.send_offsets_to_transaction({(t, 0): 1}, ConsumerGroupMetadata("g-zombie-offsets"))
        assert ei.value.error_code is ErrorCode.PRODUCER_FENCED
        with pytest.raises(BrokerError) as ei:
            z.abort_transaction()
        assert ei.value.error_code is ErrorCode.PRODUCER_FENCED
    status, body = http("GET", cluster.url(1) + "/v1/groups/g-zombie-offsets/offsets?require_stable=true")
    assert status in (200, 404), body
    assert not (body.get("offsets") if status == 200 else None), "a fenced producer's offsets were committed"


# ---- prepared transactions (KIP-939 idea) --------------------------------------------------------------------


def test_prepared_transaction_is_ended_by_its_holder_and_the_producer_reinitialises(cluster):
    t = topic(cluster)
    with Producer(cluster.urls, transactional_id="client-prepared") as p:
        p.init_transactions()
        p.begin_transaction()
        fut = p.send(t, value=b"prepared")
        prepared = p.prepare_transaction()
        assert isinstance(prepared, PreparedTransaction)
        assert (prepared.transactional_id, prepared.producer_id) == ("client-prepared", p.producer_id)
        assert fut.result().offset == 0, "prepare flushes first"
        for call in (p.begin_transaction, p.commit_transaction, lambda: p.send(t, value=b"x")):
            with pytest.raises(BrokerError) as ei:
                call()
            assert ei.value.error_code is ErrorCode.INVALID_TXN_STATE
        assert read_committed_both_ways(cluster, t, 1, settle=False) == {0: []}
        # Someone else holding the identity commits it (an external coordinator): ending a Prepared
        # transaction answers once it is visible (no wait_for_completion needed)
        status, body = http(
            "POST",
            cluster.url(2) + "/v1/transactions/client-prepared/end",
            {"producer_id": prepared.producer_id, "producer_epoch": prepared.producer_epoch, "commit": True},
        )
        assert status == 200, body
        assert body["state"] == "CompleteCommit", body
        assert read_committed_both_ways(cluster, t, 1, settle=False) == {0: [(0, b"prepared")]}
        p.init_transactions()
        p.begin_transaction()
        nxt = p.send(t, value=b"after")
        p.commit_transaction()
    assert read_committed_both_ways(cluster, t, 1) == {0: [(0, b"prepared"), (nxt.result().offset, b"after")]}


# ---- the log as read_committed sees it (§7.2, §7.4) --------------------------------------------------------------


def test_lso_is_pinned_by_an_open_transaction_and_released_by_its_end(cluster):
    # §14 item 16 (testReadCommittedConsumerShouldNotSeeUndecidedData): A's open txn hides everything after it
    t = topic(cluster)
    with Producer(cluster.urls) as plain, Producer(cluster.urls, transactional_id="client-lso-a") as a, \
            Producer(cluster.urls, transactional_id="client-lso-b") as b:  # fmt: skip
        before = [(v, plain.send(t, value=v)) for v in (b"p0", b"p1")]
        plain.flush()
        a.init_transactions()
        b.init_transactions()
        a.begin_transaction()
        a_recs = [(v, a.send(t, value=v)) for v in (b"a0", b"a1")]
        a.flush()
        first_open = a_recs[0][1].result().offset
        b.begin_transaction()
        b_recs = [(b"b0", b.send(t, value=b"b0"))]
        b.commit_transaction()
        after = [(b"p2", plain.send(t, value=b"p2"))]
        plain.flush()
        url = leader_url(cluster, t, 0)
        page = fetch_page(url, t, 0, 0, "read_committed")
        assert page["last_stable_offset"] == first_open
        assert page["high_watermark"] > first_open + 3
        assert http_read(url, t, 0) == acked(before), "B's commit and later plain writes wait behind A"
        assert consume_all(cluster.urls, [(t, 0)], "read_committed") == {(t, 0): acked(before)}
        a.commit_transaction()
        released = sorted(acked(before) + acked(a_recs) + acked(b_recs) + acked(after))
        wait_for(lambda: fetch_page(url, t, 0, 0, "read_committed")["last_stable_offset"]
                 == fetch_page(url, t, 0, 0, "read_committed")["high_watermark"], 10, "LSO == HW")  # fmt: skip
        assert read_committed_both_ways(cluster, t, 1) == {0: released}


@pytest.mark.parametrize("seed", [1, 2])
def test_three_transactional_producers_and_plain_writes_interleaved_on_one_partition(cluster, seed):
    # §14 item 17 generalised: random commit/abort by 3 producers plus idempotent plain writes on one
    # partition; read_committed (both ways) == exactly the committed + plain records, in offset order
    t = topic(cluster)
    rng = random.Random(seed)
    expected: list[tuple[int, bytes]] = []
    everything: list[tuple[int, bytes]] = []
    producers = [Producer(cluster.urls, transactional_id=f"mix-{seed}-{i}") for i in range(3)]
    plain = Producer(cluster.urls)
    open_txn: dict[int, list[tuple[bytes, Future[RecordMetadata]]]] = {}
    ends = {"commit": 0, "abort": 0}

    def end(i: int, commit: bool) -> None:
        recs = open_txn.pop(i)
        (producers[i].commit_transaction if commit else producers[i].abort_transaction)()
        ends["commit" if commit else "abort"] += 1
        got = acked(recs)
        everything.extend(got)
        if commit:
            expected.extend(got)

    try:
        for p in producers:
            p.init_transactions()
        for step in range(70):
            actor = rng.randrange(4)
            values = [f"s{step}-{actor}-{k}".encode() for k in range(rng.randint(1, 3))]
            if actor == 3:
                futs = [(v, plain.send(t, value=v)) for v in values]
                plain.flush()
                expected.extend(acked(futs))
                everything.extend(acked(futs))
                continue
            p = producers[actor]
            if actor not in open_txn:
                p.begin_transaction()
                open_txn[actor] = []
            open_txn[actor] += [(v, p.send(t, value=v)) for v in values]
            p.flush()  # land now, between the others' records
            if rng.random() < 0.3:
                end(actor, commit=rng.random() < 0.5)
        for i in list(open_txn):
            end(i, commit=rng.random() < 0.5)
    finally:
        for p in [*producers, plain]:
            p.close()
    assert ends["commit"] and ends["abort"], f"seed {seed} must exercise both outcomes: {ends}"
    expected.sort()
    assert read_committed_both_ways(cluster, t, 1) == {0: expected}
    assert [r for r in http_read(leader_url(cluster, t, 0), t, 0, "read_uncommitted")] == sorted(everything)


def test_commit_returns_at_the_decision_and_the_next_transaction_starts_at_once(cluster):
    # DESIGN.md "Transaction": EndTxn answers after PrepareCommit, the markers follow. The next transaction's
    # first send is held by the coordinator until they are written (no CONCURRENT_TRANSACTIONS reaches the
    # client's retry loop), and each commit becomes visible to read_committed within a deadline
    t = topic(cluster, 3)
    expected: dict[int, list[tuple[int, bytes]]] = {q: [] for q in range(3)}
    with Producer(cluster.urls, transactional_id="client-visible") as p:
        p.init_transactions()
        for n in range(5):
            p.begin_transaction()
            futs = [(f"{n}-{q}".encode(), p.send(t, value=f"{n}-{q}".encode(), partition=q)) for q in range(3)]
            started = time.monotonic()
            p.commit_transaction()
            assert time.monotonic() - started < 10
            for q, (v, f) in enumerate(futs):
                expected[q].append((f.result().offset, v))
        metrics = p.metrics()
        for q in range(3):
            wait_for(lambda q=q: http_read(leader_url(cluster, t, q), t, q) == expected[q], 15, f"{t}-{q} committed")
    assert "CONCURRENT_TRANSACTIONS" not in metrics["errors"], metrics["errors"]
    assert metrics["coordinator_retries"] == 0, "a coordinator call was answered with a retriable error"
    assert metrics["transactions_committed"] == 5


def test_consume_transform_produce_with_every_other_transaction_aborted_copies_exactly_once(cluster):
    # §14 item 20 (testSendOffsetsWithGroupMetadata): offsets go into the txn; an aborted txn rewinds to the
    # committed offsets and redoes the work; the output holds every input exactly once
    src, dst = topic(cluster, 2), topic(cluster)
    with Producer(cluster.urls) as plain:
        for i in range(500):
            plain.send(src, value=f"in-{i}".encode(), partition=i % 2)
    tps = [(src, 0), (src, 1)]
    group = f"copy-{src}"
    with Consumer(cluster.urls, group_id=group, isolation_level="read_committed", enable_auto_commit=False,
                  auto_offset_reset="earliest", max_poll_records=60) as consumer, \
            Producer(cluster.urls, transactional_id=f"copier-{src}") as p:  # fmt: skip
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        p.init_transactions()
        n = 0
        deadline = time.monotonic() + 120
        while any(consumer.committed(tp) != 250 for tp in tps):
            assert time.monotonic() < deadline, [consumer.committed(tp) for tp in tps]
            records = consumer.poll(timeout_ms=500)
            if not records:
                continue
            p.begin_transaction()
            for r in records:
                p.send(dst, value=b"out-" + (r.value or b""))
            p.send_offsets_to_transaction({tp: consumer.position(tp) for tp in tps}, group)
            n += 1
            if n % 2:
                p.abort_transaction()
                for tp in tps:  # rewind to what the group committed
                    committed = consumer.committed(tp)
                    consumer.seek(tp, committed if committed is not None else 0)
            else:
                p.commit_transaction()
    out = [v for _, v in read_committed_both_ways(cluster, dst, 1)[0]]
    assert sorted(out) == sorted(f"out-in-{i}".encode() for i in range(500))
    assert n >= 4


# ---- one add per transaction: the first add carries the partitions the previous transaction wrote to -----------


def _coordinator_writes(c: LocalCluster, tid: str) -> int:
    """Entries the coordinator of ``tid`` wrote: its transaction-state partition's Raft commit index less its
    term. Every leader of a term writes one barrier entry, so an election while a test counts (a ticker
    stall on this 2-core host can cause one) does not read as a coordinator write."""
    commit_index, term = _coordinator_log(c, tid)
    return commit_index - term


def _coordinator_log(c: LocalCluster, tid: str) -> tuple[int, int]:
    """Raft commit index and term of the transaction-state partition that coordinates ``tid``, on its leader."""
    status, coord = http("GET", c.urls[0] + f"/v1/coordinators/transaction/{tid}")
    assert status == 200, coord
    cfg = c.configs[coord["node_id"] - 1]
    state_path = "/v1/internal/state"
    status, state = http("GET", cfg.url + state_path, headers=node_call(cfg, cfg.node_id, "GET", state_path))
    assert status == 200, state
    (entry,) = [
        v for v in state["partitions"].values()
        if v.get("kind") == "__transaction_state" and v["partition"] == coord["partition"]
    ]  # fmt: skip
    return int(entry["commit_index"]), int(entry["term"])


def test_a_transaction_adds_its_partitions_in_one_coordinator_write_and_an_idle_producer_has_none_open(make_cluster):
    # KIP-890 part 2 implicit adds, made cheap (cluster.txn.adds): the first batch of a transaction adds the
    # partitions the previous transaction wrote to, so the other partitions' verifications find them there.
    # A steady pipeline then costs the coordinator 3 writes per transaction (the add, PrepareCommit,
    # CompleteCommit) instead of one add per partition. A hinted partition left unwritten gets a marker that
    # takes no offset and is not hinted again; a producer that stops sending has no transaction open.
    # This is the protocol without carried markers (they cost one write per transaction:
    # tests/integration/test_carried_markers.py), as a client that does not carry them gets.
    cluster = make_cluster(txn_carried_markers=False)
    t = topic(cluster, 3)
    tid = "client-hinted"
    url = cluster.urls[0] + f"/v1/transactions/{tid}"

    def txn_partitions() -> set[int]:
        status, body = http("GET", url)
        assert status == 200, body
        return {tp["partition"] for tp in body["partitions"] if tp["topic"] == t}

    with Producer(cluster.urls, transactional_id=tid, linger_ms=0) as p:
        p.init_transactions()
        expected: dict[int, list[tuple[int, bytes]]] = {q: [] for q in range(3)}

        def one(n: int, partitions: range | tuple[int, ...]) -> None:
            p.begin_transaction()
            futs = [(q, f"{n}-{q}".encode(), p.send(t, value=f"{n}-{q}".encode(), partition=q)) for q in partitions]
            for q, v, f in futs:
                expected[q].append((f.result(timeout=30).offset, v))
            p.commit_transaction()

        one(0, range(3))
        wait_settled(cluster, t, range(3))
        before = _coordinator_writes(cluster, tid)
        for n in range(1, 6):
            one(n, range(3))
        wait_settled(cluster, t, range(3))
        wait_for(lambda: http("GET", url)[1]["state"] == "CompleteCommit", 15, "the last commit to complete")
        assert _coordinator_writes(cluster, tid) - before == 3 * 5, "more than one add per transaction"

        # Partition 0 only: the add still carries 1 and 2 (hinted), whose markers then close nothing
        ends = {q: fetch_page(leader_url(cluster, t, q), t, q, 0, "read_uncommitted")["high_watermark"] for q in (1, 2)}
        p.begin_transaction()
        f = p.send(t, value=b"only-0", partition=0)
        expected[0].append((f.result(timeout=30).offset, b"only-0"))
        assert txn_partitions() == {0, 1, 2}
        p.commit_transaction()
        wait_settled(cluster, t, range(3))
        for q in (1, 2):
            assert fetch_page(leader_url(cluster, t, q), t, q, 0, "read_uncommitted")["high_watermark"] == ends[q]
        # ... and the next transaction is given only what that one wrote
        p.begin_transaction()
        f = p.send(t, value=b"again-0", partition=0)
        expected[0].append((f.result(timeout=30).offset, b"again-0"))
        assert txn_partitions() == {0}
        p.commit_transaction()
        wait_for(lambda: http("GET", url)[1]["state"] == "CompleteCommit", 15, "the commit to complete")
        # Idle: begin_transaction alone opens nothing at the coordinator
        p.begin_transaction()
        assert http("GET", url)[1]["state"] == "CompleteCommit"
        assert txn_partitions() == set()
    assert read_committed_both_ways(cluster, t, 3) == expected
