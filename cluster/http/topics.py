"""Topics and cluster metadata: create, list, describe, delete; ``/v1/cluster`` and ``/v1/metadata``.

Admin requests reaching a node that does not lead the controller are proxied
once to the controller leader.
"""

from __future__ import annotations

from aiohttp import web

from clients.protocol import BrokerError, ErrorCode

from . import parsing
from .forwarding import Forwarder
from .services import Services

__all__ = ["TopicRoutes"]


class TopicRoutes:
    def __init__(self, services: Services, forwarder: Forwarder) -> None:
        self.s = services
        self.controller = services.controller
        self.forwarder = forwarder

    def register(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/v1/cluster", self.cluster)
        r.add_get("/v1/metadata", self.metadata)
        r.add_post("/v1/topics", self.create_topic)
        r.add_get("/v1/topics", self.list_topics)
        r.add_get("/v1/topics/{topic}", self.describe_topic)
        r.add_delete("/v1/topics/{topic}", self.delete_topic)

    def _controller_url(self) -> str | None:
        return self.s.nodes.node_url(self.controller.leader_id())

    async def cluster(self, _request: web.Request) -> web.Response:
        return web.json_response(self.controller.cluster_json())

    async def metadata(self, request: web.Request) -> web.Response:
        topics = request.query.get("topics")
        names = [t for t in topics.split(",") if t] if topics else None
        return web.json_response(self.controller.metadata_json(names))

    async def create_topic(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = parsing.parse_json_object(raw)
        cfg = self.s.config
        partitions = body.get("partitions", cfg.default_partitions)
        rf = body.get("replication_factor", min(cfg.default_replication_factor, len(cfg.nodes)))
        try:
            meta = await self.controller.create_topic(body.get("name"), partitions, rf, body.get("config"))
        except BrokerError as exc:
            if exc.error_code is ErrorCode.NOT_CONTROLLER:
                return await self.forwarder.to_controller(request, exc, raw, self._controller_url)
            raise
        return web.json_response(self.controller.topic_json(meta), status=201)

    async def list_topics(self, _request: web.Request) -> web.Response:
        return web.json_response({"topics": self.controller.topics_json()})

    async def describe_topic(self, request: web.Request) -> web.Response:
        meta = self.controller.topic(request.match_info["topic"])
        return web.json_response(self.controller.topic_json(meta))

    async def delete_topic(self, request: web.Request) -> web.Response:
        try:
            meta = await self.controller.delete_topic(request.match_info["topic"])
        except BrokerError as exc:
            if exc.error_code is ErrorCode.NOT_CONTROLLER:
                return await self.forwarder.to_controller(request, exc, b"", self._controller_url)
            raise
        return web.json_response({"name": meta.name, "deleted": True})
