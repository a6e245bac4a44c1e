"""raft.traffic: per-thread cells summed by the reader, finished threads included."""

from __future__ import annotations

import threading

from raft import traffic


def test_counts_of_every_thread_add_up_and_outlive_their_threads() -> None:
    before = traffic.totals()

    def work(n: int) -> None:
        for _ in range(n):
            traffic.count_sent(10)
            traffic.count_received(7)

    threads = [threading.Thread(target=work, args=(1000 * (i + 1),)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = traffic.totals()
    frames = 1000 + 2000 + 3000 + 4000
    assert after.frames_sent - before.frames_sent == frames
    assert after.bytes_sent - before.bytes_sent == 10 * frames
    assert after.frames_received - before.frames_received == frames
    assert after.bytes_received - before.bytes_received == 7 * frames
