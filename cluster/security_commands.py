"""``txbroker acl``, ``txbroker user`` and ``txbroker whoami``: ACLs and SCRAM users of a secured cluster.

``acl`` takes kafka-acls.sh's flags:

* ``acl add``: ``--allow-principal``/``--deny-principal`` (repeatable), ``--allow-host``/``--deny-host``
  (default ``*``), ``--operation`` (repeatable, default ``All``), one or more resources (``--topic``,
  ``--group``, ``--transactional-id``, ``--cluster``), ``--resource-pattern-type literal|prefixed``.
  Every combination of principal, host, operation and resource becomes one ACL, all sent in one request.
* ``acl list``: the ACLs of the given resources (all without one), narrowed by ``--principal`` and
  ``--operation``; ``--resource-pattern-type`` ``literal``/``prefixed`` (stored pattern), ``any`` (the
  default: any pattern type) or ``match`` (every ACL that applies to the named resource: its literal
  name, the wildcard ``*`` and the prefixes it starts with).
* ``acl remove``: the ACLs matching the same flags (a resource is required); without ``--force`` it only
  prints what it would remove.

``user create NAME`` reads the password from stdin with ``--password-stdin`` (first line), else asks for
it twice on the terminal; a password is never a command-line argument. ``user list``, ``user delete NAME``,
``whoami`` (the principal the cluster knows the caller as).
"""

from __future__ import annotations

import argparse
import getpass
import itertools
import json
import sys
from collections.abc import Callable, Iterable
from typing import Any, TextIO

from clients.admin import Admin
from clients.security import AclBinding

from .client_config import add_cluster_options, client_options

__all__ = ["acl_bindings", "acl_filters", "register"]

CLUSTER_NAME = "kafka-cluster"
OPERATIONS = ("ALL", "READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "IDEMPOTENT_WRITE")


class UsageError(Exception):
    """Bad flags: printed as one line, exit 2."""


def _admin(args: argparse.Namespace) -> Admin:
    return Admin(args.bootstrap, **client_options(args))


def _operation(value: str) -> str:
    op = value.strip().upper().replace("-", "_")
    if op == "IDEMPOTENTWRITE":
        op = "IDEMPOTENT_WRITE"
    if op not in OPERATIONS:
        raise argparse.ArgumentTypeError(f"unknown operation {value!r} (one of {', '.join(OPERATIONS)})")
    return op


def resources(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(resource type, name) of every resource flag, in flag order."""
    out = [("TOPIC", t) for t in args.topic or ()]
    out += [("GROUP", g) for g in args.group or ()]
    out += [("TRANSACTIONAL_ID", t) for t in args.transactional_id or ()]
    if args.cluster:
        out.append(("CLUSTER", CLUSTER_NAME))
    return out


def _entries(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(principal, host, permission) of the --allow-*/--deny-* flags; hosts default to ``*``."""
    allow = [(p, h, "ALLOW") for p, h in itertools.product(args.allow_principal or (), args.allow_host or ["*"])]
    deny = [(p, h, "DENY") for p, h in itertools.product(args.deny_principal or (), args.deny_host or ["*"])]
    return allow + deny


def acl_bindings(args: argparse.Namespace) -> list[AclBinding]:
    """The ACLs ``acl add`` creates."""
    res = resources(args)
    if not res:
        raise UsageError("name at least one resource: --topic, --group, --transactional-id or --cluster")
    entries = _entries(args)
    if not entries:
        raise UsageError("name at least one --allow-principal or --deny-principal")
    pattern = args.resource_pattern_type.upper()
    if pattern not in ("LITERAL", "PREFIXED"):
        raise UsageError("acl add takes --resource-pattern-type literal or prefixed")
    ops = args.operation or ["ALL"]
    return [
        AclBinding(principal, rtype, name, op, permission, host, pattern)
        for (rtype, name), (principal, host, permission), op in itertools.product(res, entries, ops)
    ]


def acl_filters(args: argparse.Namespace, *, need_resource: bool) -> list[dict[str, str]]:
    """The filters of ``acl list``/``acl remove`` (``pattern_type`` left out for ``any`` and ``match``)."""
    res: list[tuple[str, str] | None] = list(resources(args)) or [None]
    if need_resource and res == [None]:
        raise UsageError("name the resource: --topic, --group, --transactional-id or --cluster")
    pattern = (args.resource_pattern_type or "any").upper()
    base: dict[str, str] = {}
    if pattern in ("LITERAL", "PREFIXED"):
        base["pattern_type"] = pattern
    who: list[dict[str, str]] = []
    for principal, host, permission in _entries(args):
        entry = {"principal": principal, "permission": permission}
        if args.allow_host if permission == "ALLOW" else args.deny_host:
            entry["host"] = host
        who.append(entry)
    if getattr(args, "principal", None):
        who.append({"principal": args.principal})
    out: list[dict[str, str]] = []
    for r, w, op in itertools.product(res, who or [{}], args.operation or [None]):
        flt = dict(base, **w)
        if r is not None:
            flt["resource_type"] = r[0]
            if pattern != "MATCH":
                flt["resource_name"] = r[1]
        if op is not None:
            flt["operation"] = op
        out.append(flt)
    return out


def applies_to(acl: dict[str, Any], resource_type: str, name: str) -> bool:
    """Kafka's MATCH filter: the ACL's pattern covers this resource (literal name, ``*``, or a prefix of it)."""
    if acl.get("resource_type") != resource_type:
        return False
    pattern, stored = acl.get("pattern_type"), str(acl.get("resource_name"))
    if pattern == "PREFIXED":
        return name.startswith(stored)
    return stored in (name, "*")


def _matching(admin: Admin, args: argparse.Namespace, need_resource: bool) -> list[dict[str, Any]]:
    """Every ACL the flags select, each once."""
    match = (args.resource_pattern_type or "").lower() == "match"
    res = resources(args)
    found: dict[str, dict[str, Any]] = {}
    for flt in acl_filters(args, need_resource=need_resource):
        for acl in admin.describe_acls(**flt):
            if match and res and not any(applies_to(acl, t, n) for t, n in res):
                continue
            found.setdefault(json.dumps(acl, sort_keys=True), acl)
    return list(found.values())


def _print_acls(acls: Iterable[dict[str, Any]], out: TextIO) -> None:
    """Grouped by resource, like kafka-acls.sh."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for a in acls:
        key = (str(a.get("resource_type")), str(a.get("resource_name")), str(a.get("pattern_type", "LITERAL")))
        groups.setdefault(key, []).append(a)
    for (rtype, name, pattern), items in sorted(groups.items()):
        out.write(f"Current ACLs for resource `ResourcePattern(resourceType={rtype}, name={name}, "
                  f"patternType={pattern})`:\n")  # fmt: skip
        for a in sorted(items, key=lambda x: json.dumps(x, sort_keys=True)):
            out.write(f" \t(principal={a.get('principal')}, host={a.get('host', '*')}, "
                      f"operation={a.get('operation')}, permissionType={a.get('permission')})\n")  # fmt: skip
        out.write("\n")


# ---- commands ---------------------------------------------------------------------------------


def cmd_acl_add(args: argparse.Namespace) -> int:
    bindings = acl_bindings(args)
    _admin(args).create_acls(bindings)
    print(f"added {len(bindings)} ACL{'s' if len(bindings) != 1 else ''}")
    _print_acls((b.to_json() for b in bindings), sys.stdout)
    return 0


def cmd_acl_list(args: argparse.Namespace) -> int:
    acls = _matching(_admin(args), args, need_resource=False)
    if args.json:
        print(json.dumps(acls, indent=2, sort_keys=True))
    else:
        _print_acls(acls, sys.stdout)
    return 0


def cmd_acl_remove(args: argparse.Namespace) -> int:
    admin = _admin(args)
    acls = _matching(admin, args, need_resource=True)
    if not args.force:
        _print_acls(acls, sys.stdout)
        print(f"{len(acls)} ACLs match; nothing removed (add --force to remove them)", file=sys.stderr)
        return 0
    if (args.resource_pattern_type or "").lower() == "match":
        deleted = admin.delete_acls([{k: a[k] for k in a if k in _FIELDS} for a in acls]) if acls else []
    else:
        deleted = admin.delete_acls(acl_filters(args, need_resource=True))
    print(f"removed {len(deleted)} ACL{'s' if len(deleted) != 1 else ''}")
    _print_acls(deleted, sys.stdout)
    return 0


_FIELDS = ("principal", "host", "resource_type", "resource_name", "pattern_type", "operation", "permission")


def read_password(args: argparse.Namespace, stdin: TextIO, prompt: Callable[[str], str] = getpass.getpass) -> str:
    if args.password_stdin:
        password = stdin.readline().rstrip("\r\n")
    else:
        password = prompt(f"password for {args.name}: ")
        if prompt("again: ") != password:
            raise UsageError("the passwords differ")
    if not password:
        raise UsageError("empty password")
    return password


def cmd_user_create(args: argparse.Namespace) -> int:
    password = read_password(args, sys.stdin)
    _admin(args).upsert_user(args.name, password, mechanism=args.mechanism, iterations=args.iterations)
    print(f"user {args.name}: {args.mechanism} credential set")
    return 0


def cmd_user_list(args: argparse.Namespace) -> int:
    users = _admin(args).list_users()
    if args.json:
        print(json.dumps(users, indent=2, sort_keys=True))
        return 0
    for u in sorted(users, key=lambda u: str(u["name"])):
        print(f"{u['name']}\t{','.join(u.get('mechanisms', []))}")
    return 0


def cmd_user_delete(args: argparse.Namespace) -> int:
    _admin(args).delete_user(args.name)
    print(f"deleted user {args.name}")
    return 0


def cmd_whoami(args: argparse.Namespace) -> int:
    print(_admin(args).whoami())
    return 0


def _usage_errors(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except UsageError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2

    return run


# ---- parser -----------------------------------------------------------------------------------


def _acl_flags(p: argparse.ArgumentParser, *, add: bool) -> None:
    p.add_argument("--allow-principal", action="append", metavar="PRINCIPAL", help="e.g. User:alice, User:*")
    p.add_argument("--deny-principal", action="append", metavar="PRINCIPAL")
    p.add_argument("--allow-host", action="append", metavar="HOST", help="default * (any host)")
    p.add_argument("--deny-host", action="append", metavar="HOST", help="default * (any host)")
    p.add_argument("--operation", action="append", type=_operation, metavar="OP",
                   help="All, Read, Write, Create, Delete, Alter, Describe, IdempotentWrite"
                   + (" (default All)" if add else ""))  # fmt: skip
    p.add_argument("--topic", action="append", metavar="NAME")
    p.add_argument("--group", action="append", metavar="NAME")
    p.add_argument("--transactional-id", action="append", metavar="ID")
    p.add_argument("--cluster", action="store_true", help="the cluster resource (kafka-cluster)")
    choices = ["literal", "prefixed"] if add else ["literal", "prefixed", "match", "any"]
    p.add_argument("--resource-pattern-type", type=str.lower, choices=choices, default="literal" if add else None,
                   help=f"default {'literal' if add else 'any'}")  # fmt: skip


def register(sub: Any, default_bootstrap: str) -> None:
    """Add ``acl``, ``user`` and ``whoami`` to the ``txbroker`` parser's subcommands."""
    acl = sub.add_parser("acl", help="ACLs (kafka-acls.sh's flags)").add_subparsers(dest="sub", required=True)
    p = acl.add_parser("add", help="add ALLOW/DENY ACLs")
    _acl_flags(p, add=True)
    add_cluster_options(p, default_bootstrap)
    p.set_defaults(fn=_usage_errors(cmd_acl_add))
    p = acl.add_parser("list", help="list ACLs (all, or of the given resources)")
    _acl_flags(p, add=False)
    p.add_argument("--principal", help="only this principal's ACLs")
    p.add_argument("--json", action="store_true")
    add_cluster_options(p, default_bootstrap)
    p.set_defaults(fn=_usage_errors(cmd_acl_list))
    p = acl.add_parser("remove", help="remove the matching ACLs (with --force; else show them)")
    _acl_flags(p, add=False)
    p.add_argument("--force", action="store_true", help="remove without asking")
    add_cluster_options(p, default_bootstrap)
    p.set_defaults(fn=_usage_errors(cmd_acl_remove))

    user = sub.add_parser("user", help="SCRAM users").add_subparsers(dest="sub", required=True)
    p = user.add_parser("create", help="create a user or change its password")
    p.add_argument("name")
    p.add_argument("--password-stdin", action="store_true", help="read the password from stdin (first line)")
    p.add_argument("--mechanism", choices=["SCRAM-SHA-256", "SCRAM-SHA-512"], default="SCRAM-SHA-256")
    p.add_argument("--iterations", type=int, help="PBKDF2 iterations (the broker's default and minimum apply)")
    add_cluster_options(p, default_bootstrap)
    p.set_defaults(fn=_usage_errors(cmd_user_create))
    p = user.add_parser("list", help="users and their mechanisms (never a secret)")
    p.add_argument("--json", action="store_true")
    add_cluster_options(p, default_bootstrap)
    p.set_defaults(fn=cmd_user_list)
    p = user.add_parser("delete", help="delete a user")
    p.add_argument("name")
    add_cluster_options(p, default_bootstrap)
    p.set_defaults(fn=cmd_user_delete)

    p = sub.add_parser("whoami", help="the principal the cluster knows you as")
    add_cluster_options(p, default_bootstrap)
    p.set_defaults(fn=cmd_whoami)
