"""Leader changes after a heal: every Raft group's leader and term, read from the nodes' metrics.

A heal should change no leadership: the majority elected its leaders during the fault, and a node
coming back follows them (pre-vote keeps it from deposing them with a term it raised while cut
off). ``HealWatch`` takes a snapshot of every group's ``(leader, term)`` when a fault heals and
another ``settle_s`` later, and records how many groups changed in between as a ``leadership``
line of the history. The leader balancer gives leadership back to preferred replicas only after
they have been healthy for ``leader_balance_hold_s``, so a settle time below it measures what
the heal itself caused.
"""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Callable, Mapping, Sequence

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["HealWatch", "Leadership", "changed_groups", "parse_leadership", "snapshot"]

#: group ("topic/partition") -> (leader node index in the URL list, or -1 if none, term)
Leadership = dict[str, tuple[int, int]]


def parse_leadership(texts: Sequence[str | None]) -> Leadership:
    """Merge the ``/metrics`` texts of the nodes (index = node position; None = no answer).

    A group's term is the highest any node reports; its leader the node that reports
    ``raft_is_leader`` 1 at that term (-1 when none does).
    """
    terms: dict[str, dict[int, int]] = {}
    leading: dict[str, set[int]] = {}
    for i, text in enumerate(texts):
        if text is None:
            continue
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name not in ("txbroker_raft_term", "txbroker_raft_is_leader"):
                    continue
                group = f"{sample.labels.get('topic')}/{sample.labels.get('partition')}"
                if sample.name == "txbroker_raft_term":
                    terms.setdefault(group, {})[i] = int(sample.value)
                elif sample.value:
                    leading.setdefault(group, set()).add(i)
    out: Leadership = {}
    for group, by_node in terms.items():
        term = max(by_node.values())
        leaders = [i for i in leading.get(group, ()) if by_node.get(i) == term]
        out[group] = (leaders[0] if len(leaders) == 1 else -1, term)
    return out


def changed_groups(before: Mapping[str, tuple[int, int]], after: Mapping[str, tuple[int, int]]) -> list[str]:
    """Groups led in both snapshots whose leader or term differs."""
    return sorted(g for g, (leader, term) in before.items() if g in after and after[g] != (leader, term))


def _metrics(url: str, timeout: float) -> str | None:
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=timeout) as resp:
            return str(resp.read().decode())
    except OSError:
        return None


def snapshot(urls: Sequence[str], timeout: float = 2.0) -> Leadership:
    """Every group's leader and term as the nodes at ``urls`` report them now."""
    return parse_leadership([_metrics(u, timeout) for u in urls])


class HealWatch:
    """On each heal, count the groups whose leadership changes within ``settle_s``; ``record`` gets
    ``(fault, heal_time, groups, changed)`` from a background thread."""

    def __init__(
        self,
        urls: Sequence[str],
        record: Callable[[str, float, int, list[str]], None],
        settle_s: float,
        stop: threading.Event,
    ) -> None:
        self._urls = list(urls)
        self._record = record
        self._settle_s = settle_s
        self._stop = stop
        self._threads: list[threading.Thread] = []

    def healed(self, fault: str, heal_time: float) -> None:
        thread = threading.Thread(target=self._watch, args=(fault, heal_time), daemon=True, name="verify-heal-watch")
        self._threads.append(thread)
        thread.start()

    def _watch(self, fault: str, heal_time: float) -> None:
        before = snapshot(self._urls)
        if self._stop.wait(self._settle_s):
            return
        after = snapshot(self._urls)
        led = {g: v for g, v in before.items() if v[0] >= 0}
        self._record(fault, heal_time, len(led), changed_groups(led, after))

    def join(self, timeout: float) -> None:
        for thread in self._threads:
            thread.join(timeout)
