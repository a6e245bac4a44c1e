"""HTTP routes of consumer groups and offsets (API.md "Producer ids and transactions"), and internal twins.

A request for group G may reach any node: one that does not coordinate G
proxies it once to the coordinator (a signed node call, never proxied again), as
the transaction routes do; a client can also ask
``GET /v1/coordinators/group/G`` and go there directly -- better for the join
long-poll, which may last up to the rebalance timeout. ``GET /v1/groups``
fans out to every node, each answering for the coordinator partitions it leads.

Administration (API.md "Operating a cluster", kafka-consumer-groups.sh):
``DELETE /v1/groups/G`` deletes an empty group; ``POST /v1/groups/G/offsets/reset``
computes (``"dry_run"``: true, the default) or writes (``"dry_run": false``) new
offsets for a group without members. Both run on the group's coordinator.

Internal endpoints (``/v1/internal/groups/*``, signed node calls only): a transaction
coordinator writes a COMMIT/ABORT marker to an offsets partition led elsewhere;
the group listing's fan-out; a partition leader's offsets for a reset (ListOffsets).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from clients.protocol import BrokerError, ControlType, ErrorCode
from coordinator.group_admin import parse_reset_to
from coordinator.group_assignors import ASSIGNORS, DEFAULT_PROTOCOL
from coordinator.group_commands import OffsetCommit
from coordinator.group_membership import JoinAnswer
from coordinator.group_metadata import NO_GENERATION
from coordinator.metadata import TopicPartition

from ..offset_lookup import LIST_OFFSETS_PATH, log_offsets_json
from ..security.acl import Operation, ResourceType
from ..topics import validate_topic_name
from . import parsing
from .access import Access, Need, RouteTable, guard
from .forwarding import Forwarder, Locate
from .node_auth import require_internal
from .services import Services

__all__ = ["GroupRoutes"]

DESCRIBE, READ, DELETE = Operation.DESCRIBE, Operation.READ, Operation.DELETE
GROUP, TOPIC = ResourceType.GROUP, ResourceType.TOPIC

_MAX_OFFSETS = 10_000
_MAX_TOPICS = 10_000
_MAX_METADATA = 4096  # Kafka's offset.metadata.max.bytes
DEFAULT_SESSION_TIMEOUT_MS = 10_000
DEFAULT_REBALANCE_TIMEOUT_MS = 30_000


def _member_id(body: dict[str, Any], *, required: bool) -> str:
    raw = parsing.get_str(body, "member_id", required=required)
    return parsing.identifier(raw, "member_id") if raw else ""


def _offsets(body: dict[str, Any]) -> tuple[OffsetCommit, ...]:
    items = parsing.get_list(body, "offsets", max_len=_MAX_OFFSETS)
    if not items:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "offsets must not be empty")
    out: dict[tuple[str, int], OffsetCommit] = {}
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"offsets[{i}] must be an object")
        topic = validate_topic_name(item.get("topic"))
        partition = parsing.get_int(item, "partition", lo=0, hi=parsing.INT32_MAX)
        offset = parsing.get_int(item, "offset", lo=0, hi=parsing.INT64_MAX)
        metadata = parsing.get_str(item, "metadata", required=False, max_len=_MAX_METADATA) or ""
        if (topic, partition) in out:
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"{topic}-{partition} appears twice in offsets")
        out[(topic, partition)] = OffsetCommit(topic, partition, offset, metadata)
    return tuple(out.values())


def _partitions_query(raw: str | None) -> set[TopicPartition] | None:
    """``topic:partition,...`` (topic names cannot hold ':')."""
    if not raw:
        return None
    out = set()
    for item in raw.split(","):
        topic, sep, partition = item.rpartition(":")
        if not sep:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "partitions is a list of topic:partition")
        out.add(TopicPartition(validate_topic_name(topic),
                               parsing.parse_decimal(partition, "partition", lo=0, hi=parsing.INT32_MAX)))  # fmt: skip
        if len(out) > _MAX_OFFSETS:
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"more than {_MAX_OFFSETS} partitions")
    return out


def _reset_partitions(body: dict[str, Any]) -> list[int] | None:
    """``"partitions"``: absent (every partition of the topic) or a non-empty list of distinct partitions."""
    if body.get("partitions") is None:
        return None
    items = parsing.get_list(body, "partitions", max_len=_MAX_OFFSETS)
    if not items:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "partitions must not be empty (leave it out for all)")
    out: list[int] = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item <= parsing.INT32_MAX:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "partitions must be a list of partition numbers (>= 0)")
        out.append(item)
    if len(set(out)) != len(out):
        raise BrokerError(ErrorCode.INVALID_REQUEST, "partitions lists a partition twice")
    return out


def _query_bool(request: web.Request, key: str) -> bool:
    raw = request.query.get(key, "false").lower()
    if raw not in ("true", "false", "1", "0"):
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"query parameter {key!r} must be true or false")
    return raw in ("true", "1")


def answer_json(a: JoinAnswer) -> dict[str, Any]:
    return {
        "group_id": a.group_id,
        "generation_id": a.generation_id,
        "member_id": a.member_id,
        "leader_id": a.leader_id,
        "protocol": a.protocol,
        "assignment": [{"topic": tp.topic, "partition": tp.partition} for tp in a.assignment],
        "members": list(a.members),
    }


class GroupRoutes:
    def __init__(self, services: Services, forwarder: Forwarder) -> None:
        self.s = services
        self.svc = services.groups
        self.forwarder = forwarder

    def register(self, app: web.Application) -> None:
        r = RouteTable(app)
        gid = "group_id"
        r.get("/v1/coordinators/group/{group_id}", self.find_coordinator, Access.user(Need(DESCRIBE, GROUP, gid)))
        r.get("/v1/groups", self.list_groups, Access.user(body="DESCRIBE on each group listed"))
        r.get(
            "/v1/groups/{group_id}",
            self.describe,
            Access.user(Need(DESCRIBE, GROUP, gid), body="DESCRIBE on each topic whose offsets are shown"),
        )
        r.delete("/v1/groups/{group_id}", self.delete_group, Access.user(Need(DELETE, GROUP, gid)))
        r.post(
            "/v1/groups/{group_id}/offsets/reset",
            self.reset_offsets,
            Access.user(Need(READ, GROUP, gid), body="READ on the topic"),
        )
        r.post("/v1/groups/{group_id}/join", self.join, Access.user(Need(READ, GROUP, gid)))
        r.post("/v1/groups/{group_id}/heartbeat", self.heartbeat, Access.user(Need(READ, GROUP, gid)))
        r.post("/v1/groups/{group_id}/leave", self.leave, Access.user(Need(READ, GROUP, gid)))
        r.post(
            "/v1/groups/{group_id}/offsets",
            self.commit_offsets,
            Access.user(
                Need(READ, GROUP, gid),
                body="READ on each topic; WRITE on the transactional id of a transactional commit",
            ),
        )
        r.get(
            "/v1/groups/{group_id}/offsets",
            self.fetch_offsets,
            Access.user(Need(DESCRIBE, GROUP, gid), body="DESCRIBE on each topic shown"),
        )
        r.post(
            "/v1/transactions/{transactional_id}/offsets",
            self.add_offsets_to_txn,
            Access.user(
                Need(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, "transactional_id"), body="READ on the group"
            ),
        )
        r.post("/v1/internal/groups/marker", self.internal_marker, Access.nodes())
        r.post("/v1/internal/groups/list", self.internal_list, Access.nodes())
        r.post(LIST_OFFSETS_PATH, self.internal_list_offsets, Access.nodes())

    # ---- plumbing -------------------------------------------------------------------------------

    def _group(self, request: web.Request) -> str:
        return parsing.identifier(request.match_info["group_id"], "group_id")

    async def _body(self, request: web.Request) -> tuple[bytes, dict[str, Any]]:
        raw = await request.read()
        return raw, parsing.parse_json_object(raw)

    async def _routed(
        self, request: web.Request, raw: bytes, call: Callable[[], Awaitable[dict[str, Any]]]
    ) -> web.Response:
        """``Forwarder.routed``; the coordinator is located anew on retries (the transaction
        coordinator for a ``transactional_id`` route, else the group's)."""
        tid = request.match_info.get("transactional_id")
        group = request.match_info.get("group_id")
        locate: Locate | None = None
        if tid:
            tp = self.s.txn.partition_for(tid)
            locate = lambda: self.s.txn.groups.coordinator_url(tp)  # noqa: E731
        elif group:
            gp = self.svc.partition_for(group)
            locate = lambda: self.svc.groups.coordinator_url(gp)  # noqa: E731
        return await self.forwarder.routed(request, raw, call, locate)

    # ---- public routes --------------------------------------------------------------------------

    async def find_coordinator(self, request: web.Request) -> web.Response:
        return web.json_response(self.svc.coordinator_json(self._group(request)))

    async def join(self, request: web.Request) -> web.Response:
        group = self._group(request)
        raw, body = await self._body(request)
        member_id = _member_id(body, required=False)
        session = parsing.get_int(body, "session_timeout_ms", default=DEFAULT_SESSION_TIMEOUT_MS, lo=1,
                                  hi=parsing.INT32_MAX)  # fmt: skip
        rebalance = parsing.get_int(body, "rebalance_timeout_ms", default=DEFAULT_REBALANCE_TIMEOUT_MS, lo=1,
                                    hi=parsing.INT32_MAX)  # fmt: skip
        topics = tuple(validate_topic_name(t) for t in parsing.get_list(body, "topics", max_len=_MAX_TOPICS))
        protocol = parsing.get_str(body, "protocol", required=False, max_len=64) or DEFAULT_PROTOCOL
        if protocol not in ASSIGNORS:
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"protocol must be one of {sorted(ASSIGNORS)}")

        async def call() -> dict[str, Any]:
            return answer_json(await self.svc.join(group, member_id, topics, protocol, session, rebalance))

        return await self._routed(request, raw, call)

    async def heartbeat(self, request: web.Request) -> web.Response:
        group = self._group(request)
        raw, body = await self._body(request)
        member_id = _member_id(body, required=True)
        generation = parsing.get_int(body, "generation_id", lo=NO_GENERATION, hi=parsing.INT32_MAX)

        async def call() -> dict[str, Any]:
            self.svc.heartbeat(group, member_id, generation)
            return {}

        return await self._routed(request, raw, call)

    async def leave(self, request: web.Request) -> web.Response:
        group = self._group(request)
        raw, body = await self._body(request)
        member_id = _member_id(body, required=True)

        async def call() -> dict[str, Any]:
            self.svc.leave(group, member_id)
            return {}

        return await self._routed(request, raw, call)

    async def commit_offsets(self, request: web.Request) -> web.Response:
        group = self._group(request)
        raw, body = await self._body(request)
        offsets = _offsets(body)
        generation = parsing.get_int(body, "generation_id", default=NO_GENERATION, lo=NO_GENERATION,
                                     hi=parsing.INT32_MAX)  # fmt: skip
        member_id = _member_id(body, required=False)
        txn_fields = [k for k in ("transactional_id", "producer_id", "producer_epoch") if body.get(k) is not None]
        if txn_fields and len(txn_fields) != 3:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "a transactional commit needs transactional_id, "
                              "producer_id and producer_epoch")  # fmt: skip
        tid = (
            parsing.identifier(str(parsing.get_str(body, "transactional_id")), "transactional_id")
            if txn_fields
            else None
        )
        pid, epoch = parsing.producer_identity(body) if txn_fields else (-1, -1)
        g = guard(request)
        if tid is not None:
            g.require(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid)
        g.require_topics(READ, (o.topic for o in offsets))

        async def call() -> dict[str, Any]:
            if tid is not None:
                res = await self.svc.txn_commit_offsets(group, tid, pid, epoch, offsets, generation, member_id)
            else:
                res = await self.svc.commit_offsets(group, offsets, generation, member_id)
            return {
                "group_id": group,
                "pending": res.pending,
                "offsets": [{"topic": o.topic, "partition": o.partition, "offset": o.offset} for o in offsets],
            }

        return await self._routed(request, raw, call)

    async def fetch_offsets(self, request: web.Request) -> web.Response:
        group = self._group(request)
        require_stable = _query_bool(request, "require_stable")
        raw_topics = request.query.get("topics")
        topics = {validate_topic_name(t) for t in raw_topics.split(",") if t} if raw_topics else None
        partitions = _partitions_query(request.query.get("partitions"))
        g = guard(request)

        async def call() -> dict[str, Any]:
            offsets = self.svc.fetch_offsets(group, topics, partitions=partitions, require_stable=require_stable)
            return {"group_id": group, "offsets": [o for o in offsets if g.may_describe(TOPIC, o["topic"])]}

        return await self._routed(request, b"", call)

    async def describe(self, request: web.Request) -> web.Response:
        group = self._group(request)
        g = guard(request)

        async def call() -> dict[str, Any]:
            d = self.svc.describe(group)
            for key in ("offsets", "pending_offsets"):
                d[key] = [o for o in d[key] if g.may_describe(TOPIC, o["topic"])]
            return d

        return await self._routed(request, b"", call)

    async def delete_group(self, request: web.Request) -> web.Response:
        group = self._group(request)

        async def call() -> dict[str, Any]:
            return await self.svc.delete_group(group)

        return await self._routed(request, b"", call)

    async def reset_offsets(self, request: web.Request) -> web.Response:
        group = self._group(request)
        raw, body = await self._body(request)
        topic = validate_topic_name(body.get("topic"))
        partitions = _reset_partitions(body)
        to = parse_reset_to(body.get("to"))
        dry_run = parsing.get_bool(body, "dry_run") if body.get("dry_run") is not None else True
        guard(request).require(READ, TOPIC, topic)

        async def call() -> dict[str, Any]:
            return await self.svc.reset_offsets(group, topic, partitions, to, execute=not dry_run)

        return await self._routed(request, raw, call)

    async def list_groups(self, request: web.Request) -> web.Response:
        g = guard(request)
        groups = self.svc.local_groups()
        errors = []
        for r in await self.forwarder.fan_out("/v1/internal/groups/list", {}):
            if "error" in r:
                errors.append(r["error"])
            else:
                groups.extend(r["groups"])
        shown = sorted((x for x in groups if g.may_describe(GROUP, x["group_id"])), key=lambda x: x["group_id"])
        return web.json_response({"groups": shown, "unreachable": errors})

    async def add_offsets_to_txn(self, request: web.Request) -> web.Response:
        """AddOffsetsToTxn: runs on the transaction coordinator of the transactional id."""
        tid = parsing.identifier(request.match_info["transactional_id"], "transactional_id")
        raw, body = await self._body(request)
        pid, epoch = parsing.producer_identity(body)
        group = parsing.identifier(str(parsing.get_str(body, "group_id")), "group_id")
        guard(request).require(READ, GROUP, group)

        async def call() -> dict[str, Any]:
            p = await self.svc.add_offsets_to_txn(tid, pid, epoch, group)
            return {"transactional_id": tid, "group_id": group, "topic": "__consumer_offsets", "partition": p}

        return await self._routed(request, raw, call)

    # ---- internal routes --------------------------------------------------------------------------

    async def internal_marker(self, request: web.Request) -> web.Response:
        require_internal(request)
        body = parsing.parse_json_object(await request.read())
        try:
            control = ControlType[str(body.get("control_type"))]
        except KeyError as exc:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "control_type must be COMMIT or ABORT") from exc
        pid, epoch = parsing.producer_identity(body)
        result = await self.svc.write_txn_marker_here(
            parsing.get_int(body, "partition", lo=0, hi=parsing.INT32_MAX),
            pid,
            epoch,
            parsing.get_int(body, "coordinator_epoch", lo=0),
            control,
            body.get("classic") is True,
        )
        return web.json_response({"log_append_time": result.log_append_time})

    async def internal_list(self, request: web.Request) -> web.Response:
        require_internal(request)
        return web.json_response({"groups": self.svc.local_groups()})

    async def internal_list_offsets(self, request: web.Request) -> web.Response:
        require_internal(request)
        body = parsing.parse_json_object(await request.read())
        topic = validate_topic_name(body.get("topic"))
        partition = parsing.get_int(body, "partition", lo=0, hi=parsing.INT32_MAX)
        ts = body.get("timestamp")
        timestamp = None if ts is None else parsing.get_int(body, "timestamp", lo=0, hi=parsing.INT64_MAX)
        found = await self.svc.offsets.local(topic, partition, timestamp)
        return web.json_response(log_offsets_json(found))
