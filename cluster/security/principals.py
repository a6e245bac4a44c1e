"""Principals (Kafka's ``User:NAME`` form) and where a request keeps its caller's identity."""

from __future__ import annotations

from aiohttp import web

from .node_calls import NodeCall

__all__ = [
    "ANONYMOUS",
    "CLIENT_HOST_KEY",
    "NODE_CALL_KEY",
    "PRINCIPAL_KEY",
    "WILDCARD_PRINCIPAL",
    "is_valid_principal",
    "user_principal",
]

#: What an open node (no ``[security]`` section) calls every caller.
ANONYMOUS = "User:ANONYMOUS"
#: An ACL's principal that matches every caller.
WILDCARD_PRINCIPAL = "User:*"
#: The request key (``request[PRINCIPAL_KEY]``) under which the HTTP layer keeps the authenticated principal.
#: (``web.RequestKey``s: aiohttp warns about plain string keys, and the values are typed.)
PRINCIPAL_KEY = web.RequestKey("txb.principal", str)
#: The request key of the client's address as ACLs match it (``*`` when unknown): the peer's, or a forwarded call's.
CLIENT_HOST_KEY = web.RequestKey("txb.client_host", str)
#: The request key under which it keeps the verified node-to-node call (``node_calls.NodeCall``), if the request is one.
NODE_CALL_KEY = web.RequestKey("txb.node_call", NodeCall)

_MAX_NAME = 256


def user_principal(name: str) -> str:
    return f"User:{name}"


def is_valid_principal(principal: str) -> bool:
    """``User:NAME`` with a non-empty printable name (ACLs and super users name principals this way)."""
    kind, sep, name = principal.partition(":")
    return kind == "User" and bool(sep) and 0 < len(name) <= _MAX_NAME and name.isprintable() and ":" not in name
