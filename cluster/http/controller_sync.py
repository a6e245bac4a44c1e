"""The node-to-node endpoint behind "a user or ACL change holds on every node when it returns".

``POST /v1/internal/controller/applied`` ``{"index": N}`` answers
``{"applied": M}`` (M >= N) once this node's controller replica applied Raft
index N, or ``REQUEST_TIMED_OUT`` after ``APPLIED_WAIT_S``; the wait is on the
event loop and blocks nothing. Only nodes of the cluster may call it.
"""

from __future__ import annotations

from aiohttp import web

from ..controller_service import APPLIED_PATH
from . import parsing
from .access import Access, RouteTable
from .node_auth import require_internal
from .services import Services

__all__ = ["register_controller_sync"]

_MAX_INDEX = 2**62


def register_controller_sync(app: web.Application, services: Services) -> None:
    async def applied(request: web.Request) -> web.Response:
        require_internal(request)
        body = parsing.parse_json_object(await request.read())
        index = parsing.get_int(body, "index", lo=0, hi=_MAX_INDEX)
        return web.json_response({"applied": await services.controller.wait_applied(index)})

    RouteTable(app).post(APPLIED_PATH, applied, Access.nodes())
