"""The composition root: one node process builds every collaborator here, and runs until SIGTERM/SIGINT.

``Node`` builds the store, the Raft node, the controller, the local replicas
and every service, and hands each service only the narrow seams it uses
(``cluster.seams``): no service holds the node, and nothing imports upward.
``NodeServer`` adds the HTTP listener (``cluster.http``).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import signal
import ssl
import sys
import time
from typing import Any

from aiohttp import web

from clients.protocol import BrokerError, ControlType, ErrorCode
from coordinator.group_metadata import OFFSETS_TOPIC
from raft import RaftError, RaftGroup, RaftNode, RaftSettings
from raft.fd_limit import raise_open_files_limit, replicas_within
from storage.commands import RevokeResult, TxnMarkerResult
from storage.store import NodeStore

from .background import every
from .cluster_nodes import ClusterNodes
from .config import ConfigError, NodeConfig
from .controller import ControllerStateMachine
from .controller_service import CONTROLLER_GROUP, ControllerService
from .controller_view import ControllerView
from .group_service import GroupService
from .http import PeerHttpClient, Services, make_app
from .internal_groups import InternalGroups
from .kafka import KafkaServer
from .kafka.handlers import ALL_APIS
from .leader_balance import Candidate, LeaderBalancer
from .metrics import GroupRaftSample, NodeMetrics, NodeSample
from .offset_lookup import OffsetLookup
from .operations import ClusterOperations
from .partitions import PartitionService
from .peers import PeerView
from .producer_ids import ProducerIdManager
from .readiness import NOT_READY_AS_REPORTED, missing_groups
from .reassignment import ReassignmentDriver
from .replicas import LocalReplica, ReplicaManager
from .routed_produce import RoutedProducer
from .seams import SystemClock, TopicDirectory
from .security.tls import node_client_context, server_context
from .state_versions import StateVersions
from .txn import TransactionCoordinator, TxnTokens
from .txn.state_manager import TXN_STATE_KIND

log = logging.getLogger(__name__)

GC_YOUNG_THRESHOLD = 20_000  # allocations between young-generation collections (CPython's default: 700)

SHUTDOWN_GRACE_S = 25.0


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        node = getattr(record, "node_id", None)
        if node is not None:
            out["node_id"] = node
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(fmt: str, level: str, node_id: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s node-{node_id} %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # Malformed HTTP is answered 400 by aiohttp's parser; it would log each with a traceback
    # (a log flood anyone can trigger). Application errors are logged by our middleware.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)


class MarkerRouter:
    """The node's ``MarkerWriter``: offsets partitions go to the group coordinators, the rest to the partitions."""

    def __init__(self) -> None:
        self.partitions: PartitionService | None = None
        self.groups: GroupService | None = None
        self.topics: TopicDirectory | None = None

    def marker_leader(self, topic: str, partition: int) -> int | None:
        """The node leading the marker's partition as this node knows now (``MarkerLeaders``)."""
        if self.groups is None or self.topics is None:
            return None
        if topic == OFFSETS_TOPIC:
            return self.groups.groups.leader_id(partition)
        try:
            return self.topics.partition_leader(self.topics.topic(topic), partition)
        except BrokerError:
            return None

    def _bound(self) -> tuple[PartitionService, GroupService]:
        if self.partitions is None or self.groups is None:
            raise BrokerError(ErrorCode.COORDINATOR_NOT_AVAILABLE, "the node is starting")
        return self.partitions, self.groups

    async def write_txn_marker(
        self, topic: str, partition: int, producer_id: int, producer_epoch: int, coordinator_epoch: int,
        control: ControlType, classic: bool = False,
    ) -> TxnMarkerResult:  # fmt: skip
        partitions, groups = self._bound()
        if topic == OFFSETS_TOPIC:
            return await groups.write_txn_marker(
                partition, producer_id, producer_epoch, coordinator_epoch, control, classic
            )
        return await partitions.write_txn_marker(
            topic, partition, producer_id, producer_epoch, coordinator_epoch, control, classic
        )

    async def revoke_txn_marker(
        self, topic: str, partition: int, producer_id: int, producer_epoch: int, coordinator_epoch: int,
        control: ControlType,
    ) -> RevokeResult:  # fmt: skip
        partitions, _groups = self._bound()
        if topic == OFFSETS_TOPIC:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "offsets partitions take no carried markers to revoke")
        return await partitions.revoke_txn_marker(
            topic, partition, producer_id, producer_epoch, coordinator_epoch, control
        )


class Node:
    """Every collaborator of one node, built and wired here; started, drained and closed together.

    Must be built on the running asyncio loop (the services schedule their tasks on it).
    ``client_ssl`` is the context of this node's HTTPS calls to other nodes (``security.tls.node_client_context``;
    None when the cluster serves plain HTTP).
    """

    def __init__(self, config: NodeConfig, metrics: NodeMetrics, client_ssl: ssl.SSLContext | None = None) -> None:
        self.config = config
        self.metrics = metrics
        self.client_ssl = client_ssl
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
            check_quorum_s=config.raft_check_quorum_s,
            log_compaction_min_entries=config.raft_log_compaction_min_entries,
            snapshot_max_bytes_per_s=config.raft_snapshot_max_bytes_per_s,
            campaign_slots=config.raft_campaign_slots,
        )
        raft_dir = data / "raft"
        self.raft = RaftNode(config.self_address.raft_address, raft_dir, settings, self.loop, bind_host=config.host)
        clock = SystemClock()
        controller_sm = ControllerStateMachine(self.store)
        self.nodes = ClusterNodes(config)
        self.nodes.update(controller_sm.view)  # the registry as this node last applied it
        self.peer_client = PeerHttpClient(
            self.nodes, config.cluster_secret, config.request_timeout_ms / 1000, ssl_context=client_ssl
        )
        self.peer_view = PeerView(config, ssl_context=client_ssl, nodes=self.nodes)
        self.state_versions = StateVersions()  # what /v1/internal/state tells each peer (its deltas)
        # the partitions' states as last read (``_partition_states``)
        self._states_generation: tuple[tuple[int, int], ...] | None = None
        self._states: dict[str, dict[str, Any]] = {}
        self._unsettled: set[str] = set()  # read while not quiet (or still applying): read again each time
        self._replica_of: dict[str, LocalReplica] = {}
        self.peer_client.reachable = self.peer_view.is_alive
        self.peer_client.relays = self._relays_to
        self.replicas = ReplicaManager(
            config,
            self.store,
            self.raft,
            raft_dir,
            self.loop,
            on_leader_change=self._on_replica_leader,
            nodes=self.nodes,
        )
        self.controller = ControllerService(
            config, controller_sm, self.raft, self.replicas, self.peer_view, self.peer_client,
            self.nodes, clock,
        )  # fmt: skip
        self.producer_ids = ProducerIdManager(self.controller.allocate_producer_ids)
        tokens = TxnTokens(config.cluster_secret)
        self.markers = MarkerRouter()
        self.txn = TransactionCoordinator(
            config, self.store, self.raft, self.peer_view, clock=clock, nodes=self.nodes, peers=self.peer_client,
            producer_ids=self.producer_ids, markers=self.markers, topics=self.controller, tokens=tokens,
            metrics=metrics, marker_leaders=self.markers,
        )  # fmt: skip
        self.groups = GroupService(
            config, self.store, self.raft, self.peer_view, clock=clock, nodes=self.nodes, peers=self.peer_client,
            topics=self.controller, txn=self.txn, metrics=metrics,
            offsets=OffsetLookup(self.replicas, self.controller, self.nodes, self.peer_client),
        )  # fmt: skip
        self.partitions = PartitionService(
            config, self.replicas, self.controller, self.nodes, self.peer_client, self.txn, tokens, metrics, clock,
            self.peer_view,
        )  # fmt: skip
        self.markers.partitions = self.partitions
        self.markers.groups = self.groups
        self.markers.topics = self.controller
        self.routed = RoutedProducer(self.partitions, self.controller, config.request_timeout_ms)
        self.operations = ClusterOperations(
            config, self.controller, self.nodes,
            {TXN_STATE_KIND: self.txn.groups.count, OFFSETS_TOPIC: self.groups.groups.count},
            self._internal_placements, clock,
        )  # fmt: skip
        self.balancer = LeaderBalancer(
            config.node_id, self.nodes, config.leader_balance_hold_s, self._balance_candidates
        )
        self.reassignments = ReassignmentDriver(
            config, self.raft, self.nodes, self.controller, self.peer_view, self._internal_placements,
            self.replicas.high_watermark,
        )  # fmt: skip
        self._tasks: list[asyncio.Task[None]] = []

    def services(self) -> Services:
        """What the HTTP layer adapts."""
        return Services(
            config=self.config, metrics=self.metrics, node=self, controller=self.controller,
            partitions=self.partitions, routed=self.routed, txn=self.txn, groups=self.groups,
            producer_ids=self.producer_ids, markers=self.markers, peers=self.peer_client, nodes=self.nodes,
            operations=self.operations, reassignments=self.reassignments, client_ssl=self.client_ssl,
        )  # fmt: skip

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
        self.peer_client.start()
        self.raft.start()
        self.controller.start(on_change=self._on_metadata)
        view = self.controller.view
        self.replicas.reconcile(view)
        self.txn.start(view)
        self.groups.start(view)
        self.reassignments.start()
        self.peer_view.start()
        self._tasks = [
            self.loop.create_task(every(self.config.leader_balance_interval_s, self.balancer.run_once)),
            self.loop.create_task(every(self.config.retention_check_interval_s, self.partitions.enforce_retention)),
        ]

    async def drain(self) -> None:
        """First shutdown phase: readiness goes 503, leadership is handed off where possible."""
        self._set_draining()
        await self._hand_off_leadership(timeout=5.0)

    async def close(self) -> None:
        """Last shutdown phase (after HTTP stopped): close Raft and RocksDB cleanly."""
        self._set_draining()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.reassignments.stop()
        await self.peer_client.close()
        await self.peer_view.stop()
        await self.groups.close()
        await self.txn.close()
        self.replicas.stop_all()
        self.raft.stop()
        self.store.close()

    def _set_draining(self) -> None:
        self.partitions.draining = True  # produce and fetch refuse or stop waiting from now on

    @property
    def draining(self) -> bool:
        return self.partitions.draining

    def is_ready(self) -> bool:
        """Serving: not draining, the controller leader known, every local internal group with a ready leader."""
        return not self.draining and not self.missing_groups()

    def missing_groups(self) -> list[dict[str, Any]]:
        """What keeps this node from serving: the controller without a known leader, and the internal groups
        replicated here without a ready leader (``cluster.readiness``)."""
        kinds: list[InternalGroups[Any]] = [self.txn.groups, self.groups.groups]
        out = [m.to_json() for m in missing_groups(self.config, self.nodes, kinds, self.peer_view)]
        if not self.controller.leader_known():
            out.insert(0, {"group": CONTROLLER_GROUP, "leader": None, "reason": "no leader"})
        return out

    async def refresh_readiness(self, timeout: float) -> None:
        """Poll now the peers that lead an internal group replicated here but have not reported it ready (leaders
        elected since the last periodic poll), waiting at most ``timeout`` seconds for their answers."""
        kinds: list[InternalGroups[Any]] = [self.txn.groups, self.groups.groups]
        stale = {
            m.leader
            for m in missing_groups(self.config, self.nodes, kinds, self.peer_view)
            if m.reason == NOT_READY_AS_REPORTED and m.leader is not None
        }
        if stale:
            await self.peer_view.refresh(stale, timeout)

    def _balance_candidates(self) -> list[Candidate]:
        """Every data partition this node replicates that is not moving.

        Coordinators (internal partitions) stay where elections put them: moving one costs its clients a
        coordinator change (NOT_COORDINATOR, a reload), which a spread of leaders does not pay for."""
        moving = self.controller.view.reassignments
        out = [Candidate(r.group, r.replicas[0]) for r in self.replicas.replicas.values() if r.replicas]
        return [c for c in out if c.group.group_id not in moving]

    def _internal_placements(self) -> dict[str, tuple[int, ...]]:
        """Every internal partition's group id -> its replica set."""
        return {**self.txn.groups.placements(), **self.groups.groups.placements()}

    def _on_metadata(self, view: ControllerView) -> None:
        """After every controller change (loop thread): learn the nodes, then follow the placement."""
        self.nodes.update(view)
        self.replicas.reconcile(view)
        self.txn.groups.reconcile(view)
        self.groups.groups.reconcile(view)

    def _relays_to(self, node_id: int) -> list[int]:
        """Live peers that may carry a call to ``node_id`` (the peer poll sees them alive)."""
        me = self.config.node_id
        return [n for n in self.nodes.node_ids() if n not in (me, node_id) and self.peer_view.is_alive(n)]

    def _all_groups(self) -> list[RaftGroup]:
        groups = [r.group for r in self.replicas.replicas.values()] + self.txn.groups.groups()
        groups += self.groups.groups.groups()
        if self.controller.group is not None:
            groups.append(self.controller.group)
        return groups

    async def _hand_off_leadership(self, timeout: float) -> None:
        led = [g for g in self._all_groups() if g.is_leader()]
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
        for addr, match in st.match_index.items():
            if addr in st.connected and match >= st.commit_index:
                return addr
        return None

    def _on_replica_leader(self, rep: LocalReplica) -> None:
        self.metrics.leader_changes.labels(rep.topic.name).inc()

    # ---- what peers and Prometheus read ------------------------------------------

    def internal_state_json(self, epoch: str | None = None, since: int | None = None) -> dict[str, Any]:
        self.state_versions.record(*self._group_states())
        delta = self.state_versions.since(epoch, since)
        return {
            "node_id": self.config.node_id,
            "controller_leader": self.controller.leader_id(),
            "epoch": delta.epoch,
            "version": delta.version,
            "full": delta.full,
            "partitions": delta.changed,
            "removed": delta.removed,
        }

    def _group_states(self) -> tuple[dict[str, dict[str, Any]], set[str] | None]:
        """Every local group's state, and which of them were read again (None: all of them)."""
        parts, touched = self._partition_states()
        for internal in (self.txn.groups.state_json(), self.groups.groups.state_json()):
            parts.update(internal)
            if touched is not None:
                touched.update(internal)
        return parts, touched

    def _partition_states(self) -> tuple[dict[str, dict[str, Any]], set[str] | None]:
        """Every local partition's state. While no group came, went, quieted or woke (``quiet_generation``),
        only the groups that are not quiet (and quiet ones still applying) are read again: a quiet group's
        log, term and leader do not change, so thousands of idle partitions cost nothing per poll."""
        generation = self.raft.quiet_generation()
        touched: set[str] | None = None
        if generation != self._states_generation:
            self._states_generation = generation
            self._states, self._unsettled, self._replica_of = {}, set(), {}
            for rep in self.replicas.replicas.values():
                self._replica_of[rep.group.group_id] = rep
                self._read_state(rep)
        else:
            touched = set()
            for gid in self.raft.loud_group_ids() | self._unsettled:
                found = self._replica_of.get(gid)
                if found is not None:
                    self._read_state(found)
                    touched.add(gid)
        return dict(self._states), touched

    def _read_state(self, rep: LocalReplica) -> None:
        group, log = rep.group, rep.log
        gid = group.group_id
        settled = group.quiet_settled()
        self._states[gid] = {
            "topic": rep.topic.name,
            "partition": rep.partition,
            "leader": self.config.node_id if group.is_leader() else rep.leader_id,
            "term": group.term(),
            "high_watermark": log.high_watermark,
            "last_stable_offset": log.last_stable_offset,
            "log_start_offset": log.log_start_offset,
        }
        if settled:
            self._unsettled.discard(gid)
        else:
            self._unsettled.add(gid)

    def metrics_sample(self) -> NodeSample:
        parts, unavailable = self.partitions.samples()
        known = self.nodes.node_ids()
        up = sum(1 for n in known if self.peer_view.is_alive(n))
        c = self.controller.group
        return NodeSample(
            controller_is_leader=bool(c and c.is_leader()),
            controller_term=c.term() if c else 0,
            controller_commit_index=c.commit_index() if c else 0,
            nodes_up=up,
            nodes_down=len(known) - up,
            unavailable_partitions=unavailable,
            partitions=parts,
            internal=[*_raft_samples(self.txn.groups), *_raft_samples(self.groups.groups)],
            raft_quiescent_groups=self.raft.quiescent_groups(),
            raft_links=self.raft.link_stats(),
        )


def _raft_samples(kind: InternalGroups[Any]) -> list[GroupRaftSample]:
    return [
        GroupRaftSample(kind.kind, p, part.group.is_leader(), part.group.term(), part.group.commit_index())
        for p, part in sorted(kind.local.items())
    ]


class NodeServer:
    """A node plus its HTTP listener, started and stopped together."""

    def __init__(self, config: NodeConfig) -> None:
        """Loads the TLS files first: a file that cannot be used raises ``ConfigError`` before anything starts."""
        self.config = config
        sec = config.security
        self.ssl_context: ssl.SSLContext | None = server_context(sec) if sec is not None and sec.tls else None
        self.client_ssl_context = node_client_context(sec)
        self.metrics = NodeMetrics()
        self.node: Node | None = None
        self._runner: web.AppRunner | None = None
        self.kafka: KafkaServer | None = None

    async def start(self) -> None:
        if self.config.security is None:
            log.warning("node %d is open: no [security] section (anyone who reaches %s may do anything)",
                        self.config.node_id, self.config.url)  # fmt: skip
        self.node = Node(self.config, self.metrics, client_ssl=self.client_ssl_context)
        await self.node.start()
        self.metrics.add_collector(self.node.metrics_sample)
        self.metrics.start_loop_monitor()
        app = make_app(self.node.services())
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, self.config.host, self.config.http_port, reuse_address=True, ssl_context=self.ssl_context
        )
        await site.start()
        log.info("node %d serving %s", self.config.node_id, self.config.url)
        if self.config.kafka_port is not None:
            self.kafka = KafkaServer(self.node.services(), ALL_APIS, self.metrics.kafka, ssl_context=self.ssl_context)
            await self.kafka.start(self.config.host, self.config.kafka_port)
            log.info("node %d serving Kafka clients on %s:%d", self.config.node_id, self.config.host,
                     self.config.kafka_port)  # fmt: skip

    async def stop(self) -> None:
        await self.metrics.stop_loop_monitor()
        if self.node is not None:
            await self.node.drain()
        if self.kafka is not None:
            await self.kafka.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        if self.node is not None:
            await self.node.close()


async def run_node(config: NodeConfig) -> int:
    try:
        server = NodeServer(config)
    except ConfigError as exc:
        log.error("node %d cannot start: %s", config.node_id, exc)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
    except Exception:
        log.exception("node %d failed to start", config.node_id)
        await server.stop()
        return 1
    gc.freeze()  # what the start built lives as long as the node: the collector no longer walks it
    await stop.wait()
    log.info("node %d shutting down", config.node_id)
    try:
        await asyncio.wait_for(server.stop(), SHUTDOWN_GRACE_S)
    except TimeoutError:
        log.error("graceful shutdown took longer than %.0fs", SHUTDOWN_GRACE_S)
        return 1
    log.info("node %d stopped", config.node_id)
    return 0


def main_node(config: NodeConfig) -> int:
    setup_logging(config.log_format, config.log_level, config.node_id)
    limit = raise_open_files_limit()
    log.info("open-files limit %d: room for about %d Raft group replicas", limit, replicas_within(limit))
    # Thousands of Raft groups are millions of long-lived objects, and Raft traffic allocates fast: with
    # the default threshold (700) the cyclic collector's older generations walk them all several times
    # a second while thousands of groups elect leaders at once. Reference counting frees almost all of
    # a node's garbage; the collector only finds cycles, which can wait for more allocations.
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    return asyncio.run(run_node(config))
