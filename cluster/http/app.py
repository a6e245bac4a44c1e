"""The HTTP API of a node (aiohttp): the application, its middleware, and the services it adapts.

Error contract (API.md): every error is an HTTP status plus
``{"error_code", "message", "retriable", ...}``. Malformed input never causes
a 5xx, never changes state, and never stops the node; unknown routes and
wrong methods answer with a JSON ``error_code`` too.

Each area has its own module of thin adapters (parse, call one domain
function, map the result): ``records`` (produce, fetch, producer ids),
``topics`` (topics, cluster metadata), ``topic_admin`` (add partitions, topic
configs), ``transactions``, ``groups``, ``admin`` (health, metrics, OpenAPI,
node-to-node state).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from clients.protocol import PRODUCE_CONTENT_TYPE, BrokerError, ErrorCode

from ..deadline import Deadline, deadline_scope
from ..metrics import NodeMetrics
from ..security.jwt_auth import JwtVerifier
from ..security.node_calls import NodeCallSigner, NodeCallVerifier
from .access import check_declared
from .admin import AdminRoutes
from .auth import Gatekeeper
from .controller_sync import register_controller_sync
from .forwarding import TIMEOUT_HEADER, Forwarder
from .groups import GroupRoutes
from .operations import OperationRoutes
from .records import RecordRoutes
from .security import SecurityRoutes
from .services import Readiness, Services
from .topic_admin import TopicAdminRoutes
from .topics import TopicRoutes
from .transactions import TxnRoutes

__all__ = ["Readiness", "Services", "error_response", "make_app"]

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


_MAX_REQUEST_TIMEOUT_MS = 300_000  # a caller's timeout beyond this is taken as this
_PRODUCE_TIMEOUT_AT = slice(4, 8)  # the binary produce request's head: magic (4 bytes), timeout_ms (int32)


async def caller_timeout_ms(request: web.Request) -> int | None:
    """The timeout the caller gave this request: ``X-Txbroker-Timeout-Ms``, else a binary produce's ``timeout_ms``."""
    raw = request.headers.get(TIMEOUT_HEADER)
    if raw is not None:
        try:
            value = int(raw)
        except ValueError:
            return None
        return min(value, _MAX_REQUEST_TIMEOUT_MS) if value > 0 else None
    if request.method == "POST" and request.path == "/v1/produce" and request.content_type == PRODUCE_CONTENT_TYPE:
        head = (await request.read())[_PRODUCE_TIMEOUT_AT]  # the handler reads the same (cached) body
        if len(head) == 4:
            value = int.from_bytes(head, "big", signed=True)
            return min(value, _MAX_REQUEST_TIMEOUT_MS) if value > 0 else None
    return None


def make_middlewares(metrics: NodeMetrics, gatekeeper: Gatekeeper, request_timeout_s: float = 30.0) -> list[Any]:
    @web.middleware
    async def errors_and_metrics(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        arrived = asyncio.get_running_loop().time()
        route = _route_template(request)
        status = 500
        try:
            await gatekeeper.admit(request)  # who is calling, and the route's rights: before the body is read
            timeout_ms = await caller_timeout_ms(request)
            budget = timeout_ms / 1000 if timeout_ms is not None else request_timeout_s
            with deadline_scope(Deadline.after(arrived, budget)):  # what every call made for it may take
                resp = await handler(request)
            status = resp.status
            return resp
        except BrokerError as exc:
            status = exc.error_code.http_status
            resp = error_response(exc)
            if exc.error_code is ErrorCode.SASL_AUTHENTICATION_FAILED:
                resp.headers["WWW-Authenticate"] = gatekeeper.challenge
            return resp
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


def make_app(services: Services) -> web.Application:
    config = services.config
    request_timeout_s = config.request_timeout_ms / 1000
    signer = NodeCallSigner(config.cluster_secret, config.node_id)
    forwarder = Forwarder(
        services.nodes, services.peers, request_timeout_s, signer=signer, ssl_context=services.client_ssl
    )
    nodes = services.nodes
    verifier = NodeCallVerifier(config.cluster_secret, node_id=config.node_id, senders=lambda n: n in nodes.node_ids())
    security = config.security
    jwt = JwtVerifier(security) if security is not None and "bearer" in security.authentication else None
    gatekeeper = Gatekeeper(security, services.controller.security_view, verifier, jwt)
    app = web.Application(
        client_max_size=config.max_request_bytes,
        middlewares=make_middlewares(services.metrics, gatekeeper, request_timeout_s),
    )

    async def on_startup(_app: web.Application) -> None:
        await forwarder.start()
        if jwt is not None:
            await jwt.start()

    async def on_cleanup(_app: web.Application) -> None:
        await forwarder.close()
        if jwt is not None:
            await jwt.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    txn_routes = TxnRoutes(services, forwarder)
    AdminRoutes(services).register(app)
    TopicRoutes(services, forwarder).register(app)
    TopicAdminRoutes(services, forwarder).register(app)
    RecordRoutes(services, forwarder, txn_routes).register(app)
    txn_routes.register(app)
    GroupRoutes(services, forwarder).register(app)
    SecurityRoutes(services, forwarder).register(app)
    OperationRoutes(services, forwarder).register(app)
    register_controller_sync(app, services)
    check_declared(app)
    return app
