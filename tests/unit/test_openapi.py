"""The OpenAPI document covers every public route the node serves (API.md: "the whole HTTP API")."""

from __future__ import annotations

from types import SimpleNamespace

from cluster.http import make_app
from cluster.http.openapi import openapi_document
from cluster.metrics import NodeMetrics


def served_routes() -> set[tuple[str, str]]:
    # The routes are registered from the handlers' objects; stand-in services are enough to build them.
    services = SimpleNamespace(
        config=SimpleNamespace(max_request_bytes=1 << 20, request_timeout_ms=30_000, security=None,
                               cluster_secret="s" * 32, node_id=1),
        metrics=NodeMetrics(), txn=None, groups=None, controller=SimpleNamespace(security_view=lambda: None),
        nodes=SimpleNamespace(node_ids=lambda: [1]), peers=None, client_ssl=None, operations=None,
        reassignments=None,
    )  # fmt: skip
    app = make_app(services)  # type: ignore[arg-type]
    out = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        if route.method in ("HEAD", "*") or path is None:
            continue
        out.add((route.method.lower(), path))
    return out


def test_every_public_route_is_documented():
    doc = openapi_document()
    documented = {(m, path) for path, ops in doc["paths"].items() for m in ops if m != "parameters"}
    public = {(m, p) for m, p in served_routes() if not p.startswith("/v1/internal/")}
    assert public - documented == set(), "routes served but missing from /v1/openapi.json"
    assert documented - public == set(), "documented routes that no handler serves"


def test_internal_routes_are_not_documented():
    assert not [p for p in openapi_document()["paths"] if p.startswith("/v1/internal/")]
