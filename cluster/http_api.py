"""The HTTP API of a node (aiohttp). Thin adapters: parse, call the broker, map.

Error contract (API.md): every error is an HTTP status plus
``{"error_code", "message", "retriable", ...}``. Malformed input never causes
a 5xx, never changes state, and never stops the node; unknown routes and
wrong methods answer with a JSON ``error_code`` too.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from clients.aio._http1 import Http1Pool
from clients.partitioner import partition_for_key
from clients.protocol import (
    BATCHES_CONTENT_TYPE,
    PRODUCE_CONTENT_TYPE,
    BrokerError,
    ErrorCode,
    ProducePartition,
    ProduceRequest,
    Record,
    StoredBatch,
    decode_produce_request,
    decode_records,
    encode_batch,
    encode_fetch_batches,
    encode_produce_request,
)
from clients.txn_filter import visible_records

from . import parsing
from .broker import READ_COMMITTED, READ_UNCOMMITTED, Broker, PartitionProduceResult
from .group_http import GroupRoutes
from .metrics import NodeMetrics
from .openapi import openapi_document
from .peers import AUTH_HEADER, FORWARDED_HEADER, sign, verify
from .txn_http import TxnRoutes

_FORWARD_TIMEOUT_S = 35.0  # an internal call: longer than any wait a node does before answering one
_MAX_INTERNAL_ANSWER = 16 * 1024 * 1024
RETRY_BACKOFF_S = 0.1  # retry.backoff.ms: how often the convenience produce looks for a new leader


def _unwritten_for_want_of_a_leader(res: PartitionProduceResult) -> bool:
    """The partition answered "not the leader" before proposing anything (the answer names the
    leader it knows, possibly none): writing again cannot duplicate the records."""
    err = res.error
    return err is not None and err.error_code is ErrorCode.NOT_LEADER_OR_FOLLOWER and "leader_id" in err.extra


log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(exc: BrokerError, status: int | None = None) -> web.Response:
    return web.json_response(exc.to_json(), status=status or exc.error_code.http_status)


def _route_template(request: web.Request) -> str:
    route = request.match_info.route
    resource = route.resource
    if resource is None:
        return "unmatched"
    return resource.canonical


def make_middlewares(metrics: NodeMetrics) -> list[Any]:
    @web.middleware
    async def errors_and_metrics(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        route = _route_template(request)
        status = 500
        try:
            resp = await handler(request)
            status = resp.status
            return resp
        except BrokerError as exc:
            status = exc.error_code.http_status
            return error_response(exc)
        except web.HTTPRequestEntityTooLarge as exc:
            status = 413
            return error_response(BrokerError(ErrorCode.MESSAGE_TOO_LARGE, f"request body too large: {exc.text}"))
        except web.HTTPException as exc:
            status = exc.status
            if exc.status < 400:
                raise
            code = ErrorCode.INVALID_REQUEST
            msg = {404: "no such route", 405: f"method {request.method} not allowed here"}.get(exc.status, exc.reason)
            return error_response(BrokerError(code, msg), status=exc.status)
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            status = 499
            raise
        except Exception:
            log.exception("unhandled error in %s %s", request.method, route)
            status = 500
            return error_response(BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, "internal error"))
        finally:
            metrics.http_requests.labels(route, request.method, f"{status // 100}xx").inc()
            metrics.http_duration.labels(route, request.method).observe(time.perf_counter() - started)

    return [errors_and_metrics]


class Api:
    def __init__(self, broker: Broker, metrics: NodeMetrics) -> None:
        self.broker = broker
        self.metrics = metrics
        self._session: aiohttp.ClientSession | None = None
        self._pool: Http1Pool | None = None
        self._rr = itertools.count()
        broker._forward = self.forward_internal
        self.txn_routes = TxnRoutes(self)
        self.group_routes = GroupRoutes(self)

    # ---- plumbing -------------------------------------------------------------

    async def on_startup(self, _app: web.Application) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_FORWARD_TIMEOUT_S))
        self._pool = Http1Pool(max_body=_MAX_INTERNAL_ANSWER)

    async def on_cleanup(self, _app: web.Application) -> None:
        if self._pool is not None:
            await self._pool.close()
        if self._session is not None:
            await self._session.close()

    async def read_json(self, request: web.Request) -> dict[str, Any]:
        return parsing.parse_json_object(await request.read())

    async def forward_internal(self, node_id: int, method: str, path: str, body: Any) -> Any:
        """POST to another node's internal endpoint (HMAC-authenticated).

        Every internal call -- verifications and markers among them, several
        per transaction -- goes over a lean keep-alive pool (``Http1Pool``: a
        fraction of aiohttp's client CPU per request).
        """
        if method != "POST":
            raise ValueError(f"internal endpoints take POST, not {method}")
        url = self.broker.node_url(node_id)
        if url is None or self._pool is None:
            raise BrokerError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"node {node_id} unknown")
        auth = f"{AUTH_HEADER}: {sign(self.broker.config.cluster_secret, method, path)}\r\n".encode("latin-1")
        try:
            resp = await self._pool.post(url + path, json.dumps(body).encode(), "application/json",
                                         _FORWARD_TIMEOUT_S, auth)  # fmt: skip
            data = json.loads(resp.body)
        except (BrokerError, ValueError) as exc:
            raise BrokerError(ErrorCode.NETWORK_EXCEPTION, f"node {node_id} unreachable: {exc}") from exc
        if resp.status >= 400:
            if not isinstance(data, dict):
                raise BrokerError(ErrorCode.NETWORK_EXCEPTION, f"node {node_id}: HTTP {resp.status} without an error")
            raise BrokerError(ErrorCode.from_name(data.get("error_code", "")), data.get("message", ""))
        return data

    async def forward_to_controller(self, request: web.Request, exc: BrokerError, raw: bytes) -> web.Response:
        """Admin requests reaching a follower are proxied once to the controller leader."""
        leader_url = exc.extra.get("leader_url")
        if request.headers.get(FORWARDED_HEADER) or not leader_url or self._session is None:
            raise exc
        return await self.proxy(request, str(leader_url), raw, ErrorCode.NOT_CONTROLLER)

    async def proxy(self, request: web.Request, url: str, raw: bytes, unreachable: ErrorCode) -> web.Response:
        """Send ``request`` once to the node at ``url`` (marked forwarded, so it is never proxied again)."""
        if self._session is None:
            raise BrokerError(unreachable, "node is starting")
        try:
            async with self._session.request(
                request.method,
                url + request.rel_url.path_qs,
                data=raw,
                headers={FORWARDED_HEADER: "1", "Content-Type": "application/json"},
            ) as resp:
                body = await resp.read()
                return web.Response(body=body, status=resp.status, content_type="application/json")
        except (aiohttp.ClientError, TimeoutError) as e:
            raise BrokerError(unreachable, f"{url} unreachable: {e}") from e

    def require_internal(self, request: web.Request) -> None:
        signature = request.headers.get(AUTH_HEADER)
        # a valid signature is hex; hmac.compare_digest raises TypeError on non-ASCII str
        if signature is not None and not signature.isascii():
            signature = None
        if not verify(self.broker.config.cluster_secret, request.method, request.path, signature):
            raise BrokerError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "internal endpoint")

    # ---- health and metadata ---------------------------------------------------------

    async def livez(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, _request: web.Request) -> web.Response:
        b = self.broker
        checks = {"controller_leader_known": b.controller_leader_id() is not None, "draining": b.draining}
        if b.is_ready():
            return web.json_response({"status": "ready", "checks": checks})
        status = "draining" if b.draining else "booting"
        return web.json_response({"status": status, "checks": checks}, status=503)

    async def metrics_endpoint(self, _request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        resp = web.Response(body=body)
        resp.content_type = CONTENT_TYPE_LATEST.split(";")[0]
        resp.charset = "utf-8"
        return resp

    async def openapi(self, _request: web.Request) -> web.Response:
        return web.json_response(openapi_document())

    async def cluster(self, _request: web.Request) -> web.Response:
        return web.json_response(self.broker.cluster_json())

    async def metadata(self, request: web.Request) -> web.Response:
        topics = request.query.get("topics")
        names = [t for t in topics.split(",") if t] if topics else None
        return web.json_response(self.broker.metadata_json(names))

    async def internal_state(self, request: web.Request) -> web.Response:
        self.require_internal(request)
        return web.json_response(self.broker.internal_state_json())

    async def internal_producer_ids(self, request: web.Request) -> web.Response:
        self.require_internal(request)
        body = await self.read_json(request)
        node_id = parsing.get_int(body, "node_id", lo=0, hi=2**31 - 1)
        block = await self.broker.allocate_producer_ids_local(node_id)
        return web.json_response({"first": block.first, "size": block.size})

    # ---- topics -------------------------------------------------------------------

    async def create_topic(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = parsing.parse_json_object(raw)
        partitions = body.get("partitions", self.broker.config.default_partitions)
        rf = body.get(
            "replication_factor", min(self.broker.config.default_replication_factor, len(self.broker.config.nodes))
        )
        try:
            meta = await self.broker.create_topic(body.get("name"), partitions, rf, body.get("config"))
        except BrokerError as exc:
            if exc.error_code is ErrorCode.NOT_CONTROLLER:
                return await self.forward_to_controller(request, exc, raw)
            raise
        return web.json_response(self.broker.topic_json(meta), status=201)

    async def list_topics(self, _request: web.Request) -> web.Response:
        topics = sorted(self.broker.view.topics.values(), key=lambda m: m.name)
        return web.json_response(
            {
                "topics": [
                    {
                        "name": m.name,
                        "partitions": len(m.partitions),
                        "replication_factor": len(m.partitions[0].replicas) if m.partitions else 0,
                    }
                    for m in topics
                ]
            }
        )

    async def describe_topic(self, request: web.Request) -> web.Response:
        meta = self.broker.topic(request.match_info["topic"])
        return web.json_response(self.broker.topic_json(meta))

    async def delete_topic(self, request: web.Request) -> web.Response:
        try:
            meta = await self.broker.delete_topic(request.match_info["topic"])
        except BrokerError as exc:
            if exc.error_code is ErrorCode.NOT_CONTROLLER:
                return await self.forward_to_controller(request, exc, b"")
            raise
        return web.json_response({"name": meta.name, "deleted": True})

    # ---- producers -------------------------------------------------------------------

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
        if tid is not None:
            return await self.txn_routes.init_producer(request, raw, body, tid, timeout_ms)
        pid, epoch = await self.broker.init_producer_id()
        return web.json_response({"producer_id": pid, "producer_epoch": epoch})

    # ---- produce ------------------------------------------------------------------------

    @staticmethod
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

    async def produce(self, request: web.Request) -> web.Response:
        raw = await request.read()
        if request.content_type == PRODUCE_CONTENT_TYPE:
            req = decode_produce_request(raw)
        else:
            req = parsing.parse_json_produce(parsing.parse_json_object(raw))
        if not req.partitions:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "partitions must not be empty")
        return self.produce_response(await self.broker.produce(req))

    async def produce_records(self, request: web.Request) -> web.Response:
        """Convenience produce: records routed by key (murmur2) or round-robin, plain writes."""
        topic = request.match_info["topic"]
        meta = self.broker.topic(topic)
        body = await self.read_json(request)
        fmt = parsing.get_format(body)
        now = int(time.time() * 1000)
        items = parsing.get_list(body, "records", max_len=parsing.MAX_RECORDS_PER_BATCH)
        if not items:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "records must not be empty")
        timeout_ms = parsing.get_int(body, "timeout_ms", default=30_000, lo=1, hi=parsing.INT32_MAX)
        n = len(meta.partitions)
        by_partition: dict[int, list[tuple[int, Record]]] = {}
        sticky = next(self._rr) % n
        for i, item in enumerate(items):
            rec = parsing.parse_record(item, f"records[{i}]", fmt, now)
            assert isinstance(item, dict)
            if item.get("partition") is not None:
                part = parsing.get_int(item, "partition", lo=0, hi=2**31 - 1)
                if part >= n:
                    raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has no partition {part}")
            elif rec.key is not None:
                part = partition_for_key(rec.key, n)
            else:
                part = sticky
            by_partition.setdefault(part, []).append((i, rec))
        max_bytes = meta.config_int("max.message.bytes")
        parts = []
        for part, recs in sorted(by_partition.items()):
            batch = encode_batch([r for _, r in recs])
            if len(batch) > max_bytes:
                code = ErrorCode.RECORD_TOO_LARGE if len(recs) == 1 else ErrorCode.MESSAGE_TOO_LARGE
                raise BrokerError(code, f"{len(batch)} bytes for partition {part} exceed max.message.bytes={max_bytes}")
            parts.append(ProducePartition(topic, part, batch))
        results = await self._produce_routed(request, parts, timeout_ms)
        offsets: list[dict[str, Any]] = [{} for _ in items]
        for res in results:
            for k, (i, _rec) in enumerate(by_partition[res.partition]):
                entry: dict[str, Any] = {"partition": res.partition}
                if res.error is None:
                    entry["offset"] = res.base_offset + k
                else:
                    entry.update(res.error.to_json())
                offsets[i] = entry
        resp = self.produce_response(results)
        body_out = json.loads(resp.body)  # type: ignore[arg-type]
        body_out["offsets"] = offsets
        return web.json_response(body_out, status=resp.status)

    async def _produce_routed(
        self, request: web.Request, parts: list[ProducePartition], timeout_ms: int
    ) -> list[PartitionProduceResult]:
        """Write each partition on its leader, here or forwarded, like a producer with retries would.

        A partition whose leader is not known yet (an election under way, or this node not yet told
        of a new leader) is tried again every ``retry.backoff.ms`` until the request's timeout. Only
        answers that prove nothing was written are retried, so a plain write is never duplicated.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(timeout_ms, self.broker.config.request_timeout_ms) / 1000
        results = await self._produce_once(request, parts, timeout_ms)
        while not request.headers.get(FORWARDED_HEADER):
            pending = [i for i, res in enumerate(results) if _unwritten_for_want_of_a_leader(res)]
            if not pending or loop.time() + RETRY_BACKOFF_S >= deadline:
                break
            await asyncio.sleep(RETRY_BACKOFF_S)
            left_ms = max(1, int((deadline - loop.time()) * 1000))
            again = await self._produce_once(request, [parts[i] for i in pending], left_ms)
            for i, res in zip(pending, again, strict=True):
                results[i] = res
        return results

    async def _produce_once(
        self, request: web.Request, parts: list[ProducePartition], timeout_ms: int
    ) -> list[PartitionProduceResult]:
        results = await self.broker.produce(ProduceRequest(tuple(parts), timeout_ms=timeout_ms))
        return await self._forward_not_leader(request, results, parts)

    async def _forward_not_leader(
        self, request: web.Request, results: list[PartitionProduceResult], parts: list[ProducePartition]
    ) -> list[PartitionProduceResult]:
        """Send partitions this node does not lead to their leaders (once), for curl users."""
        if request.headers.get(FORWARDED_HEADER) or self._session is None:
            return results
        out = []
        for res, part in zip(results, parts, strict=True):
            url = res.error.extra.get("leader_url") if res.error else None
            if res.error is None or res.error.error_code is not ErrorCode.NOT_LEADER_OR_FOLLOWER or not url:
                out.append(res)
                continue
            try:
                async with self._session.post(
                    url + "/v1/produce",
                    data=encode_produce_request(ProduceRequest((part,))),
                    headers={FORWARDED_HEADER: "1", "Content-Type": PRODUCE_CONTENT_TYPE},
                ) as resp:
                    data = (await resp.json())["partitions"][0]
                err = None
                if data.get("error_code", "NONE") != "NONE":
                    extra = {k: data[k] for k in ("leader_id", "leader_url") if k in data}
                    err = BrokerError(ErrorCode.from_name(data["error_code"]), data.get("message") or "", **extra)
                out.append(
                    PartitionProduceResult(
                        part.topic, part.partition, int(data["base_offset"]), int(data["log_append_time"]), err
                    )
                )
            except aiohttp.ClientConnectorError:
                out.append(res)  # the request never left: nothing was written, the caller may retry
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError) as exc:
                err = BrokerError(
                    ErrorCode.NETWORK_EXCEPTION, f"forward to the leader failed ({exc!r}); it may be written"
                )
                out.append(PartitionProduceResult(part.topic, part.partition, -1, -1, err))
        return out

    # ---- fetch ----------------------------------------------------------------------------

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
        res = await self.broker.fetch(topic, partition, offset, max_bytes, max_wait, isolation)
        if fmt == "binary":
            body = encode_fetch_batches(
                res.high_watermark,
                res.last_stable_offset,
                res.log_start_offset,
                [(b.base_offset, b.log_append_time, b.data) for b in res.batches],
                res.aborted_transactions,
            )
            return web.Response(body=body, content_type=BATCHES_CONTENT_TYPE)
        out: dict[str, Any] = {
            "topic": topic,
            "partition": partition,
            "high_watermark": res.high_watermark,
            "last_stable_offset": res.last_stable_offset,
            "log_start_offset": res.log_start_offset,
        }
        if fmt == "batches":
            out["aborted_transactions"] = [{"producer_id": p, "first_offset": f} for p, f in res.aborted_transactions]
            out["batches"] = [_batch_json(b) for b in res.batches]
        else:
            out["records"] = [
                _record_json(off, rec)
                for off, rec in visible_records(res.batches, res.aborted_transactions, from_offset=offset)
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
    return [_record_json(b.base_offset + i, r) for i, r in enumerate(decode_records(b.data))]


def _batch_json(b: StoredBatch) -> dict[str, Any]:
    from clients.protocol import control_type_of

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


def make_app(broker: Broker, metrics: NodeMetrics) -> web.Application:
    api = Api(broker, metrics)
    app = web.Application(client_max_size=broker.config.max_request_bytes, middlewares=make_middlewares(metrics))
    app.on_startup.append(api.on_startup)
    app.on_cleanup.append(api.on_cleanup)
    r = app.router
    r.add_get("/livez", api.livez)
    r.add_get("/readyz", api.readyz)
    r.add_get("/metrics", api.metrics_endpoint)
    r.add_get("/v1/openapi.json", api.openapi)
    r.add_get("/v1/cluster", api.cluster)
    r.add_get("/v1/metadata", api.metadata)
    r.add_post("/v1/topics", api.create_topic)
    r.add_get("/v1/topics", api.list_topics)
    r.add_get("/v1/topics/{topic}", api.describe_topic)
    r.add_delete("/v1/topics/{topic}", api.delete_topic)
    r.add_post("/v1/topics/{topic}/records", api.produce_records)
    r.add_get("/v1/topics/{topic}/partitions/{partition}/records", api.fetch)
    r.add_post("/v1/producers/init", api.init_producer)
    r.add_post("/v1/produce", api.produce)
    api.txn_routes.register(app)
    api.group_routes.register(app)
    r.add_get("/v1/internal/state", api.internal_state)
    r.add_post("/v1/internal/producer-ids", api.internal_producer_ids)
    return app
