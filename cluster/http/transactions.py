"""HTTP routes of the transaction API (API.md "Producer ids and transactions") and their internal twins.

A request for transactional id T may reach any node: if this node is not T's
coordinator it is proxied once to the coordinator (a signed node call, never
proxied again); a client may also ask ``GET /v1/coordinators/transaction/T`` and
go there directly. Listing and abort-by-prefix fan out to every node, each
answering for the coordinator partitions it leads.

Internal endpoints (``/v1/internal/txn/*``) accept only signed node calls
(``cluster.http.node_auth.require_internal``); coordinators use them to write markers on partition leaders and to
drive commit-group members on other coordinators.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiohttp import web

from clients.protocol import BrokerError, ControlType, ErrorCode, decode_token, encode_token
from coordinator.commands import MAX_ID_BYTES, GroupMember
from coordinator.metadata import TopicPartition
from coordinator.states import TransactionState

from ..partitions import MARKER_PATH
from ..security.acl import CLUSTER_NAME, Operation, ResourceType
from ..txn.verification import VERIFY_PATH
from . import parsing
from .access import Access, AnyOf, Need, RouteTable, guard
from .forwarding import Forwarder, Locate
from .node_auth import require_internal
from .services import Services

__all__ = ["TxnRoutes"]

DESCRIBE, WRITE, TXN = Operation.DESCRIBE, Operation.WRITE, ResourceType.TRANSACTIONAL_ID

_MAX_PARTITIONS = 10_000
_MAX_MEMBERS = 10_000


def _partition_items(body: dict[str, Any], key: str, max_len: int) -> list[tuple[TopicPartition, dict[str, Any]]]:
    """``body[key]``: a list of objects naming a topic and partition; each with its partition."""
    out = []
    for i, item in enumerate(parsing.get_list(body, key, max_len=max_len)):
        if not isinstance(item, dict):
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"{key}[{i}] must be an object")
        topic = parsing.get_str(item, "topic", max_len=249)
        assert topic is not None
        out.append((TopicPartition(topic, parsing.get_int(item, "partition", lo=0, hi=2**31 - 1)), item))
    return out


def _topic_partitions(body: dict[str, Any]) -> list[TopicPartition]:
    return [tp for tp, _ in _partition_items(body, "partitions", _MAX_PARTITIONS)]


def _partitions_json(tps: Iterable[TopicPartition]) -> list[dict[str, Any]]:
    return [{"topic": tp.topic, "partition": tp.partition} for tp in tps]


def _states(raw: str | None) -> set[TransactionState] | None:
    if not raw:
        return None
    try:
        return {TransactionState.from_name(s) for s in raw.split(",") if s}
    except ValueError as exc:
        raise BrokerError(ErrorCode.INVALID_REQUEST, str(exc)) from exc


class TxnRoutes:
    def __init__(self, services: Services, forwarder: Forwarder) -> None:
        self.s = services
        self.txn = services.txn
        self.forwarder = forwarder

    def register(self, app: web.Application) -> None:
        r = RouteTable(app)
        txn = "transactional_id"
        r.get(
            "/v1/coordinators/transaction/{transactional_id}",
            self.find_coordinator,
            Access.user(Need(DESCRIBE, TXN, txn)),
        )
        r.get(
            "/v1/topics/{topic}/partitions/{partition}/producers",
            self.describe_producers,
            Access.user(Need(Operation.READ, ResourceType.TOPIC, "topic")),
        )
        r.get("/v1/transactions", self.list_transactions, Access.user(body="DESCRIBE on each transactional id listed"))
        r.get("/v1/transactions/{transactional_id}", self.describe, Access.user(Need(DESCRIBE, TXN, txn)))
        r.post(
            "/v1/transactions/{transactional_id}/partitions",
            self.add_partitions,
            Access.user(Need(WRITE, TXN, txn), body="WRITE on each topic"),
        )
        r.post("/v1/transactions/{transactional_id}/end", self.end, Access.user(Need(WRITE, TXN, txn)))
        r.post("/v1/transactions/{transactional_id}/prepare", self.prepare, Access.user(Need(WRITE, TXN, txn)))
        r.post(
            "/v1/transactions/{transactional_id}/release",
            self.release,
            Access.user(Need(WRITE, TXN, txn), body="WRITE on each topic"),
        )
        r.post(
            "/v1/transactions/{transactional_id}/abort",
            self.abort,
            Access.user(AnyOf((Need(WRITE, TXN, txn), Need(Operation.ALTER, ResourceType.CLUSTER)))),
        )
        r.post(
            "/v1/transaction-groups/{group_id}/end",
            self.group_end,
            Access.user(body="WRITE on every member's transactional id (no members: ALTER on CLUSTER)"),
        )
        r.post(
            "/v1/transactions-by-prefix/abort",
            self.abort_prefix,
            Access.user(Need(Operation.ALTER, ResourceType.CLUSTER)),
        )
        for path, handler in (
            (MARKER_PATH, self.internal_marker),
            (VERIFY_PATH, self.internal_verify),
            ("/v1/internal/txn/bind", self.internal_bind),
            ("/v1/internal/txn/resolve", self.internal_resolve),
            ("/v1/internal/txn/decide", self.internal_decide),
            ("/v1/internal/txn/list", self.internal_list),
            ("/v1/internal/txn/abort-prefix", self.internal_abort_prefix),
        ):
            r.post(path, handler, Access.nodes())

    # ---- plumbing -----------------------------------------------------------------------------

    async def _routed(
        self, request: web.Request, raw: bytes, call: Callable[[], Awaitable[dict[str, Any]]], key: str | None = None
    ) -> web.Response:
        """``Forwarder.routed``; the coordinator of ``key`` (default: the path's id) is located anew on retries."""
        key = key or request.match_info.get("transactional_id") or request.match_info.get("group_id")
        return await self.forwarder.routed(request, raw, call, self.locate(key) if key else None)

    def locate(self, key: str) -> Locate:
        """Where the transaction coordinator of ``key`` is, as this node knows now."""
        partition = self.txn.partition_for(key)
        return lambda: self.txn.groups.coordinator_url(partition)

    async def _body(self, request: web.Request) -> tuple[bytes, dict[str, Any]]:
        raw = await request.read()
        return raw, parsing.parse_json_object(raw) if raw.strip() else {}

    def _tid(self, request: web.Request) -> str:
        return parsing.identifier(request.match_info["transactional_id"], "transactional_id")

    # ---- public routes ---------------------------------------------------------------------------

    async def init_producer(self, request: web.Request, raw: bytes, body: dict[str, Any], tid: str,
                            timeout_ms: int) -> web.Response:  # fmt: skip
        """InitProducerId with a transactional id (called by ``Api.init_producer``)."""
        pid = body.get("producer_id")
        epoch = body.get("producer_epoch")
        expected: tuple[int, int] | tuple[None, None] = (None, None)
        if (pid is not None or epoch is not None) and not (pid == -1 and epoch in (-1, None)):
            expected = parsing.producer_identity(body)

        async def call() -> dict[str, Any]:
            p, e = await self.txn.init_producer_id(tid, timeout_ms, *expected)
            return {"producer_id": p, "producer_epoch": e}

        return await self._routed(request, raw, call, tid)

    async def find_coordinator(self, request: web.Request) -> web.Response:
        return web.json_response(self.txn.coordinator_json(self._tid(request)))

    async def describe_producers(self, request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        partition = parsing.parse_decimal(request.match_info["partition"], "partition", lo=0, hi=2**31 - 1)
        try:
            producers = self.s.partitions.describe_producers(topic, partition)
        except BrokerError as exc:
            return await self.forwarder.to_leader(request, exc, b"", lambda: self._leader_url(topic, partition))
        return web.json_response({"topic": topic, "partition": partition, "producers": producers})

    def _leader_url(self, topic: str, partition: int) -> str | None:
        try:
            meta = self.s.controller.topic(topic)
        except BrokerError:
            return None
        return self.s.nodes.node_url(self.s.controller.partition_leader(meta, partition))

    async def describe(self, request: web.Request) -> web.Response:
        tid = self._tid(request)

        async def call() -> dict[str, Any]:
            return self.txn.describe(tid)

        return await self._routed(request, b"", call)

    async def list_transactions(self, request: web.Request) -> web.Response:
        states = _states(request.query.get("state"))
        prefix = request.query.get("prefix", "")
        local = self.txn.local_transactions(states)
        remote = await self.forwarder.fan_out("/v1/internal/txn/list", {"state": request.query.get("state", "")})
        errors = []
        for r in remote:
            if "error" in r:
                errors.append(r["error"])
            else:
                local.extend(r["transactions"])
        g = guard(request)
        txns = sorted((t for t in local if t["transactional_id"].startswith(prefix)
                       and g.may_describe(TXN, t["transactional_id"])),
                      key=lambda t: t["transactional_id"])  # fmt: skip
        return web.json_response({"transactions": txns, "unreachable": errors})

    async def _on_partitions(
        self,
        request: web.Request,
        key: str,
        op: Callable[[str, int, int, list[TopicPartition]], Awaitable[Iterable[TopicPartition]]],
    ) -> web.Response:
        """A call naming (producer id, epoch) and a list of partitions, answered with the partitions ``op`` did."""
        tid = self._tid(request)
        raw, body = await self._body(request)
        pid, epoch = parsing.producer_identity(body)
        tps = _topic_partitions(body)
        guard(request).require_topics(WRITE, (tp.topic for tp in tps))

        async def call() -> dict[str, Any]:
            return {"transactional_id": tid, key: _partitions_json(await op(tid, pid, epoch, tps))}

        return await self._routed(request, raw, call)

    async def add_partitions(self, request: web.Request) -> web.Response:
        async def add(tid: str, pid: int, epoch: int, tps: list[TopicPartition]) -> Iterable[TopicPartition]:
            return (await self.txn.add_partitions(tid, pid, epoch, tps)).added

        return await self._on_partitions(request, "added", add)

    async def end(self, request: web.Request) -> web.Response:
        tid = self._tid(request)
        raw, body = await self._body(request)
        pid, epoch = parsing.producer_identity(body)
        commit = parsing.get_bool(body, "commit")
        wait = parsing.get_bool(body, "wait_for_completion") if "wait_for_completion" in body else False
        receipts = _receipts(body)

        async def call() -> dict[str, Any]:
            answer = await self.txn.end_txn(tid, pid, epoch, commit, wait_for_completion=wait, receipts=receipts)
            res = answer.result
            out: dict[str, Any] = {
                "transactional_id": tid,
                "committed": res.commit,
                "producer_id": res.producer_id,
                "producer_epoch": res.producer_epoch,
                "state": answer.state.display_name,
            }
            if receipts is not None:  # carried markers: the next transaction's tokens (possibly none)
                out["txn_tokens"] = [{"topic": tp.topic, "partition": tp.partition, "token": encode_token(tok)}
                                     for tp, tok in sorted(answer.tokens.items())]  # fmt: skip
            return out

        return await self._routed(request, raw, call)

    async def release(self, request: web.Request) -> web.Response:
        """Carried markers: tokens the client will not use; the coordinator settles those partitions now."""
        return await self._on_partitions(request, "released", self.txn.release)

    async def prepare(self, request: web.Request) -> web.Response:
        tid = self._tid(request)
        raw, body = await self._body(request)
        pid, epoch = parsing.producer_identity(body)
        group = parsing.get_str(body, "group_id", required=False, max_len=MAX_ID_BYTES)

        async def call() -> dict[str, Any]:
            res = await self.txn.prepare(
                tid, pid, epoch, parsing.identifier(group, "group_id") if group is not None else None
            )
            return {
                "transactional_id": tid,
                "producer_id": res.producer_id,
                "producer_epoch": res.producer_epoch,
                "prepared_ms": res.prepared_ms,
                "group_id": res.group_id,
            }

        return await self._routed(request, raw, call)

    async def abort(self, request: web.Request) -> web.Response:
        tid = self._tid(request)

        async def call() -> dict[str, Any]:
            return (await self.txn.abort(tid)).describe()

        return await self._routed(request, await request.read(), call)

    async def group_end(self, request: web.Request) -> web.Response:
        group = parsing.identifier(request.match_info["group_id"], "group_id")
        raw, body = await self._body(request)
        commit = parsing.get_bool(body, "commit")
        members = []
        for i, m in enumerate(parsing.get_list(body, "members", max_len=_MAX_MEMBERS)):
            if not isinstance(m, dict):
                raise BrokerError(ErrorCode.INVALID_REQUEST, f"members[{i}] must be an object")
            tid = parsing.get_str(m, "transactional_id", max_len=MAX_ID_BYTES)
            assert tid is not None
            pid, epoch = parsing.producer_identity(m)
            members.append(GroupMember(parsing.identifier(tid, "transactional_id"), pid, epoch))
        if commit and not members:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "a commit decision needs at least one member")
        g = guard(request)
        if not members:
            g.require(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME)
        for m in members:
            g.require(WRITE, TXN, m.transactional_id)

        async def call() -> dict[str, Any]:
            self.txn.leading(group)  # NOT_COORDINATOR before any side effect elsewhere
            decision = await self.txn.group_commit(group, members, commit)
            return {
                "group_id": group,
                "committed": decision.commit,
                "members": [
                    {"transactional_id": m.transactional_id, "producer_id": m.producer_id,
                     "producer_epoch": m.producer_epoch}
                    for m in decision.members
                ],
                "pending": [m.transactional_id for m in decision.pending],
            }  # fmt: skip

        return await self._routed(request, raw, call)

    async def abort_prefix(self, request: web.Request) -> web.Response:
        _raw, body = await self._body(request)
        prefix = parsing.get_str(body, "prefix", max_len=MAX_ID_BYTES)
        assert prefix is not None
        if not prefix:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "prefix must not be empty")
        aborted = await self._abort_local_prefix(prefix)
        errors = []
        for r in await self.forwarder.fan_out("/v1/internal/txn/abort-prefix", {"prefix": prefix}):
            if "error" in r:
                errors.append(r["error"])
            else:
                aborted.extend(r["aborted"])
        return web.json_response({"aborted": sorted(aborted), "unreachable": errors})

    async def _abort_local_prefix(self, prefix: str) -> list[str]:
        out = []
        for meta in self.txn.prefix_matches(prefix):
            try:
                await self.txn.abort(meta.transactional_id)
                out.append(meta.transactional_id)
            except BrokerError:
                continue
        return out

    # ---- internal routes --------------------------------------------------------------------------

    async def _internal_body(self, request: web.Request) -> dict[str, Any]:
        require_internal(request)
        return parsing.parse_json_object(await request.read())

    async def internal_marker(self, request: web.Request) -> web.Response:
        body = await self._internal_body(request)
        topic = parsing.get_str(body, "topic", max_len=249)
        assert topic is not None
        try:
            control = ControlType[str(body.get("control_type"))]
        except KeyError as exc:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "control_type must be COMMIT or ABORT") from exc
        pid, epoch = parsing.producer_identity(body)
        args = (topic, parsing.get_int(body, "partition", lo=0, hi=2**31 - 1), pid, epoch,
                parsing.get_int(body, "coordinator_epoch", lo=0), control)  # fmt: skip
        out: dict[str, Any] = {}
        if body.get("revoke") is True:  # a revoking marker (docs/carried-markers.md): "used", or what it wrote
            revoked = await self.s.markers.revoke_txn_marker(*args)
            out["used"] = revoked.marker is None
            if revoked.marker is None:
                return web.json_response(out)
            result = revoked.marker
        else:
            result = await self.s.markers.write_txn_marker(*args, classic=body.get("classic") is True)
        out.update(offset=result.offset, txn_first_offset=result.txn_first_offset,
                   log_append_time=result.log_append_time)  # fmt: skip
        return web.json_response(out)

    async def internal_verify(self, request: web.Request) -> web.Response:
        body = await self._internal_body(request)
        tid = parsing.get_str(body, "transactional_id", max_len=MAX_ID_BYTES)
        topic = parsing.get_str(body, "topic", max_len=249)
        assert tid is not None
        assert topic is not None
        pid, epoch = parsing.producer_identity(body)
        partition = parsing.get_int(body, "partition", lo=0, hi=2**31 - 1)
        await self.txn.verify_here(tid, pid, epoch, topic, partition, add=body.get("verify_only") is not True)
        return web.json_response({"ok": True})

    def _member(self, body: dict[str, Any]) -> GroupMember:
        tid = parsing.get_str(body, "transactional_id", max_len=MAX_ID_BYTES)
        assert tid is not None
        pid, epoch = parsing.producer_identity(body)
        return GroupMember(tid, pid, epoch)

    async def internal_bind(self, request: web.Request) -> web.Response:
        body = await self._internal_body(request)
        group = parsing.get_str(body, "group_id", max_len=MAX_ID_BYTES)
        assert group is not None
        await self.txn.bind_prepared(self._member(body), group)
        return web.json_response({"ok": True})

    async def internal_resolve(self, request: web.Request) -> web.Response:
        body = await self._internal_body(request)
        group = parsing.get_str(body, "group_id", max_len=MAX_ID_BYTES)
        assert group is not None
        res = await self.txn.resolve_prepared(self._member(body), group, parsing.get_bool(body, "commit"))
        return web.json_response({"producer_id": res.producer_id, "producer_epoch": res.producer_epoch})

    async def internal_decide(self, request: web.Request) -> web.Response:
        body = await self._internal_body(request)
        group = parsing.get_str(body, "group_id", max_len=MAX_ID_BYTES)
        assert group is not None
        decision = await self.txn.group_commit(group, [], parsing.get_bool(body, "commit"))
        members = [
            {"transactional_id": m.transactional_id, "producer_id": m.producer_id, "producer_epoch": m.producer_epoch}
            for m in decision.members
        ]
        return web.json_response({"committed": decision.commit, "members": members})

    async def internal_list(self, request: web.Request) -> web.Response:
        body = await self._internal_body(request)
        state = body.get("state")
        return web.json_response(
            {"transactions": self.txn.local_transactions(_states(state if isinstance(state, str) else None))}
        )

    async def internal_abort_prefix(self, request: web.Request) -> web.Response:
        body = await self._internal_body(request)
        prefix = parsing.get_str(body, "prefix", max_len=MAX_ID_BYTES)
        assert prefix is not None
        return web.json_response({"aborted": await self._abort_local_prefix(prefix)})


_MAX_RECEIPTS = 10_000


def _receipts(body: dict[str, Any]) -> dict[TopicPartition, bytes] | None:
    """EndTxn's ``txn_receipts`` (carried markers, docs/carried-markers.md); None when the client sent none."""
    if body.get("txn_receipts") is None:
        return None
    out: dict[TopicPartition, bytes] = {}
    for i, (tp, item) in enumerate(_partition_items(body, "txn_receipts", _MAX_RECEIPTS)):
        receipt = parsing.get_str(item, "receipt", max_len=64)
        assert receipt is not None
        out[tp] = decode_token(receipt, f"txn_receipts[{i}].receipt")
    return out
