"""A node cut off from its peers, each node in its own network namespace (verify.netns).

Regression tests of the majority side's availability:

* an isolated leader steps down within the check-quorum window and answers the
  produce it holds at once with NOT_LEADER_OR_FOLLOWER, instead of at the
  request's 30 s timeout, while the majority elects a new leader and serves;
* a cut-off node raises no term (pre-vote), so when the link heals every group
  keeps the leader and the term the majority gave it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import http, plain_produce, samples, wait_for
from verify.netns import NamespacedCluster, unavailable_reason

pytestmark = [pytest.mark.fault, pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))]

Groups = dict[tuple[str, str], tuple[int | None, int]]  # (topic, partition) -> (leader node, term)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NamespacedCluster]:
    # No leader balancing during these tests: leadership moves only through the faults.
    with NamespacedCluster(tmp_path, 3, leader_balance_interval_s=3600.0) as c:
        c.start()
        yield c


def _produce(url: str, topic: str, value: bytes, timeout: float = 40.0) -> tuple[int, object, float]:
    started = time.monotonic()
    status, res = plain_produce(url, topic, value, timeout_ms=30_000, timeout=timeout)
    took = time.monotonic() - started
    if status == 200 and isinstance(res, dict):
        code = res["partitions"][0].get("error_code")
        if code not in (None, "NONE"):
            return 421 if code == "NOT_LEADER_OR_FOLLOWER" else 500, res["partitions"][0], took
    return status, res, took


def _create_topic(c: NamespacedCluster, name: str, partitions: int) -> None:
    body = {"name": name, "partitions": partitions, "replication_factor": 3}
    status, res = http("POST", c.url(1) + "/v1/topics", body)
    assert status == 201, res
    for p in range(partitions):
        wait_for(lambda p=p: c.leader_of(name, p), 30, f"a leader of {name}-{p}")


def _groups(c: NamespacedCluster, nodes: list[int]) -> Groups:
    """Every Raft group's leader and term as ``nodes`` report them in their metrics."""
    terms: dict[tuple[str, str], set[int]] = {}
    leaders: dict[tuple[str, str], set[int]] = {}
    for node in nodes:
        for labels, value in samples(c.url(node), "txbroker_raft_term"):
            terms.setdefault((labels["topic"], labels["partition"]), set()).add(int(value))
        for labels, value in samples(c.url(node), "txbroker_raft_is_leader"):
            if value:
                leaders.setdefault((labels["topic"], labels["partition"]), set()).add(node)
    out: Groups = {}
    for key, seen in terms.items():
        led = leaders.get(key, set())
        out[key] = (next(iter(led)) if len(led) == 1 else None, max(seen))
    return out


def _terms_of(c: NamespacedCluster, node: int) -> dict[tuple[str, str], int]:
    return {(lv["topic"], lv["partition"]): int(v) for lv, v in samples(c.url(node), "txbroker_raft_term")}


def test_an_isolated_leader_steps_down_and_answers_what_it_holds_at_once(cluster: NamespacedCluster) -> None:
    _create_topic(cluster, "iso", 1)
    leader = wait_for(lambda: cluster.leader_of("iso", 0), 30, "a leader")
    status, res, _ = _produce(cluster.url(leader), "iso", b"before")
    assert status == 200, res

    cluster.isolate(leader)
    # Sent at once: it reaches the leader while the leader still believes it leads, and is held.
    status, res, took = _produce(cluster.url(leader), "iso", b"during")
    assert status == 421, res
    assert took < 5.0, f"the isolated leader held the produce for {took:.1f}s"

    # The isolated node no longer names itself leader...
    def stepped_down() -> bool:
        view = http("GET", cluster.url(leader) + "/v1/metadata")[1]
        [part] = [p for t in view["topics"] if t["name"] == "iso" for p in t["partitions"]]  # type: ignore[index]
        return part["leader"] != leader

    wait_for(stepped_down, 5, "the isolated node to stop naming itself leader")
    # ...and the majority serves under a new leader.
    others = [n for n in cluster.node_ids if n != leader]

    def new_leader_takes_writes() -> bool:
        for n in others:
            status, _, _ = _produce(cluster.url(n), "iso", b"after", timeout=10)
            if status == 200:
                return True
        return False

    wait_for(new_leader_takes_writes, 15, "a produce accepted on the majority side", interval=0.2)


def test_a_cut_off_node_raises_no_term_and_the_heal_keeps_the_majoritys_leaders(cluster: NamespacedCluster) -> None:
    _create_topic(cluster, "heal", 3)
    # Cut off the controller's leader: the node that leads the most, including coordinator groups.
    target = wait_for(lambda: _groups(cluster, cluster.node_ids)[("__controller", "0")][0], 30, "a controller leader")
    others = [n for n in cluster.node_ids if n != target]
    before = _terms_of(cluster, target)

    cluster.isolate(target)
    # Hold the cut for several election timeouts; all the while the cut-off node keeps its terms.
    held_until = time.monotonic() + 6.0
    while time.monotonic() < held_until:
        now = _terms_of(cluster, target)
        raised = {k: (before[k], v) for k, v in now.items() if k in before and v > before[k]}
        assert not raised, f"the cut-off node raised terms: {raised}"
        time.sleep(0.2)

    # Cut off, it names no leader: it stepped down where it led, and has no news of the others.
    view = http("GET", cluster.url(target) + "/v1/metadata")[1]
    named = {(t["name"], p["partition"]): p["leader"] for t in view["topics"] for p in t["partitions"]}  # type: ignore[index]
    assert named and all(leader is None for leader in named.values()), named

    # The majority has a leader for every group.
    def majority_led() -> Groups | None:
        groups = _groups(cluster, others)
        return groups if groups and all(leader in others for leader, _ in groups.values()) else None

    majority = wait_for(majority_led, 20, "a leader on the majority side for every group")

    cluster.heal()

    # The healed node catches up and follows: it reports the majority's term in every group...
    def caught_up() -> bool:
        mine = _terms_of(cluster, target)
        return all(mine.get(k) == term for k, (_, term) in majority.items())

    wait_for(caught_up, 30, "the healed node to follow the majority's terms")
    # ...and no group changed leader or term because of the heal.
    after = _groups(cluster, cluster.node_ids)
    changed = {k: (majority[k], after.get(k)) for k in majority if after.get(k) != majority[k]}
    assert not changed, f"the heal moved leadership: {changed}"


def test_a_paused_leader_never_answers_a_read_from_its_stale_log_when_it_resumes(cluster: NamespacedCluster) -> None:
    _create_topic(cluster, "pause", 1)
    leader = wait_for(lambda: cluster.leader_of("pause", 0), 30, "a leader")
    status, res, _ = _produce(cluster.url(leader), "pause", b"before")
    assert status == 200, res
    others = [n for n in cluster.node_ids if n != leader]
    cluster.pause(leader)
    try:
        acked = 1

        def write_on_majority() -> bool:
            return any(_produce(cluster.url(n), "pause", b"while paused", timeout=10)[0] == 200 for n in others)

        for _ in range(5):
            wait_for(write_on_majority, 20, "a produce accepted by the majority's new leader", interval=0.1)
            acked += 1
    finally:
        cluster.resume(leader)
    # The first reads after the resume: a 421, or the data as the partition acknowledged it; never less.
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        status, res = http("GET", cluster.url(leader) + "/v1/topics/pause/partitions/0/records?offset=0", timeout=10)
        if status == 200:
            assert res["high_watermark"] >= acked, res  # type: ignore[index]
        else:
            assert status == 421, res
