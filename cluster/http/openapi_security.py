"""OpenAPI paths of users, ACLs and ``whoami``, and the security schemes (merged into ``openapi_document``)."""

from __future__ import annotations

from typing import Any

from .openapi_txn import _op

_STR = {"type": "string"}
_INT = {"type": "integer"}
_ACL = {
    "principal": _STR,
    "host": _STR,
    "resource_type": {"type": "string", "enum": ["TOPIC", "GROUP", "CLUSTER", "TRANSACTIONAL_ID"]},
    "resource_name": _STR,
    "pattern_type": {"type": "string", "enum": ["LITERAL", "PREFIXED"]},
    "operation": {
        "type": "string",
        "enum": ["ALL", "READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "IDEMPOTENT_WRITE"],
    },
    "permission": {"type": "string", "enum": ["ALLOW", "DENY"]},
}
_ACL_QUERY = ("principal", "host", "resource_type", "resource_name", "pattern_type", "operation", "permission")
_AUTH_ERRORS = (400, 401, 403, 421, 503, 504)

#: How a caller authenticates (API.md "Security"): Basic against SCRAM credentials, a bearer JWT, or mTLS.
SECURITY_SCHEMES: dict[str, Any] = {
    "basic": {"type": "http", "scheme": "basic", "description": "checked against the user's SCRAM credential"},
    "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"},
    "mtls": {"type": "mutualTLS", "description": "principal User:<certificate subject CN>"},
}


def security_paths() -> dict[str, Any]:
    return {
        "/v1/whoami": {"get": _op("the caller's principal: {principal}", errors=(401,))},
        "/v1/users": {"get": _op("users: {users: [{name, mechanisms}]} (never a secret); DESCRIBE on CLUSTER",
                                 errors=_AUTH_ERRORS)},
        "/v1/users/{name}": {
            "put": _op(
                "create or change a user's SCRAM credential (the old password stops working on every node); "
                "ALTER on CLUSTER",
                {"password": _STR, "mechanism": {"type": "string", "enum": ["SCRAM-SHA-256", "SCRAM-SHA-512"]},
                 "iterations": _INT},
                ("password",), params=("name",), errors=_AUTH_ERRORS,
            ),
            "delete": _op("delete a user; ALTER on CLUSTER", params=("name",), errors=(*_AUTH_ERRORS, 404)),
        },
        "/v1/acls": {
            "get": _op("ACLs matching the query's filters: {acls: [...]}; DESCRIBE on CLUSTER", query=_ACL_QUERY,
                       errors=_AUTH_ERRORS),
            "post": _op("create one ACL (the object) or several ({acls: [...]}); 201; ALTER on CLUSTER", _ACL,
                        ("principal", "resource_type", "resource_name", "operation", "permission"),
                        errors=_AUTH_ERRORS),
            "delete": _op("delete the ACLs matching a filter (same fields, all optional): {deleted: [...]}; "
                          "ALTER on CLUSTER", _ACL, errors=_AUTH_ERRORS),
        },
    }  # fmt: skip
