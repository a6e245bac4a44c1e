"""``txbroker group``: kafka-consumer-groups.sh over the HTTP API.

* ``group list`` prints each group id (``--state``: a GROUP STATE MEMBERS table; ``--json``: the raw list).
* ``group describe G`` prints kafka-consumer-groups.sh's offsets table (GROUP TOPIC PARTITION
  CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID; HOST and CLIENT-ID are those of Kafka
  clients' members, ``-`` for HTTP members, which are known by id only); ``--members`` the members and
  their assignments, ``--state`` the group's state and coordinator. An unknown group (``Dead``) is an error (exit 1).
* ``group delete G [G ...]`` deletes empty groups with their committed offsets (exit 1 if any failed).
* ``group reset-offsets G --topic T --to-earliest|--to-latest|--to-offset N|--to-datetime ISO
  [--partitions 0,1] [--execute]``: a dry run unless ``--execute`` (kafka-consumer-groups.sh's flags;
  ``--dry-run`` says so explicitly). ``--to-datetime`` takes ISO 8601 (``2024-05-01T12:00:00``,
  ``...Z`` or ``...+02:00``); without a zone it is local time, as in Kafka's tool.

Every subcommand takes ``--bootstrap`` and ``--command-config`` (a secured cluster's client config).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Sequence
from typing import Any

from clients.admin import Admin

from .client_config import add_cluster_options, client_options

__all__ = ["parse_datetime_ms", "parse_partitions", "register", "table"]

MISSING = "-"


def _admin(args: argparse.Namespace) -> Admin:
    return Admin(args.bootstrap, **client_options(args))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns as wide as their widest cell (None prints ``-``), two spaces apart."""
    cells = [[MISSING if v is None else str(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = [list(headers), *cells]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def parse_datetime_ms(text: str) -> int:
    """ISO 8601 to epoch milliseconds; a time without a zone is local time (kafka-consumer-groups.sh)."""
    raw = text.strip()
    if raw.endswith(("Z", "z")):
        raw = raw[:-1] + "+00:00"
    try:
        when = datetime.datetime.fromisoformat(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--to-datetime: not an ISO 8601 date-time: {text!r}") from exc
    if when.tzinfo is None:
        when = when.astimezone()  # local time
    ms = int(when.timestamp() * 1000)
    if ms < 0:
        raise argparse.ArgumentTypeError("--to-datetime: before 1970")
    return ms


def parse_partitions(text: str) -> list[int]:
    """``0,1,5`` -> [0, 1, 5]."""
    try:
        out = [int(p) for p in text.split(",") if p.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--partitions: a comma-separated list of numbers, not {text!r}") from exc
    if not out or any(p < 0 for p in out):
        raise argparse.ArgumentTypeError(f"--partitions: a comma-separated list of numbers >= 0, not {text!r}")
    return out


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


# ---- commands -----------------------------------------------------------------------------------------


def cmd_group_list(args: argparse.Namespace) -> int:
    groups = _admin(args).list_consumer_groups()
    if args.json:
        _print_json(groups)
    elif args.state:
        print(table(("GROUP", "STATE", "MEMBERS"), [(g["group_id"], g["state"], g["members"]) for g in groups]))
    else:
        for g in groups:
            print(g["group_id"])
    return 0


def _members_view(d: dict[str, Any], verbose: bool) -> str:
    headers = ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"] + (["ASSIGNMENT"] if verbose else [])
    rows = []
    for m in d["members"]:
        row: list[Any] = [d["group_id"], m["member_id"], m.get("client_host"), m.get("client_id"),
                          len(m["assignment"])]  # fmt: skip
        if verbose:
            parts = ",".join(f"{a['topic']}:{a['partition']}" for a in m["assignment"])
            row.append(parts or None)
        rows.append(row)
    return table(headers, rows)


def _state_view(d: dict[str, Any]) -> str:
    coordinator = f"node {d.get('coordinator')} (__consumer_offsets-{d.get('partition')})"
    return table(
        ("GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"),
        [(d["group_id"], coordinator, d.get("protocol"), d["state"], len(d["members"]))],
    )


def _offsets_view(d: dict[str, Any]) -> str:
    members = {m["member_id"]: m for m in d["members"]}
    rows = [
        (d["group_id"], o["topic"], o["partition"], None if o["offset"] < 0 else o["offset"],
         o.get("log_end_offset"), o.get("lag"), o.get("member_id"),
         members.get(o.get("member_id"), {}).get("client_host"), members.get(o.get("member_id"), {}).get("client_id"))
        for o in d["offsets"]
    ]  # fmt: skip
    headers = ("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST",
               "CLIENT-ID")  # fmt: skip
    return table(headers, rows)


def cmd_group_describe(args: argparse.Namespace) -> int:
    (d,) = _admin(args).describe_consumer_groups([args.group])
    if args.json:
        _print_json(d)
        return 0
    if d["state"] == "Dead":
        print(f"Error: Consumer group '{args.group}' does not exist.", file=sys.stderr)
        return 1
    if args.state:
        print(_state_view(d))
        return 0
    if not d["members"]:
        print(f"Consumer group '{args.group}' has no active members.\n")
    if args.members:
        print(_members_view(d, args.verbose))
    else:
        print(_offsets_view(d))
    return 0


def cmd_group_delete(args: argparse.Namespace) -> int:
    results = _admin(args).delete_consumer_groups(args.groups)
    failed = [(g, e) for g, e in results if e is not None]
    done = [g for g, e in results if e is None]
    if done:
        names = ", ".join(f"'{g}'" for g in done)
        print(f"Deletion of requested consumer groups ({names}) was successful.")
    if failed:
        print("Error: Deletion of some consumer groups failed:", file=sys.stderr)
        for g, e in failed:
            assert e is not None
            print(f"* Group '{g}' could not be deleted due to: {e.error_code.name}: {e.message}", file=sys.stderr)
        return 1
    return 0


def _reset_to(args: argparse.Namespace) -> str | dict[str, int]:
    if args.to_earliest:
        return "earliest"
    if args.to_latest:
        return "latest"
    if args.to_offset is not None:
        return {"offset": args.to_offset}
    return {"timestamp": args.to_datetime}


def cmd_group_reset_offsets(args: argparse.Namespace) -> int:
    if args.to_offset is not None and args.to_offset < 0:
        print("error: --to-offset must be >= 0", file=sys.stderr)
        return 2
    res = _admin(args).reset_consumer_group_offsets(
        args.group, args.topic, _reset_to(args), partitions=args.partitions, execute=args.execute
    )
    if args.json:
        _print_json(res)
    else:
        rows = [(res["group_id"], o["topic"], o["partition"], None if o["current_offset"] < 0 else o["current_offset"],
                 o["new_offset"]) for o in res["offsets"]]  # fmt: skip
        print(table(("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET"), rows))
    if res["dry_run"]:
        print("dry run: nothing changed (add --execute to commit these offsets)", file=sys.stderr)
    return 0


# ---- parser -----------------------------------------------------------------------------------------------


def register(sub: Any, default_bootstrap: str) -> None:
    """Add ``group`` (list, describe, delete, reset-offsets) to the ``txbroker`` parser's subcommands."""
    group = sub.add_parser("group", help="consumer groups (kafka-consumer-groups.sh)").add_subparsers(
        dest="sub", required=True
    )
    p = group.add_parser("list", help="every consumer group of the cluster")
    p.add_argument("--state", action="store_true", help="show each group's state and member count")
    p.add_argument("--json", action="store_true")
    add_cluster_options(p, default_bootstrap)
    p.set_defaults(fn=cmd_group_list)

    p = group.add_parser("describe", help="a group's offsets and lag (or --members, --state)")
    p.add_argument("group")
    view = p.add_mutually_exclusive_group()
    view.add_argument("--members", action="store_true", help="the members (--verbose: with their partitions)")
    view.add_argument("--state", action="store_true", help="state, coordinator, assignment strategy")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--json", action="store_true", help="the whole description as JSON")
    add_cluster_options(p, default_bootstrap)
    p.set_defaults(fn=cmd_group_describe)

    p = group.add_parser("delete", help="delete empty groups with their committed offsets")
    p.add_argument("groups", nargs="+", metavar="GROUP")
    add_cluster_options(p, default_bootstrap)
    p.set_defaults(fn=cmd_group_delete)

    p = group.add_parser("reset-offsets", help="move a group's offsets of a topic (a dry run unless --execute)")
    p.add_argument("group")
    p.add_argument("--topic", required=True)
    p.add_argument("--partitions", type=parse_partitions, help="comma-separated partitions (default: all)")
    to = p.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="the log start offset")
    to.add_argument("--to-latest", action="store_true", help="the log end offset (high watermark)")
    to.add_argument("--to-offset", type=int, metavar="N", help="N, clamped to [log start, log end]")
    to.add_argument(
        "--to-datetime", type=parse_datetime_ms, metavar="ISO",
        help="the first offset whose record timestamp is at or after this time (ISO 8601; local time without a zone)",
    )  # fmt: skip
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--execute", action="store_true", help="commit the new offsets")
    mode.add_argument("--dry-run", action="store_true", help="only show the new offsets (the default)")
    p.add_argument("--json", action="store_true")
    add_cluster_options(p, default_bootstrap)
    p.set_defaults(fn=cmd_group_reset_offsets)
