"""Idle cost of many groups: ``python -m bench.raft_idle [--groups 64] [--seconds 20]``.

Starts 3 ``raft.node_host`` processes on loopback, each hosting one replica of
N data groups plus one controller-like group, waits until every group has a
ready leader, then samples each process's CPU time from /proc/<pid>/stat over
an idle window and prints % of one core, RSS (and per group replica), thread
count and sockets per process (all socket descriptors, and the established TCP
connections among them: one per peer node with node links, ``raft.links``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from cluster.config import free_ports
from raft.node_host import HostProcess

from .measure import proc_stat


def start_cluster(
    n_groups: int, extra: list[str], tmp: str, extra_args: list[str], start_timeout: float = 30.0
) -> tuple[list[HostProcess], list[str]]:
    """Start the 3 node processes side by side (each creates its groups before it answers)."""
    addrs = [f"127.0.0.1:{port}" for port in free_ports(3)]

    def start(i: int) -> HostProcess:
        args = [
            "--addr", addrs[i], "--members", ",".join(addrs), "--data", os.path.join(tmp, f"n{i}"),
            "--groups", str(n_groups), "--prefix", "p", "--extra-groups", ",".join(extra),
            *extra_args,
        ]  # fmt: skip
        return HostProcess(args, stderr_path=os.path.join(tmp, f"n{i}.log"), start_timeout=start_timeout)

    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(start, i) for i in range(3)]
    procs = [f.result() for f in futures if f.exception() is None]
    if len(procs) < 3:
        for p in procs:
            p.kill()
        raise next(e for f in futures if (e := f.exception()) is not None)
    return procs, addrs


def sockets(pid: int) -> tuple[int, int]:
    """(socket descriptors, established TCP connections) of process ``pid``."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    established = 0
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "01" and fields[9] in inodes:
                    established += 1
    return len(inodes), established


def wait_all_leaders(procs: list[HostProcess], total: int, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        ready = set()
        for p in procs:
            ready.update(p.request({"op": "leaders"})["ready"])
        if len(ready) >= total:
            return time.monotonic() - start
        time.sleep(0.2)
    raise TimeoutError(f"only {len(ready)}/{total} groups have a ready leader")


def wait_quiescent(
    procs: list[HostProcess], timeout: float, step: float = 2.0, still: int = 3
) -> tuple[float, list[int]]:
    """Wait until no node's count of quiescent replicas (and of leaders) changes over ``still`` steps in a row."""

    def counts() -> list[tuple[int, int]]:
        out = []
        for p in procs:
            roles = p.request({"op": "roles"}, timeout=60.0)["ok"].values()
            out.append((sum(1 for r in roles if r[2] == "QUIESCENT"), sum(1 for r in roles if r[0] == "leader")))
        return out

    start = time.monotonic()
    before, same = counts(), 0
    while time.monotonic() - start < timeout and same < still:
        time.sleep(step)
        now = counts()
        same = same + 1 if now == before else 0
        before = now
    return time.monotonic() - start, [q for q, _ in before]


def quiescent_groups(metrics_url: str, timeout: float = 10.0) -> tuple[int, int, int]:
    """(``txbroker_raft_quiescent_groups``, Raft groups led, sum of their terms) as one node's ``/metrics`` says."""
    with urllib.request.urlopen(metrics_url, timeout=timeout) as resp:
        text = resp.read().decode()
    quiet = led = terms = 0
    for line in text.splitlines():
        if line.startswith("txbroker_raft_quiescent_groups "):
            quiet = int(float(line.split()[-1]))
        elif line.startswith("txbroker_raft_is_leader{") and line.endswith(" 1.0"):
            led += 1
        elif line.startswith("txbroker_raft_term{"):
            terms += int(float(line.split()[-1]))
    return quiet, led, terms


def wait_settled(metrics_urls: list[str], timeout: float, step: float = 2.0, still: int = 4) -> tuple[float, list[int]]:
    """Wait until no node's quiescent groups, led groups or terms change over ``still`` steps in a row (the
    elections, leader balancing and wake-ups after a topic's creation are over); (seconds waited, quiescent
    groups per node)."""
    start = time.monotonic()
    before = [quiescent_groups(u) for u in metrics_urls]
    same = 0
    while time.monotonic() - start < timeout and same < still:
        time.sleep(step)
        now = [quiescent_groups(u) for u in metrics_urls]
        same = same + 1 if now == before and all(q > 0 for q, _, _ in now) else 0
        before = now
    return time.monotonic() - start, [q for q, _, _ in before]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--heartbeat", type=float, default=0.1)
    ap.add_argument("--tick-interval", type=float, default=0.1)
    ap.add_argument("--tick-threads", type=int, default=1)
    ap.add_argument("--quiesce-after", type=float, default=1.0, help="0: groups never quiesce")
    ap.add_argument("--ready-timeout", type=float, default=120.0)
    args = ap.parse_args()
    extra = ["__controller"]
    total = args.groups + len(extra)
    with tempfile.TemporaryDirectory(prefix="raft-bench-idle-") as tmp:
        knobs = [
            "--heartbeat", str(args.heartbeat), "--tick-interval", str(args.tick_interval),
            "--tick-threads", str(args.tick_threads), "--quiesce-after", str(args.quiesce_after),
        ]  # fmt: skip
        procs, _ = start_cluster(args.groups, extra, tmp, knobs, start_timeout=args.ready_timeout)
        try:
            elected = wait_all_leaders(procs, total, args.ready_timeout)
            print(f"{total} groups x 3 nodes: all leaders ready after {elected:.1f}s")
            settled, quiet = wait_quiescent(procs, args.ready_timeout)
            print(f"settled after {settled:.1f}s; quiescent replicas per node: {quiet}")
            before = [proc_stat(p.pid)[0] for p in procs]
            t0 = time.monotonic()
            time.sleep(args.seconds)
            wall = time.monotonic() - t0
            after = [proc_stat(p.pid)[0] for p in procs]
            print(
                f"idle window {wall:.1f}s, heartbeat {args.heartbeat}s, "
                f"tick interval {args.tick_interval}s, tick threads {args.tick_threads}"
            )
            for i, p in enumerate(procs):
                _, rss, threads = proc_stat(p.pid)
                pct = 100.0 * (after[i] - before[i]) / wall
                socks, tcp = sockets(p.pid)
                print(
                    f"node {i} pid {p.pid}: cpu {pct:5.2f}% rss {rss:6.1f} MB ({rss / total:.3f} MB per replica) "
                    f"threads {threads} sockets {socks} (established tcp {tcp})"
                )
        finally:
            for p in procs:
                p.stop()


if __name__ == "__main__":
    main()
