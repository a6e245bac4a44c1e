"""Many partitions on real nodes: topic creation never stalls the event loop; a dead leader's groups
elect new leaders a bounded number of campaigns at a time, each on its successor replica."""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from tests.support.cluster import LocalCluster, samples, wait_for

PROBE_INTERVAL_S = 0.02
# An event loop that builds 200 groups itself is held ~0.6 s (about 3 ms a group); one that hands the
# work to a thread answers a probe within a few scheduler slices even on a busy 2-core machine.
MAX_STALL_S = 0.5


class LoopProbe:
    """A thread per node asking ``/livez`` every ``PROBE_INTERVAL_S``; the slowest answer each node gave."""

    def __init__(self, urls: list[str]) -> None:
        self.worst = dict.fromkeys(urls, 0.0)
        self.answers = dict.fromkeys(urls, 0)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(u,), daemon=True) for u in urls]

    def _run(self, url: str) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            with contextlib.suppress(OSError), urllib.request.urlopen(url + "/livez", timeout=30) as resp:
                resp.read()
                self.worst[url] = max(self.worst[url], time.monotonic() - t0)
                self.answers[url] += 1
            self._stop.wait(PROBE_INTERVAL_S)

    def __enter__(self) -> LoopProbe:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(35)


def test_creating_200_partitions_holds_no_event_loop_up(make_cluster: Callable[..., LocalCluster]) -> None:
    c = make_cluster()
    with LoopProbe(c.urls) as probe:
        wait_for(lambda: all(n > 10 for n in probe.answers.values()), 10, "the probes answered")
        c.create_topic("wide", partitions=200)
    stalls = {u: round(w, 3) for u, w in probe.worst.items()}
    assert all(w < MAX_STALL_S for w in stalls.values()), stalls
    led = c.wait_leaders("wide", 200)
    assert set(led.values()) == {1, 2, 3}  # leaders on every node from the first election on


def _metric(url: str, name: str) -> float:
    return sum(v for _labels, v in samples(url, name))


def test_a_dead_leaders_groups_elect_successors_a_bounded_number_at_a_time(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    slots = 2
    c = make_cluster(raft_campaign_slots=slots)
    partitions = 30
    c.create_topic("many", partitions=partitions)
    meta = {p["partition"]: p for t in c.metadata(1)["topics"] if t["name"] == "many" for p in t["partitions"]}
    # Every partition's first leader is its preferred replica: the others wait their successor rank.
    wait_for(lambda: _preferred_led(c, 1), 30, "every partition led by its preferred replica")
    counts: dict[int, int] = {}
    for p in meta.values():
        counts[p["replicas"][0]] = counts.get(p["replicas"][0], 0) + 1
    victim = max(counts, key=lambda n: counts[n])
    led = [p for p in meta.values() if p["replicas"][0] == victim]
    survivors = [n for n in (1, 2, 3) if n != victim]
    c.kill(victim)

    def all_led_again() -> dict[int, int] | None:
        out = {}
        for p in led:
            leader = c.leader("many", p["partition"], via=survivors[0])
            if leader is None or leader == victim:
                return None
            out[p["partition"]] = leader
        return out

    new = wait_for(all_led_again, 30, f"new leaders of the {len(led)} partitions node {victim} led")
    for p in led:  # the successor: the replica after the dead leader in the partition's replica list
        reps = p["replicas"]
        assert new[p["partition"]] == reps[(reps.index(victim) + 1) % len(reps)], (p, new[p["partition"]])
    for n in survivors:
        url = c.url(n)
        peak = _metric(url, "txbroker_raft_campaigns_in_flight_peak")
        assert 1 <= peak <= slots, (n, peak)
        assert _metric(url, "txbroker_raft_campaigns_total") >= 1


def _preferred_led(c: LocalCluster, via: int) -> bool:
    topics: list[dict[str, Any]] = c.metadata(via)["topics"]
    parts = [p for t in topics if t["name"] == "many" for p in t["partitions"]]
    return bool(parts) and all(p["leader"] == p["replicas"][0] for p in parts)
