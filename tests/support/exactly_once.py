"""Checks for producer tests: a partition's log against what was sent to it.

"Exactly once, in order" for one partition, with every sent value unique:
the log is a subsequence of the send order (no duplicate, no reordering), and
every acknowledged record is in it at the offset its ``RecordMetadata`` named.
Records whose future failed may or may not be in the log (a timeout leaves the
outcome unknown), but at most once and in order.
"""

from __future__ import annotations

from collections.abc import Sequence

from clients.records import RecordMetadata

from .cluster import LocalCluster, wait_for
from .writer import read_partition


def read_log(
    c: LocalCluster, topic: str, partition: int, at_least: int = 0, timeout: float = 30.0
) -> list[tuple[int, bytes]]:
    """Every (offset, value) of the partition as its current leader holds it (waits for ``at_least`` records)."""

    def read() -> list[tuple[int, bytes]] | None:
        leader = c.leader(topic, partition)
        if leader is None:
            return None
        got = read_partition(c, topic, partition, leader)
        return got if len(got) >= at_least else None

    return wait_for(read, timeout, f"{at_least} records in {topic}-{partition}")


def assert_exactly_once_in_order(
    sent: Sequence[bytes], acked: dict[bytes, RecordMetadata], log: Sequence[tuple[int, bytes]], where: str
) -> None:
    position = {v: i for i, v in enumerate(sent)}
    assert len(position) == len(sent), "test bug: sent values must be unique"
    values = [v for _, v in log]
    assert len(set(values)) == len(values), f"{where}: duplicate records in the log"
    unknown = [v for v in values if v not in position]
    assert not unknown, f"{where}: records nobody sent: {unknown[:3]}"
    idx = [position[v] for v in values]
    bad = next((k for k in range(1, len(idx)) if idx[k] <= idx[k - 1]), None)
    assert bad is None, f"{where}: log order differs from send order at offset {log[bad][0]}"
    offsets = {v: o for o, v in log}
    missing = [v for v in acked if v not in offsets]
    assert not missing, f"{where}: {len(missing)} acknowledged records missing, e.g. {missing[:3]}"
    wrong = [(v, md.offset, offsets[v]) for v, md in acked.items() if md.offset != offsets[v]]
    assert not wrong, f"{where}: acknowledged offsets differ from the log: {wrong[:3]}"
