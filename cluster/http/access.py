"""What each route needs: declared where the route is registered, enforced before the handler runs.

Every route is added through a ``RouteTable`` with an ``Access``: open (health,
readiness, the OpenAPI document), nodes only (``/v1/internal/*``: a verified
node-to-node call acting for itself), or an authenticated principal holding
the ACLs the declaration names. A declaration's ``needs`` name resources from
the path (``Need(Operation.WRITE, ResourceType.TRANSACTIONAL_ID,
"transactional_id")``); the middleware checks them before the body is read, so
a denied request changes nothing and a request about a topic that does not
exist is answered ``TOPIC_AUTHORIZATION_FAILED`` when denied. What depends on
the body (the topics of a produce, the group of AddOffsetsToTxn) the handler
checks through the request's ``Guard``; the declaration names it in ``body``
so the API's table of rights reads off the registrations. ``check_declared``
refuses an application with a route that has no declaration.

The rules are Kafka's (API.md "Security"); the ``Guard`` asks the node's
``Authorizer`` (an index of ACLs by resource: a decision is a few dict lookups).
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from clients.protocol import BrokerError, ErrorCode

from ..security.acl import CLUSTER_NAME, Operation, ResourceType
from ..security.guard import Guard, denied_code

__all__ = [
    "ACCESS",
    "GUARD_KEY",
    "Access",
    "AnyOf",
    "Guard",
    "Mode",
    "Need",
    "RouteTable",
    "check_access",
    "check_declared",
    "denied_code",
    "guard",
]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Mode(enum.Enum):
    OPEN = "open"  # no credentials needed
    NODE = "node"  # only a node of the cluster, acting for itself
    USER = "user"  # an authenticated principal holding the declared ACLs


@dataclass(frozen=True, slots=True)
class Need:
    """One ACL: ``operation`` on the resource named by the path parameter ``param`` (the cluster when None)."""

    operation: Operation
    resource_type: ResourceType
    param: str | None = None

    def resource_name(self, match_info: dict[str, str] | web.UrlMappingMatchInfo) -> str:
        return CLUSTER_NAME if self.param is None else match_info[self.param]


@dataclass(frozen=True, slots=True)
class AnyOf:
    """Any one of these ACLs suffices (the admin abort: WRITE on the transactional id or ALTER on the cluster)."""

    needs: tuple[Need, ...]


@dataclass(frozen=True, slots=True)
class Access:
    mode: Mode
    needs: tuple[Need | AnyOf, ...] = ()
    #: What the handler checks on the body through the ``Guard`` (documentation; the matrix test covers it).
    body: str = ""

    @classmethod
    def open(cls) -> Access:
        return cls(Mode.OPEN)

    @classmethod
    def nodes(cls) -> Access:
        return cls(Mode.NODE)

    @classmethod
    def user(cls, *needs: Need | AnyOf, body: str = "") -> Access:
        """An authenticated caller holding every one of ``needs`` (and what ``body`` says the handler checks)."""
        return cls(Mode.USER, tuple(needs), body)


#: The application key of the declarations: route -> Access.
ACCESS: web.AppKey[dict[web.AbstractRoute, Access]] = web.AppKey("txb_access", dict)


class RouteTable:
    """Adds routes to an application, each with its ``Access`` (a route cannot be added without one)."""

    def __init__(self, app: web.Application) -> None:
        self._app = app
        if ACCESS not in app:
            app[ACCESS] = {}

    def add(self, method: str, path: str, handler: Handler, access: Access) -> None:
        route = self._app.router.add_route(method, path, handler)
        self._app[ACCESS][route] = access
        if method == "GET":  # aiohttp answers HEAD for a GET route with the same handler
            for other in route.resource or ():
                if other.method == "HEAD":
                    self._app[ACCESS][other] = access

    def get(self, path: str, handler: Handler, access: Access) -> None:
        self.add("GET", path, handler, access)

    def post(self, path: str, handler: Handler, access: Access) -> None:
        self.add("POST", path, handler, access)

    def put(self, path: str, handler: Handler, access: Access) -> None:
        self.add("PUT", path, handler, access)

    def patch(self, path: str, handler: Handler, access: Access) -> None:
        self.add("PATCH", path, handler, access)

    def delete(self, path: str, handler: Handler, access: Access) -> None:
        self.add("DELETE", path, handler, access)


def check_access(g: Guard, access: Access, match_info: web.UrlMappingMatchInfo) -> None:
    """The path-level needs of ``access`` (before the body is read), checked for ``g``'s principal."""
    for need in access.needs:
        if isinstance(need, AnyOf):
            g.require_any((n.operation, n.resource_type, n.resource_name(match_info)) for n in need.needs)
        else:
            g.require(need.operation, need.resource_type, need.resource_name(match_info))


def check_declared(app: web.Application) -> None:
    """Refuse an application with a route whose rights are not declared (the node would not start)."""
    declared = app.get(ACCESS, {})
    missing = [f"{r.method} {r.resource.canonical if r.resource else '?'}" for r in app.router.routes()
               if r not in declared]  # fmt: skip
    if missing:
        raise RuntimeError(f"routes without an access declaration: {', '.join(sorted(missing))}")


#: The request key under which the middleware keeps the caller's ``Guard``.
GUARD_KEY = web.RequestKey("txb.guard", Guard)


def guard(request: web.Request) -> Guard:
    """The caller's ``Guard``, set by the middleware that admitted the request (none: denied, never open)."""
    found = request.get(GUARD_KEY)
    if not isinstance(found, Guard):
        raise BrokerError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "request not admitted by the access middleware")
    return found
