"""The admin operations as data: which request each one sends and how its answer is read.

``Admin`` (stdlib HTTP, no thread) and ``AsyncAdmin`` (aiohttp) only move
these requests; the paths, bodies, client-side checks and result shapes live
here once. Any node answers admin requests (the broker forwards topic changes
to the controller), so a transport tries the bootstrap URLs in turn while a
node is unreachable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from .protocol import BrokerError, ErrorCode
from .security import ACL_FIELDS, AclBinding

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class AdminCall(Generic[T]):
    method: str
    path: str
    body: Any
    parse: Callable[[Any], T]


def _dict(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"expected a JSON object, got {type(body).__name__}")
    return body


def _topic_path(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise BrokerError(ErrorCode.INVALID_TOPIC, f"topic name must be a non-empty string, not {name!r}")
    return f"/v1/topics/{quote(name, safe='')}"


def create_topic(
    name: str, partitions: int, replication_factor: int, config: dict[str, Any] | None
) -> AdminCall[dict[str, Any]]:
    _topic_path(name)
    body: dict[str, Any] = {"name": name, "partitions": partitions, "replication_factor": replication_factor}
    if config:
        body["config"] = {str(k): v for k, v in config.items()}
    return AdminCall("POST", "/v1/topics", body, _dict)


def delete_topic(name: str) -> AdminCall[None]:
    return AdminCall("DELETE", _topic_path(name), None, lambda _b: None)


def list_topics() -> AdminCall[list[dict[str, Any]]]:
    return AdminCall("GET", "/v1/topics", None, lambda b: list(_dict(b)["topics"]))


def describe_topic(name: str) -> AdminCall[dict[str, Any]]:
    return AdminCall("GET", _topic_path(name), None, _dict)


def create_partitions(
    name: str, count: int, assignments: Sequence[Sequence[int]] | None = None
) -> AdminCall[dict[str, Any]]:
    """Grow ``name`` to ``count`` partitions in total (only up); ``assignments``: each new partition's replicas."""
    if isinstance(count, bool) or not isinstance(count, int):
        raise BrokerError(ErrorCode.INVALID_PARTITIONS, f"count must be an integer, not {count!r}")
    body: dict[str, Any] = {"count": count}
    if assignments is not None:
        body["assignments"] = [list(reps) for reps in assignments]
    return AdminCall("POST", _topic_path(name) + "/partitions", body, _dict)


def alter_topic_config(name: str, changes: dict[str, Any]) -> AdminCall[dict[str, Any]]:
    """Set config overrides of ``name`` (a value of None deletes the override); answers the topic's config."""
    if not isinstance(changes, dict) or not changes:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "alter_topic_config needs at least one key")
    return AdminCall("PATCH", _topic_path(name) + "/config", {str(k): v for k, v in changes.items()}, _dict)


def describe_topic_config(name: str) -> AdminCall[dict[str, Any]]:
    """``{"topic", "config": every key's value, "overrides": the keys set on the topic}``."""
    return AdminCall("GET", _topic_path(name) + "/config", None, _dict)


def describe_cluster() -> AdminCall[dict[str, Any]]:
    return AdminCall("GET", "/v1/cluster", None, _dict)


def metadata(topics: Sequence[str] | None = None) -> AdminCall[dict[str, Any]]:
    query = "" if topics is None else "?topics=" + ",".join(quote(t, safe="") for t in topics)
    return AdminCall("GET", "/v1/metadata" + query, None, _dict)


def leaders_elected(description: dict[str, Any]) -> bool:
    """Whether every partition of a ``describe_topic`` answer (``{}``: not known yet) has a leader."""
    parts = description.get("partitions") or []
    return bool(parts) and all(p.get("leader") is not None and p.get("leader_url") for p in parts)


def topic_may_be_propagating(exc: BrokerError) -> bool:
    """An unknown topic right after creation: the answering node has not applied the controller's record yet."""
    return exc.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def leaders_timeout_error(name: str, timeout_s: float) -> BrokerError:
    return BrokerError(
        ErrorCode.LEADER_NOT_AVAILABLE, f"not every partition of {name!r} has a leader after {timeout_s}s"
    )


def should_try_next_node(exc: BrokerError) -> bool:
    """A transport failure: the request did not reach a broker, so another node may answer it."""
    return exc.error_code is ErrorCode.NETWORK_EXCEPTION


# ---- transactions (hanging-transaction tooling, prepared transactions) --------------------


def _txn_path(transactional_id: str) -> str:
    if not isinstance(transactional_id, str) or not transactional_id:
        raise BrokerError(
            ErrorCode.INVALID_REQUEST, f"transactional id must be a non-empty string: {transactional_id!r}"
        )
    return f"/v1/transactions/{quote(transactional_id, safe='')}"


def list_transactions(states: Sequence[str] | None = None, prefix: str = "") -> AdminCall[list[dict[str, Any]]]:
    """Every transaction of the cluster (optionally in ``states``, e.g. ``["Ongoing", "Prepared"]``)."""
    query = []
    if states:
        query.append("state=" + ",".join(quote(s, safe="") for s in states))
    if prefix:
        query.append("prefix=" + quote(prefix, safe=""))
    path = "/v1/transactions" + ("?" + "&".join(query) if query else "")
    return AdminCall("GET", path, None, lambda b: list(_dict(b)["transactions"]))


def describe_transaction(transactional_id: str) -> AdminCall[dict[str, Any]]:
    return AdminCall("GET", _txn_path(transactional_id), None, _dict)


def abort_transaction(transactional_id: str) -> AdminCall[dict[str, Any]]:
    """Fence the producer and abort its open (or unbound prepared) transaction."""
    return AdminCall("POST", _txn_path(transactional_id) + "/abort", {}, _dict)


def abort_transactions_with_prefix(prefix: str) -> AdminCall[list[str]]:
    if not prefix:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "prefix must not be empty")
    return AdminCall("POST", "/v1/transactions-by-prefix/abort", {"prefix": prefix},
                     lambda b: list(_dict(b)["aborted"]))  # fmt: skip


def complete_prepared(
    transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
) -> AdminCall[dict[str, Any]]:
    """Commit or abort a prepared (unbound) transaction by the identity it was prepared with."""
    body = {"producer_id": producer_id, "producer_epoch": producer_epoch, "commit": commit}
    return AdminCall("POST", _txn_path(transactional_id) + "/end", body, _dict)


def commit_prepared_group(
    group_id: str, members: Sequence[tuple[str, int, int]], commit: bool = True
) -> AdminCall[dict[str, Any]]:
    """Decide a commit group of prepared transactions ``(transactional_id, producer_id, epoch)`` as one unit.

    The decision is write-once: the answer carries the recorded decision and its members,
    which may differ from ``members`` when the group was decided before.
    """
    if not isinstance(group_id, str) or not group_id:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "group id must be a non-empty string")
    body = {
        "commit": commit,
        "members": [{"transactional_id": t, "producer_id": p, "producer_epoch": e} for t, p, e in members],
    }
    return AdminCall("POST", f"/v1/transaction-groups/{quote(group_id, safe='')}/end", body, _dict)


def describe_producers(topic: str, partition: int) -> AdminCall[list[dict[str, Any]]]:
    path = f"{_topic_path(topic)}/partitions/{int(partition)}/producers"
    return AdminCall("GET", path, None, lambda b: list(_dict(b)["producers"]))


# ---- security: ACLs, users, the caller's principal (API.md "Security") ----------------------


def _acl_json(acl: AclBinding | dict[str, Any]) -> dict[str, Any]:
    if isinstance(acl, AclBinding):
        return acl.to_json()
    if isinstance(acl, dict):
        return dict(acl)
    raise BrokerError(ErrorCode.INVALID_REQUEST, f"an ACL is an AclBinding or a dict, not {type(acl).__name__}")


def _filter_json(flt: AclBinding | dict[str, Any]) -> dict[str, str]:
    if isinstance(flt, AclBinding):
        return flt.to_json()
    if not isinstance(flt, dict):
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"an ACL filter is a dict, not {type(flt).__name__}")
    unknown = sorted(set(flt) - set(ACL_FIELDS))
    if unknown:
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"unknown ACL filter fields {unknown}; known: {list(ACL_FIELDS)}")
    return {k: str(v) for k, v in flt.items() if v is not None}


def create_acls(acls: Sequence[AclBinding | dict[str, Any]]) -> AdminCall[None]:
    body = [_acl_json(a) for a in acls]
    if not body:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "create_acls needs at least one ACL")
    return AdminCall("POST", "/v1/acls", {"acls": body}, lambda _b: None)


def describe_acls(flt: dict[str, Any]) -> AdminCall[list[dict[str, Any]]]:
    query = "&".join(f"{k}={quote(v, safe='')}" for k, v in _filter_json(flt).items())
    return AdminCall("GET", "/v1/acls" + ("?" + query if query else ""), None, lambda b: list(_dict(b)["acls"]))


def delete_acls(flt: AclBinding | dict[str, Any]) -> AdminCall[list[dict[str, Any]]]:
    """One filter per request (the broker takes one filter object); every field left out matches anything."""
    return AdminCall("DELETE", "/v1/acls", _filter_json(flt), lambda b: list(_dict(b)["deleted"]))


def _user_path(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"user name must be a non-empty string, not {name!r}")
    return f"/v1/users/{quote(name, safe='')}"


USER_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


def upsert_user(name: str, password: str, mechanism: str, iterations: int | None) -> AdminCall[None]:
    if mechanism not in USER_MECHANISMS:
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"mechanism must be one of {USER_MECHANISMS}, not {mechanism!r}")
    if not isinstance(password, str) or not password:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "password must be a non-empty string")
    body: dict[str, Any] = {"password": password, "mechanism": mechanism}
    if iterations is not None:
        body["iterations"] = int(iterations)
    return AdminCall("PUT", _user_path(name), body, lambda _b: None)


def delete_user(name: str) -> AdminCall[None]:
    return AdminCall("DELETE", _user_path(name), None, lambda _b: None)


def list_users() -> AdminCall[list[dict[str, Any]]]:
    return AdminCall("GET", "/v1/users", None, lambda b: list(_dict(b)["users"]))


def whoami() -> AdminCall[str]:
    return AdminCall("GET", "/v1/whoami", None, lambda b: str(_dict(b)["principal"]))


AclFilters = AclBinding | dict[str, Any] | Sequence[AclBinding | dict[str, Any]]


def as_filters(filters: AclFilters) -> list[AclBinding | dict[str, Any]]:
    """``delete_acls``'s argument: one filter (a dict, or a binding to delete exactly) or a list of them."""
    out: list[AclBinding | dict[str, Any]] = [filters] if isinstance(filters, AclBinding | dict) else list(filters)
    if not out:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "delete_acls needs at least one filter")
    return out
