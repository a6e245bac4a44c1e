"""``/readyz`` per API.md: 200 only once the node serves requests, on real node processes.

Ready means the controller leader is known and every internal group the node
replicates (``__transaction_state``, ``__consumer_offsets``) has a ready
leader: a transactional request sent the moment a node turns ready succeeds.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import LocalCluster, http, wait_for

pytestmark = pytest.mark.integration

TXN_PARTITIONS = 16
OFFSETS_PARTITIONS = 8


def readyz(c: LocalCluster, node: int) -> tuple[int, Any] | None:
    try:
        return http("GET", c.url(node) + "/readyz?verbose", timeout=2)
    except OSError:
        return None  # not listening yet


def coordinator_requests(c: LocalCluster, node: int, tid: str) -> list[tuple[str, int, Any]]:
    """InitProducerId and DescribeTransactions for ``tid`` through ``node``: (what, status, body) each."""
    out = []
    status, body = http("POST", c.url(node) + "/v1/producers/init",
                        {"transactional_id": tid, "transaction_timeout_ms": 60_000}, timeout=10)  # fmt: skip
    out.append(("init", status, body))
    status, body = http("GET", f"{c.url(node)}/v1/transactions/{tid}", timeout=10)
    out.append(("describe", status, body))
    return out


def assert_missing_listed(body: dict[str, Any]) -> None:
    missing = body["missing_groups"]
    assert missing, body
    for m in missing:
        assert set(m) == {"group", "leader", "reason"}, m
        assert m["group"].startswith(("__transaction_state-", "__consumer_offsets-", "__controller")), m


def test_ready_node_serves_coordinator_requests_at_once(tmp_path: Path):
    c = LocalCluster(tmp_path / "cluster", 3, transaction_state_partitions=TXN_PARTITIONS,
                     offsets_topic_partitions=OFFSETS_PARTITIONS)  # fmt: skip
    try:
        for n in (1, 2, 3):
            c.start_node(n)
        # As soon as each node answers /readyz 200, transactional requests through it succeed (no 503)
        booting: list[dict[str, Any]] = []
        answers: list[tuple[int, str, int, Any]] = []
        pending = {1, 2, 3}
        deadline = time.monotonic() + 60
        while pending and time.monotonic() < deadline:
            for n in sorted(pending):
                got = readyz(c, n)
                if got is None:
                    continue
                status, body = got
                if status == 503:
                    booting.append(body)
                    continue
                assert status == 200, body
                assert body["status"] == "ready" and body["missing_groups"] == []
                # one id per transaction-state partition, so every coordinator partition is asked
                for k in range(3 * TXN_PARTITIONS):
                    answers += [(n, what, s, b) for what, s, b in coordinator_requests(c, n, f"tx-{n}-{k}")]
                pending.discard(n)
            time.sleep(0.01)  # polling interval, bounded by the deadline above
        assert not pending, f"nodes {pending} never ready"
        failed = [(n, what, s, b) for n, what, s, b in answers if s != 200]
        assert failed == []
        # A 503 before readiness said what was missing
        for body in booting:
            assert body["status"] == "booting"
            assert_missing_listed(body)
        # And every id is described through every node
        for n in (1, 2, 3):
            for m in (1, 2, 3):
                status, body = http("GET", f"{c.url(n)}/v1/transactions/tx-{m}-0", timeout=10)
                assert status == 200, body

        # When two of the three nodes die, the last one is not ready any more, and says why
        c.signal(2, signal.SIGKILL)
        c.signal(3, signal.SIGKILL)

        def not_ready() -> dict[str, Any] | None:
            got = readyz(c, 1)
            return got[1] if got is not None and got[0] == 503 else None

        body = wait_for(not_ready, 30, "node 1 /readyz 503 with no quorum")
        assert_missing_listed(body)

        def all_groups_missing() -> bool:
            got = readyz(c, 1)
            assert got is not None and got[0] == 503, got
            groups = {m["group"] for m in got[1]["missing_groups"]}
            return groups >= {f"__transaction_state-{p}" for p in range(TXN_PARTITIONS)} | {
                f"__consumer_offsets-{p}" for p in range(OFFSETS_PARTITIONS)
            }

        wait_for(all_groups_missing, 30, "every internal group listed as missing on node 1")
    finally:
        c.close()
