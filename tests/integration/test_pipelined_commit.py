"""``AsyncProducer.commit_and_begin``: a commit the sending loop does not wait for (docs/pipelined-commit.md).

Three real node processes. The rules these guard:
* every record is delivered once, in ``send`` order per partition, and each
  transaction is atomic, although the next transaction's records were batched
  while the previous one committed;
* the next transaction's records are sent only after the previous commit
  ended, so read_committed never shows them before their own commit;
* a pipelined commit that fails takes the next transaction with it: its
  records fail unsent, and the producer is where ``commit_transaction``
  would have left it (fenced: fatal; a failed batch: abort, then go on).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from clients import Producer
from clients.aio import AsyncProducer
from clients.aio._transactions import TransactionAbortedError
from clients.protocol import BrokerError, ErrorCode
from tests.integration.test_txn_client import topic
from tests.support.cluster import LocalCluster, wait_for
from tests.support.txn_reads import consume_all, http_read, leader_url, wait_settled

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("pipelined-commit"), 3)
    try:
        yield c.start()
    finally:
        c.close()


def read(c: LocalCluster, t: str, partition: int, isolation: str) -> list[bytes]:
    return [v for _, v in http_read(leader_url(c, t, partition), t, partition, isolation)]


def test_pipelined_commits_deliver_every_record_once_in_order_and_each_transaction_whole(cluster):
    t = topic(cluster, 3)
    txns, per_txn = 15, 24

    async def run() -> tuple[dict[int, list[bytes]], int, int]:
        sent: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
        async with AsyncProducer(cluster.urls, transactional_id="pc-order", linger_ms=1) as p:
            await p.init_transactions()
            epoch0 = p.producer_epoch
            p.begin_transaction()
            outcomes = []
            for n in range(txns):
                for i in range(per_txn):
                    v = f"t{n}-{i}".encode()
                    await p.send(t, value=v, partition=i % 3)
                    sent[i % 3].append(v)
                outcome = await p.commit_and_begin()
                # The commit runs in the background: the loop is free to fill the next transaction.
                assert not outcome.done()
                outcomes.append(outcome)
            await p.commit_transaction()  # the last (empty) one: waits for the pipelined commit first
            await asyncio.gather(*outcomes)
            m = p.metrics()
            return sent, m["transactions_committed"], p.producer_epoch - epoch0

    sent, committed, epochs = asyncio.run(run())
    assert committed == txns + 1
    assert epochs == txns, "TV2: every EndTxn that reached the coordinator handed out the next epoch"
    wait_settled(cluster, t, range(3))
    by_consumer = consume_all(cluster.urls, [(t, p) for p in range(3)], "read_committed")
    for p in range(3):
        assert [v for _, v in by_consumer[(t, p)]] == sent[p]
        assert read(cluster, t, p, "read_committed") == sent[p]
        assert read(cluster, t, p, "read_uncommitted") == sent[p], "no record was written twice"


def test_records_sent_during_a_pipelined_commit_stay_invisible_until_their_own_commit(cluster):
    t = topic(cluster)

    async def run() -> None:
        async with AsyncProducer(cluster.urls, transactional_id="pc-visible") as p:
            await p.init_transactions()
            p.begin_transaction()
            for v in (b"a", b"b"):
                await p.send(t, value=v)
            outcome = await p.commit_and_begin()
            later = await p.send(t, value=b"c")  # the next transaction's: held until the commit ends
            assert not later.done()
            await outcome
            md = await later  # sent once the commit ended, under the next transaction's identity
            assert md.offset > 1
            await asyncio.to_thread(
                wait_for, lambda: read(cluster, t, 0, "read_committed") == [b"a", b"b"], 30, "a and b committed"
            )
            assert read(cluster, t, 0, "read_uncommitted") == [b"a", b"b", b"c"]
            assert read(cluster, t, 0, "read_committed") == [b"a", b"b"], "c's transaction is still open"
            await p.commit_transaction()

    asyncio.run(run())
    wait_settled(cluster, t, [0])
    assert read(cluster, t, 0, "read_committed") == [b"a", b"b", b"c"]


def test_a_fenced_pipelined_commit_fails_the_next_transactions_records_unsent(cluster):
    t = topic(cluster)
    tid = "pc-fenced"

    async def run() -> None:
        async with AsyncProducer(cluster.urls, transactional_id=tid) as z, \
                AsyncProducer(cluster.urls, transactional_id=tid) as s:  # fmt: skip
            await z.init_transactions()
            z.begin_transaction()
            await z.send_and_wait(t, value=b"zombie")
            await s.init_transactions()  # fences z and aborts its open transaction
            outcome = await z.commit_and_begin()
            never = await z.send(t, value=b"never")
            with pytest.raises(BrokerError) as ei:
                await outcome
            assert ei.value.error_code is ErrorCode.PRODUCER_FENCED
            with pytest.raises(TransactionAbortedError, match="did not commit"):
                await never
            with pytest.raises(BrokerError) as ei:
                await z.send(t, value=b"after")
            assert ei.value.error_code is ErrorCode.PRODUCER_FENCED
            s.begin_transaction()
            await s.send_and_wait(t, value=b"successor")
            await s.commit_transaction()

    asyncio.run(run())
    wait_settled(cluster, t, [0])
    assert read(cluster, t, 0, "read_committed") == [b"successor"]
    assert b"never" not in read(cluster, t, 0, "read_uncommitted"), "a held record was sent"


def test_a_failed_batch_makes_the_pipelined_commit_abortable_and_the_producer_goes_on(cluster):
    t = topic(cluster, **{"max.message.bytes": 2048})

    async def run() -> None:
        async with AsyncProducer(cluster.urls, transactional_id="pc-abortable") as p:
            await p.init_transactions()
            p.begin_transaction()
            await p.send_and_wait(t, value=b"small")
            big = await p.send(t, value=b"x" * 4096)  # the broker rejects its batch: MESSAGE_TOO_LARGE
            outcome = await p.commit_and_begin()
            held = await p.send(t, value=b"held")
            with pytest.raises(BrokerError) as ei:
                await outcome
            assert ei.value.error_code is ErrorCode.TRANSACTION_ABORTABLE
            with pytest.raises(BrokerError) as ei:
                await big
            assert ei.value.error_code is ErrorCode.MESSAGE_TOO_LARGE
            with pytest.raises(TransactionAbortedError):
                await held
            with pytest.raises(BrokerError) as ei:
                await p.commit_transaction()
            assert ei.value.error_code is ErrorCode.TRANSACTION_ABORTABLE
            await p.abort_transaction()
            p.begin_transaction()
            await p.send(t, value=b"good")
            await p.commit_transaction()

    asyncio.run(run())
    wait_settled(cluster, t, [0])
    assert read(cluster, t, 0, "read_committed") == [b"good"]
    assert b"held" not in read(cluster, t, 0, "read_uncommitted")


def test_calls_behind_a_pending_pipelined_commit_wait_for_it(cluster):
    t = topic(cluster, 2)

    async def run() -> int:
        async with AsyncProducer(cluster.urls, transactional_id="pc-chain") as p:
            await p.init_transactions()
            p.begin_transaction()
            await p.send(t, value=b"one", partition=0)
            first = await p.commit_and_begin()
            await p.send(t, value=b"two", partition=1)
            second = await p.commit_and_begin()  # waits for the first, then commits "two"
            assert first.done() and first.exception() is None
            await p.send(t, value=b"three", partition=0)
            await p.flush()  # waits for the second commit, then sends "three"
            assert second.done() and second.exception() is None
            await p.abort_transaction()
            p.begin_transaction()
            await p.send(t, value=b"four", partition=1)
            await p.commit_and_begin()
            committed: int = p.metrics()["transactions_committed"]
            return committed  # close() waits for the last pipelined commit

    assert asyncio.run(run()) == 2
    wait_settled(cluster, t, [0, 1])
    assert read(cluster, t, 0, "read_committed") == [b"one"]
    assert read(cluster, t, 1, "read_committed") == [b"two", b"four"]
    assert read(cluster, t, 0, "read_uncommitted") == [b"one", b"three"]


def test_the_threaded_producer_pipelines_commits_in_send_order(cluster):
    t = topic(cluster)
    with Producer(cluster.urls, transactional_id="pc-sync") as p:
        p.init_transactions()
        p.begin_transaction()
        first = [p.send(t, value=f"a{i}".encode()) for i in range(50)]
        outcome = p.commit_and_begin()  # every record handed off before it is in the committed transaction
        second = [p.send(t, value=f"b{i}".encode()) for i in range(50)]
        outcome.result(timeout=30)
        p.commit_transaction()
    offsets = [f.result().offset for f in first + second]
    assert offsets == sorted(offsets) and len(set(offsets)) == 100
    wait_settled(cluster, t, [0])
    assert read(cluster, t, 0, "read_committed") == [f"a{i}".encode() for i in range(50)] + [
        f"b{i}".encode() for i in range(50)
    ]
