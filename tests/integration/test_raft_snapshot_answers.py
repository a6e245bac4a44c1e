"""A follower that waits for a snapshot keeps answering its leader (``raft.quorum_guard``).

3 RaftNodes in one process, one store-backed group. A follower that missed
the compacted part of the log is sent a full snapshot, which the leader first
builds from its store: slow for a large partition (here slowed to 2 s). The
leader's check quorum must keep counting that follower as heard all along, or
the group's leadership rests on the third node alone while a replaced node
catches up.
"""

from __future__ import annotations

import asyncio
import pathlib
import threading
import time
from collections.abc import Callable
from typing import BinaryIO

import pytest

from raft import RaftSettings
from raft import pysyncobj_patches as patches
from tests.raft_support.cluster import PASSWORD, Cluster, eventually, run
from tests.raft_support.counter_sm import DurableCounterStateMachine

pytestmark = pytest.mark.integration

BUILD_S = 2.0


def test_a_follower_waiting_for_a_snapshot_counts_as_heard(tmp_path: pathlib.Path) -> None:
    async def scenario() -> None:
        settings = RaftSettings(password=PASSWORD, log_compaction_min_entries=20, log_compaction_split=False)
        c = Cluster(tmp_path, ["s"], settings=settings, durable=True)
        try:
            c.start_all()
            leader = (await c.wait_leaders())["s"]
            lagging = (leader + 1) % 3
            c.stop_node(lagging)
            for _ in range(100):
                await c.submit("s", b"add:k:1")
            so = c.group(leader, "s")._so
            await eventually(lambda: len(patches.raft_log(so)) < 50, 10, "the leader compacted its log")

            sm = c.sms[(leader, "s")]
            assert isinstance(sm, DurableCounterStateMachine)
            building = threading.Event()
            built = threading.Event()
            consistent_snapshot = sm.consistent_snapshot

            def slow_snapshot() -> tuple[int, Callable[[BinaryIO], None]]:
                index, write = consistent_snapshot()

                def slow_write(out: BinaryIO) -> None:
                    building.set()
                    time.sleep(BUILD_S)  # the build thread: a large partition's copy
                    write(out)
                    built.set()

                return index, slow_write

            sm.consistent_snapshot = slow_snapshot  # type: ignore[method-assign]
            term = c.group(leader, "s").term()
            address = c.addrs[lagging]
            c.start_node(lagging)
            await eventually(building.is_set, 10, "the leader building a full snapshot")
            started = time.monotonic()
            oldest = 0.0
            while not built.is_set():
                assert time.monotonic() - started < BUILD_S + 5, "the build never finished"
                if time.monotonic() - started > 0.5:  # past the connection's first answers
                    answered = {str(n.id): t for n, t in dict(patches.last_response_times(so)).items()}
                    oldest = max(oldest, patches.syncobj_clock() - answered[address])
                await asyncio.sleep(0.02)
            assert oldest < settings.check_quorum_s, f"the waiting follower went unheard for {oldest:.2f} s"
            await c.wait_value("s", "k", 100, timeout=20)
            assert c.sms[(lagging, "s")].restored_from_snapshot >= 1
            assert c.group(leader, "s").is_leader() and c.group(leader, "s").term() == term
        finally:
            c.close()

    run(scenario)
