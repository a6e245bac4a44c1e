"""The driver's side of the job-atomic write: one commit-group decision, then cleanup.

A *commit group* is the set of prepared transactions that become visible
together: for a batch job the group id is its write id, for a micro-batch
``<sink id>:<batch id>``. ``finish_group`` asks the broker to commit exactly
the members Spark reported (one per partition: the attempt Spark accepted)
with ``POST /v1/transaction-groups/{group}/end``. The broker binds each member
to the group, records the decision in one Raft entry and then writes every
member's COMMIT markers -- and keeps doing so after a coordinator failover,
so once the decision is recorded the driver may die.

The decision is write-once: a second call for the same group (a retried job
with the same write id, a replayed micro-batch, a retried commit call) gets
the recorded decision and member list back. If those members are not ours,
our transactions are simply not part of it: the output is already there once,
and ours is aborted by the sweep.

``sweep`` aborts every open or prepared transaction under a prefix that is
*not* bound to a commit group: failed and speculative attempts, attempts
whose commit Spark denied, and attempts of earlier runs that never reached a
decision. Bound transactions are left to their group's decision (aborting one
would record an ABORT decision for the group, which would refuse the retry of
a batch job or the replay of a micro-batch forever).

``python -m spark_io.commit MANIFEST.json`` commits a manifest written by a
writer run with the test option ``_test.handoffCommit`` (the same code path as
the driver; used to kill "the driver" between decision and markers).
"""

from __future__ import annotations

import enum
import json
import logging
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from clients.protocol import BrokerError, ErrorCode

from .broker import BrokerClient
from .options import NO_CREDENTIALS, Credentials

log = logging.getLogger("spark_io")

# An abort that finds the transaction already ended (or gone) has nothing left to do.
_ALREADY_ENDED = {ErrorCode.INVALID_TXN_STATE, ErrorCode.PRODUCER_FENCED, ErrorCode.TRANSACTIONAL_ID_NOT_FOUND,
                  ErrorCode.INVALID_PRODUCER_ID_MAPPING}  # fmt: skip


@dataclass(frozen=True)
class Member:
    transactional_id: str
    producer_id: int
    producer_epoch: int


class Outcome(enum.Enum):
    COMMITTED = "committed"  # our members are the group's recorded COMMIT
    DUPLICATE = "duplicate"  # the group was committed before with other members (retry/replay)
    ABORTED = "aborted"  # the group's recorded decision is ABORT


def finish_group(client: BrokerClient, group: str, members: Iterable[Member], deadline_s: float) -> Outcome:
    ours = sorted(set(members), key=lambda m: m.transactional_id)
    if not ours:
        return Outcome.COMMITTED
    body = {"commit": True, "members": [asdict(m) for m in ours]}
    res = client.coordinator_call(f"/v1/transaction-groups/{quote(group, safe='')}/end", body,
                                  f"commit group {group}", deadline_s=deadline_s)  # fmt: skip
    recorded = {Member(m["transactional_id"], int(m["producer_id"]), int(m["producer_epoch"])) for m in res["members"]}
    if not res["committed"]:
        return Outcome.ABORTED
    return Outcome.COMMITTED if recorded == set(ours) else Outcome.DUPLICATE


def sweep(client: BrokerClient, prefix: str) -> list[str]:
    """Abort the open/prepared transactions under ``prefix`` that no commit group owns; returns their ids."""
    aborted = []
    for txn in client.list_transactions(prefix):
        tid = txn["transactional_id"]
        if txn.get("group_id") is not None:
            continue
        try:
            client.abort_transaction(tid)
            aborted.append(tid)
        except BrokerError as exc:
            if exc.error_code not in _ALREADY_ENDED:
                raise
    return aborted


def commit_and_sweep(
    client: BrokerClient, group: str, prefix: str, members: list[Member], deadline_s: float
) -> Outcome:
    """``finish_group`` then a best-effort ``sweep``: once the decision is recorded the job's output is final."""
    outcome = finish_group(client, group, members, deadline_s)
    try:
        swept = sweep(client, prefix)
        if swept:
            log.info("commit group %s: aborted %d other attempt(s): %s", group, len(swept), swept[:10])
    except BrokerError as exc:
        log.warning("commit group %s is %s; cleanup of other attempts failed (%s); the broker's transaction "
                    "timeout ends them", group, outcome.value, exc)  # fmt: skip
    return outcome


# ---- manifest hand-off (tests and operators) -----------------------------------------------------------


def write_manifest(path: str, bootstrap: str, group: str, prefix: str, members: list[Member]) -> None:
    doc = {"bootstrap": bootstrap, "group": group, "prefix": prefix, "members": [asdict(m) for m in members]}
    Path(path).write_text(json.dumps(doc, indent=2))


def commit_manifest(path: str, deadline_s: float = 120.0, credentials: Credentials = NO_CREDENTIALS) -> Outcome:
    """Commit a hand-off manifest (it holds no credentials: a secured cluster needs ``credentials``)."""
    doc: dict[str, Any] = json.loads(Path(path).read_text())
    members = [Member(m["transactional_id"], int(m["producer_id"]), int(m["producer_epoch"])) for m in doc["members"]]
    client = BrokerClient(doc["bootstrap"], credentials=credentials)
    return commit_and_sweep(client, doc["group"], doc["prefix"], members, deadline_s)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m spark_io.commit MANIFEST.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO)
    outcome = commit_manifest(args[0])
    print(outcome.value, flush=True)
    return 0 if outcome is not Outcome.ABORTED else 1


if __name__ == "__main__":
    sys.exit(main())
