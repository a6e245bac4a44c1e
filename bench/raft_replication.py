"""Replication throughput of one group: ``python -m bench.raft_replication``.

Starts 3 node processes on loopback hosting one group; the leader's process
submits ``--n`` commands of ``--size`` bytes (default 64 KiB) with at most
``--outstanding`` in flight, and prints MB/s and p50/p99 commit latency, plus
the sequential (one at a time) latency of small commands.

``--bare`` runs the same load on stock PySyncObj for comparison: autoTick,
its own TCPTransport (one port per group), batch mode, password set, the
pickle-protocol-4 patch applied, journal + dump files, and the reference's
tuned periods (autoTickPeriod 0.01 s, appendEntriesPeriod 0.02 s) with
1 MiB AppendEntries batches.

``start_group`` and ``wait_leader`` start such a group for other benchmarks
(the baselines of ``txbroker bench produce``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from typing import Any

from cluster.config import free_ports
from raft.node_host import HostProcess

from .harness import wait_for
from .measure import quantile

PASSWORD = "bench-password"
_MODULE = "bench.raft_replication"  # this module, as its stock-PySyncObj children run it (``python -m``)


# --- stock PySyncObj node (child process) -----------------------------------


def _bare_node(addr: str, members: list[str], data: str) -> None:
    from pysyncobj import SyncObj, SyncObjConf, replicated

    from raft import pysyncobj_patches

    pysyncobj_patches.apply_pickle_protocol_only()
    os.makedirs(data, exist_ok=True)

    class Bare(SyncObj):  # type: ignore[misc]  # PySyncObj is untyped
        def __init__(self) -> None:
            conf = SyncObjConf(
                password=PASSWORD,
                bindAddress=addr,
                autoTickPeriod=0.01,
                appendEntriesPeriod=0.02,
                raftMinTimeout=1.0,
                raftMaxTimeout=3.0,
                appendEntriesBatchSizeBytes=1 << 20,
                sendBufferSize=1 << 20,
                recvBufferSize=1 << 20,
                journalFile=os.path.join(data, "journal"),
                fullDumpFile=os.path.join(data, "dump"),
                logCompactionMinEntries=20000,
                commandsWaitLeader=False,
            )
            super().__init__(addr, [m for m in members if m != addr], conf)
            self.applied_bytes = 0

        @replicated  # type: ignore[untyped-decorator]
        def put(self, data: bytes) -> int:
            self.applied_bytes += len(data)
            return int(self.raftLastApplied) + 1

    obj = Bare()
    obj.waitBinded()
    print(json.dumps({"started": addr, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "leaders":
            ready = ["bench"] if obj._isLeader() and obj.raftLastApplied >= 2 else []
            print(json.dumps({"ready": ready, "leaders": {}}), flush=True)
        elif req["op"] == "bench":
            print(json.dumps(_bare_bench(obj, req["n"], req["size"], req["outstanding"])), flush=True)
        elif req["op"] == "stop":
            obj.destroy_synchronous()
            print(json.dumps({"ok": True}), flush=True)
            return


def _bare_bench(obj: Any, n: int, size: int, outstanding: int) -> dict[str, Any]:
    payload = os.urandom(size)
    window = threading.Semaphore(outstanding)
    latencies: list[float] = []
    errors = 0
    finished = threading.Event()
    lock = threading.Lock()
    count = 0

    def make_cb(t0: float) -> Any:
        def cb(_res: Any, err: int) -> None:
            nonlocal errors, count
            with lock:
                if err == 0:
                    latencies.append(time.perf_counter() - t0)
                else:
                    errors += 1
                count += 1
                if count == n:
                    finished.set()
            window.release()

        return cb

    start = time.perf_counter()
    for _ in range(n):
        window.acquire()
        obj.put(payload, callback=make_cb(time.perf_counter()))
    finished.wait(300)
    elapsed = time.perf_counter() - start
    return {
        "elapsed_s": elapsed,
        "mb_per_s": len(latencies) * size / elapsed / 1e6,
        "cmds_per_s": len(latencies) / elapsed,
        "p50_ms": (quantile(latencies, 0.5) or 0.0) * 1e3,
        "p99_ms": (quantile(latencies, 0.99) or 0.0) * 1e3,
        "errors": errors,
    }


def start_group(tmp: str, bare: bool, node_args: list[str]) -> list[HostProcess]:
    """3 processes on loopback hosting the group ``bench``, data and logs under ``tmp``.

    ``bare``: stock PySyncObj nodes (this module's children); else ``raft.node_host`` processes given
    ``node_args`` after the group's own arguments. The caller stops them (``HostProcess.stop``).
    """
    addrs = [f"127.0.0.1:{port}" for port in free_ports(3)]
    procs: list[HostProcess] = []
    try:
        for i, addr in enumerate(addrs):
            data, log = os.path.join(tmp, f"n{i}"), os.path.join(tmp, f"n{i}.log")
            if bare:
                procs.append(HostProcess(["--bare-node", addr, ",".join(addrs), data], stderr_path=log, module=_MODULE))
            else:
                args = ["--addr", addr, "--members", ",".join(addrs), "--data", data,
                        "--groups", "0", "--extra-groups", "bench", *node_args]  # fmt: skip
                procs.append(HostProcess(args, stderr_path=log))
    except BaseException:
        for p in procs:
            p.stop()
        raise
    return procs


def wait_leader(procs: list[HostProcess], timeout: float) -> HostProcess:
    """The process whose replica leads the group ``bench`` and is ready for commands."""

    def leader() -> HostProcess | None:
        return next((p for p in procs if p.request({"op": "leaders"})["ready"]), None)

    found: HostProcess = wait_for(leader, timeout, "a leader of the bench group", 0.1)
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--size", type=int, default=64 * 1024)
    ap.add_argument("--outstanding", type=int, default=32)
    ap.add_argument("--seq", type=int, default=300, help="sequential small commands for latency")
    ap.add_argument("--bare", action="store_true", help="stock PySyncObj instead of raft/")
    ap.add_argument("--bare-node", nargs=3, metavar=("ADDR", "MEMBERS", "DATA"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bare_node:
        addr, members, data = args.bare_node
        _bare_node(addr, members.split(","), data)
        return
    with tempfile.TemporaryDirectory(prefix="raft-bench-repl-") as tmp:
        procs = start_group(tmp, args.bare, ["--password", PASSWORD, "--compaction-min-entries", "20000"])
        try:
            leader = wait_leader(procs, 30)
            mode = "stock PySyncObj (--bare)" if args.bare else "raft/ (shared port + ticker)"
            seq = leader.request({"op": "bench", "group": "bench", "n": args.seq, "size": 100, "outstanding": 1})
            print(f"{mode}: sequential 100 B commands: p50 {seq['p50_ms']:.2f} ms p99 {seq['p99_ms']:.2f} ms")
            r = leader.request(
                {"op": "bench", "group": "bench", "n": args.n, "size": args.size, "outstanding": args.outstanding},
                timeout=600,
            )
            print(
                f"{mode}: {args.n} x {args.size} B, {args.outstanding} outstanding: "
                f"{r['mb_per_s']:.1f} MB/s, {r['cmds_per_s']:.0f} cmd/s, "
                f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, errors {r['errors']}"
            )
        finally:
            for p in procs:
                p.stop()


if __name__ == "__main__":
    main()
