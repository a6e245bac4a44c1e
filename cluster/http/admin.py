"""Health, metrics, the OpenAPI document, and the node-to-node state, producer-id and relay endpoints."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from clients.protocol import BrokerError, ErrorCode

from ..controller_service import PRODUCER_IDS_PATH
from ..security.acl import Operation, ResourceType
from ..state_versions import EPOCH_MAX_LEN
from . import parsing
from .access import Access, Need, RouteTable
from .internal import RELAY_PATH
from .node_auth import require_internal
from .openapi import openapi_document
from .services import Services

__all__ = ["AdminRoutes"]

DESCRIBE_CLUSTER = Need(Operation.DESCRIBE, ResourceType.CLUSTER)
#: How long ``/readyz`` waits for the peers it asks afresh (``Readiness.refresh_readiness``).
READYZ_REFRESH_S = 0.5


class AdminRoutes:
    def __init__(self, services: Services) -> None:
        self.s = services

    def register(self, app: web.Application) -> None:
        r = RouteTable(app)
        sec = self.s.config.security
        r.get("/livez", self.livez, Access.open())
        r.get("/readyz", self.readyz, Access.open())
        metrics_open = sec is None or sec.metrics_public
        r.get("/metrics", self.metrics, Access.open() if metrics_open else Access.user(DESCRIBE_CLUSTER))
        r.get("/v1/openapi.json", self.openapi, Access.open())
        r.get("/v1/internal/state", self.internal_state, Access.nodes())
        r.post(PRODUCER_IDS_PATH, self.internal_producer_ids, Access.nodes())
        r.post(RELAY_PATH, self.internal_relay, Access.nodes())

    async def livez(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        """200 once the node serves requests (``Node.is_ready``), else 503; ``?verbose`` lists what is missing."""
        node = self.s.node
        # A leader elected since this node last polled it is asked now: not ready only by a view up to one
        # peer-poll interval old, the node answers 200 about half an interval sooner.
        await node.refresh_readiness(READYZ_REFRESH_S)
        missing = node.missing_groups()
        checks = {
            "controller_leader_known": self.s.controller.leader_known(),
            "internal_groups_led": not missing,
            "draining": node.draining,
        }
        ready = node.is_ready()
        body: dict[str, Any] = {"status": "ready" if ready else "draining" if node.draining else "booting"}
        body["checks"] = checks
        if "verbose" in request.query:
            body["missing_groups"] = missing
        return web.json_response(body, status=200 if ready else 503)

    async def metrics(self, _request: web.Request) -> web.Response:
        body = generate_latest(self.s.metrics.registry)
        resp = web.Response(body=body)
        resp.content_type = CONTENT_TYPE_LATEST.split(";")[0]
        resp.charset = "utf-8"
        return resp

    async def openapi(self, _request: web.Request) -> web.Response:
        return web.json_response(openapi_document())

    async def internal_state(self, request: web.Request) -> web.Response:
        require_internal(request)
        # ``epoch`` and ``since``: the version of this node's states the peer holds (``cluster.state_versions``)
        epoch = request.query.get("epoch") or None
        if epoch is not None and (len(epoch) > EPOCH_MAX_LEN or not epoch.isalnum()):
            raise BrokerError(ErrorCode.INVALID_REQUEST, "query parameter 'epoch' is not a state epoch")
        since = parsing.query_int(request.query, "since", default=-1, lo=0, hi=2**63 - 1) if epoch else None
        return web.json_response(self.s.node.internal_state_json(epoch, since))

    async def internal_producer_ids(self, request: web.Request) -> web.Response:
        require_internal(request)
        body = parsing.parse_json_object(await request.read())
        node_id = parsing.get_int(body, "node_id", lo=0, hi=2**31 - 1)
        block = await self.s.controller.allocate_producer_ids_local(node_id)
        return web.json_response({"first": block.first, "size": block.size})

    async def internal_relay(self, request: web.Request) -> web.Response:
        """Make another node's internal call for a node that cannot reach it (``cluster.http.internal``)."""
        require_internal(request)
        body = parsing.parse_json_object(await request.read())
        node_id = parsing.get_int(body, "node_id", lo=0, hi=2**31 - 1)
        path = parsing.get_str(body, "path", max_len=256) or ""
        inner = body.get("body")
        if not path.startswith("/v1/internal/") or path == RELAY_PATH or not isinstance(inner, dict):
            raise BrokerError(ErrorCode.INVALID_REQUEST, "a relay carries an internal path (not a relay) and a body")
        if node_id == self.s.config.node_id:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "a relay names another node")
        return web.json_response(await self.s.peers.call(node_id, path, inner, relay=False))
