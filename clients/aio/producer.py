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

This class composes the parts and keeps the record path and the
transactional calls: batching is ``_accumulator``, the requests are
``_sender``, the waits for memory and ``flush`` are ``_batch_reports``, the
coordinator requests are ``_txn_coordinator``, and ``commit_and_begin``'s
background commit is ``_pipelined_commit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Unpack

from ..partitioner import partition_for_key
from ..protocol import BrokerError, ErrorCode
from ..records import ConsumerGroupMetadata, OffsetAndMetadata, PreparedTransaction, RecordMetadata, TopicPartition
from ..security import ClientSecurity, SecurityOptions, is_auth_failure
from ._accumulator import RecordAccumulator
from ._batch import (
    BATCH_OVERHEAD,
    NO_HEADERS,
    UNKEYED_OVERHEAD,
    RecordSink,
    add_callback,
    encode_headers,
    record_size,
)
from ._batch_reports import BatchReports
from ._idempotence import IdempotenceManager
from ._metadata import MetadataCache, parse_bootstrap
from ._pipelined_commit import PipelinedCommit
from ._sender import Sender
from ._session import HttpSession
from ._transactions import TransactionAbortedError, TransactionManager, TxnState
from ._txn_coordinator import CoordinatorClient, offset_commit_entries
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


class AsyncProducer:
    """Kafka-style producer on asyncio. Names and defaults follow kafka-python.

    ``url_rewrites`` is for tests only: it maps the node URLs the cluster
    advertises in its metadata to the URLs this client must use instead (a
    fault-injecting proxy in front of each node).

    ``transactional_id`` makes it a transactional producer (idempotence is
    forced on); ``transaction_timeout_ms`` is the coordinator's limit on one
    open transaction. The transactional methods block at most ``max_block_ms``
    unless given a ``timeout`` (seconds), as in Kafka.

    ``stall_refresh_ms`` (default 2500; 0 turns it off): a produce or
    coordinator request without an answer this long makes the producer look
    up the partition leader / coordinator again while the request waits; if it
    moved to another node, the request is abandoned and sent there (safe:
    sequence numbers and the transaction protocol deduplicate the repeat),
    else it waits up to ``request_timeout_ms``.
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
        stall_refresh_ms: int = 2_500,
        url_rewrites: Mapping[str, str] | None = None,
        _on_release: Callable[[int], None] | None = None,
        **security: Unpack[SecurityOptions],
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
        sec = ClientSecurity.from_options(parse_bootstrap(bootstrap), **security)
        self._session = HttpSession(request_timeout_ms=request_timeout_ms, security=sec)
        self._metadata = MetadataCache(self._session, bootstrap, metadata_max_age_ms=metadata_max_age_ms)
        self._idem = IdempotenceManager(enabled=enable_idempotence, transactional=transactional_id is not None)
        self._txn = TransactionManager(transactional_id, self._idem) if transactional_id is not None else None
        self._coordinators = CoordinatorClient(
            self._session,
            self._metadata,
            request_timeout_s=request_timeout_ms / 1000,
            retry_backoff_s=retry_backoff_ms / 1000,
            rewrite=self._rewrite,
            stall_refresh_s=stall_refresh_ms / 1000,
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
            on_report=lambda batch: self._reports.reported(batch),
            request_overhead=len(transactional_id.encode()) if transactional_id is not None else 0,
        )
        self._sender = Sender(
            self._acc,
            self._idem,
            self._txn,
            self._session,
            self._metadata,
            acks=self._acks,
            request_timeout_ms=request_timeout_ms,
            retry_backoff_s=self._retry_backoff_s,
            rewrite=self._rewrite,
            stall_refresh_s=stall_refresh_ms / 1000,
        )
        self._wake = self._sender.wake
        self._pipelined = PipelinedCommit(self._acc, self._wake)
        self._reports = BatchReports(
            self._acc,
            buffer_memory=buffer_memory,
            max_block_s=self._max_block_s,
            wake=self._wake,
            on_release=_on_release,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    # ---- public API --------------------------------------------------------------------------

    @property
    def producer_id(self) -> int:
        return self._idem.current.producer_id

    @property
    def producer_epoch(self) -> int:
        return self._idem.current.epoch

    @property
    def requests_sent(self) -> int:
        """Produce requests made so far."""
        return self._sender.requests_sent

    async def start(self) -> None:
        """Start the sender and (idempotent mode) wait for a producer id, at most ``max_block_ms``.

        A transactional producer gets its id from ``init_transactions``.
        """
        self.ensure_started()
        if self._txn is not None:
            return
        try:
            async with asyncio.timeout(self._max_block_s):
                await self._sender.wait_for_producer_id()
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
                        self._wake()
                    await asyncio.sleep(0)  # a batch filled up: let the sender ship it
                return fut
        kb, vb, hb, nbytes = self.serialize(key, value, headers)
        if self._loop is None:
            self.ensure_started()
        n = self._metadata.cached_partition_count(topic)
        if not n or (partition is not None and partition >= n):
            n = await self._wait_for_topic(topic, partition)
        if self._reports.lacks_room(nbytes):
            await self._reports.wait_for_room(nbytes, self.check_open)
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
        n = self._metadata.cached_partition_count(topic) or 0
        if partition >= n:
            n = await self._wait_for_topic(topic, partition)
        if not 0 <= partition < n:
            raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has {n} partitions, not {partition}")
        nbytes = batch.size() - BATCH_OVERHEAD
        if nbytes and self._reports.lacks_room(nbytes):
            await self._reports.wait_for_room(nbytes, self.check_open)
        self.check_open()
        pb = batch.take()  # last: a send_batch refused up to here leaves the batch to the caller
        assert self._loop is not None
        fut = self._loop.create_future()
        pb.assign(topic, partition, self._loop.time(), fut)
        self._acc.append_batch(pb)
        if self._acc.window_open(topic, partition):
            self._wake()
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
        await self._pipelined.settle()
        await self._reports.flush(timeout)

    async def close(self, timeout: float | None = None) -> None:
        """Stop accepting records, deliver what is queued, release every resource.

        With ``timeout`` (seconds), batches still unacknowledged when it
        passes fail with ``DeliveryTimeoutError``. Without, waits at most about
        ``delivery_timeout_ms`` (every batch expires by then).
        """
        if self._closed:
            return
        await self._pipelined.settle(timeout)  # its held batches are sent or failed first
        self._closed = True
        self._acc.closing = True
        self._wake()
        try:
            if self._loop is not None:
                try:
                    async with asyncio.timeout(timeout):
                        await self._sender.join()
                except TimeoutError:
                    self._acc.abort_incomplete(f"producer closed after {timeout}s with the batch unacknowledged")
            release = self._release_unused_tokens() if self._loop is not None else None
            if release is not None:  # the last commit's markers are written now instead of after the timer
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(5.0, timeout if timeout is not None else 5.0)):
                        await asyncio.shield(release)
        finally:
            await self._sender.stop()
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
        try:
            ident = await self._coordinators.init_producer_id(
                txn.transactional_id, self.transaction_timeout_ms, deadline
            )
        except BrokerError as exc:
            if exc.error_code in (ErrorCode.PRODUCER_FENCED, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED):
                raise txn.fail(exc) from exc
            txn.init_failed()  # a timeout, or a configuration the coordinator refuses (INVALID_TRANSACTION_TIMEOUT)
            raise
        except asyncio.CancelledError:
            txn.init_failed()
            raise
        txn.initialized(ident.producer_id, ident.epoch)
        self._acc.reset_after_transaction()
        self._wake()

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
        await self._pipelined.settle()
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
        await self._pipelined.settle()
        txn = self._txn_manager()
        txn.begin_pipelined_commit()
        self.ensure_started()
        assert self._loop is not None
        deadline = self._deadline(timeout)

        async def commit() -> None:
            await self._reports.flush(max(0.0, deadline - time.monotonic()), held=False)
            txn.raise_if_abortable()
            await self._end_transaction(txn, deadline, commit=True)

        return self._pipelined.start(self._loop, txn, commit)

    async def abort_transaction(self, timeout: float | None = None) -> None:
        """Fail the records not sent yet, wait for those in flight, then EndTxn(abort).

        The unsent records' futures fail with ``TransactionAbortedError``
        (``TRANSACTION_ABORTABLE``). After ``REQUEST_TIMED_OUT`` call it again.
        """
        await self._pipelined.settle()
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
        await self._pipelined.settle()
        txn = self._txn_manager()
        txn.begin_end(TxnState.PREPARING)
        deadline = self._deadline(timeout)
        await self.flush(max(0.0, deadline - time.monotonic()))
        txn.raise_if_abortable()
        await self._sender.wait_requests_idle(deadline)
        tid = txn.transactional_id
        try:
            ident = await self._coordinators.prepare_txn(tid, self._idem.current, group_id, deadline)
        except BrokerError as exc:
            if exc.retriable:
                raise  # outcome unknown: call prepare_transaction again (or abort_transaction)
            raise txn.end_rejected(exc) from exc
        txn.prepared()
        return PreparedTransaction(tid, ident.producer_id, ident.epoch)

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
        await self._pipelined.settle()  # the next transaction's identity comes with the previous commit's end
        txn = self._txn_manager()
        txn.check_offsets()
        group = group_id if isinstance(group_id, ConsumerGroupMetadata) else ConsumerGroupMetadata(group_id)
        if not isinstance(group.group_id, str) or not group.group_id:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "group_id must be a non-empty string")
        entries = offset_commit_entries(offsets)
        deadline = self._deadline(timeout)
        tid = txn.transactional_id
        ident = self._idem.current
        try:
            if group.group_id not in txn.offset_groups:
                # Counted before the call: if its answer is lost the coordinator may know the txn (EndTxn needed).
                txn.offset_groups.add(group.group_id)
                await self._coordinators.add_offsets_to_txn(tid, ident, group.group_id, deadline)
            await self._coordinators.txn_offset_commit(tid, ident, group, entries, deadline)
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
        await self._sender.wait_requests_idle(deadline)
        try:
            # Carried markers: the partitions' receipts go to the coordinator, which answers with tokens.
            ident, tokens = await self._coordinators.end_txn(
                txn.transactional_id, cur, commit=commit, receipts=txn.receipts, deadline=deadline
            )
        except BrokerError as exc:
            if exc.retriable:
                raise  # outcome unknown: the same call again resumes it with the same identity
            raise txn.end_rejected(exc) from exc
        txn.ended(ident.producer_id, ident.epoch, committed=commit, tokens=tokens)
        if tokens and self._loop is not None:
            self._loop.call_later(self._token_release_s, self._release_unused_tokens, txn.token_generation)
        self._acc.reset_after_transaction()
        self._wake()

    def _release_unused_tokens(self, generation: int | None = None) -> asyncio.Task[Any] | None:
        """Give back the tokens of ``generation`` (None: whichever are held) no batch has taken yet."""
        txn = self._txn
        if txn is None or not txn.tokens or (generation is not None and generation != txn.token_generation):
            return None
        unused, txn.tokens = txn.tokens, {}
        tid, ident = txn.transactional_id, self._idem.current
        deadline = time.monotonic() + self._request_timeout_ms / 1000

        async def release() -> None:
            try:
                await self._coordinators.release_tokens(tid, ident, unused, deadline)
            except BrokerError as exc:  # the coordinator's reservation timer settles them anyway
                log.debug("releasing unused tokens of %s failed: %s", tid, exc)

        return self._sender.spawn(release())

    def metrics(self) -> dict[str, Any]:
        """Counters for tests and benchmarks (not a stable interface)."""
        return {
            **self._acc.stats,
            "requests": self.requests_sent,
            "epoch_bumps": self._idem.epoch_bumps,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "state": self._idem.state.name,
            "errors": dict(self._sender.errors),
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
            and self._sender.internal_error is None
            and (txn is None or (txn.open and txn.fatal_error is None))
        )

    def _raise_if_fatal(self) -> None:
        if self._txn is not None and self._txn.fatal_error is not None:
            raise self._txn.fatal_error
        if self._idem.fatal_error is not None:
            raise self._idem.fatal_error
        if self._sender.internal_error is not None:
            raise self._sender.internal_error

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
                    self._wake()
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
            self._wake()
        return changed

    def cached_partition_count(self, topic: str) -> int | None:
        return self._metadata.cached_partition_count(topic)

    def _available(self, topic: str, n: int) -> list[int]:
        up = [p for p in range(n) if (info := self._metadata.cached(topic, p)) is not None and info.leader_url]
        return up or list(range(n))

    async def wait_for_topic(self, topic: str, partition: int | None = None) -> int:
        self.ensure_started()
        n = self._metadata.cached_partition_count(topic)
        return n if n and (partition is None or partition < n) else await self._wait_for_topic(topic, partition)

    async def _wait_for_topic(self, topic: str, partition: int | None = None) -> int:
        """Partition count of ``topic``, refreshing metadata until it exists (and has ``partition``, which a
        topic may just have gained) or ``max_block_ms`` passes.

        The metadata request names the topic (as Kafka's producer does): a secured cluster leaves the
        topics the caller may not DESCRIBE out of a full listing, and answers a named one with
        ``TOPIC_AUTHORIZATION_FAILED``, which is raised at once instead of waiting for the topic.
        """
        deadline = time.monotonic() + self._max_block_s
        last: BrokerError | None = None
        while True:
            try:
                await self._metadata.refresh([topic])
            except BrokerError as exc:
                if is_auth_failure(exc):
                    raise
                last = exc
            n = self._metadata.cached_partition_count(topic)
            if n and (partition is None or partition < n):
                return n
            if time.monotonic() + self._retry_backoff_s > deadline:
                what = f"topic {topic!r}" if not n or partition is None else f"partition {topic}-{partition}"
                raise BrokerError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"{what} not in metadata after max_block_ms" + (f": {last.message}" if last else ""),
                )
            await asyncio.sleep(self._retry_backoff_s)

    # ---- sender ------------------------------------------------------------------------------

    def ensure_started(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._sender.start(self._loop)

    def _rewrite(self, url: str) -> str:
        return self._rewrites.get(url, url)
