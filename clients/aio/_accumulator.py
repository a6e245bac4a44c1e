"""Per-partition batching, sending order, retries and expiry of the producer (Kafka's ``RecordAccumulator``
plus the bookkeeping half of its ``Sender``). Pure: the clock is an argument, no I/O.

Terms:

* Each partition has a **queue** of unsequenced batches (the last one may
  still be open) and an **in-flight window**: the sequenced batches from the
  oldest one not yet done, in sequence order. The window holds at most
  ``max_in_flight`` batches: the broker remembers the last 5 batches of a
  producer per partition, so a retry of the oldest batch in the window is
  still recognised as a duplicate.
* A batch in the window is **live** while it may still be written by a request
  this producer will make or has made and not given up on: IN_FLIGHT (not
  expired) or RETRY_WAIT.
* ``OUT_OF_ORDER_SEQUENCE_NUMBER`` while an earlier batch of the window is
  live only means the requests overtook each other (they travel over
  different HTTP connections): the batch is resent, same bytes, once its
  predecessors are acknowledged -- as Kafka retries it.

``drain`` decides what to send now; ``handle_response`` applies one answer;
``expire`` enforces ``delivery_timeout_ms``. The caller does the HTTP and the
metadata refreshes the returned ``Outcome`` asks for.

Not thread-safe: the owning event loop calls every method.
"""

from __future__ import annotations

import enum
import random
from collections import deque
from collections.abc import Callable, Iterator, Sequence

from ..protocol import BrokerError, ErrorCode
from ._batch import BATCH_OVERHEAD, BatchState, DeliveryTimeoutError, ProducerBatch, RecordSink
from ._idempotence import IdempotenceManager, ProducerIdState

__all__ = ["Outcome", "PartitionQueue", "RecordAccumulator"]

TopicPartition = tuple[str, int]

# Retriable errors the broker answers before it proposes the batch to Raft: the
# batch is certainly not in the log. The coordinator errors come only from the
# KIP-890 verification of a transactional batch, which precedes the proposal.
# Any other retriable error (lost answer, leader change) may hide a written batch.
_NOT_SUBMITTED = frozenset(
    {
        ErrorCode.THROTTLING_QUOTA_EXCEEDED,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.CONCURRENT_TRANSACTIONS,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    }
)
# Kafka retries these although txbroker's ErrorCode marks the last one non-retriable:
# the client's metadata may simply be older than the topic.
_PRODUCER_RETRIABLE = frozenset(c for c in ErrorCode if c.retriable) | {ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
METADATA_ERRORS = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.REQUEST_TIMED_OUT,
    }
)
# Binary produce request framing (clients.protocol): header + partition count, and per partition
# topic length, partition, batch length. Counted so a request never exceeds max_request_size.
_REQUEST_FRAMING = 18
_PART_FRAMING = 10
# Rejections that depend only on the batch bytes: every attempt (same bytes) met the same fate,
# so none of them can be in the log, whatever answers were lost before.
_CONTENT_ERRORS = frozenset(
    {
        ErrorCode.CORRUPT_MESSAGE,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.MESSAGE_TOO_LARGE,
        ErrorCode.RECORD_TOO_LARGE,
        ErrorCode.INVALID_TIMESTAMP,
    }
)
_FENCED = frozenset({ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED})


class Outcome(enum.Enum):
    ACKED = "acked"
    RETRY = "retry"  # resend the same bytes later
    RESEQUENCE = "resequence"  # never written: send again under the next epoch
    FAILED = "failed"  # reported to the caller as failed
    FATAL = "fatal"  # producer fenced: every batch failed
    LATE = "late"  # an answer for a batch that had already expired


class PartitionQueue:
    __slots__ = ("inflight", "last_full", "open", "partition", "queue", "topic")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.queue: deque[ProducerBatch] = deque()
        self.inflight: list[ProducerBatch] = []
        self.open: ProducerBatch | None = None
        self.last_full = False  # the last batch was sealed because it was full (sticky partitioner moves on)

    def has_live_predecessors(self, batch: ProducerBatch) -> bool:
        for b in self.inflight:
            if b is batch:
                return False
            if (b.state is BatchState.IN_FLIGHT and not b.expired) or b.state is BatchState.RETRY_WAIT:
                return True
        return False

    def has_live(self) -> bool:
        return any(b.state in (BatchState.IN_FLIGHT, BatchState.RETRY_WAIT) for b in self.inflight)

    def pop_done(self) -> None:
        while self.inflight and self.inflight[0].state is BatchState.DONE:
            self.inflight.pop(0)


class RecordAccumulator:
    """Batches records per partition and tracks every batch until it is reported.

    ``on_report(batch)`` is called once per batch when its futures complete
    (memory accounting, flush waiters).
    """

    def __init__(
        self,
        idempotence: IdempotenceManager,
        *,
        batch_size: int,
        linger_s: float,
        max_in_flight: int,
        delivery_timeout_s: float,
        retry_backoff_s: float,
        retries: int,
        max_request_size: int,
        on_report: Callable[[ProducerBatch], None] = lambda _b: None,
        rng: random.Random | None = None,
        request_overhead: int = 0,
    ) -> None:
        """``request_overhead``: bytes every produce request carries besides its batches (the transactional id)."""
        self.idem = idempotence
        self.batch_size = batch_size
        self.linger_s = linger_s
        self.max_in_flight = max_in_flight
        self.delivery_timeout_s = delivery_timeout_s
        self.retry_backoff_s = retry_backoff_s
        self.retries = retries
        self.max_request_size = max_request_size
        self.request_framing = _REQUEST_FRAMING + request_overhead
        self.on_report = on_report
        self.partitions: dict[TopicPartition, PartitionQueue] = {}
        self.sticky: dict[str, int] = {}
        self.buffered_bytes = 0
        self.flushing = 0
        # A pipelined commit is under way: batches created now belong to the next transaction and are held
        # (never sequenced or sent) until it ends (``release_held``) or fails (``fail_held``).
        self.holding = False
        self.closing = False
        self.memory_waiters = 0
        self.outstanding_requests = 0
        self._rng = rng or random.Random()
        self._rotate = 0
        self.no_leader: set[TopicPartition] = set()
        self.stats = {
            "batches": 0,
            "retries": 0,
            "resequenced": 0,
            "expired": 0,
            "late_success": 0,
            "records_acked": 0,
            "bytes_acked": 0,
        }

    # ---- appending -------------------------------------------------------------------------

    def _queue(self, tp: TopicPartition) -> PartitionQueue:
        pq = self.partitions.get(tp)
        if pq is None:
            pq = self.partitions[tp] = PartitionQueue(tp[0], tp[1])
        return pq

    def sticky_partition(self, topic: str, available: Callable[[], Sequence[int]], nbytes: int) -> int:
        """Kafka's sticky partitioner for null keys: stay on one partition until its batch is full.

        ``available``: partitions with a known leader (evaluated only when switching).
        When switching it prefers the partitions with the fewest batches queued or in
        flight (Kafka's adaptive partitioning, KIP-794): a random pick keeps filling
        partitions whose in-flight window is full while others sit idle (measured:
        15 requests in flight only a third of the time at full speed).
        """
        p = self.sticky.get(topic)
        if p is not None:
            pq = self.partitions.get((topic, p))
            if pq is None:
                return p
            if pq.open is not None and pq.open.has_room(nbytes, self.batch_size):
                return p
            if pq.open is None and not pq.last_full:
                return p
        options = available()
        choices = [q for q in options if q != p] or list(options)
        if len(choices) > 1:
            loads = [self._backlog(topic, q) for q in choices]
            least = min(loads)
            choices = [q for q, n in zip(choices, loads, strict=True) if n == least]
        p = self._rng.choice(choices)
        self.sticky[topic] = p
        return p

    def _backlog(self, topic: str, partition: int) -> int:
        pq = self.partitions.get((topic, partition))
        return 0 if pq is None else len(pq.queue) + len(pq.inflight)

    def append_sticky(
        self,
        topic: str,
        timestamp: int,
        value: bytes | None,
        headers: bytes,
        nbytes: int,
        sink: RecordSink,
        clock: Callable[[], float],
        available: Callable[[str, int], Sequence[int]],
        num_partitions: int,
    ) -> bool:
        """``append`` of a record without key or partition: the sticky partition's open batch when it has room.

        The common case of a producer's hot loop, so it touches as little as it can;
        anything else (no open batch, full batch) goes the general way.
        """
        batch = self.open_sticky_batch(topic, nbytes)
        if batch is not None:
            batch.append_unkeyed(timestamp, value, headers, sink)  # not empty: first_ts is set
            return self.appended_to_open(batch, nbytes)
        p = self.sticky_partition(topic, lambda: available(topic, num_partitions), nbytes)
        return self.append(topic, p, timestamp, None, value, headers, nbytes, sink, clock())

    def open_sticky_batch(self, topic: str, nbytes: int) -> ProducerBatch | None:
        """The sticky partition's open batch if it has room for ``nbytes`` more (``send``'s fast path)."""
        p = self.sticky.get(topic)
        if p is None:
            return None
        pq = self.partitions.get((topic, p))
        if pq is None:
            return None
        batch = pq.open
        if batch is None or batch.size + nbytes > self.batch_size:
            return None
        return batch

    def appended_to_open(self, batch: ProducerBatch, nbytes: int) -> bool:
        """Account a record added to ``batch`` (from ``open_sticky_batch``); True when that filled it."""
        self.buffered_bytes += nbytes
        if batch.size < self.batch_size:
            return False
        pq = self.partitions[(batch.topic, batch.partition)]
        batch.sealed = pq.last_full = True
        pq.open = None
        return True

    def append(
        self,
        topic: str,
        partition: int,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: bytes,
        nbytes: int,
        sink: RecordSink,
        now: float,
    ) -> bool:
        """Add one record; True when a batch was created or sealed (the sender should look again)."""
        pq = self._queue((topic, partition))
        batch = pq.open
        changed = False
        if batch is None or not batch.has_room(nbytes, self.batch_size):
            if batch is not None:
                batch.sealed = True
            batch = pq.open = ProducerBatch(topic, partition, now)
            batch.held = self.holding
            pq.last_full = False
            pq.queue.append(batch)
            self.stats["batches"] += 1
            changed = True
        batch.append(timestamp, key, value, headers, sink)
        self.buffered_bytes += nbytes
        if batch.size >= self.batch_size:
            batch.sealed = pq.last_full = True
            pq.open = None
            changed = True
        return changed

    def append_batch(self, batch: ProducerBatch) -> None:
        """Queue a batch built apart (``send_batch``), after every record already in its partition."""
        pq = self._queue((batch.topic, batch.partition))
        if pq.open is not None:  # the open batch holds earlier records: it goes first, as it is
            pq.open.sealed = True
            pq.open = None
        batch.sealed = True
        batch.held = self.holding
        pq.queue.append(batch)
        self.stats["batches"] += 1
        self.buffered_bytes += batch.size - BATCH_OVERHEAD

    # ---- pipelined commit: the next transaction's batches wait for the previous one's end ----------

    def hold_new_batches(self) -> None:
        """Cut every partition: what is queued now is the committing transaction's, what comes later is held.

        Open batches are sealed so no later record joins them; they go out
        now, like every batch of the committing transaction.
        """
        for pq in self.partitions.values():
            if pq.open is not None:
                pq.open.sealed = True
                pq.open = None
        self.holding = True

    def release_held(self) -> None:
        """The previous transaction ended: the held batches are the open transaction's, sent as usual."""
        self.holding = False
        for pq in self.partitions.values():
            for b in pq.queue:
                b.held = False

    def fail_held(self, exc: BrokerError) -> int:
        """The previous transaction did not commit: the held batches were never sent; fail them; how many.

        Their failure says nothing of the committing transaction, so it is not
        reported to the idempotence manager (a commit that timed out must stay
        a commit, never turn into an abort).
        """
        self.holding = False
        n = 0
        for pq in self.partitions.values():
            if pq.open is not None and pq.open.held:
                pq.open = None
            kept = [b for b in pq.queue if not b.held]
            for b in pq.queue:
                if b.held:
                    self._report_failure(b, exc, notify=False)
                    b.transition_to(BatchState.DONE)
                    n += 1
            pq.queue.clear()
            pq.queue.extend(kept)
        return n

    # ---- reporting ---------------------------------------------------------------------------

    def _report_success(self, batch: ProducerBatch, base_offset: int, log_append_time: int) -> None:
        if not batch.reported:
            self.buffered_bytes -= batch.size - BATCH_OVERHEAD
            self.stats["records_acked"] += batch.record_count
            self.stats["bytes_acked"] += batch.size - BATCH_OVERHEAD
            batch.complete(base_offset, log_append_time)
            self.on_report(batch)

    def _report_failure(self, batch: ProducerBatch, exc: BrokerError, *, notify: bool = True) -> None:
        if not batch.reported:
            self.buffered_bytes -= batch.size - BATCH_OVERHEAD
            batch.fail(exc)
            self.on_report(batch)
            if notify:
                self.idem.batch_failed(exc)

    def _finish(self, pq: PartitionQueue, batch: ProducerBatch) -> None:
        batch.transition_to(BatchState.DONE)
        pq.pop_done()

    # ---- sending -------------------------------------------------------------------------------

    def _sendable_new(self, batch: ProducerBatch, now: float) -> bool:
        return not batch.held and (
            batch.sealed
            or now - batch.created >= self.linger_s
            or self.flushing > 0
            or self.closing
            or self.memory_waiters > 0
        )

    @staticmethod
    def _retries_to_send(pq: PartitionQueue, now: float) -> tuple[list[ProducerBatch], bool]:
        """Retries of ``pq`` that may go now, and whether new batches must wait.

        Retries go out in sequence order: a batch waits while an earlier one
        still waits (sending it first would only be rejected as out of order).
        A batch rejected as out of order waits until the earlier batches it
        overtook are answered. New batches wait behind any retry, as in Kafka.
        """
        sends: list[ProducerBatch] = []
        hold = ooo_hold = False
        for b in pq.inflight:
            st = b.state
            if st is BatchState.IN_FLIGHT:
                ooo_hold = ooo_hold or not b.expired
            elif st is BatchState.RESEQUENCE:
                hold = True
            elif st is BatchState.RETRY_WAIT:
                if hold or b.retry_at > now or (b.wait_for_predecessors and ooo_hold):
                    hold = True
                else:
                    sends.append(b)
        return sends, hold

    def window_open(self, topic: str, partition: int) -> bool:
        """Whether ``partition`` may put another batch in flight now (else only an answer changes that)."""
        pq = self.partitions.get((topic, partition))
        if pq is None:
            return True
        return len(pq.inflight) < self.max_in_flight

    def drain(self, now: float, leader_of: Callable[[str, int], str | None]) -> list[tuple[str, list[ProducerBatch]]]:
        """Choose the batches to send now and group them into requests.

        ``leader_of`` answers the leader URL of a partition, or None while it
        is unknown (its batches then wait, and expire if it never becomes
        known). Returns ``(leader_url, batches)`` per request: at most one
        batch per partition per request (the broker rejects a partition twice),
        at most ``max_request_size`` bytes. Chosen batches are IN_FLIGHT on return.
        """
        idem = self.idem
        slots: dict[str, tuple[list[list[ProducerBatch]], list[int]]] = {}
        items = list(self.partitions.values())
        if len(items) > 1:
            self._rotate = (self._rotate + 1) % len(items)
            items = items[self._rotate :] + items[: self._rotate]
        self.no_leader.clear()
        for pq in items:
            if not pq.queue and not pq.inflight:
                continue
            sends, hold = self._retries_to_send(pq, now)
            new = (
                not hold
                and idem.can_sequence
                and pq.queue
                and len(pq.inflight) < self.max_in_flight
                and self._sendable_new(pq.queue[0], now)
            )
            if not sends and not new:
                continue
            url = leader_of(pq.topic, pq.partition)
            if url is None:
                self.no_leader.add((pq.topic, pq.partition))
                continue
            while new:
                b = pq.queue.popleft()
                b.sealed = True
                if pq.open is b:
                    pq.open = None
                seq = idem.next_sequence((pq.topic, pq.partition), b.record_count) if idem.enabled else -1
                cur = idem.current
                b.seal_wire(cur.producer_id, cur.epoch, seq, transactional=idem.transactional)
                pq.inflight.append(b)
                sends.append(b)
                new = bool(pq.queue) and len(pq.inflight) < self.max_in_flight and self._sendable_new(pq.queue[0], now)
            requests, sizes = slots.setdefault(url, ([], []))
            start = 0
            for b in sends:
                b.sent_with_live_predecessors = pq.has_live_predecessors(b)
                b.wait_for_predecessors = False
                b.transition_to(BatchState.IN_FLIGHT)
                b.attempts += 1
                if b.attempts > 1:
                    self.stats["retries"] += 1
                assert b.wire is not None
                n = len(b.wire) + _PART_FRAMING + len(b.topic.encode())
                i = start  # this partition's next batch goes into a later request than its previous one
                while i < len(requests) and sizes[i] + n > self.max_request_size:
                    i += 1
                if i == len(requests):
                    requests.append([])
                    sizes.append(self.request_framing)
                requests[i].append(b)
                sizes[i] += n
                start = i + 1
        out = [(url, batches) for url, (requests, _) in slots.items() for batches in requests]
        self.outstanding_requests += len(out)
        return out

    # ---- answers ---------------------------------------------------------------------------

    def handle_response(
        self, batch: ProducerBatch, base_offset: int, log_append_time: int, error: BrokerError | None, now: float
    ) -> Outcome:
        """Apply the answer for one batch of a finished request (``error`` None = acknowledged)."""
        pq = self._queue((batch.topic, batch.partition))
        idem = self.idem
        if batch.expired:
            self._finish(pq, batch)
            if error is None:
                self.stats["late_success"] += 1
            return Outcome.LATE
        if error is None or error.error_code is ErrorCode.DUPLICATE_SEQUENCE_NUMBER:
            self._report_success(batch, base_offset if error is None else -1, log_append_time)
            self._finish(pq, batch)
            return Outcome.ACKED
        batch.last_error = error
        code = error.error_code
        if code in _CONTENT_ERRORS:
            batch.maybe_written = False
        if idem.enabled and code in _FENCED:
            if idem.is_current(batch.producer_id, batch.producer_epoch):
                self._report_failure(batch, error)
                self._finish(pq, batch)
                self.fail_all(BrokerError(code, f"producer fenced: {error.message}"))
                return Outcome.FATAL
            return self._fail(pq, batch, error)
        if idem.enabled and batch.behind_gap:
            return self._resequence(pq, batch)
        if idem.enabled and code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER:
            if batch.sent_with_live_predecessors or pq.has_live_predecessors(batch):
                return self._retry(batch, now, wait_for_predecessors=True)
            idem.request_bump(f"{batch.topic}-{batch.partition}: sequence {batch.base_sequence} out of order")
            return self._retry(batch, now) if batch.maybe_written else self._resequence(pq, batch)
        if idem.enabled and code is ErrorCode.UNKNOWN_PRODUCER_ID:
            idem.request_bump(f"{batch.topic}-{batch.partition}: broker lost this producer's state")
            return self._retry(batch, now) if batch.maybe_written else self._resequence(pq, batch)
        if code in _PRODUCER_RETRIABLE:
            if code not in _NOT_SUBMITTED:
                batch.maybe_written = True
            if batch.attempts > self.retries:
                return self._fail(pq, batch, error)
            return self._retry(batch, now)
        return self._fail(pq, batch, error)

    def handle_transport_error(self, batch: ProducerBatch, error: BrokerError, now: float) -> Outcome:
        """The whole request failed without per-partition answers (timeout, connection lost)."""
        return self.handle_response(batch, -1, -1, error, now)

    def _retry(self, batch: ProducerBatch, now: float, *, wait_for_predecessors: bool = False) -> Outcome:
        batch.transition_to(BatchState.RETRY_WAIT)
        batch.wait_for_predecessors = wait_for_predecessors
        batch.retry_at = now if wait_for_predecessors else now + self.retry_backoff_s
        return Outcome.RETRY

    def _resequence(self, pq: PartitionQueue, batch: ProducerBatch) -> Outcome:
        batch.transition_to(BatchState.RESEQUENCE)
        self.stats["resequenced"] += 1
        self.idem.request_bump(f"{batch.topic}-{batch.partition}: sequence {batch.base_sequence} was not written")
        self._mark_gap(pq, batch)
        return Outcome.RESEQUENCE

    def _fail(self, pq: PartitionQueue, batch: ProducerBatch, error: BrokerError) -> Outcome:
        self._report_failure(batch, error)
        if self.idem.enabled:
            if not batch.maybe_written:
                self._mark_gap(pq, batch)
            self.idem.request_bump(f"{batch.topic}-{batch.partition}: batch failed with {error.error_code.name}")
        self._finish(pq, batch)
        return Outcome.FAILED

    def _mark_gap(self, pq: PartitionQueue, batch: ProducerBatch) -> None:
        """``batch`` is certainly not in the log and never will be: no later batch of its epoch can land either.

        Those batches are re-sequenced under the next epoch instead of being
        retried until they expire: waiting ones now, in-flight ones when their
        request returns (an answer other than success is then certain).
        """
        behind = False
        for b in pq.inflight:
            if b is batch:
                behind = True
            elif behind:
                b.behind_gap = True
                if b.state is BatchState.RETRY_WAIT:
                    b.transition_to(BatchState.RESEQUENCE)
                    self.stats["resequenced"] += 1

    def request_finished(self) -> None:
        self.outstanding_requests -= 1

    # ---- expiry, bump, fatal ----------------------------------------------------------------

    def expire(self, now: float) -> int:
        """Fail every batch older than ``delivery_timeout_ms``; returns how many expired.

        Held batches (the next transaction's, behind a pipelined commit) do not expire while held: the
        commit's own deadline decides their fate (released, or failed unsent), and their expiry would
        wrongly make the committing transaction abortable.
        """
        limit = self.delivery_timeout_s
        n = 0
        for pq in self.partitions.values():
            while pq.queue and not pq.queue[0].held and now - pq.queue[0].created >= limit:
                b = pq.queue.popleft()
                if pq.open is b:
                    pq.open = None
                self._expire_one(b, now, maybe_written=False)
                b.transition_to(BatchState.DONE)
                n += 1
            for b in pq.inflight:
                if b.reported or now - b.created < limit:
                    continue
                maybe = b.maybe_written or b.state is BatchState.IN_FLIGHT
                self._expire_one(b, now, maybe_written=maybe)
                n += 1
                if not maybe and self.idem.enabled:
                    self._mark_gap(pq, b)
                if b.state is BatchState.IN_FLIGHT:
                    b.expired = True  # DONE when its request returns
                else:
                    b.transition_to(BatchState.DONE)
                self.idem.request_bump(f"{b.topic}-{b.partition}: sequence {b.base_sequence} expired")
            pq.pop_done()
        self.stats["expired"] += n
        return n

    def _expire_one(self, b: ProducerBatch, now: float, *, maybe_written: bool) -> None:
        where = "may have been written" if maybe_written else "was not written"
        cause = f"; last error {b.last_error.error_code.name}" if b.last_error is not None else ""
        self._report_failure(
            b,
            DeliveryTimeoutError(
                f"expiring {b.record_count} record(s) for {b.topic}-{b.partition}: "
                f"{(now - b.created) * 1000:.0f} ms since batch creation ({where}){cause}",
                maybe_written=maybe_written,
            ),
        )

    def ready_to_bump(self) -> bool:
        """BUMP_PENDING and nothing old-epoch can still be sent or answered."""
        if self.idem.state is not ProducerIdState.BUMP_PENDING or self.outstanding_requests:
            return False
        return not any(pq.has_live() for pq in self.partitions.values())

    def reset_after_bump(self) -> None:
        """After the epoch bump: RESEQUENCE batches go back to the front of their queue, windows empty."""
        for pq in self.partitions.values():
            back = [b for b in pq.inflight if b.state is BatchState.RESEQUENCE]
            for b in back:
                b.unsequence()
                b.transition_to(BatchState.QUEUED)
                b.sealed = True
            pq.queue.extendleft(reversed(back))
            pq.inflight = []

    def fail_all(self, exc: BrokerError) -> None:
        """The producer is fenced or closed: report every batch not yet reported as failed."""
        if self.idem.enabled:
            self.idem.fail_fatally(exc)
        for pq in self.partitions.values():
            for b in pq.inflight:
                self._report_failure(b, exc)
                if b.state is not BatchState.IN_FLIGHT and b.state is not BatchState.DONE:
                    b.transition_to(BatchState.DONE)
                elif b.state is BatchState.IN_FLIGHT:
                    b.expired = True
            while pq.queue:
                b = pq.queue.popleft()
                self._report_failure(b, exc)
                b.transition_to(BatchState.DONE)
            pq.open = None
            pq.pop_done()

    def fail_undrained(self, exc: BrokerError) -> int:
        """The transaction is being aborted: fail every batch no request carries now; returns how many.

        Queued batches and batches waiting for a retry or a re-sequencing are
        never sent again (Kafka's ``abortUndrainedBatches``); a batch in flight
        is left to its answer. Whatever of the transaction did land is removed
        from read_committed view by the ABORT marker, and an old-epoch request
        that lands later is fenced by the partition.
        """
        n = 0
        for pq in self.partitions.values():
            for b in pq.inflight:
                if b.state in (BatchState.RETRY_WAIT, BatchState.RESEQUENCE):
                    self._report_failure(b, exc)
                    b.transition_to(BatchState.DONE)
                    n += 1
            while pq.queue:
                b = pq.queue.popleft()
                self._report_failure(b, exc)
                b.transition_to(BatchState.DONE)
                n += 1
            pq.open = None
            pq.pop_done()
        return n

    def has_undrained(self) -> bool:
        return any(
            pq.queue or any(b.state in (BatchState.RETRY_WAIT, BatchState.RESEQUENCE) for b in pq.inflight)
            for pq in self.partitions.values()
        )

    def reset_after_transaction(self) -> None:
        """A new identity (the next transaction's epoch): forget the finished windows."""
        for pq in self.partitions.values():
            pq.pop_done()
            pq.inflight = [b for b in pq.inflight if b.state is not BatchState.DONE]

    def abort_incomplete(self, why: str) -> None:
        """close(timeout) gave up: fail what is left (outcome unknown for anything sent)."""
        for pq in self.partitions.values():
            for b in [*pq.inflight, *pq.queue]:
                maybe = b.maybe_written or b.state is BatchState.IN_FLIGHT
                self._report_failure(b, DeliveryTimeoutError(f"{b.topic}-{b.partition}: {why}", maybe_written=maybe))

    # ---- timing and introspection ------------------------------------------------------------

    def next_deadline(self, now: float) -> float | None:
        """Earliest time something changes without an answer arriving: linger, backoff, expiry."""
        best: float | None = None

        def consider(t: float) -> None:
            nonlocal best
            if best is None or t < best:
                best = t

        for tp, pq in self.partitions.items():
            if pq.queue and not pq.queue[0].held:  # a held head waits for its commit's end, not for a time
                head = pq.queue[0]
                consider(head.created + self.delivery_timeout_s)
                if self.idem.can_sequence and len(pq.inflight) < self.max_in_flight and tp not in self.no_leader:
                    consider(head.created + self.linger_s)
            for b in pq.inflight:
                if not b.reported:
                    consider(b.created + self.delivery_timeout_s)
                if b.state is BatchState.RETRY_WAIT and not b.wait_for_predecessors and tp not in self.no_leader:
                    consider(b.retry_at)
        return best

    def unreported(self, *, held: bool = True) -> Iterator[ProducerBatch]:
        """Batches whose futures are not completed yet; ``held=False`` leaves out the next transaction's."""
        for pq in self.partitions.values():
            for b in pq.inflight:
                if not b.reported:
                    yield b
            for b in pq.queue:
                if not b.reported and (held or not b.held):
                    yield b

    def has_pending(self) -> bool:
        return self.outstanding_requests > 0 or any(pq.queue or pq.inflight for pq in self.partitions.values())
