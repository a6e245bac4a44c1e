"""Pre-vote and check quorum in real Raft groups (3 RaftNodes in one process, real TCP).

* A follower whose election deadline passes while its leader is alive asks its
  peers first; they refuse, and no term changes anywhere: stock PySyncObj would
  raise the term and depose the leader.
* A leader that loses its majority steps down within the check-quorum window and
  fails the proposal it holds at once, instead of at the proposal's timeout.
* Failover after a leader stops still elects within a few election timeouts.
"""

from __future__ import annotations

import pathlib
import time

import pytest

from raft import RaftCommandFailed, RaftSettings
from raft import pysyncobj_patches as patches
from tests.raft_support.cluster import PASSWORD, Cluster, eventually, run

pytestmark = pytest.mark.integration

GROUP = "q"


def _so(c: Cluster, i: int) -> object:
    return c.group(i, GROUP)._so


def test_a_follower_past_its_deadline_asks_first_and_nobody_changes_term(tmp_path: pathlib.Path) -> None:
    # An active group: a quiescent follower that hears its leader's node moves its deadline
    # back itself (tests/integration/test_raft_quiescence.py) and would ask nobody.
    settings = RaftSettings(password=PASSWORD, quiesce_after_s=0)

    async def scenario() -> None:
        c = Cluster(tmp_path, [GROUP], settings=settings)
        try:
            c.start_all()
            leader = (await c.wait_leaders())[GROUP]
            assert await c.submit(GROUP, b"add:k:1") == 1
            follower = next(i for i in range(3) if i != leader)
            terms = [c.group(i, GROUP).term() for i in range(3)]
            so = _so(c, follower)
            rounds_before = so.pre_vote_rounds  # type: ignore[attr-defined]

            def expire() -> None:
                patches.set_election_deadline(so, 0.0)

            c.group(follower, GROUP)._shard.call(expire).result(5)
            await eventually(lambda: so.pre_vote_rounds > rounds_before, 5, "a pre-vote round")  # type: ignore[attr-defined]
            # Give the round every chance to be (wrongly) won: a campaign would follow within a tick.
            await eventually(lambda: so._txb_round is None or so._txb_round.lost, 5, "the round's answers")  # type: ignore[attr-defined]
            assert [c.group(i, GROUP).term() for i in range(3)] == terms
            assert c.leader_index(GROUP) == leader
            assert so.pre_vote_campaigns == 0  # type: ignore[attr-defined]
            assert await c.submit(GROUP, b"add:k:1") == 2
        finally:
            c.close()

    run(scenario)


def test_a_leader_without_its_majority_steps_down_and_fails_what_it_holds(tmp_path: pathlib.Path) -> None:
    # A wide check-quorum window, so that the proposal below is surely made while the node still leads.
    settings = RaftSettings(
        password=PASSWORD,
        election_timeout_min_s=3.0,
        election_timeout_max_s=4.0,
        check_quorum_s=2.0,
        leader_fallback_s=20.0,
    )

    async def scenario() -> None:
        c = Cluster(tmp_path, [GROUP], settings=settings)
        try:
            c.start_all()
            leader = (await c.wait_leaders(timeout=30))[GROUP]
            assert await c.submit(GROUP, b"add:k:1") == 1
            for i in range(3):
                if i != leader:
                    c.stop_node(i)
            group = c.group(leader, GROUP)
            assert group.is_leader(), "stopping the followers took longer than the check-quorum window"
            started = time.monotonic()
            with pytest.raises(RaftCommandFailed) as failed:
                await group.submit(b"add:k:1", timeout=30.0)
            took = time.monotonic() - started
            assert failed.value.reason == "LEADERSHIP_LOST"
            assert took < settings.check_quorum_s + 1.5, f"held for {took:.1f}s"
            assert not group.is_leader()
            assert group._so.quorum_step_downs == 1  # type: ignore[union-attr]
            assert group._so.failed_on_step_down >= 1  # type: ignore[union-attr]
        finally:
            c.close()

    run(scenario)


def test_a_stopped_leader_is_replaced_within_a_few_election_timeouts(tmp_path: pathlib.Path) -> None:
    async def scenario() -> None:
        c = Cluster(tmp_path, [GROUP])
        try:
            c.start_all()
            leader = (await c.wait_leaders())[GROUP]
            assert await c.submit(GROUP, b"add:k:1") == 1
            old_term = c.group(leader, GROUP).term()
            c.stop_node(leader)
            took = await eventually(lambda: c.leader_index(GROUP) is not None, 10, "a new leader")
            new = c.leader_index(GROUP)
            assert new is not None and new != leader
            assert c.group(new, GROUP).term() <= old_term + 2  # pre-vote rounds raise no term; at most a split vote
            assert took < 5.0
            assert await c.submit(GROUP, b"add:k:1") == 2
        finally:
            c.close()

    run(scenario)


def test_a_leader_counts_as_responsive_only_the_followers_that_answer(tmp_path: pathlib.Path) -> None:
    async def scenario() -> None:
        c = Cluster(tmp_path, [GROUP])
        try:
            c.start_all()
            leader = (await c.wait_leaders())[GROUP]
            followers = [i for i in range(3) if i != leader]
            group = c.group(leader, GROUP)
            await eventually(
                lambda: group.status().responsive == {c.addrs[i] for i in followers}, 5, "both followers answering"
            )
            c.stop_node(followers[0])
            await eventually(lambda: group.status().responsive == {c.addrs[followers[1]]}, 5, "one answering")
            assert group.is_leader()  # still a majority
            assert c.group(followers[1], GROUP).status().responsive == frozenset()  # a follower reports none
        finally:
            c.close()

    run(scenario)
