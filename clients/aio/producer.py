"""``AsyncProducer``: the batching, idempotent producer (kafka-python's ``KafkaProducer`` on asyncio).

What it guarantees with ``enable_idempotence=True`` (the default): every
acknowledged record is in the log exactly once, and records to one partition
land in the order ``send`` was called, whatever the network does -- lost
answers, leader changes, a paused broker. How:

* Records go into a per-partition batch (``batch_size``, ``linger_ms``); the
  partition is murmur2 of the key, or a sticky partition for null keys.
* The sender task drains sealed batches into binary produce requests, batches
  to several partitions led by the same node sharing one request, with at most
  ``max_in_flight_requests_per_connection`` (<= 5) unacknowledged batches per
  partition. A retry resends the same producer id, epoch and sequence bytes,
  so the broker answers a retry of a batch it already holds with the original
  offsets.
* A batch that expires (``delivery_timeout_ms``) after it was sent leaves its
  sequence unresolved: its futures fail with ``DeliveryTimeoutError``
  (``REQUEST_TIMED_OUT``), no new batch is sequenced until every request has
  returned, then the epoch is bumped and all sequences restart at 0 (KIP-360;
  see ``_idempotence``).

Transactions (``transactional_id``; kafka_txn.md §4.3, TV2): ``init_transactions``,
then ``begin_transaction`` / ``send`` ... / ``send_offsets_to_transaction`` /
``commit_transaction`` or ``abort_transaction``, or ``prepare_transaction`` for an
external coordinator. Batches are flagged transactional and the request names
the transactional id; the first batch to a partition adds it to the
transaction (the partition leader verifies with the coordinator, KIP-890).
Each EndTxn hands back the identity of the next transaction. The state
machine and error handling (fenced -> fatal, failed batch -> abortable) are
in ``_transactions``. ``commit_and_begin`` pipelines commits: the next
transaction's records are batched while the previous one commits and go out
the moment it has (docs/pipelined-commit.md).

The event loop is never blocked: ``send`` encodes the record and returns a
future; it suspends only to learn a topic's partitions or when
``buffer_memory`` is used up (at most ``max_block_ms``). Not thread-safe: use
it from the loop it was started on (``clients.Producer`` wraps it for threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ..partitioner import partition_for_key
from ..protocol import (
    PRODUCE_CONTENT_TYPE,
    BrokerError,
    ErrorCode,
    ProducePartition,
    ProduceRequest,
    decode_token,
    encode_produce_request,
    encode_token,
)
from ..records import ConsumerGroupMetadata, OffsetAndMetadata, PreparedTransaction, RecordMetadata, TopicPartition
from ._accumulator import METADATA_ERRORS, Outcome, RecordAccumulator
from ._batch import (
    BATCH_OVERHEAD,
    NO_HEADERS,
    UNKEYED_OVERHEAD,
    ProducerBatch,
    RecordSink,
    add_callback,
    encode_headers,
    record_size,
)
from ._idempotence import IdempotenceManager, ProducerIdState
from ._metadata import MetadataCache
from ._session import HttpSession
from ._transactions import TransactionAbortedError, TransactionManager, TxnState
from ._txn_coordinator import CoordinatorClient, group_offsets_path, offset_commit_entries, transaction_path
from .batch_builder import BatchBuilder

__all__ = ["AsyncProducer", "Callback", "Serializer"]

log = logging.getLogger("clients.producer")

Serializer = Callable[[Any], bytes | None]
Callback = Callable[[RecordMetadata | None, BaseException | None], None]
_MAX_RETRIES = 2**31 - 1


def _acks(value: str | int) -> int:
    if value in ("all", -1, "-1"):
        return -1
    if value in (1, "1"):
        return 1
    if value in (0, "0"):
        return 0
    raise BrokerError(ErrorCode.INVALID_CONFIG, f"acks must be 'all', 1 or 0, got {value!r}")


def _as_bytes(what: str, v: Any) -> bytes | None:
    if v is None or type(v) is bytes:
        return v
    if isinstance(v, bytes | bytearray | memoryview):
        return bytes(v)
    raise BrokerError(
        ErrorCode.INVALID_REQUEST,
        f"{what} must be bytes or None (or configure {what}_serializer), got {type(v).__name__}",
    )


class _Settable(Protocol):
    """What an asyncio or a concurrent.futures future offers to be completed."""

    def done(self) -> bool: ...
    def cancel(self) -> bool: ...
    def set_result(self, result: None, /) -> None: ...
    def set_exception(self, exception: BaseException, /) -> None: ...


def copy_outcome(src: asyncio.Future[None], dst: _Settable) -> None:
    """Complete ``dst`` as ``src`` (done) completed: result, exception or cancellation."""
    if dst.done():
        return
    if src.cancelled():
        dst.cancel()
    elif (exc := src.exception()) is not None:
        dst.set_exception(exc)
    else:
        dst.set_result(None)


class AsyncProducer:
    """Kafka-style producer on asyncio. Names and defaults follow kafka-python.

    ``url_rewrites`` is for tests only: it maps the node URLs the cluster
    advertises in its metadata to the URLs this client must use instead (a
    fault-injecting proxy in front of each node).

    ``transactional_id`` makes it a transactional producer (idempotence is
    forced on); ``transaction_timeout_ms`` is the coordinator's limit on one
    open transaction. The transactional methods block at most ``max_block_ms``
    unless given a ``timeout`` (seconds), as in Kafka.
    """

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        client_id: str | None = None,
        key_serializer: Serializer | None = None,
        value_serializer: Serializer | None = None,
        acks: str | int = "all",
        enable_idempotence: bool = True,
        linger_ms: int = 5,
        batch_size: int = 65536,
        max_in_flight_requests_per_connection: int = 5,
        retries: int = _MAX_RETRIES,
        retry_backoff_ms: int = 100,
        delivery_timeout_ms: int = 120_000,
        request_timeout_ms: int = 30_000,
        buffer_memory: int = 32 * 1024 * 1024,
        max_request_size: int = 1_048_576,
        max_block_ms: int = 60_000,
        metadata_max_age_ms: int = 300_000,
        transactional_id: str | None = None,
        transaction_timeout_ms: int = 60_000,
        txn_token_release_ms: int = 20,
        url_rewrites: Mapping[str, str] | None = None,
        _on_release: Callable[[int], None] | None = None,
    ) -> None:
        self._acks = _acks(acks)
        if transactional_id is not None:
            if not transactional_id:
                raise BrokerError(ErrorCode.INVALID_CONFIG, "transactional_id must not be empty (use None)")
            enable_idempotence = True  # as in Kafka: a transactional producer is idempotent
        if enable_idempotence and self._acks != -1:
            raise BrokerError(ErrorCode.INVALID_CONFIG, "enable_idempotence requires acks='all'")
        if enable_idempotence and not 1 <= max_in_flight_requests_per_connection <= 5:
            raise BrokerError(
                ErrorCode.INVALID_CONFIG,
                "enable_idempotence requires max_in_flight_requests_per_connection between 1 and 5 "
                "(the broker keeps the last 5 batches per producer for duplicate detection)",
            )
        if max_in_flight_requests_per_connection < 1 or batch_size < 1 or retries < 0 or buffer_memory < 1:
            raise BrokerError(ErrorCode.INVALID_CONFIG, "batch_size, buffer_memory and max_in_flight must be >= 1")
        if delivery_timeout_ms < linger_ms + request_timeout_ms:
            raise BrokerError(
                ErrorCode.INVALID_CONFIG, "delivery_timeout_ms must be >= linger_ms + request_timeout_ms (as in Kafka)"
            )
        self.client_id = client_id
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        # Carried markers: tokens not used this long after a commit are given back, so the partitions the next
        # transaction skips get their markers now (docs/carried-markers.md).
        self._token_release_s = txn_token_release_ms / 1000
        self._key_ser = key_serializer
        self._value_ser = value_serializer
        self._request_timeout_ms = request_timeout_ms
        self._buffer_memory = buffer_memory
        self._max_request_size = max_request_size
        self._max_record_bytes = min(max_request_size - BATCH_OVERHEAD, buffer_memory)
        self._max_block_s = max_block_ms / 1000
        self._retry_backoff_s = retry_backoff_ms / 1000
        self._rewrites = {k.rstrip("/"): v.rstrip("/") for k, v in (url_rewrites or {}).items()}
        self._on_release = _on_release
        self._session = HttpSession(request_timeout_ms=request_timeout_ms)
        self._metadata = MetadataCache(self._session, bootstrap, metadata_max_age_ms=metadata_max_age_ms)
        self._idem = IdempotenceManager(enabled=enable_idempotence, transactional=transactional_id is not None)
        self._txn = TransactionManager(transactional_id, self._idem) if transactional_id is not None else None
        self._coordinators = CoordinatorClient(
            self._session,
            self._metadata,
            request_timeout_s=request_timeout_ms / 1000,
            retry_backoff_s=retry_backoff_ms / 1000,
            rewrite=self._rewrite,
        )
        self._acc = RecordAccumulator(
            self._idem,
            batch_size=batch_size,
            linger_s=linger_ms / 1000,
            max_in_flight=max_in_flight_requests_per_connection,
            delivery_timeout_s=delivery_timeout_ms / 1000,
            retry_backoff_s=retry_backoff_ms / 1000,
            retries=retries,
            max_request_size=max_request_size,
            on_report=self._on_report,
            request_overhead=len(transactional_id.encode()) if transactional_id is not None else 0,
        )
        self._wake = asyncio.Event()
        self._init_done = asyncio.Event()  # an InitProducerId attempt sequence ended (id or fatal error)
        self._memory_freed = asyncio.Event()
        self._requests_idle = asyncio.Event()
        self._flush_waiters: list[tuple[set[ProducerBatch], asyncio.Future[None]]] = []
        self._sender: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._metadata_task: asyncio.Task[None] | None = None
        self._init_task: asyncio.Task[None] | None = None
        self._pipelined: asyncio.Task[None] | None = None  # commit_and_begin's commit, until it ends
        self._closed = False
        self._internal_error: BrokerError | None = None
        self._errors: dict[str, int] = {}
        self.requests_sent = 0

    # ---- public API --------------------------------------------------------------------------

    @property
    def producer_id(self) -> int:
        return self._idem.current.producer_id

    @property
    def producer_epoch(self) -> int:
        return self._idem.current.epoch

    async def start(self) -> None:
        """Start the sender and (idempotent mode) wait for a producer id, at most ``max_block_ms``.

        A transactional producer gets its id from ``init_transactions``.
        """
        self.ensure_started()
        if self._txn is not None:
            return
        try:
            async with asyncio.timeout(self._max_block_s):
                while self._idem.state is ProducerIdState.UNINITIALIZED:
                    self._init_done.clear()
                    await self._init_done.wait()
        except TimeoutError as exc:
            raise BrokerError(ErrorCode.REQUEST_TIMED_OUT, "no producer id within max_block_ms") from exc
        self._raise_if_fatal()

    async def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
        timestamp_ms: int | None = None,
        callback: Callback | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue one record; the returned future resolves to its ``RecordMetadata`` once acknowledged."""
        if (
            key is None
            and partition is None
            and headers is None
            and timestamp_ms is None
            and callback is None
            and type(value) is bytes
            and self._value_ser is None
            and self._loop is not None
            and self._usable()
        ):
            # The hot loop's case -- a bytes value for the sticky partition's open batch -- in few steps;
            # the same checks and bytes as the general path below, which takes every other case.
            nbytes = len(value) + UNKEYED_OVERHEAD
            acc = self._acc
            batch = acc.open_sticky_batch(topic, nbytes)
            if (
                batch is not None
                and nbytes <= self._max_record_bytes
                and acc.buffered_bytes + nbytes <= self._buffer_memory
            ):
                fut: asyncio.Future[RecordMetadata] = self._loop.create_future()
                batch.append_unkeyed(time.time_ns() // 1_000_000, value, NO_HEADERS, fut)
                if acc.appended_to_open(batch, nbytes):
                    if acc.window_open(topic, batch.partition):
                        self._wake.set()
                    await asyncio.sleep(0)  # a batch filled up: let the sender ship it
                return fut
        kb, vb, hb, nbytes = self.serialize(key, value, headers)
        if self._sender is None:
            self.ensure_started()
        n = self._metadata.cached_partition_count(topic)
        if not n:
            n = await self._wait_for_topic(topic)
        if self._acc.buffered_bytes + nbytes > self._buffer_memory and self._acc.buffered_bytes > 0:
            await self._wait_for_memory(nbytes)
        assert self._loop is not None
        fut = self._loop.create_future()
        if callback is not None:
            add_callback(fut, callback, log.error)
        if self.append(topic, partition, kb, vb, hb, nbytes, timestamp_ms, fut, n):
            await asyncio.sleep(0)  # a batch filled up: let the sender ship it
        return fut

    def create_batch(self) -> BatchBuilder:
        """An empty ``BatchBuilder`` for ``send_batch`` (aiokafka's name), bounded by ``batch_size``."""
        return BatchBuilder(
            self._acc.batch_size,
            self.encode_record,
            max_record_bytes=self._max_record_bytes,
            plain_values=self._value_ser is None,
        )

    async def send_batch(self, batch: BatchBuilder, topic: str, *, partition: int) -> asyncio.Future[RecordMetadata]:
        """Queue ``batch`` for ``partition`` as one record batch; the future resolves to its first record's metadata.

        Same guarantees as ``send``: sequenced, retried, in order with the
        partition's other records, in the open transaction. Suspends like
        ``send`` to learn the topic or while ``buffer_memory`` is used up.
        """
        self.check_open()
        self.ensure_started()
        n = self._metadata.cached_partition_count(topic) or await self._wait_for_topic(topic)
        if not 0 <= partition < n:
            raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has {n} partitions, not {partition}")
        nbytes = batch.size() - BATCH_OVERHEAD
        if nbytes and self._acc.buffered_bytes + nbytes > self._buffer_memory and self._acc.buffered_bytes > 0:
            await self._wait_for_memory(nbytes)
        self.check_open()
        pb = batch.take()  # last: a send_batch refused up to here leaves the batch to the caller
        assert self._loop is not None
        fut = self._loop.create_future()
        pb.assign(topic, partition, self._loop.time(), fut)
        self._acc.append_batch(pb)
        if self._acc.window_open(topic, partition):
            self._wake.set()
        return fut

    async def send_and_wait(self, topic: str, value: Any = None, key: Any = None, **kw: Any) -> RecordMetadata:
        return await (await self.send(topic, value, key, **kw))

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(await self.wait_for_topic(topic)))

    async def flush(self, timeout: float | None = None) -> None:
        """Send everything queued now and wait until each of those batches is acknowledged or failed.

        Raises ``BrokerError(REQUEST_TIMED_OUT)`` if ``timeout`` (seconds) passes first.
        During a pipelined commit it first waits for that commit (the records
        sent since are held until it ends).
        """
        await self._settle_pipelined()
        await self._flush(timeout)

    async def _flush(self, timeout: float | None, *, held: bool = True) -> None:
        """``flush``; ``held=False`` (a pipelined commit's own flush) leaves out the next transaction's batches."""
        pending = set(self._acc.unreported(held=held))
        if not pending:
            return
        assert self._loop is not None
        fut: asyncio.Future[None] = self._loop.create_future()
        waiter = (pending, fut)
        self._flush_waiters.append(waiter)
        self._acc.flushing += 1
        self._wake.set()
        try:
            async with asyncio.timeout(timeout):
                await fut
        except TimeoutError as exc:
            raise BrokerError(
                ErrorCode.REQUEST_TIMED_OUT, f"flush: {len(pending)} batch(es) not done within {timeout}s"
            ) from exc
        finally:
            self._acc.flushing -= 1
            self._flush_waiters.remove(waiter)

    async def close(self, timeout: float | None = None) -> None:
        """Stop accepting records, deliver what is queued, release every resource.

        With ``timeout`` (seconds), batches still unacknowledged when it
        passes fail with ``DeliveryTimeoutError``. Without, waits at most about
        ``delivery_timeout_ms`` (every batch expires by then).
        """
        if self._closed:
            return
        await self._settle_pipelined(timeout)  # its held batches are sent or failed first
        self._closed = True
        self._acc.closing = True
        self._wake.set()
        try:
            if self._sender is not None:
                try:
                    async with asyncio.timeout(timeout):
                        await asyncio.shield(self._sender)
                except TimeoutError:
                    self._acc.abort_incomplete(f"producer closed after {timeout}s with the batch unacknowledged")
            release = self._release_unused_tokens() if self._loop is not None else None
            if release is not None:  # the last commit's markers are written now instead of after the timer
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(5.0, timeout if timeout is not None else 5.0)):
                        await asyncio.shield(release)
        finally:
            tasks = [t for t in (self._sender, self._metadata_task, self._init_task, *self._tasks) if t is not None]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._acc.abort_incomplete("producer closed")
            await self._session.close()

    # ---- transactions (kafka_txn.md §4.3, TV2; states and error handling in _transactions) --------

    def _txn_manager(self) -> TransactionManager:
        if self._txn is None:
            raise BrokerError(ErrorCode.INVALID_CONFIG, "transactional methods need a transactional_id")
        if self._closed:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "the producer is closed")
        return self._txn

    def _deadline(self, timeout: float | None) -> float:
        return time.monotonic() + (self._max_block_s if timeout is None else timeout)

    async def init_transactions(self, timeout: float | None = None) -> None:
        """InitProducerId for the transactional id: fences every older instance and aborts its open transaction.

        Retries CONCURRENT_TRANSACTIONS (the coordinator is still aborting the
        previous instance's transaction) and coordinator moves until
        ``timeout`` (seconds, default ``max_block_ms``); after a timeout it may
        be called again.
        """
        txn = self._txn_manager()
        txn.begin_init()
        self.ensure_started()
        deadline = self._deadline(timeout)
        with contextlib.suppress(BrokerError, TimeoutError):  # learn every node's URL: lookups survive a dead bootstrap
            async with asyncio.timeout(max(0.0, deadline - time.monotonic()) / 2):
                await self._metadata.refresh()
        tid = txn.transactional_id
        body = {"transactional_id": tid, "transaction_timeout_ms": self.transaction_timeout_ms}
        try:
            res = await self._coordinators.call(
                "transaction", tid, "/v1/producers/init", body, deadline, "init_transactions"
            )
        except BrokerError as exc:
            if exc.error_code in (ErrorCode.PRODUCER_FENCED, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED):
                raise txn.fail(exc) from exc
            txn.init_failed()  # a timeout, or a configuration the coordinator refuses (INVALID_TRANSACTION_TIMEOUT)
            raise
        except asyncio.CancelledError:
            txn.init_failed()
            raise
        txn.initialized(int(res["producer_id"]), int(res["producer_epoch"]))
        self._acc.reset_after_transaction()
        self._wake.set()

    def begin_transaction(self) -> None:
        """Open a transaction locally; the coordinator learns of it with its first batch or offsets."""
        self._txn_manager().begin()

    async def commit_transaction(self, timeout: float | None = None) -> None:
        """Flush, then EndTxn(commit); returns once the coordinator has written every COMMIT marker.

        Raises ``TRANSACTION_ABORTABLE`` if a record of the transaction failed
        (call ``abort_transaction``), ``PRODUCER_FENCED`` if fenced, and
        ``REQUEST_TIMED_OUT`` when ``timeout`` passes first -- the commit may
        then still happen: call ``commit_transaction`` again to finish it.
        """
        await self._settle_pipelined()
        txn = self._txn_manager()
        txn.begin_end(TxnState.COMMITTING)
        deadline = self._deadline(timeout)
        await self.flush(max(0.0, deadline - time.monotonic()))
        txn.raise_if_abortable()
        await self._end_transaction(txn, deadline, commit=True)

    async def commit_and_begin(self, timeout: float | None = None) -> asyncio.Future[None]:
        """Commit the open transaction and open the next one at once; returns the commit's outcome as a future.

        A pipelined ``commit_transaction`` + ``begin_transaction``: the caller
        goes on sending without waiting. Records sent from now on belong to the
        next transaction; they are batched while the commit runs (flush, then
        EndTxn) and sent, in order after everything of the committed
        transaction, the moment it has ended. The future resolves when the
        commit is done and raises what ``commit_transaction`` would have.
        If the commit fails, the next transaction never happened: its records'
        futures fail with ``TransactionAbortedError`` (nothing of them was
        sent) and the producer is where ``commit_transaction`` would have left
        it -- call ``abort_transaction`` after ``TRANSACTION_ABORTABLE``,
        ``commit_transaction`` again after ``REQUEST_TIMED_OUT``; fenced is
        fatal. Every other transactional call (and ``flush``, ``close``) waits
        for a pending pipelined commit first; a second ``commit_and_begin``
        does too. docs/pipelined-commit.md.
        """
        await self._settle_pipelined()
        txn = self._txn_manager()
        txn.begin_pipelined_commit()
        self.ensure_started()
        self._acc.hold_new_batches()
        self._wake.set()
        assert self._loop is not None
        outcome: asyncio.Future[None] = self._loop.create_future()
        # An outcome nobody awaits must not be logged as lost: the state the failure leaves raises it anyway.
        outcome.add_done_callback(lambda f: f.cancelled() or f.exception())
        task = self._loop.create_task(self._pipelined_commit(txn, self._deadline(timeout)))
        self._pipelined = task

        def settled(t: asyncio.Task[None]) -> None:
            if self._pipelined is t:
                self._pipelined = None
            copy_outcome(t, outcome)

        task.add_done_callback(settled)
        return outcome

    async def _pipelined_commit(self, txn: TransactionManager, deadline: float) -> None:
        try:
            await self._flush(max(0.0, deadline - time.monotonic()), held=False)
            txn.raise_if_abortable()
            await self._end_transaction(txn, deadline, commit=True)
        except BaseException as exc:
            txn.pipelined_commit_unsettled()  # a timeout: commit_transaction finishes it (never an abort)
            code = exc.error_code.name if isinstance(exc, BrokerError) else type(exc).__name__
            self._acc.fail_held(
                TransactionAbortedError(f"{txn.transactional_id}: the transaction before it did not commit ({code})")
            )
            self._wake.set()
            raise
        self._acc.release_held()
        self._wake.set()

    async def _settle_pipelined(self, timeout: float | None = None) -> None:
        """Wait until a pending pipelined commit has ended, whatever its outcome (its state tells).

        With ``timeout`` (``close``) it is cancelled when that passes first: its outcome stays unknown
        and its held records fail unsent.
        """
        task = self._pipelined
        if task is None:
            return
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            task.cancel()
            await asyncio.wait({task})

    async def abort_transaction(self, timeout: float | None = None) -> None:
        """Fail the records not sent yet, wait for those in flight, then EndTxn(abort).

        The unsent records' futures fail with ``TransactionAbortedError``
        (``TRANSACTION_ABORTABLE``). After ``REQUEST_TIMED_OUT`` call it again.
        """
        await self._settle_pipelined()
        txn = self._txn_manager()
        txn.begin_end(TxnState.ABORTING)
        deadline = self._deadline(timeout)
        self._acc.fail_undrained(TransactionAbortedError(f"{txn.transactional_id}: transaction aborted before send"))
        await self.flush(max(0.0, deadline - time.monotonic()))
        await self._end_transaction(txn, deadline, commit=False)

    async def prepare_transaction(
        self, group_id: str | None = None, timeout: float | None = None
    ) -> PreparedTransaction:
        """Flush, then make the transaction durable on the coordinator for an external coordinator to end.

        Whoever holds the returned ``PreparedTransaction`` may commit or abort
        it later (``POST /v1/transactions/{id}/end``); with ``group_id`` it is
        bound to that commit group and only the group's decision ends it.
        This producer may then only be closed or ``init_transactions``'d again.
        """
        await self._settle_pipelined()
        txn = self._txn_manager()
        txn.begin_end(TxnState.PREPARING)
        deadline = self._deadline(timeout)
        await self.flush(max(0.0, deadline - time.monotonic()))
        txn.raise_if_abortable()
        await self._wait_requests_idle(deadline)
        cur = self._idem.current
        body: dict[str, Any] = {"producer_id": cur.producer_id, "producer_epoch": cur.epoch}
        if group_id is not None:
            body["group_id"] = group_id
        tid = txn.transactional_id
        try:
            res = await self._coordinators.call(
                "transaction", tid, transaction_path(tid, "prepare"), body, deadline, "prepare_transaction"
            )
        except BrokerError as exc:
            if exc.retriable:
                raise  # outcome unknown: call prepare_transaction again (or abort_transaction)
            raise txn.end_rejected(exc) from exc
        txn.prepared()
        return PreparedTransaction(tid, int(res["producer_id"]), int(res["producer_epoch"]))

    async def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata],
        group_id: str | ConsumerGroupMetadata,
        timeout: float | None = None,
    ) -> None:
        """Commit consumer offsets as part of the transaction (AddOffsetsToTxn, then TxnOffsetCommit).

        They become the group's committed offsets when the transaction
        commits and vanish when it aborts. Pass the consumer's
        ``ConsumerGroupMetadata`` so the group coordinator fences a zombie
        member (KIP-447: ``ILLEGAL_GENERATION``/``UNKNOWN_MEMBER_ID``). Any
        failure leaves the transaction abortable (fenced: fatal).
        """
        await self._settle_pipelined()  # the next transaction's identity comes with the previous commit's end
        txn = self._txn_manager()
        txn.check_offsets()
        group = group_id if isinstance(group_id, ConsumerGroupMetadata) else ConsumerGroupMetadata(group_id)
        if not isinstance(group.group_id, str) or not group.group_id:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "group_id must be a non-empty string")
        entries = offset_commit_entries(offsets)
        deadline = self._deadline(timeout)
        tid = txn.transactional_id
        cur = self._idem.current
        ident = {"producer_id": cur.producer_id, "producer_epoch": cur.epoch}
        try:
            if group.group_id not in txn.offset_groups:
                # Counted before the call: if its answer is lost the coordinator may know the txn (EndTxn needed).
                txn.offset_groups.add(group.group_id)
                await self._coordinators.call(
                    "transaction", tid, transaction_path(tid, "offsets"), {**ident, "group_id": group.group_id},
                    deadline, "AddOffsetsToTxn",
                )  # fmt: skip
            body = {
                "offsets": entries,
                "transactional_id": tid,
                **ident,
                "generation_id": group.generation_id,
                "member_id": group.member_id,
            }
            await self._coordinators.call(
                "group", group.group_id, group_offsets_path(group.group_id), body, deadline, "TxnOffsetCommit"
            )
        except BrokerError as exc:
            if exc.error_code in (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH):
                raise txn.fail(exc) from exc
            txn.on_abortable(f"sending offsets for group {group.group_id!r} failed: {exc}")
            raise

    async def _end_transaction(self, txn: TransactionManager, deadline: float, *, commit: bool) -> None:
        """EndTxn once nothing of the transaction is in flight; adopt the identity it hands out."""
        cur = self._idem.current
        if not txn.needs_end_txn():
            txn.ended(cur.producer_id, cur.epoch, committed=commit)  # the coordinator never heard of it
            return
        await self._wait_requests_idle(deadline)
        tid = txn.transactional_id
        body: dict[str, Any] = {"producer_id": cur.producer_id, "producer_epoch": cur.epoch, "commit": commit}
        # Carried markers: the partitions' receipts go back to the coordinator, which answers with tokens.
        body["txn_receipts"] = [{"topic": t, "partition": p, "receipt": encode_token(r)}
                                for (t, p), r in sorted(txn.receipts.items())]  # fmt: skip
        what = "commit_transaction" if commit else "abort_transaction"
        try:
            res = await self._coordinators.call("transaction", tid, transaction_path(tid, "end"), body, deadline, what)
        except BrokerError as exc:
            if exc.retriable:
                raise  # outcome unknown: the same call again resumes it with the same identity
            raise txn.end_rejected(exc) from exc
        tokens = {(str(t["topic"]), int(t["partition"])): decode_token(str(t["token"]), "txn_tokens")
                  for t in res.get("txn_tokens") or ()}  # fmt: skip
        txn.ended(int(res["producer_id"]), int(res["producer_epoch"]), committed=commit, tokens=tokens)
        if tokens and self._loop is not None:
            self._loop.call_later(self._token_release_s, self._release_unused_tokens, txn.token_generation)
        self._acc.reset_after_transaction()
        self._wake.set()

    def _release_unused_tokens(self, generation: int | None = None) -> asyncio.Task[Any] | None:
        """Give back the tokens of ``generation`` (None: whichever are held) no batch has taken yet."""
        txn = self._txn
        if txn is None or not txn.tokens or (generation is not None and generation != txn.token_generation):
            return None
        unused, txn.tokens = txn.tokens, {}
        cur = self._idem.current
        tid = txn.transactional_id
        body = {"producer_id": cur.producer_id, "producer_epoch": cur.epoch,
                "partitions": [{"topic": t, "partition": p} for t, p in sorted(unused)]}  # fmt: skip
        deadline = time.monotonic() + self._request_timeout_ms / 1000

        async def release() -> None:
            try:
                await self._coordinators.call(
                    "transaction", tid, transaction_path(tid, "release"), body, deadline, "release tokens"
                )
            except BrokerError as exc:  # the coordinator's reservation timer settles them anyway
                log.debug("releasing unused tokens of %s failed: %s", tid, exc)

        return self._spawn(release())

    async def _wait_requests_idle(self, deadline: float) -> None:
        """Wait until no produce request is outstanding (expired batches' requests included)."""
        while self._acc.outstanding_requests:
            self._requests_idle.clear()
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await self._requests_idle.wait()
            except TimeoutError as exc:
                raise BrokerError(ErrorCode.REQUEST_TIMED_OUT, "produce requests still in flight") from exc

    def metrics(self) -> dict[str, Any]:
        """Counters for tests and benchmarks (not a stable interface)."""
        return {
            **self._acc.stats,
            "requests": self.requests_sent,
            "epoch_bumps": self._idem.epoch_bumps,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "state": self._idem.state.name,
            "errors": dict(self._errors),
            "buffered_bytes": self._acc.buffered_bytes,
            **(
                {
                    "transaction_state": self._txn.state.name,
                    "transactions_committed": self._txn.transactions_committed,
                    "transactions_aborted": self._txn.transactions_aborted,
                    "coordinator_retries": self._coordinators.retries,
                }
                if self._txn is not None
                else {}
            ),
        }

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    # ---- record path (also used by the sync facade from the loop thread) ------------------------

    def check_open(self) -> None:
        if self._closed:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "send() after close()")
        self._raise_if_fatal()
        if self._txn is not None:
            self._txn.check_send()

    def _usable(self) -> bool:
        """What ``check_open`` checks, as a test: open, not failed, and inside a transaction if transactional."""
        txn = self._txn
        return (
            not self._closed
            and self._idem.fatal_error is None
            and self._internal_error is None
            and (txn is None or (txn.open and txn.fatal_error is None))
        )

    def _raise_if_fatal(self) -> None:
        if self._txn is not None and self._txn.fatal_error is not None:
            raise self._txn.fatal_error
        if self._idem.fatal_error is not None:
            raise self._idem.fatal_error
        if self._internal_error is not None:
            raise self._internal_error

    def serialize(
        self, key: Any, value: Any, headers: Sequence[tuple[str, bytes | None]] | None
    ) -> tuple[bytes | None, bytes | None, bytes, int]:
        """Check the producer is usable and encode one record's parts; any thread may call it."""
        self.check_open()
        return self.encode_record(key, value, headers)

    def encode_record(
        self, key: Any, value: Any, headers: Sequence[tuple[str, bytes | None]] | None
    ) -> tuple[bytes | None, bytes | None, bytes, int]:
        """One record's key, value and header bytes and its size, through the serializers; no state checks."""
        if key is not None:
            if self._key_ser is not None:
                key = self._key_ser(key)
            if type(key) is not bytes:
                key = _as_bytes("key", key)
        if value is not None:
            if self._value_ser is not None:
                value = self._value_ser(value)
            if type(value) is not bytes:
                value = _as_bytes("value", value)
        hb = encode_headers(headers) if headers else NO_HEADERS
        nbytes = record_size(key, value, hb)
        if nbytes > self._max_record_bytes:
            raise BrokerError(
                ErrorCode.RECORD_TOO_LARGE,
                f"record of {nbytes} bytes exceeds max_request_size={self._max_request_size} "
                f"or buffer_memory={self._buffer_memory}",
            )
        return key, value, hb, nbytes

    def append(
        self,
        topic: str,
        partition: int | None,
        kb: bytes | None,
        vb: bytes | None,
        hb: bytes,
        nbytes: int,
        timestamp_ms: int | None,
        sink: RecordSink,
        num_partitions: int,
    ) -> bool:
        """Put one encoded record into its batch; True when a batch was created or filled."""
        if self._txn is not None:
            self._txn.check_send()  # the transaction may have ended since send() checked
        ts = timestamp_ms if timestamp_ms is not None else int(time.time() * 1000)
        if partition is None:
            if kb is None:
                assert self._loop is not None
                changed = self._acc.append_sticky(
                    topic, ts, vb, hb, nbytes, sink, self._loop.time, self._available, num_partitions
                )
                if changed and self._acc.window_open(topic, self._acc.sticky[topic]):
                    self._wake.set()
                return changed
            partition = partition_for_key(kb, num_partitions)
        elif not 0 <= partition < num_partitions:
            raise BrokerError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has {num_partitions} partitions, not {partition}"
            )
        assert self._loop is not None
        changed = self._acc.append(topic, partition, ts, kb, vb, hb, nbytes, sink, self._loop.time())
        # A full in-flight window: the sender has nothing to send until an answer arrives, which wakes it
        # anyway. At full speed that is the usual case, and waking it per filled batch cost CPU for nothing.
        if changed and self._acc.window_open(topic, partition):
            self._wake.set()
        return changed

    def cached_partition_count(self, topic: str) -> int | None:
        return self._metadata.cached_partition_count(topic)

    def _available(self, topic: str, n: int) -> list[int]:
        up = [p for p in range(n) if (info := self._metadata.cached(topic, p)) is not None and info.leader_url]
        return up or list(range(n))

    async def wait_for_topic(self, topic: str) -> int:
        self.ensure_started()
        n = self._metadata.cached_partition_count(topic)
        return n if n else await self._wait_for_topic(topic)

    async def _wait_for_topic(self, topic: str) -> int:
        """Partition count of ``topic``, refreshing metadata until it exists or ``max_block_ms`` passes."""
        deadline = time.monotonic() + self._max_block_s
        last: BrokerError | None = None
        while True:
            try:
                await self._metadata.refresh()
            except BrokerError as exc:
                last = exc
            n = self._metadata.cached_partition_count(topic)
            if n:
                return n
            if time.monotonic() + self._retry_backoff_s > deadline:
                raise BrokerError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"topic {topic!r} not in metadata after max_block_ms" + (f": {last.message}" if last else ""),
                )
            await asyncio.sleep(self._retry_backoff_s)

    async def _wait_for_memory(self, nbytes: int) -> None:
        acc = self._acc
        acc.memory_waiters += 1
        self._wake.set()
        try:
            async with asyncio.timeout(self._max_block_s):
                while acc.buffered_bytes + nbytes > self._buffer_memory and acc.buffered_bytes > 0:
                    self._memory_freed.clear()
                    await self._memory_freed.wait()
                    self.check_open()
        except TimeoutError as exc:
            raise BrokerError(
                ErrorCode.REQUEST_TIMED_OUT, f"buffer_memory={self._buffer_memory} still full after max_block_ms"
            ) from exc
        finally:
            acc.memory_waiters -= 1

    def _on_report(self, batch: ProducerBatch) -> None:
        if batch.failure is not None:
            log.warning(
                "%d record(s) to %s-%d failed: %s", batch.record_count, batch.topic, batch.partition, batch.failure
            )
        self._memory_freed.set()
        for pending, fut in self._flush_waiters:
            pending.discard(batch)
            if not pending and not fut.done():
                fut.set_result(None)
        if self._on_release is not None:
            self._on_release(batch.size - BATCH_OVERHEAD)

    # ---- sender ------------------------------------------------------------------------------

    def ensure_started(self) -> None:
        if self._sender is None:
            self._loop = asyncio.get_running_loop()
            self._sender = self._loop.create_task(self._run_sender(), name="txbroker-producer-sender")
            self._sender.add_done_callback(self._task_done)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        """A bug in the sender must not leave futures pending forever: fail everything, loudly."""
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        log.error("producer internal error", exc_info=exc)
        self._internal_error = BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"producer internal error: {exc!r}")
        self._acc.fail_all(self._internal_error)
        self._wake.set()

    async def _run_sender(self) -> None:
        loop = asyncio.get_running_loop()
        acc, idem = self._acc, self._idem
        while True:
            self._wake.clear()
            now = loop.time()
            acc.expire(now)
            txn = self._txn
            if txn is not None and txn.state in (TxnState.ABORTABLE_ERROR, TxnState.ABORTING) and acc.has_undrained():
                acc.fail_undrained(TransactionAbortedError(f"{txn.transactional_id}: transaction is being aborted"))
            if idem.state is ProducerIdState.UNINITIALIZED and self._init_task is None and txn is None:
                self._init_task = loop.create_task(self._init_producer_id())
            elif acc.ready_to_bump():
                bumped = idem.bump_epoch()
                acc.reset_after_bump()
                what = f"epoch bumped to {idem.current.epoch}" if bumped else "epoch exhausted, new producer id next"
                log.warning("producer %d: %s after %s", idem.current.producer_id, what, idem.bump_reason)
                continue
            for url, batches in acc.drain(now, self._leader_of):
                self._spawn(self._send_request(url, batches))
            if acc.no_leader:
                self._refresh_metadata()
            if acc.closing and not acc.has_pending():
                return
            deadline = acc.next_deadline(now)
            if not self._wake.is_set():
                handle = loop.call_at(deadline, self._wake.set) if deadline is not None else None
                await self._wake.wait()
                if handle is not None:
                    handle.cancel()

    def _rewrite(self, url: str) -> str:
        return self._rewrites.get(url, url)

    def _leader_of(self, topic: str, partition: int) -> str | None:
        info = self._metadata.cached(topic, partition)
        if info is None or info.leader_url is None:
            return None
        return self._rewrite(info.leader_url)

    def _refresh_metadata(self) -> None:
        """Refresh metadata in the background (one refresh at a time), then wake the sender."""
        if self._metadata_task is None or self._metadata_task.done():
            assert self._loop is not None
            self._metadata_task = self._loop.create_task(self._refresh_metadata_once())

    async def _refresh_metadata_once(self) -> None:
        try:
            await self._metadata.refresh()
        except BrokerError as exc:
            log.debug("metadata refresh failed: %s", exc)
            await asyncio.sleep(self._retry_backoff_s)
        self._wake.set()

    async def _init_producer_id(self) -> None:
        """InitProducerId with retries; any node answers for a producer without a transactional id."""
        try:
            while True:
                last: BrokerError | None = None
                for url in dict.fromkeys(map(self._rewrite, self._metadata.urls())):
                    try:
                        body = await self._session.request_json(
                            "POST", url + "/v1/producers/init", {"transactional_id": None}
                        )
                        self._idem.set_producer_id(int(body["producer_id"]), int(body["producer_epoch"]))
                        log.debug("producer id %d epoch %d", self.producer_id, self.producer_epoch)
                        return
                    except BrokerError as exc:
                        if not exc.retriable:
                            self._acc.fail_all(exc)
                            return
                        last = exc
                log.debug("producer id not available yet: %s", last)
                await asyncio.sleep(self._retry_backoff_s)
        finally:
            self._init_task = None
            self._init_done.set()
            self._wake.set()

    async def _send_request(self, url: str, batches: list[ProducerBatch]) -> None:
        acc = self._acc
        txn = self._txn
        if txn is not None:
            for b in batches:
                if not b.token_taken:
                    b.token_taken = True
                    b.txn_token = txn.take_token(b.topic, b.partition)
        req = ProduceRequest(
            tuple(ProducePartition(b.topic, b.partition, b.wire or b"", b.txn_token) for b in batches),
            acks=self._acks,
            timeout_ms=self._request_timeout_ms,
            transactional_id=self.transactional_id,
        )
        answers: dict[tuple[str, int], Any] = {}
        whole: BrokerError | None = None
        self.requests_sent += 1
        try:
            _, raw = await self._session.post_bytes(
                url + "/v1/produce", encode_produce_request(req), PRODUCE_CONTENT_TYPE
            )
            parts = json.loads(raw)["partitions"]
        except BrokerError as exc:
            parts = exc.extra.get("partitions")
            if not isinstance(parts, list):
                whole = exc
        except (ValueError, KeyError, TypeError) as exc:
            whole = BrokerError(ErrorCode.NETWORK_EXCEPTION, f"malformed produce answer from {url}: {exc!r}")
        finally:
            acc.request_finished()
            if acc.outstanding_requests == 0:
                self._requests_idle.set()
        if whole is None:
            for p in parts:
                answers[(p.get("topic"), p.get("partition"))] = p
        now = asyncio.get_running_loop().time()
        refresh = False
        for b in batches:
            err = whole
            base = lat = -1
            if err is None:
                p = answers.get((b.topic, b.partition))
                code = p.get("error_code", "NONE") if isinstance(p, dict) else None
                if p is None or code is None:
                    err = BrokerError(ErrorCode.NETWORK_EXCEPTION, f"no answer for {b.topic}-{b.partition}")
                elif code != "NONE":
                    extra = {k: v for k, v in p.items() if k == "leader_url"}
                    err = BrokerError(ErrorCode.from_name(str(code)), str(p.get("message") or ""), **extra)
                else:
                    base, lat = int(p.get("base_offset", -1)), int(p.get("log_append_time", -1))
                    receipt = p.get("txn_receipt")
                    if txn is not None and isinstance(receipt, str):
                        txn.receipts[(b.topic, b.partition)] = decode_token(receipt, "txn_receipt")
            if err is not None:
                if err.error_code is ErrorCode.TRANSACTION_RESERVATION_REVOKED:
                    b.txn_token = None  # resent without it: the partition leader verifies with the coordinator
                self._errors[err.error_code.name] = self._errors.get(err.error_code.name, 0) + 1
                if err.error_code is ErrorCode.NOT_LEADER_OR_FOLLOWER:
                    self._metadata.invalidate(b.topic, b.partition, err.extra.get("leader_url"))
                if err.error_code in METADATA_ERRORS:
                    refresh = True
            outcome = acc.handle_response(b, base, lat, err, now)
            if outcome is Outcome.FATAL:
                log.error("producer %d fenced: %s", self.producer_id, err)
        if refresh:
            self._refresh_metadata()
        self._wake.set()
