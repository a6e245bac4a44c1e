"""One Spark task attempt's transaction, written directly on the HTTP contract (API.md, binary produce).

Life of a ``TransactionalWriter``:

1. ``begin``: ``POST /v1/producers/init`` with the attempt's own
   transactional id (never shared, so no other writer fences it) and the
   transaction timeout;
2. ``append`` records; full batches go out as binary transactional produce
   requests (``encode_batch(..., transactional=True)``), one request per
   partition leader carrying that leader's batches. The first produce to a
   partition adds it to the transaction (KIP-890 v2). Sequence numbers make
   a resent batch a duplicate the broker recognises, so every retriable
   failure is retried with the very same bytes;
3. ``prepare``: the transaction becomes PREPARED: durable, invisible, exempt
   from the transaction timeout, and completable later by whoever holds
   (transactional id, producer id, epoch) -- the driver.

It is *not* bound to a commit group here: only the driver's group commit
binds exactly the members it decides on, so aborting an attempt (task
failure, ``abort()``) never records a decision for the job's group and a
retried job with the same write id can still commit.

Sending overlaps encoding: each full batch is sent by a pool thread while the
task fills the next one. At most one batch per partition is in flight, so
sequence order holds without the broker's 5-batch window; keyless rows move
to the next partition with every batch (Kafka's sticky partitioner), so
several partitions' batches are usually in flight at once.
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import quote

from clients.partitioner import partition_for_key
from clients.protocol import (
    BATCH_HEADER,
    PRODUCE_CONTENT_TYPE,
    BrokerError,
    ErrorCode,
    ProducePartition,
    ProduceRequest,
    Record,
    encode_batch,
    encode_produce_request,
)

from . import _http
from .broker import BrokerClient, retry_delay

log = logging.getLogger("spark_io")
TP = tuple[str, int]
# Per-record framing overhead (timestamp, lengths, header count) for the batch-size estimate.
_RECORD_OVERHEAD = 18


@dataclass
class _Pending:
    records: list[Record] = field(default_factory=list)
    size: int = 0


@dataclass(frozen=True)
class _Batch:
    tp: TP
    data: bytes
    count: int


class TransactionalWriter:
    def __init__(
        self,
        client: BrokerClient,
        transactional_id: str,
        *,
        transaction_timeout_ms: int,
        batch_bytes: int,
        request_timeout_ms: int,
    ) -> None:
        self.client = client
        self.tid = transactional_id
        self.timeout_ms = transaction_timeout_ms
        self.batch_bytes = batch_bytes
        self.request_timeout_ms = request_timeout_ms
        self.producer_id = -1
        self.producer_epoch = -1
        self.records = 0
        self.payload_bytes = 0
        self._pending: dict[TP, _Pending] = {}
        self._sequence: dict[TP, int] = {}
        self._sticky: dict[str, int] = {}
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="txn-send")
        self._inflight: dict[TP, Future[None]] = {}

    @property
    def _txn_path(self) -> str:
        return f"/v1/transactions/{quote(self.tid, safe='')}"

    def begin(self) -> None:
        res = self.client.coordinator_call(
            "/v1/producers/init",
            {"transactional_id": self.tid, "transaction_timeout_ms": self.timeout_ms},
            f"init {self.tid}",
            deadline_s=self.request_timeout_ms / 1000 * 2,
        )
        self.producer_id, self.producer_epoch = int(res["producer_id"]), int(res["producer_epoch"])

    # ---- records -----------------------------------------------------------------------------------

    def partition_for(self, topic: str, key: bytes | None, partition: int | None) -> int:
        """An explicit partition, else Kafka's murmur2 of the key, else a sticky partition per topic."""
        if partition is not None:
            return partition
        n = self.client.partition_count(topic)
        if key is not None:
            return partition_for_key(key, n)
        return self._sticky.setdefault(topic, hash(self.tid) % n)

    def append(self, topic: str, partition: int, record: Record) -> None:
        tp = (topic, partition)
        pending = self._pending.get(tp)
        if pending is None:
            pending = self._pending[tp] = _Pending()
        size = len(record.value or b"") + len(record.key or b"") + _RECORD_OVERHEAD
        for k, v in record.headers:
            size += len(k.encode()) + len(v or b"") + 6
        if pending.records and pending.size + size > self.client.max_message_bytes(topic) - BATCH_HEADER.size:
            self._cut_partition(tp)  # the batch may not grow past the topic's max.message.bytes
            pending = self._pending[tp] = _Pending()
        pending.records.append(record)
        pending.size += size
        self.records += 1
        self.payload_bytes += len(record.value or b"") + len(record.key or b"")
        if pending.size >= self.batch_bytes:
            self._cut_partition(tp)

    def _cut_partition(self, tp: TP) -> None:
        """Encode ``tp``'s pending records as its next batch and send it once its previous batch is acknowledged."""
        topic = tp[0]
        if topic in self._sticky:  # the next keyless records go to the next partition
            self._sticky[topic] = (self._sticky[topic] + 1) % self.client.partition_count(topic)
        pending = self._pending.pop(tp)
        seq = self._sequence.get(tp, 0)
        data = encode_batch(pending.records, producer_id=self.producer_id, producer_epoch=self.producer_epoch,
                            base_sequence=seq, transactional=True)  # fmt: skip
        self._sequence[tp] = seq + len(pending.records)
        previous = self._inflight.pop(tp, None)
        if previous is not None:
            previous.result()  # one batch in flight per partition keeps the sequence order
        self._inflight[tp] = self._pool.submit(self._send, _Batch(tp, data, len(pending.records)))

    def flush(self) -> None:
        """Send everything appended so far and wait for every acknowledgement."""
        for tp in [tp for tp, p in self._pending.items() if p.records]:
            self._cut_partition(tp)
        inflight, self._inflight = self._inflight, {}
        for fut in inflight.values():
            fut.result()

    # ---- sending -------------------------------------------------------------------------------------

    def _send(self, batch: _Batch) -> None:
        """Produce ``batch`` until it is acknowledged (the same bytes on every retry) or fails for good."""
        deadline = time.monotonic() + max(60.0, 4 * self.request_timeout_ms / 1000)
        attempt = 0
        while True:
            try:
                self._produce(self.client.leader_url(batch.tp), batch)
                return
            except BrokerError as exc:
                if not exc.retriable or time.monotonic() > deadline:
                    raise
            time.sleep(retry_delay(attempt))
            attempt += 1

    def _produce(self, leader: str, batch: _Batch) -> None:
        """One binary produce request; raises the partition's error (DUPLICATE_SEQUENCE_NUMBER is success)."""
        tp = batch.tp
        req = ProduceRequest((ProducePartition(tp[0], tp[1], batch.data),), acks=-1,
                             timeout_ms=self.request_timeout_ms, transactional_id=self.tid)  # fmt: skip
        try:
            _ctype, body = _http.request("POST", leader + "/v1/produce", encode_produce_request(req),
                                         credentials=self.client.credentials,
                                         content_type=PRODUCE_CONTENT_TYPE,
                                         timeout=self.request_timeout_ms / 1000 + 5)  # fmt: skip
            parts = json.loads(body)["partitions"]
        except BrokerError as exc:
            parts = exc.extra.get("partitions")
            if not isinstance(parts, list) or not parts:
                self.client.forget_leader(tp)
                raise
        code = ErrorCode.from_name(parts[0].get("error_code") or "NONE")
        if code in (ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER):
            return
        if code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION):
            self.client.forget_leader(tp)
        raise BrokerError(code, f"{self.tid} -> {tp[0]}-{tp[1]}: {parts[0].get('message') or code.name}")

    # ---- ending ----------------------------------------------------------------------------------------

    def prepare(self) -> tuple[int, int]:
        """Flush, then PREPARE (unbound); returns the identity the driver commits it with."""
        self.flush()
        res = self.client.coordinator_call(
            self._txn_path + "/prepare",
            {"producer_id": self.producer_id, "producer_epoch": self.producer_epoch},
            f"prepare {self.tid}",
            deadline_s=self.request_timeout_ms / 1000 * 2,
        )
        return int(res["producer_id"]), int(res["producer_epoch"])

    def abort_quietly(self) -> None:
        """Best effort: end our own open transaction as aborted (the driver's sweep is the backstop)."""
        if self.producer_id < 0:
            return
        try:
            self.client.coordinator_call(
                self._txn_path + "/end",
                {"producer_id": self.producer_id, "producer_epoch": self.producer_epoch, "commit": False},
                f"abort {self.tid}",
                deadline_s=5,
            )
        except BrokerError as exc:
            log.info("could not abort %s (the driver will): %s", self.tid, exc)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
