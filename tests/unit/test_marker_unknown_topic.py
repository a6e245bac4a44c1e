"""A marker (or revocation) whose partition's topic the coordinator node does not know (``cluster.txn.markers``
``marker_until_applied``).

"Unknown topic" from the coordinator's own metadata may mean the node just took over and has not applied the
topic's creation yet, not that the topic is gone. Taking it for "gone" at once skips the marker and leaves the
transaction open on that partition for good (a copier fault test with revocations shows it), so an unknown
topic is retried for a grace period first; a newer producer epoch ends the marker at once.
"""

from __future__ import annotations

import asyncio
import time

from clients.protocol import BrokerError, ErrorCode
from cluster.txn.markers import marker_until_applied
from coordinator.metadata import MarkerPlan, TopicPartition

TP = TopicPartition("orders", 0)
PLAN = MarkerPlan("job-1", 7, 3, True, (TP,), 1)


def _run(errors: list[ErrorCode], grace_s: float, *, leading: bool = True) -> tuple[bool | None, int, float]:
    """Drive a marker whose first sends fail with ``errors`` (then it is applied): (answer, sends, seconds)."""
    sends = 0

    async def send() -> bool:
        nonlocal sends
        sends += 1
        if sends <= len(errors):
            raise BrokerError(errors[sends - 1], "from the test")
        return True

    async def main() -> bool | None:
        return await marker_until_applied(send, True, PLAN, TP, lambda: leading, "marker", grace_s)

    started = time.monotonic()
    answer = asyncio.run(main())
    return answer, sends, time.monotonic() - started


def test_an_unknown_topic_is_retried_within_the_grace_period_until_the_marker_is_applied() -> None:
    answer, sends, _ = _run([ErrorCode.UNKNOWN_TOPIC_OR_PARTITION] * 2, grace_s=30.0)
    assert (answer, sends) == (True, 3)


def test_a_topic_that_stays_unknown_past_the_grace_period_counts_as_gone() -> None:
    answer, sends, took = _run([ErrorCode.UNKNOWN_TOPIC_OR_PARTITION] * 100, grace_s=0.3)
    assert answer is True  # "superseded": nothing left to write there
    assert took >= 0.3 and 2 <= sends < 100


def test_without_a_grace_period_an_unknown_topic_is_gone_at_once() -> None:
    assert _run([ErrorCode.UNKNOWN_TOPIC_OR_PARTITION], grace_s=0.0)[:2] == (True, 1)


def test_a_newer_producer_epoch_supersedes_the_marker_at_once_whatever_the_grace() -> None:
    assert _run([ErrorCode.INVALID_PRODUCER_EPOCH], grace_s=30.0)[:2] == (True, 1)


def test_other_retriable_errors_are_retried_and_a_lost_leadership_gives_up() -> None:
    assert _run([ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.REQUEST_TIMED_OUT], grace_s=0.0)[:2] == (True, 3)
    assert _run([], grace_s=0.0, leading=False)[:2] == (None, 0)
