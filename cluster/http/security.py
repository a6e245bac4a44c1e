"""Users (SCRAM credentials), ACLs and ``whoami``: thin adapters over the controller's replicated security state.

Changes are controller commands: a node that does not lead the controller
proxies them once to the leader, which answers after every live node has
applied the change (so a changed password stops working everywhere at once).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from clients.protocol import BrokerError, ErrorCode

from ..security.acl import AclBinding, AclFilter, Operation, ResourceType
from . import parsing
from .access import Access, Need, RouteTable, guard
from .forwarding import Forwarder
from .services import Services

__all__ = ["SecurityRoutes"]

ALTER_CLUSTER = Access.user(Need(Operation.ALTER, ResourceType.CLUSTER))
DESCRIBE_CLUSTER = Access.user(Need(Operation.DESCRIBE, ResourceType.CLUSTER))
_MAX_ACLS_PER_REQUEST = 1000


class SecurityRoutes:
    def __init__(self, services: Services, forwarder: Forwarder) -> None:
        self.s = services
        self.controller = services.controller
        self.forwarder = forwarder

    def register(self, app: web.Application) -> None:
        r = RouteTable(app)
        r.get("/v1/whoami", self.whoami, Access.user())
        r.get("/v1/users", self.list_users, DESCRIBE_CLUSTER)
        r.put("/v1/users/{name}", self.upsert_user, ALTER_CLUSTER)
        r.delete("/v1/users/{name}", self.delete_user, ALTER_CLUSTER)
        r.get("/v1/acls", self.describe_acls, DESCRIBE_CLUSTER)
        r.post("/v1/acls", self.create_acls, ALTER_CLUSTER)
        r.delete("/v1/acls", self.delete_acls, ALTER_CLUSTER)

    async def _at_controller(
        self, request: web.Request, raw: bytes, call: Callable[[], Awaitable[web.Response]]
    ) -> web.Response:
        try:
            return await call()
        except BrokerError as exc:
            if exc.error_code is ErrorCode.NOT_CONTROLLER:
                locate = lambda: self.s.nodes.node_url(self.controller.leader_id())  # noqa: E731
                return await self.forwarder.to_controller(request, exc, raw, locate)
            raise

    async def whoami(self, request: web.Request) -> web.Response:
        return web.json_response({"principal": guard(request).principal})

    async def list_users(self, _request: web.Request) -> web.Response:
        return web.json_response({"users": self.controller.users_json()})

    async def upsert_user(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        raw = await request.read()
        body = parsing.parse_json_object(raw)
        password = parsing.get_str(body, "password", max_len=1024)
        mechanism = parsing.get_str(body, "mechanism", required=False, max_len=32) or "SCRAM-SHA-256"
        iterations = body.get("iterations")
        if iterations is not None:
            iterations = parsing.get_int(body, "iterations", lo=1, hi=parsing.INT32_MAX)

        async def call() -> web.Response:
            return web.json_response(await self.controller.upsert_user(name, mechanism, password, iterations))

        return await self._at_controller(request, raw, call)

    async def delete_user(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]

        async def call() -> web.Response:
            await self.controller.delete_user(name)
            return web.json_response({"name": name, "deleted": True})

        return await self._at_controller(request, b"", call)

    async def describe_acls(self, request: web.Request) -> web.Response:
        flt = AclFilter.from_query(request.query)
        return web.json_response({"acls": [b.to_json() for b in self.controller.describe_acls(flt)]})

    async def create_acls(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = parsing.parse_json_object(raw)
        items: Any = body.get("acls", [body])
        if not isinstance(items, list) or not items or len(items) > _MAX_ACLS_PER_REQUEST:
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"acls must list 1 to {_MAX_ACLS_PER_REQUEST} ACL objects")
        bindings = [AclBinding.from_json(item) for item in items]  # every one valid before any is recorded

        async def call() -> web.Response:
            await self.controller.create_acls(bindings)
            return web.json_response({"acls": [b.to_json() for b in bindings]}, status=201)

        return await self._at_controller(request, raw, call)

    async def delete_acls(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = parsing.parse_json_object(raw) if raw.strip() else {}
        items: Any = body.get("filters", [body])
        if not isinstance(items, list) or not items or len(items) > _MAX_ACLS_PER_REQUEST:
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"filters must list 1 to {_MAX_ACLS_PER_REQUEST} filters")
        filters = [AclFilter.from_json(item) for item in items]

        async def call() -> web.Response:
            deleted = await self.controller.delete_acls(filters)
            return web.json_response({"deleted": [b.to_json() for b in deleted]})

        return await self._at_controller(request, raw, call)
