"""``txbroker topic add-partitions|alter-config|describe-config``: kafka-topics.sh --alter and kafka-configs.sh.

``add-partitions T --count N`` grows a topic to N partitions in total (only
up); ``--replica-assignment 1:2:3,2:3:1`` places them by hand, in
kafka-topics.sh's format (partitions separated by commas, each one's node ids
by colons, preferred leader first), either for the new partitions only or for
every partition (the existing ones' part is then left out, as kafka-topics.sh
does). ``alter-config T --set k=v --delete k`` sets and deletes config
overrides (kafka-configs.sh --add-config / --delete-config);
``describe-config T`` prints every key's value and where it comes from. A
refusal prints the error code and exits non-zero (``cluster.cli.main``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from clients.admin import Admin
from clients.protocol import BrokerError, ErrorCode

from .client_config import client_options

__all__ = ["add_topic_admin_parsers"]


def _key_value(text: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    if not eq or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, not {text!r}")
    return key.strip(), value.strip()


def parse_replica_assignment(text: str) -> list[list[int]]:
    """``"1:2:3,2:3:1"`` -> ``[[1, 2, 3], [2, 3, 1]]`` (INVALID_REPLICA_ASSIGNMENT when malformed)."""
    out = []
    for part in text.split(","):
        try:
            out.append([int(r) for r in part.split(":")])
        except ValueError:
            raise BrokerError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"{part!r} is not a colon-separated list of node ids"
            ) from None
    return out


def print_config(config: dict[str, Any]) -> None:
    """One ``key=value`` line per config key, marked ``(override)`` or ``(default)``."""
    overrides = config.get("overrides", {})
    print(f"config of topic {config['topic']}:")
    for key, value in config["config"].items():
        print(f"  {key}={value}\t({'override' if key in overrides else 'default'})")


def cmd_add_partitions(args: argparse.Namespace) -> int:
    admin = Admin(args.bootstrap, **client_options(args))
    assignments = None
    if args.replica_assignment is not None:
        assignments = parse_replica_assignment(args.replica_assignment)
        if len(assignments) == args.count:  # every partition's: the existing ones stay where they are
            current = len(admin.describe_topic(args.topic)["partitions"])
            assignments = assignments[current:]
    res = admin.create_partitions(args.topic, args.count, assignments)
    print(f"topic {res['name']} has {len(res['partitions'])} partitions")
    return 0


def cmd_alter_config(args: argparse.Namespace) -> int:
    changes: dict[str, Any] = dict(args.set or [])
    for key in args.delete or []:
        if key in changes:
            raise BrokerError(ErrorCode.INVALID_CONFIG, f"{key} is both set and deleted")
        changes[key] = None
    if not changes:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "give at least one --set KEY=VALUE or --delete KEY")
    print_config(Admin(args.bootstrap, **client_options(args)).alter_topic_config(args.topic, changes))
    return 0


def cmd_describe_config(args: argparse.Namespace) -> int:
    print_config(Admin(args.bootstrap, **client_options(args)).describe_topic_config(args.topic))
    return 0


def add_topic_admin_parsers(
    topic: argparse._SubParsersAction[argparse.ArgumentParser], bootstrap: Callable[[argparse.ArgumentParser], None]
) -> None:
    """The three commands under ``txbroker topic``; ``bootstrap`` adds --bootstrap and --command-config."""
    p = topic.add_parser("add-partitions", help="grow a topic to --count partitions in total (only up)")
    p.add_argument("topic")
    p.add_argument("--count", type=int, required=True, help="the topic's new partition count")
    p.add_argument(
        "--replica-assignment",
        metavar="IDS",
        help="node ids per partition, e.g. 1:2:3,2:3:1 (the new partitions', or every partition's)",
    )
    bootstrap(p)
    p.set_defaults(fn=cmd_add_partitions)
    p = topic.add_parser("alter-config", help="set or delete a topic's config overrides")
    p.add_argument("topic")
    p.add_argument("--set", action="append", type=_key_value, metavar="KEY=VALUE", help="set an override")
    p.add_argument("--delete", action="append", metavar="KEY", help="delete an override (back to the default)")
    bootstrap(p)
    p.set_defaults(fn=cmd_alter_config)
    p = topic.add_parser("describe-config", help="every config key of a topic, its value and where it comes from")
    p.add_argument("topic")
    bootstrap(p)
    p.set_defaults(fn=cmd_describe_config)
