"""Records: produce (binary and JSON), the routed convenience produce, fetch, and InitProducerId."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

from aiohttp import web

from clients.protocol import (
    BATCHES_CONTENT_TYPE,
    PRODUCE_CONTENT_TYPE,
    BrokerError,
    ErrorCode,
    Record,
    StoredBatch,
    control_type_of,
    decode_produce_request,
    encode_fetch_batches,
)
from clients.txn_filter import visible_batches
from storage.kafka_batch import as_txbroker, batch_records

from ..partitions import (
    READ_COMMITTED,
    READ_REPLICA_ANY,
    READ_REPLICA_LEADER,
    READ_UNCOMMITTED,
    PartitionProduceResult,
)
from ..security.acl import CLUSTER_NAME, Operation, ResourceType
from . import parsing
from .access import Access, Need, RouteTable, guard
from .forwarding import Forwarder, forwarded
from .services import Services
from .transactions import TxnRoutes

__all__ = ["RecordRoutes", "produce_response"]

TOPIC = ResourceType.TOPIC

# A binary fetch answer carries a follower read's extra fields as headers (the JSON forms: as fields).
SERVED_BY_HEADER = "X-Txbroker-Served-By"
REPLICA_END_HEADER = "X-Txbroker-Replica-End-Offset"


def produce_response(results: list[PartitionProduceResult]) -> web.Response:
    body: dict[str, Any] = {"partitions": [r.to_json() for r in results]}
    errors = [r.error for r in results if r.error is not None]
    status = 200
    if errors and len(errors) == len(results) and len({e.error_code for e in errors}) == 1:
        # Every partition failed the same way: answer with that error's status and name
        # (per-partition details stay in "partitions").
        first = errors[0]
        status = first.error_code.http_status
        body.update(first.to_json())
    return web.json_response(body, status=status)


class RecordRoutes:
    def __init__(self, services: Services, forwarder: Forwarder, txn_routes: TxnRoutes) -> None:
        self.s = services
        self.forwarder = forwarder
        self.txn_routes = txn_routes

    def register(self, app: web.Application) -> None:
        r = RouteTable(app)
        r.post("/v1/topics/{topic}/records", self.produce_records, Access.user(Need(Operation.WRITE, TOPIC, "topic")))
        r.get("/v1/topics/{topic}/partitions/{partition}/records", self.fetch,
              Access.user(Need(Operation.READ, TOPIC, "topic")))  # fmt: skip
        r.post(
            "/v1/producers/init",
            self.init_producer,
            Access.user(
                body="WRITE on the transactional id; without one IDEMPOTENT_WRITE on CLUSTER or WRITE on some topic"
            ),
        )
        r.post("/v1/produce", self.produce, Access.user(
            body="WRITE on each topic, and on the transactional id of a transactional produce"))  # fmt: skip

    async def init_producer(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = parsing.parse_json_object(raw) if raw.strip() else {}
        tid = parsing.get_str(body, "transactional_id", required=False, max_len=2**15 - 1)
        if tid == "":
            # Kafka's InitProducerId answers INVALID_REQUEST for an empty transactional id
            raise BrokerError(ErrorCode.INVALID_REQUEST, "transactional_id must not be empty (use null)")
        timeout_ms = body.get("transaction_timeout_ms", 60_000)
        if timeout_ms is None:
            timeout_ms = 60_000
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int):
            raise BrokerError(ErrorCode.INVALID_REQUEST, "transaction_timeout_ms must be an integer")
        if not 1 <= timeout_ms <= parsing.INT32_MAX:
            raise BrokerError(
                ErrorCode.INVALID_TRANSACTION_TIMEOUT,
                f"transaction_timeout_ms must be between 1 and {parsing.INT32_MAX}",
            )
        g = guard(request)
        if tid is not None:
            g.require(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid)
            return await self.txn_routes.init_producer(request, raw, body, tid, timeout_ms)
        if not g.allowed(Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME) and not g.may_on_some(
            Operation.WRITE, TOPIC
        ):
            raise BrokerError(
                ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                f"{g.principal} needs IDEMPOTENT_WRITE on the cluster or WRITE on some topic",
            )
        pid = await self.s.producer_ids.next_producer_id()
        self.s.metrics.producer_ids_allocated.inc()
        return web.json_response({"producer_id": pid, "producer_epoch": 0})

    async def produce(self, request: web.Request) -> web.Response:
        raw = await request.read()
        if request.content_type == PRODUCE_CONTENT_TYPE:
            req = decode_produce_request(raw)
        else:
            req = parsing.parse_json_produce(parsing.parse_json_object(raw))
        if not req.partitions:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "partitions must not be empty")
        g = guard(request)
        if req.transactional_id is not None:
            g.require(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, req.transactional_id)
        g.require_topics(Operation.WRITE, (p.topic for p in req.partitions))
        return produce_response(await self.s.partitions.produce(req))

    async def produce_records(self, request: web.Request) -> web.Response:
        """Convenience produce: records routed by key (murmur2) or round-robin, plain writes."""
        topic = request.match_info["topic"]
        n = len(self.s.controller.topic(topic).partitions)
        body = parsing.parse_json_object(await request.read())
        fmt = parsing.get_format(body)
        now = int(time.time() * 1000)
        items = parsing.get_list(body, "records", max_len=parsing.MAX_RECORDS_PER_BATCH)
        if not items:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "records must not be empty")
        timeout_ms = parsing.get_int(body, "timeout_ms", default=30_000, lo=1, hi=parsing.INT32_MAX)
        records: list[tuple[Record, int | None]] = []
        for i, item in enumerate(items):
            rec = parsing.parse_record(item, f"records[{i}]", fmt, now)
            assert isinstance(item, dict)
            explicit = None
            if item.get("partition") is not None:
                explicit = parsing.get_int(item, "partition", lo=0, hi=2**31 - 1)
                if explicit >= n:
                    raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has no partition {explicit}")
            records.append((rec, explicit))
        out = await self.s.routed.produce_records(
            topic, records, timeout_ms, None if forwarded(request) else self.forwarder.acting_for(request)
        )
        resp = produce_response(out.results)
        body_out = json.loads(resp.body)  # type: ignore[arg-type]
        body_out["offsets"] = out.records
        return web.json_response(body_out, status=resp.status)

    async def fetch(self, request: web.Request) -> web.StreamResponse:
        q = request.query
        topic = request.match_info["topic"]
        partition = parsing.parse_decimal(request.match_info["partition"], "partition", lo=-(2**31), hi=2**31 - 1)
        offset = parsing.query_int(q, "offset", default=None, lo=0, hi=parsing.INT64_MAX)
        max_bytes = parsing.query_int(q, "max_bytes", default=1 << 20, lo=1, hi=64 << 20)
        max_wait = parsing.query_int(q, "max_wait_ms", default=0, lo=0, hi=parsing.INT32_MAX)
        isolation = q.get("isolation", READ_UNCOMMITTED)
        if isolation not in (READ_COMMITTED, READ_UNCOMMITTED):
            raise BrokerError(ErrorCode.INVALID_REQUEST, "isolation must be read_committed or read_uncommitted")
        fmt = q.get("format", "json")
        if fmt not in ("json", "batches", "binary"):
            raise BrokerError(ErrorCode.INVALID_REQUEST, "format must be json, batches or binary")
        read_replica = q.get("read_replica", READ_REPLICA_LEADER)
        if read_replica not in (READ_REPLICA_LEADER, READ_REPLICA_ANY):
            raise BrokerError(ErrorCode.INVALID_REQUEST, "read_replica must be leader or any")
        res = await self.s.partitions.fetch(topic, partition, offset, max_bytes, max_wait, isolation, read_replica)
        if fmt == "binary":
            body = encode_fetch_batches(
                res.high_watermark,
                res.last_stable_offset,
                res.log_start_offset,
                [(b.base_offset, b.log_append_time, as_txbroker(b).data) for b in res.batches],
                res.aborted_transactions,
            )
            headers = {}
            if res.served_by is not None:
                headers = {SERVED_BY_HEADER: str(res.served_by), REPLICA_END_HEADER: str(res.replica_end_offset)}
            return web.Response(body=body, content_type=BATCHES_CONTENT_TYPE, headers=headers)
        out: dict[str, Any] = {
            "topic": topic,
            "partition": partition,
            "high_watermark": res.high_watermark,
            "last_stable_offset": res.last_stable_offset,
            "log_start_offset": res.log_start_offset,
        }
        if res.served_by is not None:
            out["served_by"] = res.served_by
            out["replica_end_offset"] = res.replica_end_offset
        if fmt == "batches":
            out["aborted_transactions"] = [{"producer_id": p, "first_offset": f} for p, f in res.aborted_transactions]
            out["batches"] = [_batch_json(b) for b in res.batches]
        else:
            out["records"] = [
                _record_json(b.base_offset + i, rec)
                for b in visible_batches(res.batches, res.aborted_transactions)
                for i, rec in enumerate(batch_records(b))
                if b.base_offset + i >= offset
            ]
        out["next_offset"] = res.batches[-1].last_offset + 1 if res.batches else offset
        return web.json_response(out)


def _b64(v: bytes | None) -> str | None:
    return None if v is None else base64.b64encode(v).decode("ascii")


def _record_json(offset: int, r: Record) -> dict[str, Any]:
    return {
        "offset": offset,
        "timestamp": r.timestamp,
        "key": _b64(r.key),
        "value": _b64(r.value),
        "headers": [{"key": k, "value": _b64(v)} for k, v in r.headers],
    }


def _records_json(b: StoredBatch) -> list[dict[str, Any]]:
    return [_record_json(b.base_offset + i, r) for i, r in enumerate(batch_records(b))]


def _batch_json(b: StoredBatch) -> dict[str, Any]:
    ctype = control_type_of(b.data) if b.header.is_control else None
    return {
        "base_offset": b.base_offset,
        "last_offset": b.last_offset,
        "producer_id": b.header.producer_id,
        "producer_epoch": b.header.producer_epoch,
        "base_sequence": b.header.base_sequence,
        "is_transactional": b.header.is_transactional,
        "is_control": b.header.is_control,
        "control_type": ctype.name if ctype is not None else None,
        "log_append_time": b.log_append_time,
        "records": _records_json(b),
    }
