"""The broker service: what a node does for each API call, independent of HTTP.

Handlers in ``cluster/http_api.py`` parse a request, call one method here and
map the result. Domain rules that decide the log's content run in the storage
state machines' ``apply``; the checks here only fail fast.

Everything runs on the asyncio loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clients.protocol import (
    BrokerError,
    ControlType,
    ErrorCode,
    ProducePartition,
    ProduceRequest,
    StoredBatch,
    encode_token,
    parse_batch,
)
from raft import (
    LeadershipEvent,
    NotLeaderError,
    QueueFullError,
    RaftCommandFailed,
    RaftError,
    RaftGroup,
    RaftNode,
    RaftSettings,
    RaftTimeoutError,
)
from storage.commands import (
    AppendResult,
    RevokeResult,
    TxnMarkerCommand,
    TxnMarkerResult,
    encode_append,
    encode_carried_append,
    encode_retention,
    encode_revoke_marker,
    encode_txn_marker,
)
from storage.store import NodeStore

from .config import NodeConfig
from .controller import (
    ControllerStateMachine,
    ControllerView,
    ProducerIdBlock,
    allocate_producer_ids_command,
    create_topic_command,
    delete_topic_command,
)
from .group_service import OFFSETS_TOPIC, GroupService
from .metrics import NodeMetrics, NodeSample, PartitionSample
from .peers import PeerView
from .producer_ids import ProducerIdManager
from .replicas import LocalReplica, ReplicaManager
from .sequencer import SubmitSequencer
from .topics import (
    TopicMetadata,
    assign_replicas,
    group_id_for,
    validate_topic_config,
    validate_topic_name,
)
from .txn_service import TransactionService
from .txn_tokens import CarriedMarker, TxnTokens

log = logging.getLogger(__name__)

_CARRIED_EPOCHS_KEPT = 100_000

CONTROLLER_GROUP = "__controller"
READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"


def now_ms() -> int:
    return int(time.time() * 1000)


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


def _marker_result(control: ControlType, body: dict[str, Any]) -> TxnMarkerResult:
    """A forwarded marker's answer (``/v1/internal/txn/marker``) as the leader's apply returned it."""
    return TxnMarkerResult(
        control, body.get("offset"), body.get("txn_first_offset"), int(body.get("log_append_time", -1))
    )


@dataclass(frozen=True, slots=True)
class FetchResult:
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    upper_bound: int
    batches: list[StoredBatch]
    aborted_transactions: list[tuple[int, int]]


class Broker:
    def __init__(self, config: NodeConfig, metrics: NodeMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.loop = asyncio.get_running_loop()
        data = config.data_dir
        data.mkdir(parents=True, exist_ok=True)
        self.store = NodeStore(data / "db", direct_io=config.store_direct_io)
        settings = RaftSettings(
            password=config.cluster_secret,
            tick_threads=config.raft_tick_threads,
            heartbeat_s=config.raft_heartbeat_s,
            election_timeout_min_s=config.raft_election_timeout_min_s,
            election_timeout_max_s=config.raft_election_timeout_max_s,
            log_compaction_min_entries=config.raft_log_compaction_min_entries,
        )
        self.raft_dir = data / "raft"
        self.raft = RaftNode(
            config.self_address.raft_address, self.raft_dir, settings, self.loop, bind_host=config.host
        )
        self.controller_sm = ControllerStateMachine(self.store)
        self.replicas = ReplicaManager(
            config, self.store, self.raft, self.raft_dir, self.loop, on_leader_change=self._on_replica_leader
        )
        self.peers = PeerView(config)
        self.producer_ids = ProducerIdManager(self._allocate_producer_ids)
        self.txn_tokens = TxnTokens(config.cluster_secret)
        # (topic, partition, producer id) -> epoch of the last carried batch accepted here (bounded, oldest out)
        self._carried_epochs: OrderedDict[tuple[str, int, int], int] = OrderedDict()
        self.sequencer = SubmitSequencer(on_wait=lambda outcome: metrics.reordered_batches.labels(outcome).inc())
        self.txn = TransactionService(self)
        self.consumer_groups = GroupService(self)
        self.controller: RaftGroup | None = None
        self.draining = False
        self._tasks: list[asyncio.Task[None]] = []
        self._forward: Any = None  # set by the HTTP layer: async (node_id, method, path, json) -> response

    # ---- lifecycle --------------------------------------------------------

    async def start(self) -> None:
        marker = self.config.data_dir / "cluster_id"
        if marker.exists():
            found = marker.read_text().strip()
            if found != self.config.cluster_id:
                raise RuntimeError(
                    f"data dir {self.config.data_dir} belongs to cluster {found}, not {self.config.cluster_id}"
                )
        else:
            marker.write_text(self.config.cluster_id + "\n")
        self.raft.start()
        members = [n.raft_address for n in self.config.nodes]

        def on_change(view: ControllerView) -> None:  # Raft ticker thread: hand off to the loop
            self.loop.call_soon_threadsafe(self._on_metadata, view)

        self.controller_sm.on_change = on_change
        self.controller = self.raft.add_group(
            CONTROLLER_GROUP, members, self.controller_sm, on_event=self._on_controller_event
        )
        self.replicas.reconcile(self.controller_sm.view)
        self.txn.start()
        self.consumer_groups.start()
        self.peers.start()
        self._tasks = [
            self.loop.create_task(self._every(self.config.leader_balance_interval_s, self._balance_leaders)),
            self.loop.create_task(self._every(self.config.retention_check_interval_s, self._enforce_retention)),
        ]

    async def drain(self) -> None:
        """First shutdown phase: readiness goes 503, leadership is handed off where possible."""
        self.draining = True
        await self._hand_off_leadership(timeout=5.0)

    async def close(self) -> None:
        """Last shutdown phase (after HTTP stopped): close Raft and RocksDB cleanly."""
        self.draining = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.peers.stop()
        await self.consumer_groups.close()
        await self.txn.close()
        self.replicas.stop_all()
        self.raft.stop()
        self.store.close()

    async def _hand_off_leadership(self, timeout: float) -> None:
        groups = [r.group for r in self.replicas.replicas.values()] + self.txn.groups.groups()
        groups += self.consumer_groups.groups.groups()
        if self.controller is not None:
            groups.append(self.controller)
        led = [g for g in groups if g.is_leader()]
        for g in led:
            target = self._caught_up_follower(g)
            if target is not None:
                try:
                    g.transfer_leadership(target)
                except RaftError:
                    log.debug("leadership transfer of %s refused", g.group_id)
        deadline = self.loop.time() + timeout
        # Leadership moves in the ticker threads with no loop-side event to await; poll briefly.
        while any(g.is_leader() for g in led) and self.loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)

    @staticmethod
    def _caught_up_follower(group: RaftGroup) -> str | None:
        st = group.status()
        best = None
        for addr, match in st.match_index.items():
            if addr in st.connected and match >= st.commit_index:
                best = addr
                break
        return best

    async def _every(self, interval: float, fn: Any) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await fn()
            except Exception:
                log.exception("background task %s failed", getattr(fn, "__name__", fn))

    # ---- metadata ---------------------------------------------------------

    @property
    def view(self) -> ControllerView:
        return self.controller_sm.view

    def _on_metadata(self, view: ControllerView) -> None:
        self.replicas.reconcile(view)

    def _on_controller_event(self, event: LeadershipEvent) -> None:
        log.info(
            "controller leader is now %s (term %d, this node leads: %s)", event.leader, event.term, event.is_leader
        )

    def _on_replica_leader(self, rep: LocalReplica) -> None:
        self.metrics.leader_changes.labels(rep.topic.name).inc()

    def controller_leader_id(self) -> int | None:
        if self.controller is not None:
            addr = self.controller.leader()
            if addr is not None:
                node = self.config.node_by_raft_address(addr)
                if node is not None:
                    return node.id
        return self.peers.controller_leader()

    def is_ready(self) -> bool:
        """Serving: not draining, and this node's own controller replica knows a leader."""
        return not self.draining and self.controller is not None and self.controller.leader() is not None

    def topic(self, name: str) -> TopicMetadata:
        meta = self.view.topics.get(name)
        if meta is None:
            raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
        return meta

    def partition_state(self, meta: TopicMetadata, partition: int) -> dict[str, Any]:
        """Leader and offsets of a partition: the local replica's values if it has one."""
        rep = self.replicas.get(meta.name, partition)
        if rep is not None:
            leader = rep.leader_id
            if rep.group.is_leader():
                leader = self.config.node_id
            return {
                "leader": leader,
                "high_watermark": rep.log.high_watermark,
                "last_stable_offset": rep.log.last_stable_offset,
                "log_start_offset": rep.log.log_start_offset,
            }
        info = self.peers.remote_partition(group_id_for(meta.topic_id, partition)) or {}
        return {
            "leader": info.get("leader"),
            "high_watermark": info.get("high_watermark", -1),
            "last_stable_offset": info.get("last_stable_offset", -1),
            "log_start_offset": info.get("log_start_offset", -1),
        }

    def node_url(self, node_id: int | None) -> str | None:
        if node_id is None:
            return None
        n = self.config.node(node_id)
        return n.url if n else None

    def cluster_json(self) -> dict[str, Any]:
        return {
            "cluster_id": self.config.cluster_id,
            "nodes": [{"id": n.id, "url": n.url, "alive": self.peers.is_alive(n.id)} for n in self.config.nodes],
            "controller_leader": self.controller_leader_id(),
        }

    def topic_json(self, meta: TopicMetadata) -> dict[str, Any]:
        parts = []
        for a in meta.partitions:
            st = self.partition_state(meta, a.partition)
            parts.append(
                {
                    "partition": a.partition,
                    "leader": st["leader"],
                    "leader_url": self.node_url(st["leader"]),
                    "replicas": list(a.replicas),
                    "high_watermark": st["high_watermark"],
                    "last_stable_offset": st["last_stable_offset"],
                    "log_start_offset": st["log_start_offset"],
                }
            )
        return {
            "name": meta.name,
            "topic_id": meta.topic_id,
            "partitions": parts,
            "replication_factor": len(meta.partitions[0].replicas) if meta.partitions else 0,
            "config": dict(meta.config),
        }

    def metadata_json(self, topics: Sequence[str] | None = None) -> dict[str, Any]:
        metas = [m for m in self.view.topics.values() if topics is None or m.name in topics]
        return {
            "nodes": self.cluster_json()["nodes"],
            "controller_leader": self.controller_leader_id(),
            "topics": [self.topic_json(m) for m in sorted(metas, key=lambda m: m.name)],
        }

    def internal_state_json(self) -> dict[str, Any]:
        parts: dict[str, Any] = {}
        for rep in self.replicas.replicas.values():
            leader = self.config.node_id if rep.group.is_leader() else rep.leader_id
            parts[group_id_for(rep.topic.topic_id, rep.partition)] = {
                "topic": rep.topic.name,
                "partition": rep.partition,
                "leader": leader,
                "term": rep.group.term(),
                "high_watermark": rep.log.high_watermark,
                "last_stable_offset": rep.log.last_stable_offset,
                "log_start_offset": rep.log.log_start_offset,
            }
        parts.update(self.txn.groups.state_json())
        parts.update(self.consumer_groups.groups.state_json())
        return {
            "node_id": self.config.node_id,
            "controller_leader": self.controller_leader_id(),
            "partitions": parts,
        }

    # ---- controller commands ------------------------------------------------

    async def _controller_submit(self, command: bytes) -> Any:
        if self.controller is None:
            raise BrokerError(ErrorCode.NOT_CONTROLLER, "controller not started")
        try:
            result = await self.controller.submit(command, timeout=self.config.request_timeout_ms / 1000)
        except NotLeaderError as exc:
            node = self.config.node_by_raft_address(exc.leader) if exc.leader else None
            if node is None:  # our Raft has no leader yet; peers may know it
                known = self.peers.controller_leader()
                node = self.config.node(known) if known is not None and known != self.config.node_id else None
            raise BrokerError(
                ErrorCode.NOT_CONTROLLER,
                "this node is not the controller leader",
                leader_id=node.id if node else None,
                leader_url=node.url if node else None,
            ) from exc
        except RaftTimeoutError as exc:
            raise BrokerError(ErrorCode.REQUEST_TIMED_OUT, "controller command timed out") from exc
        except RaftError as exc:
            raise BrokerError(ErrorCode.NOT_CONTROLLER, f"controller command failed: {exc}") from exc
        if isinstance(result, BrokerError):
            raise result
        return result

    async def create_topic(
        self, name: object, partitions: object, replication_factor: object, config: object
    ) -> TopicMetadata:
        name = validate_topic_name(name)
        if isinstance(partitions, bool) or not isinstance(partitions, int):
            raise BrokerError(ErrorCode.INVALID_PARTITIONS, "partitions must be an integer")
        if partitions < 1 or partitions > self.config.max_partitions_per_topic:
            raise BrokerError(
                ErrorCode.INVALID_PARTITIONS,
                f"partitions must be between 1 and {self.config.max_partitions_per_topic}",
            )
        if isinstance(replication_factor, bool) or not isinstance(replication_factor, int):
            raise BrokerError(ErrorCode.INVALID_REPLICATION_FACTOR, "replication_factor must be an integer")
        cfg = validate_topic_config(config)
        if name in self.view.topics:
            raise BrokerError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        assignment = assign_replicas(
            [n.id for n in self.config.nodes], partitions, replication_factor, self.view.placement_cursor
        )
        meta: TopicMetadata = await self._controller_submit(create_topic_command(name, assignment, cfg, now_ms()))
        return meta

    async def delete_topic(self, name: str) -> TopicMetadata:
        self.topic(name)
        meta: TopicMetadata = await self._controller_submit(delete_topic_command(name))
        return meta

    async def allocate_producer_ids_local(self, node_id: int) -> ProducerIdBlock:
        block: ProducerIdBlock = await self._controller_submit(allocate_producer_ids_command(node_id))
        return block

    async def _allocate_producer_ids(self) -> ProducerIdBlock:
        try:
            return await self.allocate_producer_ids_local(self.config.node_id)
        except BrokerError as exc:
            if exc.error_code is not ErrorCode.NOT_CONTROLLER or self._forward is None:
                raise
            leader = exc.extra.get("leader_id") or self.controller_leader_id()
            if leader is None:
                raise BrokerError(ErrorCode.COORDINATOR_NOT_AVAILABLE, "no controller leader") from exc
            body = await self._forward(leader, "POST", "/v1/internal/producer-ids", {"node_id": self.config.node_id})
            return ProducerIdBlock(int(body["first"]), int(body["size"]))

    async def init_producer_id(self) -> tuple[int, int]:
        pid = await self.producer_ids.next_producer_id()
        self.metrics.producer_ids_allocated.inc()
        return pid, 0

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
        control: ControlType,
    ) -> TxnMarkerResult:  # fmt: skip
        """Write a COMMIT/ABORT marker on the partition's leader (here, or forwarded to it)."""
        if topic == OFFSETS_TOPIC:
            return await self.consumer_groups.write_txn_marker(
                partition, producer_id, producer_epoch, coordinator_epoch, control
            )
        marker = TxnMarkerCommand(producer_id, producer_epoch, coordinator_epoch, control, now_ms())
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
        if topic == OFFSETS_TOPIC:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "offsets partitions take no carried markers to revoke")
        marker = TxnMarkerCommand(producer_id, producer_epoch, coordinator_epoch, control, now_ms())
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
        meta = self.topic(topic)
        if not 0 <= partition < len(meta.partitions):
            raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has no partition {partition}")
        rep = self.replicas.get(topic, partition)
        if rep is not None and rep.group.is_leader():
            command = encode_revoke_marker(marker) if revoke else encode_txn_marker(
                marker.producer_id, marker.producer_epoch, marker.coordinator_epoch, marker.control_type,
                marker.timestamp_ms,
            )  # fmt: skip
            result = await self._submit(rep, command, self.config.request_timeout_ms / 1000)
            if isinstance(result, BrokerError):
                raise result
            return result, None
        leader = self.partition_state(meta, partition)["leader"]
        if leader is None or leader == self.config.node_id or self._forward is None:
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
        return None, await self._forward(leader, "POST", "/v1/internal/txn/marker", body)

    # ---- produce ------------------------------------------------------------

    def _not_leader(self, meta: TopicMetadata, partition: int) -> BrokerError:
        leader = self.partition_state(meta, partition)["leader"]
        return BrokerError(
            ErrorCode.NOT_LEADER_OR_FOLLOWER,
            f"node {self.config.node_id} is not the leader of {meta.name}-{partition}",
            leader_id=leader,
            leader_url=self.node_url(leader),
        )

    def _leader_replica(self, topic: str, partition: int) -> tuple[TopicMetadata, LocalReplica]:
        meta = self.topic(topic)
        if isinstance(partition, bool) or not isinstance(partition, int):
            raise BrokerError(ErrorCode.INVALID_REQUEST, "partition must be an integer")
        if not 0 <= partition < len(meta.partitions):
            raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has no partition {partition}")
        rep = self.replicas.get(topic, partition)
        if rep is None or not rep.group.is_leader():
            raise self._not_leader(meta, partition)
        return meta, rep

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

    async def _produce_partition(
        self, p: ProducePartition, timeout: float, acks: int, transactional_id: str | None = None
    ) -> PartitionProduceResult:
        started = time.perf_counter()
        carried: CarriedMarker | None = None
        try:
            meta, rep = self._leader_replica(p.topic, p.partition)
            max_bytes = meta.config_int("max.message.bytes")
            if len(p.batch) > max_bytes:
                raise BrokerError(
                    ErrorCode.MESSAGE_TOO_LARGE, f"batch of {len(p.batch)} bytes exceeds max.message.bytes={max_bytes}"
                )
            header = parse_batch(p.batch)
            if header.is_control:
                raise BrokerError(ErrorCode.INVALID_REQUEST, "clients may not write control batches")
            pre = rep.log.check_append(header)
            if pre is not None:
                raise pre
            if transactional_id is not None and not header.is_transactional:
                raise BrokerError(ErrorCode.INVALID_REQUEST, "transactional_id given for a non-transactional batch")
            if header.is_transactional:
                if transactional_id is None:
                    raise BrokerError(ErrorCode.INVALID_REQUEST, "a transactional batch needs the transactional_id")
                if acks == 0:
                    raise BrokerError(ErrorCode.INVALID_REQUIRED_ACKS, "transactional writes need acks=all")
                if p.txn_token is not None:
                    # Carried marker: the token proves the partition is reserved for this transaction and
                    # carries the previous one's marker; apply writes both (docs/carried-markers.md).
                    carried = self.txn_tokens.open_token(
                        p.txn_token, transactional_id, header.producer_id, header.producer_epoch, p.topic,
                        p.partition,
                    )  # fmt: skip
                    self.metrics.txn_checked_by_token.inc()
                    self._carried_epochs[(p.topic, p.partition, header.producer_id)] = header.producer_epoch
                    self._carried_epochs.move_to_end((p.topic, p.partition, header.producer_id))
                    if len(self._carried_epochs) > _CARRIED_EPOCHS_KEPT:
                        self._carried_epochs.popitem(last=False)
                elif (
                    header.base_sequence > 0
                    and self._carried_epochs.get((p.topic, p.partition, header.producer_id)) == header.producer_epoch
                ):
                    # Behind a carried batch of its epoch: that batch (sequence 0) opens the transaction here, and
                    # this one can only be appended after it (sequence order), so it needs no verification.
                    pass
                elif rep.log.opens_transaction(header):
                    # KIP-890: admit the batch only once the coordinator has this partition in the txn.
                    self.metrics.txn_checked_by_coordinator.inc()
                    await self.txn.verify_partition(
                        transactional_id, header.producer_id, header.producer_epoch, p.topic, p.partition
                    )
            elif p.txn_token is not None:
                raise BrokerError(ErrorCode.INVALID_REQUEST, "a transaction token needs a transactional batch")
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
            if carried is None:
                command = encode_append(p.batch, now_ms())
            else:
                marker = TxnMarkerCommand(header.producer_id, header.producer_epoch, carried.coordinator_epoch,
                                          carried.control_type, now_ms())  # fmt: skip
                command = encode_carried_append(marker, p.batch)
            if acks == 0:
                rep.group.submit_threadsafe(command, lambda _r, _e: None)
                return PartitionProduceResult(p.topic, p.partition)
            try:
                result = await self._submit(rep, command, timeout)
            except BrokerError:
                if sequenced:
                    self.sequencer.forget(seq_key)  # outcome unknown: start again from the applied state
                raise
            if isinstance(result, BrokerError):
                if sequenced:
                    self.sequencer.forget(seq_key)  # rejected: the log's next sequence is not past this batch
                raise result
            if not isinstance(result, AppendResult):
                raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"unexpected append result {result!r}")
            if result.duplicate:
                self.metrics.duplicate_batches.labels(p.topic).inc()
            else:
                self.metrics.records_produced.labels(p.topic).inc(header.record_count)
                self.metrics.bytes_produced.labels(p.topic).inc(len(p.batch))
            self.metrics.produce_duration.labels("ok").observe(time.perf_counter() - started)
            receipt = None
            # One receipt per partition per transaction is all the coordinator needs: the first batch of an epoch
            # here (sequence 0; TV2 starts every transaction at a new epoch), duplicates included, so a lost answer
            # is made good by the resend. Signing every answer cost an HMAC per request for nothing.
            if transactional_id is not None and self.config.txn_carried_markers and header.base_sequence == 0:
                receipt = self.txn_tokens.receipt(
                    transactional_id, header.producer_id, header.producer_epoch, p.topic, p.partition
                )
            return PartitionProduceResult(
                p.topic, p.partition, result.base_offset, result.log_append_time, duplicate=result.duplicate,
                txn_receipt=receipt,
            )  # fmt: skip
        except BrokerError as exc:
            self.metrics.produce_failed(p.topic, exc.error_code.name)
            self.metrics.produce_duration.labels("error").observe(time.perf_counter() - started)
            return PartitionProduceResult(p.topic, p.partition, error=exc)

    async def _submit(self, rep: LocalReplica, command: bytes, timeout: float) -> Any:
        started = time.perf_counter()
        try:
            result = await rep.group.submit(command, timeout=timeout)
        except NotLeaderError as exc:
            raise self._not_leader(rep.topic, rep.partition) from exc
        except RaftTimeoutError as exc:
            raise BrokerError(
                ErrorCode.REQUEST_TIMED_OUT, "not committed within the timeout; the write may still succeed"
            ) from exc
        except QueueFullError as exc:
            raise BrokerError(ErrorCode.THROTTLING_QUOTA_EXCEEDED, "partition write queue is full") from exc
        except RaftCommandFailed as exc:
            raise BrokerError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER, f"leadership changed while writing ({exc.reason})"
            ) from exc
        self.metrics.raft_commit_duration.observe(time.perf_counter() - started)
        return result

    # ---- fetch ----------------------------------------------------------------

    async def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_bytes: int,
        max_wait_ms: int,
        isolation: str,
    ) -> FetchResult:
        started = time.perf_counter()
        outcome = "error"
        try:
            meta = self.topic(topic)
            if not 0 <= partition < len(meta.partitions):
                raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has no partition {partition}")
            rep = self.replicas.get(topic, partition)
            if rep is None:
                raise self._not_leader(meta, partition)
            plog = rep.log
            wait = min(max_wait_ms, self.config.max_fetch_wait_ms) / 1000
            read_committed = isolation == READ_COMMITTED

            def bound() -> int:
                return plog.last_stable_offset if read_committed else plog.high_watermark

            if offset < plog.log_start_offset or offset > plog.high_watermark:
                raise BrokerError(
                    ErrorCode.OFFSET_OUT_OF_RANGE,
                    f"offset {offset} is outside [{plog.log_start_offset}, {plog.high_watermark}]",
                    log_start_offset=plog.log_start_offset,
                    high_watermark=plog.high_watermark,
                )
            if offset >= bound() and wait > 0 and not self.draining:
                await rep.notifier.wait_until(lambda: offset < bound() or self.draining, wait)
            info = plog.fetch(offset, max_bytes, read_committed=read_committed)
            batches = info.batches
            outcome = "ok"
            nrec = sum(b.header.record_count for b in batches if not b.header.is_control)
            self.metrics.records_fetched.labels(topic).inc(nrec)
            self.metrics.bytes_fetched.labels(topic).inc(sum(len(b.data) for b in batches))
            return FetchResult(
                info.high_watermark,
                info.last_stable_offset,
                info.log_start_offset,
                info.upper_bound,
                batches,
                info.aborted_transactions,
            )
        finally:
            self.metrics.fetch_duration.labels(outcome).observe(time.perf_counter() - started)

    # ---- background ------------------------------------------------------------

    async def _balance_leaders(self) -> None:
        """Move leadership back to each partition's preferred replica (Kafka's auto leader rebalance)."""
        for rep in list(self.replicas.replicas.values()):
            preferred = rep.replicas[0]
            if preferred == self.config.node_id or not rep.group.is_leader():
                continue
            addr = self.config.node(preferred)
            if addr is None:
                continue
            st = rep.group.status()
            if addr.raft_address in st.connected and st.match_index.get(addr.raft_address, -1) >= st.commit_index:
                with contextlib.suppress(RaftError):  # refused while a transfer is in flight: next round
                    rep.group.transfer_leadership(addr.raft_address)

    async def _enforce_retention(self) -> None:
        now = now_ms()
        for rep in list(self.replicas.replicas.values()):
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

    # ---- metrics ------------------------------------------------------------------

    def metrics_sample(self) -> NodeSample:
        parts = []
        unavailable: dict[str, int] = {}
        for rep in list(self.replicas.replicas.values()):
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
        up = sum(1 for n in self.config.nodes if self.peers.is_alive(n.id))
        c = self.controller
        return NodeSample(
            controller_is_leader=bool(c and c.is_leader()),
            controller_term=c.term() if c else 0,
            controller_commit_index=c.commit_index() if c else 0,
            nodes_up=up,
            nodes_down=len(self.config.nodes) - up,
            unavailable_partitions=unavailable,
            partitions=parts,
        )
