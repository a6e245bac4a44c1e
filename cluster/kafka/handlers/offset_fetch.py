"""OffsetFetch (key 9): a group's committed offsets, the same state the HTTP offsets API reads.

Named partitions without a committed offset answer offset -1; no topics
(null, version 2 and up) means every partition the group committed, leaving
out the topics the caller may not DESCRIBE. With ``require_stable``
(version 7 and up, KIP-447) a partition whose transactional offset still
waits for its transaction's marker answers UNSTABLE_OFFSET_COMMIT (the
consumer retries), as the HTTP API's ``require_stable``. Version 8 and up
fetch several groups at once, each answered on its own (a client sends each
group to its coordinator). From version 5 each partition's committed leader
epoch comes back as OffsetCommit or TxnOffsetCommit stored it (-1 when none).
Versions 1-9 (10 names topics by id).

Authorization: DESCRIBE on the group, DESCRIBE on each topic.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import OffsetFetchRequest, OffsetFetchResponse

from clients.protocol import BrokerError, ErrorCode
from coordinator.metadata import TopicPartition

from ...security.acl import Operation, ResourceType
from ..api import KafkaApi, RequestContext, error_code
from ..group_requests import group_refusal

__all__ = ["API"]

#: (topic, partition) -> (offset, committed leader epoch, metadata, error code)
_Rows = dict[tuple[str, int], tuple[int, int, str, int]]


def _fetch(ctx: RequestContext, group_id: str, topics: list[Any] | None, require_stable: bool) -> tuple[int, _Rows]:
    """The group-level error code and the rows answered."""
    refusal = group_refusal(ctx, group_id, Operation.DESCRIBE)
    named = None if topics is None else [(t.name, p) for t in topics for p in t.partition_indexes]
    if refusal is not None:
        return refusal.code, {key: (-1, -1, "", refusal.code) for key in named or []}
    allowed = {t for t, _ in named or []} if named is not None else None
    denied = {t for t in allowed or () if not ctx.guard.allowed(Operation.DESCRIBE, ResourceType.TOPIC, t)}
    wanted = None if named is None else {TopicPartition(t, p) for t, p in named if t not in denied}
    svc = ctx.services.groups
    unstable: set[tuple[str, int]] = set()
    try:
        try:
            found = svc.committed_offsets(group_id, partitions=wanted, require_stable=require_stable)
        except BrokerError as exc:
            if exc.error_code is not ErrorCode.UNSTABLE_OFFSET_COMMIT:
                raise
            unstable = {(p["topic"], p["partition"]) for p in exc.extra.get("partitions", [])}
            found = svc.committed_offsets(group_id, partitions=wanted)
    except BrokerError as exc:
        code = error_code(exc)
        return code, {key: (-1, -1, "", code) for key in named or []}
    rows: _Rows = {}
    for key in named or []:
        rows[key] = (-1, -1, "", ErrorCode.TOPIC_AUTHORIZATION_FAILED.code if key[0] in denied else 0)
    for c in found:
        key = (c.topic, c.partition)
        if named is None and not ctx.guard.may_describe(ResourceType.TOPIC, key[0]):
            continue
        rows[key] = (c.offset, c.leader_epoch, c.metadata, 0)
    for key in unstable:
        rows[key] = (-1, -1, "", ErrorCode.UNSTABLE_OFFSET_COMMIT.code)
    return 0, rows


def _by_topic(rows: _Rows) -> dict[str, list[tuple[int, int, int, str, int]]]:
    out: dict[str, list[tuple[int, int, int, str, int]]] = {}
    for (topic, partition), (offset, epoch, metadata, code) in sorted(rows.items()):
        out.setdefault(topic, []).append((partition, offset, epoch, metadata, code))
    return out


async def handle(ctx: RequestContext, request: Any) -> Any:
    stable = ctx.api_version >= 7 and bool(request.require_stable)
    if ctx.api_version >= 8:
        G = OffsetFetchResponse.OffsetFetchResponseGroup
        T = G.OffsetFetchResponseTopics
        P = T.OffsetFetchResponsePartitions
        groups = []
        for g in request.groups:
            code, rows = _fetch(ctx, g.group_id, g.topics, stable)
            topics = [
                T(name=name, partitions=[P(partition_index=p, committed_offset=o, committed_leader_epoch=e,
                                           metadata=m, error_code=c) for p, o, e, m, c in parts])
                for name, parts in _by_topic(rows).items()
            ]  # fmt: skip
            groups.append(G(group_id=g.group_id, topics=topics, error_code=code))
        return OffsetFetchResponse(throttle_time_ms=0, groups=groups)
    T1 = OffsetFetchResponse.OffsetFetchResponseTopic
    P1 = T1.OffsetFetchResponsePartition
    code, rows = _fetch(ctx, request.group_id, request.topics, stable)
    topics = [
        T1(name=name, partitions=[P1(partition_index=p, committed_offset=o, committed_leader_epoch=e, metadata=m,
                                     error_code=c) for p, o, e, m, c in parts])
        for name, parts in _by_topic(rows).items()
    ]  # fmt: skip
    return OffsetFetchResponse(throttle_time_ms=0, topics=topics, error_code=code)


API = KafkaApi("OffsetFetch", OffsetFetchRequest, OffsetFetchResponse, 1, 9, handle)
