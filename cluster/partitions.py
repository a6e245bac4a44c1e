"""Produce, fetch and transaction markers on the data partitions this node replicates.

Kafka's ``ReplicaManager.appendRecords`` / ``fetchMessages``: a request for a
partition this node does not lead answers ``NOT_LEADER_OR_FOLLOWER`` with
the leader's URL. Domain rules that decide the log's content run in the
storage state machines' ``apply``; the checks here only fail fast.

Fetch reads from the *ready* leader (its term's barrier applied, so its log
holds everything the partition acknowledged). A follower read
(``read_replica=any``, KIP-392) is served by any replica from its own
committed copy; see ``PartitionService.fetch`` for the offsets it reports.

Everything runs on the asyncio loop thread.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clients.protocol import (
    BatchFormat,
    BatchHeader,
    BrokerError,
    ControlType,
    ErrorCode,
    ProducePartition,
    ProduceRequest,
    StoredBatch,
    encode_token,
    parse_batch,
)
from raft import NotLeaderError, QueueFullError, RaftCommandFailed, RaftTimeoutError
from storage.commands import (
    AppendResult,
    RevokeResult,
    TxnMarkerCommand,
    TxnMarkerResult,
    encode_append,
    encode_carried_append,
    encode_delete_records,
    encode_retention,
    encode_revoke_marker,
    encode_txn_marker,
)
from storage.kafka_batch import parse_kafka_batch

from .config import NodeConfig
from .controller_service import ControllerService
from .metrics import NodeMetrics, PartitionSample
from .replicas import LocalReplica, ReplicaManager
from .seams import Clock, NodeDirectory, PartitionVerifier, PeerClient, PeerPartitions
from .sequencer import SubmitSequencer
from .topics import TopicMetadata, group_id_for
from .txn.tokens import CarriedMarker, TxnTokens

__all__ = [
    "LIST_OFFSETS_EARLIEST",
    "LIST_OFFSETS_LATEST",
    "MARKER_PATH",
    "READ_COMMITTED",
    "READ_REPLICA_ANY",
    "READ_REPLICA_LEADER",
    "READ_UNCOMMITTED",
    "FetchResult",
    "PartitionProduceResult",
    "PartitionService",
]

log = logging.getLogger(__name__)

READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"
READ_REPLICA_LEADER = "leader"  # the default: only the partition's ready leader answers a fetch
READ_REPLICA_ANY = "any"  # a follower read: any replica answers from its own committed copy
MARKER_PATH = "/v1/internal/txn/marker"
LIST_OFFSETS_LATEST = -1  # Kafka's ListOffsetsRequest.LATEST_TIMESTAMP
LIST_OFFSETS_EARLIEST = -2  # ... EARLIEST_TIMESTAMP
_CARRIED_EPOCHS_KEPT = 100_000
_LEADER_HINT_WAIT_S = 1.0  # a long-poll that lost leadership waits this long at most to learn the new leader


@dataclass(frozen=True, slots=True)
class PartitionProduceResult:
    topic: str
    partition: int
    base_offset: int = -1
    log_append_time: int = -1
    error: BrokerError | None = None
    duplicate: bool = False
    txn_receipt: bytes | None = None  # carried markers: the leader's receipt of a transactional batch

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "topic": self.topic,
            "partition": self.partition,
            "base_offset": self.base_offset,
            "log_append_time": self.log_append_time,
            "error_code": self.error.error_code.name if self.error else "NONE",
            "message": self.error.message if self.error else None,
        }
        if self.error is not None:
            out["retriable"] = self.error.retriable
            out.update(self.error.extra)
        if self.txn_receipt is not None:
            out["txn_receipt"] = encode_token(self.txn_receipt)
        return out


@dataclass(frozen=True, slots=True)
class FetchResult:
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    upper_bound: int
    batches: list[StoredBatch]
    aborted_transactions: list[tuple[int, int]]
    served_by: int | None = None  # a follower read (read_replica=any): the node that answered
    replica_end_offset: int | None = None  # ... and the end of that node's committed copy


def _marker_result(control: ControlType, body: dict[str, Any]) -> TxnMarkerResult:
    """A forwarded marker's answer (``/v1/internal/txn/marker``) as the leader's apply returned it."""
    return TxnMarkerResult(
        control, body.get("offset"), body.get("txn_first_offset"), int(body.get("log_append_time", -1))
    )


class CarriedEpochs:
    """(topic, partition, producer id) -> epoch of the last carried batch accepted here (bounded, oldest out).

    A batch behind a carried batch of its epoch (sequence > 0) needs no verification: the carried batch
    (sequence 0) opens the transaction on the partition, and this one can only be appended after it.
    """

    def __init__(self, capacity: int = _CARRIED_EPOCHS_KEPT) -> None:
        self._capacity = capacity
        self._epochs: OrderedDict[tuple[str, int, int], int] = OrderedDict()

    def accepted(self, topic: str, partition: int, producer_id: int, epoch: int) -> None:
        key = (topic, partition, producer_id)
        self._epochs[key] = epoch
        self._epochs.move_to_end(key)
        if len(self._epochs) > self._capacity:
            self._epochs.popitem(last=False)

    def behind_carried(self, topic: str, partition: int, header: BatchHeader) -> bool:
        return header.base_sequence > 0 and self._epochs.get((topic, partition, header.producer_id)) == (
            header.producer_epoch
        )


class PartitionService:
    """The data partitions' API on this node: produce, fetch, markers, producer state, retention."""

    def __init__(
        self,
        config: NodeConfig,
        replicas: ReplicaManager,
        controller: ControllerService,
        nodes: NodeDirectory,
        peers: PeerClient,
        verifier: PartitionVerifier,
        tokens: TxnTokens,
        metrics: NodeMetrics,
        clock: Clock,
        peer_partitions: PeerPartitions,
    ) -> None:
        self.config = config
        self._replicas = replicas
        self._controller = controller
        self._nodes = nodes
        self._peers = peers
        self._peer_partitions = peer_partitions
        self._verifier = verifier
        self._tokens = tokens
        self._metrics = metrics
        self._clock = clock
        self._carried = CarriedEpochs()
        self.sequencer = SubmitSequencer(on_wait=lambda outcome: metrics.reordered_batches.labels(outcome).inc())
        self.draining = False

    # ---- leadership -----------------------------------------------------------------------

    def _not_leader(self, meta: TopicMetadata, partition: int, why: str = "") -> BrokerError:
        leader = self._controller.partition_leader(meta, partition)
        if leader == self.config.node_id:
            leader_group = self._replicas.get(meta.name, partition)
            if leader_group is None or not leader_group.group.is_leader():
                # Elected here but its barrier is not applied yet: point back here, the client retries.
                return BrokerError(
                    ErrorCode.NOT_LEADER_OR_FOLLOWER,
                    f"node {self.config.node_id} is the new leader of {meta.name}-{partition}, still loading",
                    leader_id=leader,
                    leader_url=self._nodes.node_url(leader),
                )
        return BrokerError(
            ErrorCode.NOT_LEADER_OR_FOLLOWER,
            why or f"node {self.config.node_id} is not the leader of {meta.name}-{partition}",
            leader_id=leader,
            leader_url=self._nodes.node_url(leader),
        )

    def _existing(self, topic: str, partition: int) -> TopicMetadata:
        meta = self._controller.topic(topic)
        if isinstance(partition, bool) or not isinstance(partition, int):
            raise BrokerError(ErrorCode.INVALID_REQUEST, "partition must be an integer")
        if not 0 <= partition < len(meta.partitions):
            raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has no partition {partition}")
        return meta

    def _leader_replica(self, topic: str, partition: int) -> tuple[TopicMetadata, LocalReplica]:
        meta = self._existing(topic, partition)
        rep = self._replicas.get(topic, partition)
        if rep is None or not rep.group.is_leader():
            raise self._not_leader(meta, partition)
        return meta, rep

    async def _submit(
        self, rep: LocalReplica, command: bytes, timeout: float, on_applied: Callable[[Any], None] | None = None
    ) -> Any:
        started = time.perf_counter()
        try:
            result = await rep.group.submit(command, timeout=timeout, on_applied=on_applied)
        except NotLeaderError as exc:
            raise self._not_leader(rep.topic, rep.partition) from exc
        except RaftTimeoutError as exc:
            raise BrokerError(
                ErrorCode.REQUEST_TIMED_OUT, "not committed within the timeout; the write may still succeed"
            ) from exc
        except QueueFullError as exc:
            raise BrokerError(ErrorCode.THROTTLING_QUOTA_EXCEEDED, "partition write queue is full") from exc
        except RaftCommandFailed as exc:
            why = f"leadership changed while writing ({exc.reason}); the write may still succeed"
            raise self._not_leader(rep.topic, rep.partition, why) from exc
        self._metrics.raft_commit_duration.observe(time.perf_counter() - started)
        return result

    # ---- produce ------------------------------------------------------------------------------

    async def produce(self, req: ProduceRequest) -> list[PartitionProduceResult]:
        if req.acks not in (-1, 0, 1):
            raise BrokerError(ErrorCode.INVALID_REQUIRED_ACKS, "acks must be 'all' (-1) or 0")
        if self.draining:
            raise BrokerError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "node is shutting down")
        seen: set[tuple[str, int]] = set()
        for p in req.partitions:
            if (p.topic, p.partition) in seen:
                raise BrokerError(ErrorCode.INVALID_REQUEST, f"{p.topic}-{p.partition} appears twice")
            seen.add((p.topic, p.partition))
        timeout = max(0.001, min(req.timeout_ms, self.config.request_timeout_ms) / 1000)
        coros = [self._produce_partition(p, timeout, req.acks, req.transactional_id) for p in req.partitions]
        return list(await asyncio.gather(*coros))

    def _checked_batch(self, p: ProducePartition, meta: TopicMetadata, rep: LocalReplica) -> BatchHeader:
        """The batch's header, once it passes the checks that need no Raft round (size, control, sequence)."""
        max_bytes = meta.config_int("max.message.bytes")
        if len(p.batch) > max_bytes:
            raise BrokerError(
                ErrorCode.MESSAGE_TOO_LARGE, f"batch of {len(p.batch)} bytes exceeds max.message.bytes={max_bytes}"
            )
        header = parse_kafka_batch(p.batch) if p.format is BatchFormat.KAFKA else parse_batch(p.batch)
        if header.is_control:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "clients may not write control batches")
        pre = rep.log.check_append(header)
        if pre is not None:
            raise pre
        return header

    async def _admit_transactional(
        self, p: ProducePartition, header: BatchHeader, rep: LocalReplica, acks: int, transactional_id: str | None
    ) -> CarriedMarker | None:
        """Check a batch against its transaction: the carried marker it brings, if any (else None)."""
        if not header.is_transactional:
            if transactional_id is not None:
                raise BrokerError(ErrorCode.INVALID_REQUEST, "transactional_id given for a non-transactional batch")
            if p.txn_token is not None:
                raise BrokerError(ErrorCode.INVALID_REQUEST, "a transaction token needs a transactional batch")
            return None
        if transactional_id is None:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "a transactional batch needs the transactional_id")
        if acks == 0:
            raise BrokerError(ErrorCode.INVALID_REQUIRED_ACKS, "transactional writes need acks=all")
        if p.txn_token is not None and p.format is not BatchFormat.TXBROKER:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "a transaction token travels with txbroker batches only")
        if p.txn_token is not None:
            # Carried marker: the token proves the partition is reserved for this transaction and
            # carries the previous one's marker; apply writes both (docs/carried-markers.md).
            carried = self._tokens.open_token(
                p.txn_token, transactional_id, header.producer_id, header.producer_epoch, p.topic, p.partition
            )
            self._metrics.txn_checked_by_token.inc()
            self._carried.accepted(p.topic, p.partition, header.producer_id, header.producer_epoch)
            return carried
        if self._carried.behind_carried(p.topic, p.partition, header):
            return None
        if rep.log.opens_transaction(header):
            # KIP-890: admit the batch only once the coordinator has this partition in the txn.
            self._metrics.txn_checked_by_coordinator.inc()
            await self._verifier.verify_partition(
                transactional_id, header.producer_id, header.producer_epoch, p.topic, p.partition,
                rep.log.producer_entry(header.producer_id),
            )  # fmt: skip
        return None

    def _append_command(self, p: ProducePartition, header: BatchHeader, carried: CarriedMarker | None) -> bytes:
        now = self._clock.now_ms()
        if carried is None:
            return encode_append(p.batch, now, p.format)
        marker = TxnMarkerCommand(
            header.producer_id, header.producer_epoch, carried.coordinator_epoch, carried.control_type, now
        )
        return encode_carried_append(marker, p.batch)

    async def _produce_partition(
        self, p: ProducePartition, timeout: float, acks: int, transactional_id: str | None = None
    ) -> PartitionProduceResult:
        started = time.perf_counter()
        try:
            meta, rep = self._leader_replica(p.topic, p.partition)
            header = self._checked_batch(p, meta, rep)
            carried = await self._admit_transactional(p, header, rep, acks, transactional_id)
            seq_key = (p.topic, p.partition, header.producer_id)
            sequenced = header.is_idempotent and header.base_sequence >= 0
            if sequenced:
                # Batches of one producer may arrive out of order on separate connections: submit in order.
                await self.sequencer.wait_turn(
                    seq_key,
                    header.producer_epoch,
                    header.base_sequence,
                    timeout,
                    functools.partial(rep.log.expected_sequence, header.producer_id, header.producer_epoch),
                )
                self.sequencer.submitted(seq_key, header.producer_epoch, header.base_sequence, header.record_count)
            command = self._append_command(p, header, carried)
            count = functools.partial(self._count_produced, p, header)
            if acks == 0:
                rep.group.submit_threadsafe(command, lambda r, e: count(r) if e is None else None)
                return PartitionProduceResult(p.topic, p.partition)
            # counted when applied, not when answered: a write whose answer timed out still counts once
            result = await self._append(rep, command, timeout, seq_key if sequenced else None, count)
            self._metrics.produce_duration.labels("ok").observe(time.perf_counter() - started)
            return PartitionProduceResult(
                p.topic, p.partition, result.base_offset, result.log_append_time, duplicate=result.duplicate,
                txn_receipt=self._receipt(p, header, transactional_id),
            )  # fmt: skip
        except BrokerError as exc:
            self._metrics.produce_failed(p.topic, exc.error_code.name)
            self._metrics.produce_duration.labels("error").observe(time.perf_counter() - started)
            return PartitionProduceResult(p.topic, p.partition, error=exc)

    async def _append(
        self,
        rep: LocalReplica,
        command: bytes,
        timeout: float,
        seq_key: tuple[str, int, int] | None,
        on_applied: Callable[[Any], None] | None = None,
    ) -> AppendResult:
        """Propose the append and wait for its apply; a sequenced batch's failure resets its sequencer."""
        try:
            result = await self._submit(rep, command, timeout, on_applied)
        except BrokerError:
            if seq_key is not None:
                self.sequencer.forget(seq_key)  # outcome unknown: start again from the applied state
            raise
        if isinstance(result, BrokerError):
            if seq_key is not None:
                self.sequencer.forget(seq_key)  # rejected: the log's next sequence is not past this batch
            raise result
        if not isinstance(result, AppendResult):
            raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"unexpected append result {result!r}")
        return result

    def _count_produced(self, p: ProducePartition, header: BatchHeader, result: object) -> None:
        if not isinstance(result, AppendResult):
            return  # refused by the log (an error result): nothing appended
        if result.duplicate:
            self._metrics.duplicate_batches.labels(p.topic).inc()
        else:
            self._metrics.records_produced.labels(p.topic).inc(header.record_count)
            self._metrics.bytes_produced.labels(p.topic).inc(len(p.batch))

    def _receipt(self, p: ProducePartition, header: BatchHeader, transactional_id: str | None) -> bytes | None:
        # One receipt per partition per transaction is all the coordinator needs: the first batch of an epoch
        # here (sequence 0; TV2 starts every transaction at a new epoch), duplicates included, so a lost answer
        # is made good by the resend. Signing every answer would cost an HMAC per request for nothing.
        if (
            transactional_id is None
            or not self.config.txn_carried_markers
            or header.base_sequence != 0
            or p.format is not BatchFormat.TXBROKER  # tokens travel with txbroker batches only
        ):
            return None
        return self._tokens.receipt(transactional_id, header.producer_id, header.producer_epoch, p.topic, p.partition)

    # ---- fetch ----------------------------------------------------------------------------------

    async def fetch(
        self, topic: str, partition: int, offset: int, max_bytes: int, max_wait_ms: int, isolation: str,
        read_replica: str = READ_REPLICA_LEADER,
    ) -> FetchResult:  # fmt: skip
        """Records from ``offset``, per API.md "Fetch".

        ``read_replica="leader"``: only the ready leader that holds its lease (a majority answered it
        within ``raft_check_quorum_s``: a paused or cut-off leader does not) answers, else
        ``NOT_LEADER_OR_FOLLOWER`` with the leader's URL; so ``high_watermark`` is never below what the
        partition acknowledged before the request arrived. A long-poll that loses leadership ends at
        once with that error.

        ``read_replica="any"``: any replica answers from its own committed copy, whose end is
        ``replica_end_offset``. Its ``high_watermark`` is the highest high watermark of the leader this
        replica knows: from the commits it has applied (its own end) or from the leader's state it last
        read (peer polling). So it may exceed ``replica_end_offset``: offsets between the two are valid
        (an empty answer, or a long-poll until the copy catches up), not out of range.
        """
        started = time.perf_counter()
        outcome = "error"
        try:
            meta = self._controller.topic(topic)
            if not 0 <= partition < len(meta.partitions):
                raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has no partition {partition}")
            rep = self._replicas.get(topic, partition)
            leader_read = read_replica == READ_REPLICA_LEADER
            if rep is None or (leader_read and not rep.group.holds_lease()):
                raise self._not_leader(meta, partition)
            plog = rep.log
            wait = min(max_wait_ms, self.config.max_fetch_wait_ms) / 1000
            read_committed = isolation == READ_COMMITTED
            known_hw = plog.high_watermark if leader_read else self._known_high_watermark(rep)

            def bound() -> int:
                return plog.last_stable_offset if read_committed else plog.high_watermark

            def lost() -> bool:
                return leader_read and not rep.group.holds_lease()

            if offset < plog.log_start_offset or offset > known_hw:
                raise BrokerError(
                    ErrorCode.OFFSET_OUT_OF_RANGE,
                    f"offset {offset} is outside [{plog.log_start_offset}, {known_hw}]",
                    log_start_offset=plog.log_start_offset,
                    high_watermark=known_hw,
                )
            if offset >= bound() and wait > 0 and not self.draining:
                waited = time.perf_counter()
                await rep.notifier.wait_until(lambda: offset < bound() or self.draining or lost(), wait)
                if lost():
                    # Leadership moved while waiting: name the new leader once known (within a moment).
                    hint_wait = min(_LEADER_HINT_WAIT_S, wait - (time.perf_counter() - waited))
                    await rep.notifier.wait_until(lambda: rep.leader_id not in (None, self.config.node_id), hint_wait)
            if lost():
                raise self._not_leader(meta, partition)
            info = plog.fetch(offset, max_bytes, read_committed=read_committed)
            batches = info.batches
            outcome = "ok"
            nrec = sum(b.header.record_count for b in batches if not b.header.is_control)
            self._metrics.records_fetched.labels(topic).inc(nrec)
            self._metrics.bytes_fetched.labels(topic).inc(sum(len(b.data) for b in batches))
            if leader_read:
                return FetchResult(
                    info.high_watermark, info.last_stable_offset, info.log_start_offset, info.upper_bound, batches,
                    info.aborted_transactions,
                )  # fmt: skip
            return FetchResult(
                max(info.high_watermark, self._known_high_watermark(rep)), info.last_stable_offset,
                info.log_start_offset, info.upper_bound, batches, info.aborted_transactions,
                served_by=self.config.node_id, replica_end_offset=info.high_watermark,
            )  # fmt: skip
        finally:
            self._metrics.fetch_duration.labels(outcome).observe(time.perf_counter() - started)

    def _known_high_watermark(self, rep: LocalReplica) -> int:
        """The highest high watermark of the partition's leader this replica knows (see ``fetch``)."""
        own = rep.log.high_watermark
        if rep.group.is_leader():
            return own
        info = self._peer_partitions.remote_partition(group_id_for(rep.topic.topic_id, rep.partition))
        reported = info.get("high_watermark") if info is not None else None
        if isinstance(reported, int) and not isinstance(reported, bool):
            return max(own, reported)
        return own

    async def list_offset(self, topic: str, partition: int, timestamp_ms: int, read_committed: bool) -> tuple[int, int]:
        """Kafka's ListOffsets on the partition's leader, as (offset, timestamp): ``LATEST`` (-1: the high
        watermark, or the LSO for read_committed), ``EARLIEST`` (-2: the log start), both with timestamp -1,
        or the first record whose timestamp is at or after ``timestamp_ms`` and that record's timestamp
        ((-1, -1) when none is; the log scan runs in a worker thread)."""
        _meta, rep = self._leader_replica(topic, partition)
        plog = rep.log
        if timestamp_ms == LIST_OFFSETS_LATEST:
            return (plog.last_stable_offset if read_committed else plog.high_watermark), -1
        if timestamp_ms == LIST_OFFSETS_EARLIEST:
            return plog.log_start_offset, -1
        if timestamp_ms < 0:
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"unknown ListOffsets timestamp {timestamp_ms}")
        found = await asyncio.to_thread(plog.record_for_timestamp, timestamp_ms)
        bound = plog.last_stable_offset if read_committed else plog.high_watermark
        return found if found is not None and found[0] < bound else (-1, -1)

    async def delete_records(self, topic: str, partition: int, before_offset: int, timeout_ms: int) -> int:
        """Kafka's DeleteRecords on the partition's leader: the log start offset moves up to ``before_offset``
        (-1: the high watermark) through the partition's Raft log; answers the log start offset after it (the
        low watermark). An offset below -1 or above the high watermark is OFFSET_OUT_OF_RANGE; one at or
        below the log start changes nothing. Producer state stays (the producers' sequences go on). The answer
        waits for the Raft commit, within ``timeout_ms`` (at most ``request_timeout_ms``; 0 or less: that)."""
        _meta, rep = self._leader_replica(topic, partition)
        plog = rep.log
        if before_offset < -1 or before_offset > plog.high_watermark:
            raise BrokerError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"cannot delete records of {topic}-{partition} before {before_offset}: "
                f"the high watermark is {plog.high_watermark}",
            )
        if before_offset != -1 and before_offset <= plog.log_start_offset:
            return plog.log_start_offset
        limit = self.config.request_timeout_ms
        timeout = (min(timeout_ms, limit) if timeout_ms > 0 else limit) / 1000  # 0: Kafka's "do not wait"
        result = await self._submit(rep, encode_delete_records(before_offset), timeout=timeout)
        if isinstance(result, BrokerError):
            raise result
        return int(result.log_start_offset)

    # ---- producer state and markers --------------------------------------------------------------

    def describe_producers(self, topic: str, partition: int) -> list[dict[str, Any]]:
        """Kafka's DescribeProducers: the producer state of a partition, from its leader."""
        _meta, rep = self._leader_replica(topic, partition)
        return [
            {
                "producer_id": e.producer_id,
                "producer_epoch": e.producer_epoch,
                "last_sequence": e.last_seq,
                "last_timestamp": e.last_timestamp,
                "coordinator_epoch": e.coordinator_epoch,
                "current_txn_start_offset": e.current_txn_first_offset,
                "current_txn_start_time": e.current_txn_start_time,
            }
            for e in sorted(rep.log.producer_entries(), key=lambda e: e.producer_id)
        ]

    async def write_txn_marker(
        self, topic: str, partition: int, producer_id: int, producer_epoch: int, coordinator_epoch: int,
        control: ControlType, classic: bool = False,
    ) -> TxnMarkerResult:  # fmt: skip
        """Write a COMMIT/ABORT marker on the partition's leader (here, or forwarded to it).

        ``classic``: the marker of a classic-protocol transaction (storage.commands).
        """
        marker = TxnMarkerCommand(
            producer_id, producer_epoch, coordinator_epoch, control, self._clock.now_ms(), classic
        )
        result, body = await self._marker_on_leader(topic, partition, marker, revoke=False)
        if body is not None:
            return _marker_result(control, body)
        if not isinstance(result, TxnMarkerResult):
            raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"unexpected marker result {result!r}")
        return result

    async def revoke_txn_marker(
        self, topic: str, partition: int, producer_id: int, producer_epoch: int, coordinator_epoch: int,
        control: ControlType,
    ) -> RevokeResult:  # fmt: skip
        """A revoking marker on the partition's leader (docs/carried-markers.md): ``used`` or the marker's outcome."""
        marker = TxnMarkerCommand(producer_id, producer_epoch, coordinator_epoch, control, self._clock.now_ms())
        result, body = await self._marker_on_leader(topic, partition, marker, revoke=True)
        if body is not None:
            used = bool(body.get("used"))
            return RevokeResult(used=used, marker=None if used else _marker_result(control, body))
        if not isinstance(result, RevokeResult):
            raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"unexpected revoke result {result!r}")
        return result

    async def _marker_on_leader(
        self, topic: str, partition: int, marker: TxnMarkerCommand, *, revoke: bool
    ) -> tuple[Any, dict[str, Any] | None]:
        """Apply ``marker`` here if this node leads the partition (result, None), else forward it (None, answer)."""
        meta = self._controller.topic(topic)
        if not 0 <= partition < len(meta.partitions):
            raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has no partition {partition}")
        rep = self._replicas.get(topic, partition)
        if rep is not None and rep.group.is_leader():
            command = encode_revoke_marker(marker) if revoke else encode_txn_marker(
                marker.producer_id, marker.producer_epoch, marker.coordinator_epoch, marker.control_type,
                marker.timestamp_ms, marker.classic,
            )  # fmt: skip
            result = await self._submit(rep, command, self.config.request_timeout_ms / 1000)
            if isinstance(result, BrokerError):
                raise result
            return result, None
        leader = self._controller.partition_leader(meta, partition)
        if leader is None or leader == self.config.node_id:
            raise self._not_leader(meta, partition)
        body: dict[str, Any] = {
            "topic": topic,
            "partition": partition,
            "producer_id": marker.producer_id,
            "producer_epoch": marker.producer_epoch,
            "coordinator_epoch": marker.coordinator_epoch,
            "control_type": marker.control_type.name,
        }
        if revoke:
            body["revoke"] = True
        if marker.classic:
            body["classic"] = True
        return None, await self._peers.call(leader, MARKER_PATH, body)

    # ---- background -------------------------------------------------------------------------------

    async def enforce_retention(self) -> None:
        now = self._clock.now_ms()
        for rep in list(self._replicas.replicas.values()):
            if not rep.group.is_leader():
                continue
            meta = rep.topic
            retention_ms = meta.config_int("retention.ms")
            retention_bytes = meta.config_int("retention.bytes")
            oldest = rep.log.oldest_batch_max_timestamp()
            expired = retention_ms >= 0 and oldest is not None and oldest < now - retention_ms
            too_big = retention_bytes >= 0 and rep.log.size_bytes > retention_bytes
            if not (expired or too_big):
                continue
            cmd = encode_retention(now, retention_ms, retention_bytes, meta.config_int("producer.id.expiration.ms"))
            try:
                await self._submit(rep, cmd, timeout=10.0)
            except BrokerError as exc:
                log.warning("retention of %s-%d not applied: %s", meta.name, rep.partition, exc)

    def samples(self) -> tuple[list[PartitionSample], dict[str, int]]:
        """Per local replica its metrics sample, and per topic the count of partitions without a leader."""
        parts = []
        unavailable: dict[str, int] = {}
        for rep in list(self._replicas.replicas.values()):
            try:
                st = rep.group.status()
            except Exception:  # status() reads PySyncObj internals; tolerate a racy read
                continue
            lag = 0
            under = False
            if st.state == "leader":
                for m in rep.group.members:
                    if m == rep.group.self_address:
                        continue
                    match = st.match_index.get(m, 0)
                    lag = max(lag, st.commit_index - match)
                    if m not in st.connected or st.commit_index - match > 1000:
                        under = True
            if st.leader is None:
                unavailable[rep.topic.name] = unavailable.get(rep.topic.name, 0) + 1
            parts.append(
                PartitionSample(
                    topic=rep.topic.name,
                    partition=rep.partition,
                    is_leader=rep.group.is_leader(),
                    term=st.term,
                    commit_index=st.commit_index,
                    high_watermark=rep.log.high_watermark,
                    last_stable_offset=rep.log.last_stable_offset,
                    log_start_offset=rep.log.log_start_offset,
                    size_bytes=rep.log.size_bytes,
                    under_replicated=under,
                    follower_lag_entries=lag,
                )
            )
        return parts, unavailable
