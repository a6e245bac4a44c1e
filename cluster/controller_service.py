"""The controller group of a node, and the metadata every request reads from it.

Kafka splits this between the controller (commands that change metadata) and
the ``MetadataCache`` (what every broker knows); here both are one small
class around the replicated ``ControllerView``: topics and their placement,
who leads each partition (this node's replicas, else what the peers report),
and the nodes' URLs. Controller commands (create/delete topic, add partitions,
alter a topic's config, producer-id blocks) are proposed on this node's controller replica and answered
``NOT_CONTROLLER`` with the leader's URL when another node leads it.

Users and ACLs live in the same replicated state. A change (a user's
credential, ACLs) returns only after every live node applied it: the
proposer asks each live peer ``POST /v1/internal/controller/applied``
``{"index": N}``, which answers once that node's controller replica applied
the change's Raft index (``wait_applied``), so a changed password or ACL
holds on every node when the call returns. Adding partitions and altering a
topic's config wait the same way, so every node's metadata shows them then. ``security_view()`` gives the
``Authorizer`` and ``CredentialChecker`` of the current state, rebuilt on the
loop when the state changes; readers never wait. The controller leader
records the config's bootstrap users and ACLs once (``bootstrap_security``).

Everything runs on the asyncio loop thread; the state machine's change
callback arrives on a Raft thread and only hands off.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from clients.protocol import BrokerError, ErrorCode
from raft import LeadershipEvent, NotLeaderError, RaftError, RaftGroup, RaftNode, RaftTimeoutError

from .cluster_nodes import ClusterNodes
from .config import NodeConfig
from .controller import (
    ControllerStateMachine,
    ProducerIdBlock,
    allocate_producer_ids_command,
    create_topic_command,
    delete_topic_command,
)
from .controller_view import ControllerView
from .deadline import Deadline, call_at_leader, current_deadline, loop_now
from .membership import describe_assignment, topic_placement_nodes
from .peers import PeerView
from .replicas import ReplicaManager
from .seams import Clock, PeerClient
from .security.acl import AclBinding, AclFilter, describe
from .security.authorizer import Authorizer
from .security.credentials import CredentialChecker
from .security.principals import is_valid_principal, user_principal
from .security.scram import (
    DEFAULT_ITERATIONS,
    MAX_ITERATIONS,
    MECHANISMS,
    MIN_ITERATIONS,
    ScramCredential,
    check_password,
    make_credential,
)
from .security_state import (
    SecurityChange,
    SecurityView,
    bootstrap_command,
    create_acls_command,
    delete_acls_command,
    delete_user_command,
    upsert_user_command,
)
from .topic_admin import (
    add_partitions_command,
    alter_topic_config_command,
    config_changes,
    new_partitions,
    validate_partition_count,
)
from .topics import (
    PartitionAssignment,
    TopicMetadata,
    assign_replicas,
    group_id_for,
    validate_topic_config,
    validate_topic_name,
)

__all__ = [
    "APPLIED_PATH",
    "APPLIED_WAIT_S",
    "CONTROLLER_COMMAND_PATH",
    "CONTROLLER_GROUP",
    "PRODUCER_IDS_PATH",
    "ControllerService",
    "SecurityRuntime",
    "validate_user_name",
]

log = logging.getLogger(__name__)

CONTROLLER_GROUP = "__controller"
PRODUCER_IDS_PATH = "/v1/internal/producer-ids"
# a node proposes a membership command (a finished move, a decommissioned node) at the controller leader
CONTROLLER_COMMAND_PATH = "/v1/internal/controller/command"
#: A node answers once its controller replica applied ``{"index": N}`` (at most ``APPLIED_WAIT_S`` later).
APPLIED_PATH = "/v1/internal/controller/applied"
APPLIED_WAIT_S = 5.0
_MAX_USER_NAME = 256
_MAX_PASSWORD = 1024
_APPLIED_POLL_S = 0.05  # a waiter looks again this often (an index may be applied without a security change)
_BOOTSTRAP_RETRY_S = 0.5
#: how long a metadata answer waits for the replicas of partitions it names no leader for (``refresh_leaders``)
LEADER_REFRESH_TIMEOUT_S = 0.5


def validate_user_name(name: object) -> str:
    """A user name: 1-256 printable characters, no ':' and no whitespace; INVALID_REQUEST otherwise."""
    if (
        not isinstance(name, str)
        or not 0 < len(name) <= _MAX_USER_NAME
        or not name.isprintable()
        or ":" in name
        or any(c.isspace() for c in name)
        or not is_valid_principal(user_principal(name))
    ):
        raise BrokerError(
            ErrorCode.INVALID_REQUEST,
            f"a user name is 1-{_MAX_USER_NAME} printable characters without ':' or whitespace",
        )
    return name


@dataclass(frozen=True, slots=True)
class SecurityRuntime:
    """What requests check against: the replicated users and ACLs as an ``Authorizer`` and a
    ``CredentialChecker`` (``view`` is the state they were built from)."""

    view: SecurityView
    authorizer: Authorizer
    credentials: CredentialChecker


class ControllerService:
    """Cluster metadata (a ``TopicDirectory``) and the controller's commands."""

    def __init__(
        self,
        config: NodeConfig,
        sm: ControllerStateMachine,
        raft: RaftNode,
        replicas: ReplicaManager,
        peer_view: PeerView,
        peers: PeerClient,
        nodes: ClusterNodes,
        clock: Clock,
    ) -> None:
        self.config = config
        self.sm = sm
        self._raft = raft
        self._replicas = replicas
        self._peer_view = peer_view
        self._peers = peers
        self._nodes = nodes
        self._clock = clock
        self.group: RaftGroup | None = None
        self._security: SecurityRuntime | None = None
        self._applied = asyncio.Event()  # set (and replaced) when the replicated security state changes
        self._bootstrap_task: asyncio.Task[None] | None = None

    def start(self, on_change: Callable[[ControllerView], None]) -> None:
        """Join the controller group; ``on_change`` runs on the loop after every metadata change."""
        loop = asyncio.get_running_loop()

        def changed(view: ControllerView) -> None:  # Raft ticker thread: hand off to the loop
            loop.call_soon_threadsafe(on_change, view)

        def security_changed(_index: int) -> None:  # Raft ticker thread: hand off to the loop
            loop.call_soon_threadsafe(self._security_changed)

        self.sm.on_change = changed
        self.sm.on_security_change = security_changed
        self.security_view()
        members = [n.raft_address for n in self.config.nodes]
        self.group = self._raft.add_group(CONTROLLER_GROUP, members, self.sm, on_event=self._on_event)

    def _on_event(self, event: LeadershipEvent) -> None:
        log.info(
            "controller leader is now %s (term %d, this node leads: %s)", event.leader, event.term, event.is_leader
        )
        if event.is_leader:
            self._maybe_bootstrap()

    # ---- nodes ------------------------------------------------------------------------------

    def leader_id(self) -> int | None:
        """The controller leader as far as this node knows (its own replica, else its peers)."""
        if self.group is not None:
            addr = self.group.leader()
            if addr is not None:
                node = self._nodes.node_by_raft_address(addr)
                if node is not None:
                    return node.id
        return self._peer_view.controller_leader()

    def leader_known(self) -> bool:
        """This node's own controller replica knows a leader (the readiness condition)."""
        return self.group is not None and self.group.leader() is not None

    # ---- topics and partitions (TopicDirectory) --------------------------------------------------

    @property
    def view(self) -> ControllerView:
        return self.sm.view

    def topic(self, name: str) -> TopicMetadata:
        meta = self.view.topics.get(name)
        if meta is None:
            raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
        return meta

    def partition_counts(self) -> dict[str, int]:
        return {name: len(meta.partitions) for name, meta in self.view.topics.items()}

    def partition_state(self, meta: TopicMetadata, partition: int) -> dict[str, Any]:
        """Leader and offsets of a partition: the local replica's values if it has one."""
        rep = self._replicas.get(meta.name, partition)
        if rep is not None:
            leader = rep.leader_id
            if rep.group.is_leader():
                leader = self.config.node_id
            elif leader is None:
                # No news of a leader here (cut off from it): a live peer may follow one (non-transitive cuts).
                reported = (self._peer_view.remote_partition(group_id_for(meta.topic_id, partition)) or {}).get(
                    "leader"
                )
                leader = int(reported) if reported is not None and reported != self.config.node_id else None
            return {
                "leader": leader,
                "high_watermark": rep.log.high_watermark,
                "last_stable_offset": rep.log.last_stable_offset,
                "log_start_offset": rep.log.log_start_offset,
            }
        info = self._peer_view.remote_partition(group_id_for(meta.topic_id, partition)) or {}
        return {
            "leader": info.get("leader"),
            "high_watermark": info.get("high_watermark", -1),
            "last_stable_offset": info.get("last_stable_offset", -1),
            "log_start_offset": info.get("log_start_offset", -1),
        }

    def partition_leader(self, meta: TopicMetadata, partition: int) -> int | None:
        leader = self.partition_state(meta, partition)["leader"]
        return int(leader) if leader is not None else None

    async def refresh_leaders(self, metas: Iterable[TopicMetadata], timeout: float = LEADER_REFRESH_TIMEOUT_S) -> None:
        """Ask the replicas of every partition of ``metas`` this node names no leader for, now, rather than
        wait for the next peer poll (a partition made a moment ago on other nodes has a leader they know
        of first). Returns within ``timeout`` seconds; a partition still without one is in an election."""
        nodes: set[int] = set()
        for meta in metas:
            for a in meta.partitions:
                if self.partition_leader(meta, a.partition) is None:
                    nodes.update(a.replicas)
        nodes.discard(self.config.node_id)
        if nodes:
            await self._peer_view.refresh(nodes, timeout)

    def high_watermark(self, meta: TopicMetadata, partition: int) -> int:
        hw = self.partition_state(meta, partition).get("high_watermark")
        return hw if isinstance(hw, int) else -1

    # ---- JSON views ---------------------------------------------------------------------------

    def cluster_json(self) -> dict[str, Any]:
        return {
            "cluster_id": self.config.cluster_id,
            "nodes": [self.node_json(i) for i in self._nodes.all_ids()],
            "founders": list(self._nodes.founders),
            "controller_leader": self.leader_id(),
        }

    def topic_json(self, meta: TopicMetadata) -> dict[str, Any]:
        parts = []
        for a in meta.partitions:
            st = self.partition_state(meta, a.partition)
            parts.append(
                {
                    "partition": a.partition,
                    "leader": st["leader"],
                    "leader_url": self._nodes.node_url(st["leader"]),
                    "replicas": list(a.replicas),
                    "high_watermark": st["high_watermark"],
                    "last_stable_offset": st["last_stable_offset"],
                    "log_start_offset": st["log_start_offset"],
                    **describe_assignment(meta, self.view, a.partition),
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
            "controller_leader": self.leader_id(),
            "topics": [self.topic_json(m) for m in sorted(metas, key=lambda m: m.name)],
        }

    def topics_json(self) -> list[dict[str, Any]]:
        """The topic listing: name, partition count, replication factor."""
        return [
            {
                "name": m.name,
                "partitions": len(m.partitions),
                "replication_factor": len(m.partitions[0].replicas) if m.partitions else 0,
            }
            for m in sorted(self.view.topics.values(), key=lambda m: m.name)
        ]

    # ---- controller commands ------------------------------------------------------------------

    def _not_controller(self, leader: str | None) -> BrokerError:
        node = self._nodes.node_by_raft_address(leader) if leader else None
        if node is None:  # our Raft has no leader yet; peers may know it
            known = self._peer_view.controller_leader()
            node = self._nodes.node(known) if known is not None and known != self.config.node_id else None
        return BrokerError(
            ErrorCode.NOT_CONTROLLER,
            "this node is not the controller leader",
            leader_id=node.id if node else None,
            leader_url=node.url if node else None,
        )

    def require_leader(self) -> None:
        """NOT_CONTROLLER (with the leader's URL when known) unless this node leads the controller group."""
        self._require_leader()

    def _require_leader(self) -> None:
        """NOT_CONTROLLER (with the leader's URL when known) unless this node leads the controller group."""
        if self.group is None:
            raise BrokerError(ErrorCode.NOT_CONTROLLER, "controller not started")
        if not self.group.is_leader():
            raise self._not_controller(self.group.leader())

    async def submit_command(self, command: bytes) -> Any:
        """Propose a controller command on this node's replica (NOT_CONTROLLER elsewhere); its result."""
        return await self._submit(command)

    async def submit_at_leader(self, command: bytes) -> None:
        """Propose a controller command here if this node leads the controller, else at the leader
        (``POST /v1/internal/controller/command``), within the current request's deadline."""
        me = self.config.node_id

        def resolve(last: BrokerError | None) -> int | None:
            hint = last.extra.get("leader_id") if last is not None else None
            return int(hint) if isinstance(hint, int) else (self.leader_id() or me)

        async def attempt(node: int) -> None:
            if node == me:
                await self._submit(command)
            else:
                await self._peers.call(node, CONTROLLER_COMMAND_PATH, {"command": json.loads(command)})

        deadline = current_deadline() or Deadline.after(loop_now(), self.config.request_timeout_ms / 1000)
        await call_at_leader(resolve, attempt, deadline, what="controller command")

    def node_json(self, node_id: int) -> dict[str, Any]:
        """A node as ``/v1/cluster`` and ``/v1/nodes`` show it."""
        addr = self._nodes.node(node_id)
        voters = self.group.voters() if self.group is not None else frozenset()
        return {
            "id": node_id,
            "url": addr.url if addr else None,
            "host": addr.host if addr else None,
            "raft_port": addr.raft_port if addr else None,
            "kafka": addr.kafka_address if addr else None,
            "alive": self._peer_view.is_alive(node_id),
            "state": self._nodes.state(node_id) or "active",
            "controller_voter": addr is not None and addr.raft_address in voters,
        }

    async def _submit(self, command: bytes) -> Any:
        if self.group is None:
            raise BrokerError(ErrorCode.NOT_CONTROLLER, "controller not started")
        try:
            result = await self.group.submit(command, timeout=self.config.request_timeout_ms / 1000)
        except NotLeaderError as exc:
            raise self._not_controller(exc.leader) from exc
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
        name, assignment, cfg = self.check_new_topic(name, partitions, replication_factor, config)
        meta: TopicMetadata = await self._submit(create_topic_command(name, assignment, cfg, self._clock.now_ms()))
        return meta

    def check_new_topic(
        self, name: object, partitions: object, replication_factor: object, config: object
    ) -> tuple[str, tuple[PartitionAssignment, ...], dict[str, int | str]]:
        """What ``create_topic`` checks before it proposes (a create with ``validate_only`` stops here):
        the name, the placement of its partitions and its validated config; the error it would answer."""
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
            topic_placement_nodes(self.view, self._nodes.node_ids()),
            partitions,
            replication_factor,
            self.view.placement_cursor,
        )
        return name, assignment, cfg

    async def delete_topic(self, name: str) -> TopicMetadata:
        self.topic(name)
        meta: TopicMetadata = await self._submit(delete_topic_command(name))
        return meta

    async def add_partitions(self, name: str, count: object, assignments: object = None) -> TopicMetadata:
        """Grow ``name`` to ``count`` partitions (Kafka's CreatePartitions); returns once every live node knows them.

        Only up (INVALID_PARTITIONS otherwise); ``assignments`` places the new partitions (else round-robin
        continuing from the topic's last partition). Checked against the controller leader's view: a follower
        answers NOT_CONTROLLER first, so a view that lags never refuses what the leader would take."""
        if isinstance(count, bool) or not isinstance(count, int):
            raise BrokerError(ErrorCode.INVALID_PARTITIONS, "count must be an integer: the new partition count")
        self._require_leader()
        meta = self.topic(name)
        count = validate_partition_count(count, len(meta.partitions), self.config.max_partitions_per_topic)
        added = new_partitions(meta, count, topic_placement_nodes(self.view, self._nodes.node_ids()), assignments)
        grown: TopicMetadata = await self._submit(add_partitions_command(meta, added))
        await self._applied_everywhere(self.sm.last_applied)
        return grown

    async def alter_topic_config(self, name: str, changes: object) -> TopicMetadata:
        """Set (and with ``None`` delete) overrides of ``name``'s config, validated like creation (Kafka's
        IncrementalAlterConfigs); returns once every live node applies the new values."""
        sets, deletes = config_changes(changes)
        self._require_leader()
        meta = self.topic(name)
        altered: TopicMetadata = await self._submit(alter_topic_config_command(meta, sets, deletes))
        await self._applied_everywhere(self.sm.last_applied)
        return altered

    async def allocate_producer_ids_local(self, node_id: int) -> ProducerIdBlock:
        """A producer-id block for ``node_id`` from this node's controller replica (NOT_CONTROLLER elsewhere)."""
        block: ProducerIdBlock = await self._submit(allocate_producer_ids_command(node_id))
        return block

    async def allocate_producer_ids(self) -> ProducerIdBlock:
        """A producer-id block for this node: from its own controller replica, else from the leader's.

        Within the deadline of the request that needs it (``cluster.deadline``), retried at the controller
        leader as then known while the answer says it moved (an unanswered block is never reissued).
        """
        me = self.config.node_id

        def resolve(last: BrokerError | None) -> int | None:
            hint = last.extra.get("leader_id") if last is not None else None
            return int(hint) if isinstance(hint, int) else (self.leader_id() or me)

        async def attempt(node: int) -> ProducerIdBlock:
            if node == me:
                return await self.allocate_producer_ids_local(me)
            body = await self._peers.call(node, PRODUCER_IDS_PATH, {"node_id": me})
            return ProducerIdBlock(int(body["first"]), int(body["size"]))

        deadline = current_deadline() or Deadline.after(loop_now(), self.config.request_timeout_ms / 1000)
        return await call_at_leader(resolve, attempt, deadline, what="producer-id block from the controller")

    # ---- users and ACLs -------------------------------------------------------------------------

    def security_view(self) -> SecurityRuntime:
        """The authorizer and credential checker of the replicated state as this node has applied it."""
        state = self.sm.security
        current = self._security
        if current is not None and current.view is state:
            return current
        sec = self.config.security
        if current is not None and current.view.acls is state.acls:
            authorizer = current.authorizer
        else:
            authorizer = Authorizer(
                state.acls,
                super_users=frozenset(sec.super_users) if sec is not None else frozenset(),
                # an open node (no [security] section) lets everyone do what no ACL mentions
                allow_everyone_if_no_acl_found=sec.allow_everyone_if_no_acl_found if sec is not None else True,
            )
        if current is None:
            credentials = CredentialChecker(state.users)
        else:
            credentials = current.credentials
            if current.view.users is not state.users:
                credentials.replace_users(state.users)
        self._security = SecurityRuntime(state, authorizer, credentials)
        return self._security

    def _security_changed(self) -> None:
        self.security_view()
        self._applied.set()
        self._applied = asyncio.Event()

    def users_json(self) -> list[dict[str, Any]]:
        """``GET /v1/users``: every user's name and SCRAM mechanisms (never a secret)."""
        return self.sm.security.users_json()

    def describe_acls(self, flt: AclFilter) -> list[AclBinding]:
        return describe(self.sm.security.acls, flt)

    async def upsert_user(
        self, name: object, mechanism: object, password: object = None, iterations: object = None
    ) -> dict[str, Any]:
        """Create or change a user's SCRAM credential; only the hashed credential is proposed.

        The user's credentials of other mechanisms stay only if ``password`` is theirs too, so the
        old password stops working whatever mechanism it was set with."""
        user = validate_user_name(name)
        if not isinstance(mechanism, str) or mechanism.strip().upper() not in MECHANISMS:
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"mechanism must be one of {', '.join(MECHANISMS)}")
        mech = mechanism.strip().upper()
        if iterations is None:
            iterations = DEFAULT_ITERATIONS
        if isinstance(iterations, bool) or not isinstance(iterations, int):
            raise BrokerError(ErrorCode.INVALID_REQUEST, "iterations must be an integer")
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise BrokerError(
                ErrorCode.INVALID_REQUEST, f"iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}"
            )
        if not isinstance(password, str) or not password or len(password) > _MAX_PASSWORD:
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"password must be 1-{_MAX_PASSWORD} characters")
        self._require_leader()
        others = [c for m, c in self.sm.security.users.get(user, {}).items() if m != mech]
        rounds = iterations

        def derive() -> list[ScramCredential]:  # PBKDF2: in a worker thread
            return [make_credential(password, mech, rounds), *(c for c in others if check_password(c, password))]

        credentials = await asyncio.to_thread(derive)
        change: SecurityChange = await self._submit(upsert_user_command(user, credentials))
        await self._applied_everywhere(change.index)
        return {
            "name": user,
            "mechanisms": sorted(c.mechanism for c in credentials),
            "created": change.value["created"],
        }

    async def delete_user(self, name: object) -> None:
        """Remove a user (RESOURCE_NOT_FOUND when there is none)."""
        user = validate_user_name(name)
        change: SecurityChange = await self._submit(delete_user_command(user))
        await self._applied_everywhere(change.index)

    async def create_acls(self, bindings: Sequence[AclBinding]) -> list[AclBinding]:
        """Add ACLs (one already there stays as it is); answers them."""
        if not bindings:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "no ACLs given")
        change: SecurityChange = await self._submit(create_acls_command(list(bindings)))
        await self._applied_everywhere(change.index)
        return list(bindings)

    async def delete_acls(self, filters: Sequence[AclFilter]) -> list[AclBinding]:
        """Remove every ACL one of ``filters`` matches; answers the removed ones."""
        if not filters:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "no ACL filters given")
        change: SecurityChange = await self._submit(delete_acls_command(list(filters)))
        await self._applied_everywhere(change.index)
        deleted: list[AclBinding] = change.value
        return deleted

    async def wait_applied(self, index: int, timeout: float = APPLIED_WAIT_S) -> int:
        """Wait (without blocking the loop) until this node's controller replica applied ``index``; answers the
        applied index. REQUEST_TIMED_OUT after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while self.sm.last_applied < index:
            left = end - loop.time()
            if left <= 0:
                raise BrokerError(
                    ErrorCode.REQUEST_TIMED_OUT,
                    f"node {self.config.node_id} applied the controller log to {self.sm.last_applied}, not {index}",
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._applied.wait(), min(left, _APPLIED_POLL_S))
        self.security_view()
        return self.sm.last_applied

    async def _applied_everywhere(self, index: int) -> None:
        """Return once this node and every live peer applied ``index``.

        A peer that cannot be reached is not live (it serves nobody); a live one that has not applied the
        change within ``APPLIED_WAIT_S`` makes this REQUEST_TIMED_OUT (the change itself is committed)."""
        me = self.config.node_id
        peers = [n for n in self._nodes.node_ids() if n != me and self._peer_view.is_alive(n)]

        async def at(node: int) -> BrokerError | None:
            try:
                await self._peers.call(node, APPLIED_PATH, {"index": index})
            except BrokerError as exc:
                if exc.error_code in (ErrorCode.NETWORK_EXCEPTION, ErrorCode.COORDINATOR_NOT_AVAILABLE):
                    log.warning("node %d did not confirm controller index %d: %s", node, index, exc)
                    return None
                return exc
            return None

        await self.wait_applied(index)
        failures = [(node, exc) for node, exc in zip(peers, await asyncio.gather(*(at(n) for n in peers)), strict=True)]
        late = [(node, exc) for node, exc in failures if exc is not None]
        if late:
            detail = "; ".join(f"node {node}: {exc}" for node, exc in late)
            raise BrokerError(
                ErrorCode.REQUEST_TIMED_OUT,
                f"the change is committed, but not yet applied on every live node ({detail})",
                committed=True,
            )

    def _maybe_bootstrap(self) -> None:
        """On gaining the controller leadership: record the config's bootstrap users and ACLs once."""
        sec = self.config.security
        if sec is None or not (sec.bootstrap_users or sec.bootstrap_acls) or self.sm.security.bootstrapped:
            return
        if self._bootstrap_task is None or self._bootstrap_task.done():
            self._bootstrap_task = asyncio.get_running_loop().create_task(self._bootstrap(), name="security-bootstrap")

    async def _bootstrap(self) -> None:
        sec = self.config.security
        assert sec is not None
        users: dict[str, dict[str, ScramCredential]] = {}
        for u in sec.bootstrap_users:
            try:
                users.setdefault(validate_user_name(u.name), {})[u.mechanism] = ScramCredential.from_bootstrap(u)
            except BrokerError as exc:
                log.error("bootstrap user %r is not recorded: %s", u.name, exc)
        bindings: list[AclBinding] = []
        for raw in sec.bootstrap_acls:
            try:
                bindings.append(AclBinding.from_json(raw))
            except BrokerError as exc:
                log.error("bootstrap ACL %r is not recorded: %s", raw, exc)
        while self.group is not None and self.group.is_leader() and not self.sm.security.bootstrapped:
            try:
                change: SecurityChange = await self._submit(bootstrap_command(users, bindings))
            except BrokerError as exc:
                if exc.error_code is ErrorCode.NOT_CONTROLLER:
                    return
                log.warning("recording the bootstrap users and ACLs failed (retrying): %s", exc)
                await asyncio.sleep(_BOOTSTRAP_RETRY_S)
                continue
            if change.value:
                log.info("recorded %d bootstrap users and %d bootstrap ACLs", len(users), len(bindings))
            return
