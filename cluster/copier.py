"""``txbroker copy``: an exactly-once consume-transform-produce application (Kafka's TransactionalMessageCopier).

One copier instance is one consumer-group member plus one transactional
producer. It reads the input topic with ``read_committed`` and the group's
committed offsets, sends each record (transformed) to the output topic inside
a transaction, and commits the consumed positions *in the same transaction*
(``send_offsets_to_transaction`` with the consumer's group metadata, KIP-447).
Output records and input offsets therefore become visible together or not at
all, whatever crashes: a restarted copier resumes from the last committed
offsets and every aborted transaction's output stays invisible.

A transaction commits when it holds ``commit_every`` records, when it is
``commit_every_ms`` old, or when a poll finds no more input (0 disables the
first two triggers). Failure handling follows Kafka's copier:

* a rebalance (partitions revoked or lost) aborts the open transaction; the
  new assignment starts from the committed offsets (stable ones only);
* a fenced producer (a newer instance with the same transactional id, or a
  coordinator that aborted a timed-out transaction) is fatal: the copier
  exits non-zero;
* any other failure aborts the transaction and rewinds to the committed
  offsets (a stale group generation also rejoins the group first);
* a commit whose outcome is unknown (timeout) is retried, never turned into
  an abort (kafka_txn.md §12).

Progress is printed as JSON lines (``stage``, ``consumed``, ``copied``,
``remaining`` = records of the assigned partitions not yet consumed, ...)
like Kafka's copier, at most every ``progress_interval_ms`` and at shutdown.
With ``idle_exit_ms`` the copier stops by itself once no record arrived for
that long and the *group's* committed offsets cover the whole input (so a
member does not leave while another member's partitions are still to copy).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from clients.aio import AsyncConsumer, AsyncProducer, ConsumerRebalanceListener
from clients.protocol import BrokerError, ErrorCode
from clients.records import ConsumerRecord, OffsetAndMetadata, TopicPartition
from clients.security import SecurityOptions

__all__ = ["CopierConfig", "CopierStats", "TransactionalCopier", "copy", "load_transform", "run_copier"]

log = logging.getLogger(__name__)

Transform = Callable[[bytes | None], bytes | None]
Emit = Callable[[dict[str, Any]], None]

# Records transformed between two yields to the event loop: a slow transform must not starve the
# heartbeats (the group session) or the producer's sender, which share the copier's loop.
_YIELD_EVERY = 50

# The producer cannot go on (Kafka's copier rethrows these and dies).
FATAL = frozenset(
    {
        ErrorCode.PRODUCER_FENCED,
        ErrorCode.INVALID_PRODUCER_EPOCH,
        ErrorCode.INVALID_PRODUCER_ID_MAPPING,
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        ErrorCode.GROUP_AUTHORIZATION_FAILED,
        ErrorCode.TOPIC_AUTHORIZATION_FAILED,
        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
    }
)
# The member's generation is over: rejoin, the rebalance reads the committed offsets again.
GROUP_FENCED = frozenset({ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.REBALANCE_IN_PROGRESS})


class FatalCopierError(Exception):
    """The copier must stop (fenced, unauthorized): the process exits non-zero."""


def load_transform(spec: str) -> Transform:
    """``identity``, ``upper`` or ``python:MODULE:FUNCTION`` (``f(value: bytes | None) -> bytes | str | None``)."""
    if spec == "identity":
        return lambda v: v
    if spec == "upper":
        return lambda v: v.upper() if v is not None else None
    if spec.startswith("python:"):
        module, _, name = spec[len("python:") :].rpartition(":")
        if not module or not name:
            raise ValueError(f"--transform python:MODULE:FUNCTION, not {spec!r}")
        fn = getattr(importlib.import_module(module), name)
        if not callable(fn):
            raise ValueError(f"{spec}: {name} is not callable")

        def call(v: bytes | None) -> bytes | None:
            out = fn(v)
            if isinstance(out, str):
                return out.encode()
            if out is not None and not isinstance(out, bytes | bytearray):
                raise TypeError(f"{spec} returned {type(out).__name__}, not bytes/str/None")
            return bytes(out) if out is not None else None

        return call
    raise ValueError(f"unknown transform {spec!r}: use identity, upper or python:MODULE:FUNCTION")


@dataclass(frozen=True, slots=True)
class CopierConfig:
    bootstrap: str
    input_topic: str
    output_topic: str
    group_id: str
    transactional_id: str
    transform: str = "identity"
    commit_every: int = 500
    commit_every_ms: int = 100
    max_records: int | None = None
    idle_exit_ms: int | None = None
    transaction_timeout_ms: int = 60_000
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 3_000
    max_poll_interval_ms: int = 60_000
    partition_assignment_strategy: str = "range"
    progress_interval_ms: int = 1_000
    linger_ms: int = 5
    batch_size: int = 65_536
    max_poll_records: int = 500
    #: The clients' TLS and credential options (``--command-config``); kept out of repr (a password).
    security: SecurityOptions = field(default_factory=lambda: SecurityOptions(), repr=False)

    def validate(self) -> None:
        if self.commit_every < 0 or self.commit_every_ms < 0:
            raise ValueError("--commit-every and --commit-every-ms must be >= 0")
        if self.max_records is not None and self.max_records < 1:
            raise ValueError("--max-records must be positive")
        if self.input_topic == self.output_topic:
            raise ValueError("--from and --to must name different topics")


@dataclass
class CopierStats:
    consumed: int = 0  # records polled, re-reads after an abort included
    copied: int = 0  # records committed to the output
    transactions: int = 0
    aborted: int = 0
    rebalances: int = 0
    remaining: int = -1  # records of the assigned partitions not yet consumed (-1: unknown)
    group_remaining: int = -1  # input records the group has not committed yet (-1: unknown)
    started: float = field(default_factory=time.monotonic)


class TransactionalCopier(ConsumerRebalanceListener):
    """The copy loop (module docstring); also the consumer's rebalance listener."""

    def __init__(self, config: CopierConfig, emit: Emit) -> None:
        config.validate()
        self.config = config
        self._emit = emit
        self._transform = load_transform(config.transform)
        self.stats = CopierStats()
        self.consumer = AsyncConsumer(
            config.bootstrap,
            group_id=config.group_id,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=config.session_timeout_ms,
            heartbeat_interval_ms=config.heartbeat_interval_ms,
            max_poll_interval_ms=config.max_poll_interval_ms,
            partition_assignment_strategy=config.partition_assignment_strategy,
            max_poll_records=config.max_poll_records,
            **config.security,
        )
        self.producer = AsyncProducer(
            config.bootstrap,
            transactional_id=config.transactional_id,
            transaction_timeout_ms=config.transaction_timeout_ms,
            linger_ms=config.linger_ms,
            batch_size=config.batch_size,
            **config.security,
        )
        self._in_txn = False
        self._txn_started = 0.0
        self._txn_records = 0
        self._txn_partitions: set[TopicPartition] = set()
        self._last_record = time.monotonic()
        self._last_progress = 0.0
        self._last_done_check = 0.0
        self._stop = asyncio.Event()

    # ---- progress ------------------------------------------------------------------------------

    def _report_due(self) -> bool:
        return (time.monotonic() - self._last_progress) * 1000 >= self.config.progress_interval_ms

    def _report(self, stage: str, *, force: bool = False) -> None:
        if not force and not self._report_due():
            return
        now = time.monotonic()
        self._last_progress = now
        gm = self.consumer.group_metadata()
        s = self.stats
        self._emit(
            {
                "stage": stage,
                "transactional_id": self.config.transactional_id,
                "group_id": self.config.group_id,
                "generation_id": gm.generation_id,
                "member_id": gm.member_id,
                "assignment": sorted(f"{t}-{p}" for t, p in self.consumer.assignment()),
                "consumed": s.consumed,
                "copied": s.copied,
                "remaining": s.remaining,
                "transactions": s.transactions,
                "aborted": s.aborted,
                "rebalances": s.rebalances,
                "elapsed_s": round(now - s.started, 3),
                "time_ms": int(time.time() * 1000),
            }
        )

    async def _remaining(self) -> int:
        """Records of the assigned partitions above the position (Kafka's copier ``messagesRemaining``).

        -1 when the cluster cannot tell right now (a leader or coordinator is moving).
        """
        tps = sorted(self.consumer.assignment())
        if not tps:
            return 0
        try:
            ends = await self.consumer.end_offsets(tps)
            total = 0
            for tp in tps:
                total += max(0, ends[tp] - await self.consumer.position(tp, timeout_ms=1000))
        except BrokerError as exc:
            if exc.retriable:
                return -1
            raise
        return total

    async def _group_remaining(self) -> int:
        """Input records whose offsets the group has not committed (stable offsets only; -1: unknown now)."""
        try:
            parts = await self.consumer.partitions_for_topic(self.config.input_topic)
            tps = [(self.config.input_topic, p) for p in sorted(parts)]
            ends = await self.consumer.end_offsets(tps)
            committed = await self.consumer.committed_offsets(tps, timeout_ms=0)
            starts = await self.consumer.beginning_offsets([tp for tp in tps if committed.get(tp) is None])
        except BrokerError as exc:
            if exc.retriable:  # UNSTABLE_OFFSET_COMMIT (a transaction is deciding) or a moving leader
                return -1
            raise
        total = 0
        for tp in tps:
            om = committed.get(tp)
            total += max(0, ends[tp] - (om.offset if om is not None else starts[tp]))
        return total

    # ---- transactions ----------------------------------------------------------------------------

    def _due(self, now: float, polled: int) -> bool:
        cfg = self.config
        if not self._in_txn:
            return False
        if polled == 0:  # the input is drained for now: do not sit on a partial transaction
            return True
        if cfg.commit_every and self._txn_records >= cfg.commit_every:
            return True
        if cfg.commit_every_ms and (now - self._txn_started) * 1000 >= cfg.commit_every_ms:
            return True
        return cfg.max_records is not None and self.stats.copied + self._txn_records >= cfg.max_records

    def _poll_budget(self) -> tuple[float, int]:
        """(poll timeout ms, max records) so that the poll ends when the transaction is due."""
        cfg = self.config
        limit = cfg.max_poll_records
        if cfg.commit_every:
            limit = min(limit, max(1, cfg.commit_every - self._txn_records))
        if cfg.max_records is not None:
            limit = min(limit, max(1, cfg.max_records - self.stats.copied - self._txn_records))
        timeout = 100.0
        if self._in_txn and cfg.commit_every_ms:
            age_ms = (time.monotonic() - self._txn_started) * 1000
            timeout = max(0.0, min(timeout, cfg.commit_every_ms - age_ms))
        return timeout, limit

    async def _copy(self, records: list[ConsumerRecord]) -> None:
        if not self._in_txn:
            self.producer.begin_transaction()
            self._in_txn = True
            self._txn_started = time.monotonic()
            self._txn_records = 0
            self._txn_partitions = set()
        out = self.config.output_topic
        for i, r in enumerate(records):
            headers = list(r.headers) if r.headers else None
            await self.producer.send(out, value=self._transform(r.value), key=r.key, headers=headers)
            self._txn_partitions.add((r.topic, r.partition))
            if i % _YIELD_EVERY == _YIELD_EVERY - 1:
                await asyncio.sleep(0)
        self._txn_records += len(records)
        self.stats.consumed += len(records)

    async def _commit(self) -> None:
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        try:
            for tp in sorted(self._txn_partitions):
                offsets[tp] = OffsetAndMetadata(await self.consumer.position(tp))
            await self.producer.send_offsets_to_transaction(offsets, self.consumer.group_metadata())
        except BrokerError as exc:
            await self._abort(exc)
            return
        while True:
            try:
                await self.producer.commit_transaction()
                break
            except BrokerError as exc:
                if exc.retriable and self._stop.is_set():
                    # Stopping with the outcome unknown: the coordinator finishes the commit or the
                    # transaction times out; a restart reads whichever offsets became committed.
                    self._in_txn = False
                    return
                if exc.retriable:  # outcome unknown: the same call resumes it (never an abort)
                    log.warning("%s: commit not confirmed (%s); retrying", self.config.transactional_id, exc)
                    await asyncio.sleep(0.1)
                    continue
                await self._abort(exc)
                return
        self._in_txn = False
        self.stats.transactions += 1
        self.stats.copied += self._txn_records

    async def _end_abort(self) -> None:
        """Abort the open transaction; retried while the outcome is unknown."""
        if not self._in_txn:
            return
        while True:
            try:
                await self.producer.abort_transaction()
                break
            except BrokerError as exc:
                if exc.error_code in FATAL:
                    self._in_txn = False
                    raise FatalCopierError(f"abort failed: {exc}") from exc
                if not exc.retriable:
                    raise
                await asyncio.sleep(0.1)
        self._in_txn = False
        self.stats.aborted += 1

    async def _abort(self, cause: BrokerError) -> None:
        """Abort after a failure, then resume from the committed offsets (Kafka's copier)."""
        if cause.error_code in FATAL:
            self._in_txn = False  # a fenced producer cannot abort; the coordinator does
            raise FatalCopierError(str(cause)) from cause
        log.warning("%s: aborting the transaction: %s", self.config.transactional_id, cause)
        await self._end_abort()
        if cause.error_code in GROUP_FENCED:
            self.consumer.enforce_rebalance()  # the rejoin reads the committed offsets again
            return
        tps = sorted(self.consumer.assignment())
        while True:
            try:
                committed = await self.consumer.committed_offsets(tps)
                break
            except BrokerError as exc:
                if not exc.retriable:
                    raise
                log.warning("%s: committed offsets not readable yet (%s)", self.config.transactional_id, exc)
        for tp in tps:
            om = committed.get(tp)
            if om is None:
                self.consumer.seek_to_beginning(tp)
            else:
                self.consumer.seek(tp, om.offset)

    # ---- rebalance listener ----------------------------------------------------------------------

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        if self._in_txn:
            log.info("%s: partitions revoked %s: aborting the open transaction", self.config.transactional_id,
                     sorted(revoked))  # fmt: skip
            await self._end_abort()

    async def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        await self.on_partitions_revoked(lost)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.stats.rebalances += 1
        self._report("Rebalanced", force=True)

    # ---- the loop ----------------------------------------------------------------------------------

    async def _finished(self, now: float) -> bool:
        cfg = self.config
        if cfg.max_records is not None and self.stats.copied >= cfg.max_records:
            return True
        if cfg.idle_exit_ms is None or self._in_txn or (now - self._last_record) * 1000 < cfg.idle_exit_ms:
            return False
        if now - self._last_done_check < 0.5:
            return False
        self._last_done_check = now
        if self.consumer.group_metadata().generation_id < 0:
            return False  # mid-rebalance: partitions may be on their way here
        self.stats.group_remaining = await self._group_remaining()
        return self.stats.group_remaining == 0

    async def run(self, stop: asyncio.Event) -> CopierStats:
        self._stop = stop
        try:
            await self.producer.init_transactions()
            self.consumer.subscribe([self.config.input_topic], listener=self)
            self._report("Startup", force=True)
            while not stop.is_set():
                timeout_ms, limit = self._poll_budget()
                records = await self.consumer.poll(timeout_ms, max_records=limit)
                now = time.monotonic()
                if records:
                    self._last_record = now
                    await self._copy(records)
                if self._due(time.monotonic(), len(records)):
                    await self._commit()
                    if self._report_due():
                        self.stats.remaining = await self._remaining()
                        self._report("ProcessLoop", force=True)
                if await self._finished(now):
                    break
            await self._end_abort()
            self.stats.remaining = await self._remaining()
        finally:
            with contextlib.suppress(Exception):
                await self.consumer.close()
            with contextlib.suppress(Exception):
                await self.producer.close()
        self._report("ShutdownComplete", force=True)
        return self.stats


def print_json(obj: dict[str, Any]) -> None:
    print(json.dumps(obj, sort_keys=True), flush=True)


async def copy(config: CopierConfig, stop: asyncio.Event | None = None, emit: Emit = print_json) -> CopierStats:
    """Run a copier until ``stop`` is set, ``max_records`` are copied or (``idle_exit_ms``) the input is done."""
    return await TransactionalCopier(config, emit).run(stop or asyncio.Event())


def run_copier(config: CopierConfig, emit: Emit = print_json, *, handle_signals: bool = False) -> CopierStats:
    """Blocking ``copy``; with ``handle_signals`` SIGTERM/SIGINT stop it cleanly (abort, leave the group)."""

    async def main() -> CopierStats:
        stop = asyncio.Event()
        if handle_signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
        return await copy(config, stop, emit)

    return asyncio.run(main())


def main_copy(config: CopierConfig) -> int:
    """The ``txbroker copy`` command: 0 when done or stopped, 1 when fatal (fenced)."""
    try:
        stats = run_copier(config, handle_signals=True)
    except (FatalCopierError, BrokerError) as exc:
        # A fenced producer may surface from any producer call (send, begin, commit), not only from
        # the abort path that wraps it: every fatal end prints the Fatal line (Kafka's copier dies too).
        if isinstance(exc, BrokerError) and exc.error_code not in FATAL:
            raise
        print_json({"stage": "Fatal", "transactional_id": config.transactional_id, "error": str(exc)})
        print(f"error: {exc}", file=sys.stderr)
        return 1
    log.info("copier %s done: %s", config.transactional_id, asdict(stats))
    return 0
