"""Operating a cluster over HTTP: nodes, partition moves, decommission (API.md "Operating a cluster").

Requests that change the cluster go to the controller leader (a follower
proxies them once). ``GET /v1/reassignments`` is answered by any node: the
controller's record of every move, merged with the progress that the moving
groups' leaders report (``POST /v1/internal/reassignments/progress``, asked of
every node).
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from clients.protocol import BrokerError, ErrorCode

from ..controller_service import CONTROLLER_COMMAND_PATH
from ..security.acl import Operation, ResourceType
from . import parsing
from .access import Access, Need, RouteTable
from .forwarding import Forwarder
from .node_auth import require_internal
from .services import Services

__all__ = ["OperationRoutes"]

PROGRESS_PATH = "/v1/internal/reassignments/progress"
ALTER_CLUSTER = Access.user(Need(Operation.ALTER, ResourceType.CLUSTER))
DESCRIBE_CLUSTER = Access.user(Need(Operation.DESCRIBE, ResourceType.CLUSTER))
# Nodes may propose only what a node does on its own: finishing a move, the driver's node states.
_NODE_COMMANDS = frozenset({"complete_reassignment", "set_node_state"})


class OperationRoutes:
    def __init__(self, services: Services, forwarder: Forwarder) -> None:
        self.s = services
        self.ops = services.operations
        self.forwarder = forwarder

    def register(self, app: web.Application) -> None:
        r = RouteTable(app)
        r.get("/v1/nodes", self.list_nodes, DESCRIBE_CLUSTER)
        r.post("/v1/nodes", self.register_node, ALTER_CLUSTER)
        r.get("/v1/nodes/{node_id}", self.describe_node, DESCRIBE_CLUSTER)
        r.post("/v1/nodes/{node_id}/decommission", self.decommission, ALTER_CLUSTER)
        r.post("/v1/topics/{topic}/partitions/{partition}/reassign", self.reassign, ALTER_CLUSTER)
        r.delete("/v1/topics/{topic}/partitions/{partition}/reassign", self.cancel, ALTER_CLUSTER)
        r.get("/v1/reassignments", self.reassignments, DESCRIBE_CLUSTER)
        r.post(PROGRESS_PATH, self.internal_progress, Access.nodes())
        r.post(CONTROLLER_COMMAND_PATH, self.internal_command, Access.nodes())

    def _controller_url(self) -> str | None:
        return self.s.nodes.node_url(self.s.controller.leader_id())

    async def _at_controller(self, request: web.Request, raw: bytes, call: Any) -> web.Response:
        try:
            body, status = await call()
        except BrokerError as exc:
            if exc.error_code is ErrorCode.NOT_CONTROLLER:
                return await self.forwarder.to_controller(request, exc, raw, self._controller_url)
            raise
        return web.json_response(body, status=status)

    @staticmethod
    def _path_int(request: web.Request, name: str) -> int:
        raw = request.match_info[name]
        if not raw.isdigit() or len(raw) > 10:
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"{name} must be a non-negative integer")
        return int(raw)

    def _node_id(self, request: web.Request) -> int:
        return self._path_int(request, "node_id")

    def _partition(self, request: web.Request) -> int:
        return self._path_int(request, "partition")

    async def list_nodes(self, _request: web.Request) -> web.Response:
        return web.json_response({"nodes": self.ops.nodes_json()})

    async def describe_node(self, request: web.Request) -> web.Response:
        return web.json_response(self.ops.node_json(self._node_id(request)))

    async def register_node(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = parsing.parse_json_object(raw)

        async def call() -> tuple[Any, int]:
            rec = await self.ops.register_node(body)
            return {**rec.to_json(), "url": rec.address.url}, 201

        return await self._at_controller(request, raw, call)

    async def decommission(self, request: web.Request) -> web.Response:
        node_id = self._node_id(request)

        async def call() -> tuple[Any, int]:
            return await self.ops.decommission(node_id), 202

        return await self._at_controller(request, b"", call)

    async def reassign(self, request: web.Request) -> web.Response:
        topic, partition = request.match_info["topic"], self._partition(request)
        raw = await request.read()
        body = parsing.parse_json_object(raw)

        async def call() -> tuple[Any, int]:
            return await self.ops.reassign(topic, partition, body.get("replicas")), 202

        return await self._at_controller(request, raw, call)

    async def cancel(self, request: web.Request) -> web.Response:
        topic, partition = request.match_info["topic"], self._partition(request)

        async def call() -> tuple[Any, int]:
            return await self.ops.cancel(topic, partition), 200

        return await self._at_controller(request, b"", call)

    async def reassignments(self, _request: web.Request) -> web.Response:
        progress = self._local_progress()
        if self.s.controller.view.reassignments:
            for answer in await self.forwarder.fan_out(PROGRESS_PATH, {}):
                if isinstance(answer, dict):
                    for item in answer.get("moves", []):
                        if isinstance(item, dict) and isinstance(item.get("group_id"), str):
                            progress.setdefault(item["group_id"], item)
        return web.json_response({"reassignments": self.ops.reassignments_json(progress)})

    def _local_progress(self) -> dict[str, dict[str, Any]]:
        out = {}
        for move in self.s.controller.view.reassignments.values():
            report = self.s.reassignments.progress(move)
            if report is not None:
                out[move.group_id] = report
        return out

    async def internal_progress(self, request: web.Request) -> web.Response:
        require_internal(request)
        return web.json_response({"moves": list(self._local_progress().values())})

    async def internal_command(self, request: web.Request) -> web.Response:
        """A node proposes its own membership command (a finished move) at the controller leader."""
        require_internal(request)
        body = parsing.parse_json_object(await request.read())
        command = body.get("command")
        if not isinstance(command, dict) or command.get("op") not in _NODE_COMMANDS:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "not a command a node proposes")
        await self.s.controller.submit_command(json.dumps(command).encode())
        return web.json_response({"ok": True})
