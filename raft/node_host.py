"""A process hosting one ``RaftNode`` and N groups, driven by JSON lines on stdin.

Used by the benchmarks (``bench.raft_idle``, ``bench.raft_replication``) and
the multi-process integration tests. One request per line on stdin, one
JSON reply per line on stdout, in order. Requests (``op``):

* ``leaders`` -> ``{"leaders": {group: leader|null}, "ready": [groups led here]}``
* ``submit`` group, command (latin-1 text), timeout -> ``{"ok": result}`` or
  ``{"error": class name, "leader": addr}``
* ``status`` group -> GroupStatus fields
* ``roles`` -> ``{"ok": {group: [state, term, quiescence]}}`` for every group (quiescence:
  ``raft.quiescence.QuiescenceState`` name)
* ``sm`` group, attr -> ``{"ok": getattr(state_machine, attr)()}`` (the attribute's value
  when it is not callable)
* ``voters`` group -> ``{"ok": [addresses]}``; ``learners`` likewise
* ``change_membership`` group, add or remove, timeout -> ``{"ok": true}`` or an error
* ``member_lag`` / ``learner_lag`` group, address -> ``{"ok": int|null}``
* ``add_learner`` / ``remove_learner`` group, address, timeout -> ``{"ok": true}`` or an error
* ``transfer`` group, to -> asks the leader to hand over (best effort)
* ``batch`` requests -> ``{"ok": [replies]}``: the requests run concurrently
* ``load`` group, key -> starts submitting ``add:<key>:1`` one after another
  (retrying on errors) until ``load_stop`` group -> ``{"ok": committed, "errors": n}``
* ``bench`` group, n, size, outstanding -> throughput and latency of n
  submits of ``size`` bytes with at most ``outstanding`` in flight
* ``links`` -> ``{"ok": {node link counters (``raft.links.LinkStats``)..., "rejected": n}}``
* ``stop`` -> stops the node and exits

``--sm module:factory`` builds each group's state machine as
``factory(group_dir: str)``; the default counts bytes in memory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib
import json
import logging
import os
import pathlib
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from raft.errors import NotLeaderError, RaftError
from raft.fd_limit import raise_open_files_limit
from raft.group import RaftGroup
from raft.node import RaftNode
from raft.settings import RaftSettings
from raft.state_machine import NOOP_COMMAND, StateMachine

MEMBERSHIP_OPS = frozenset(
    {"voters", "learners", "member_lag", "learner_lag", "transfer"}
    | {"change_membership", "add_learner", "remove_learner"}
)


class ByteCountingStateMachine:
    """Minimal in-memory machine: counts entries and bytes; returns the index."""

    def __init__(self, _path: str = "") -> None:
        self._last_applied = 0
        self.entries = 0
        self.bytes = 0

    @property
    def last_applied(self) -> int:
        return self._last_applied

    def apply(self, index: int, command: bytes) -> Any:
        if index <= self._last_applied:
            return None
        self._last_applied = index
        if command[:1] != NOOP_COMMAND:
            self.entries += 1
            self.bytes += len(command)
        return index

    def write_snapshot(self, out: BinaryIO) -> None:
        out.write(json.dumps([self.entries, self.bytes]).encode())

    def read_snapshot(self, inp: BinaryIO, last_applied: int) -> None:
        self.entries, self.bytes = json.loads(inp.read())
        self._last_applied = last_applied


def _load_factory(spec: str) -> Callable[[str], StateMachine]:
    module, _, name = spec.partition(":")
    factory: Callable[[str], StateMachine] = getattr(importlib.import_module(module), name)
    return factory


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


class Host:
    def __init__(self, args: argparse.Namespace, loop: asyncio.AbstractEventLoop) -> None:
        settings = RaftSettings(
            password=args.password,
            tick_threads=args.tick_threads,
            heartbeat_s=args.heartbeat,
            tick_interval_s=args.tick_interval,
            log_compaction_min_entries=args.compaction_min_entries,
            commit_notify_delay_s=args.commit_notify_delay,
            quiesce_after_s=args.quiesce_after,
            quiescent_tick_s=args.quiescent_tick,
        )
        self.node = RaftNode(args.addr, pathlib.Path(args.data), settings, loop)
        self.factory = _load_factory(args.sm) if args.sm else ByteCountingStateMachine
        self.sms: dict[str, StateMachine] = {}
        self.members = args.members.split(",")
        self.group_ids = [f"{args.prefix}{i}" for i in range(args.groups)]
        self.group_ids += [g for g in args.extra_groups.split(",") if g]
        self.loads: dict[str, tuple[asyncio.Task[None], list[int]]] = {}

    def start(self) -> None:
        self.node.start()
        for gid in self.group_ids:
            path = str(self.node.data_dir / f"sm-{gid}")
            os.makedirs(path, exist_ok=True)
            sm = self.factory(path)
            self.sms[gid] = sm
            self.node.add_group(gid, self.members, sm)

    async def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req["op"]
        if op == "leaders":
            groups = self.node.groups
            return {
                "leaders": {gid: g.leader() for gid, g in groups.items()},
                "ready": [gid for gid, g in groups.items() if g.is_leader()],
            }
        if op == "roles":
            roles = {}
            for gid, g in self.node.groups.items():
                st = g.status()
                roles[gid] = [st.state, st.term, g.quiescence().name]
            return {"ok": roles}
        if op == "links":
            stats = dataclasses.asdict(self.node.link_stats())
            stats["rejected"] = self.node.rejected_connections
            return {"ok": stats}
        if op == "batch":
            return {"ok": await asyncio.gather(*(self.handle(r) for r in req["requests"]))}
        group = self.node.group(req.get("group", ""))
        if op == "stop":
            self.node.stop()
            return {"ok": True}
        if group is None:
            return {"error": "NoSuchGroup"}
        if op == "submit":
            try:
                result = await group.submit(req["command"].encode("latin-1"), float(req.get("timeout", 5.0)))
                return {"ok": result}
            except NotLeaderError as e:
                return {"error": "NotLeaderError", "leader": e.leader}
            except RaftError as e:
                return {"error": type(e).__name__, "detail": str(e)}
        if op == "status":
            st = group.status()
            return {
                "state": st.state,
                "leader": st.leader,
                "term": st.term,
                "commit_index": st.commit_index,
                "last_applied": st.last_applied,
                "match_index": st.match_index,
                "connected": sorted(st.connected),
                "voters": sorted(st.voters),
            }
        if op == "sm":
            value = getattr(self.sms[group.group_id], req["attr"])
            return {"ok": value() if callable(value) else value}
        if op in MEMBERSHIP_OPS:
            return await self.membership(group, op, req)
        if op == "load":
            counts = [0, 0]
            task = asyncio.get_running_loop().create_task(self.load(group, req["key"], counts))
            self.loads[group.group_id] = (task, counts)
            return {"ok": True}
        if op == "load_stop":
            task, counts = self.loads.pop(group.group_id)
            counts.append(-1)  # stop after the submit in flight (cancelling one may lose its count)
            await task
            return {"ok": counts[0], "errors": counts[1]}
        if op == "bench":
            return await self.bench(group.group_id, req["n"], req["size"], req["outstanding"])
        return {"error": f"unknown op {op!r}"}

    async def membership(self, group: RaftGroup, op: str, req: dict[str, Any]) -> dict[str, Any]:
        timeout = float(req.get("timeout", 10.0))
        try:
            if op == "voters":
                return {"ok": sorted(group.voters())}
            if op == "learners":
                return {"ok": sorted(group.learners())}
            if op == "member_lag":
                return {"ok": group.member_lag(req["address"])}
            if op == "learner_lag":
                return {"ok": group.learner_lag(req["address"])}
            if op == "transfer":
                group.transfer_leadership(req["to"])
                return {"ok": True}
            if op == "change_membership":
                await group.change_membership(add=req.get("add"), remove=req.get("remove"), timeout=timeout)
            elif op == "add_learner":
                await group.add_learner(req["address"], timeout)
            else:
                await group.remove_learner(req["address"], timeout)
            return {"ok": True}
        except NotLeaderError as e:
            return {"error": "NotLeaderError", "leader": e.leader}
        except (RaftError, ValueError) as e:
            return {"error": type(e).__name__, "detail": str(e)}

    async def load(self, group: RaftGroup, key: str, counts: list[int]) -> None:
        """Submit ``add:<key>:1`` one at a time until ``counts`` grows; counts[0] committed, counts[1] errors."""
        command = f"add:{key}:1".encode()
        while len(counts) == 2:
            try:
                await group.submit(command, 5.0)
                counts[0] += 1
            except RaftError:
                counts[1] += 1
                await asyncio.sleep(0.05)

    async def bench(self, gid: str, n: int, size: int, outstanding: int) -> dict[str, Any]:
        group = self.node.group(gid)
        assert group is not None
        payload = os.urandom(size)
        sem = asyncio.Semaphore(outstanding)
        latencies: list[float] = []
        errors = 0

        async def one() -> None:
            nonlocal errors
            async with sem:
                t0 = time.perf_counter()
                try:
                    await group.submit(payload, 30.0)
                    latencies.append(time.perf_counter() - t0)
                except RaftError:
                    errors += 1

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        elapsed = time.perf_counter() - start
        latencies.sort()
        return {
            "elapsed_s": elapsed,
            "mb_per_s": len(latencies) * size / elapsed / 1e6,
            "cmds_per_s": len(latencies) / elapsed,
            "p50_ms": _percentile(latencies, 0.5) * 1e3,
            "p99_ms": _percentile(latencies, 0.99) * 1e3,
            "errors": errors,
        }


class HostProcess:
    """Parent-side handle of a ``raft.node_host`` child process."""

    def __init__(
        self,
        args: list[str],
        stderr_path: str | None = None,
        module: str = "raft.node_host",
        start_timeout: float = 30.0,
    ) -> None:
        repo_root = str(pathlib.Path(__file__).resolve().parent.parent)
        self._stderr = open(stderr_path or os.devnull, "ab")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            cwd=repo_root,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        try:
            started = self._read(start_timeout)
        except (TimeoutError, EOFError):
            self.kill()
            raise
        self.pid = int(started["pid"])

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _read(self, timeout: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty as e:
            raise TimeoutError("node_host did not answer") from e
        if line is None:
            raise EOFError(f"node_host exited with {self.proc.wait()}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def request(self, req: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self._read(timeout)

    def kill(self) -> None:
        """SIGKILL (no clean shutdown), then reap."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.wait()

    def stop(self) -> None:
        """Clean stop; falls back to SIGKILL."""
        if self.proc.poll() is None:
            try:
                self.request({"op": "stop"}, timeout=30.0)
            except (TimeoutError, EOFError, BrokenPipeError, OSError):
                self.proc.kill()
        self.wait()

    def wait(self) -> None:
        try:
            self.proc.wait(30.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        self._stderr.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--addr", required=True)
    p.add_argument("--members", required=True, help="comma-separated raft addresses")
    p.add_argument("--data", required=True)
    p.add_argument("--groups", type=int, default=1)
    p.add_argument("--prefix", default="g")
    p.add_argument("--extra-groups", default="", help="comma-separated extra group ids")
    p.add_argument("--password", default="txbroker-test")
    p.add_argument("--sm", default="")
    p.add_argument("--tick-threads", type=int, default=1)
    p.add_argument("--heartbeat", type=float, default=0.1)
    p.add_argument("--tick-interval", type=float, default=0.1)
    p.add_argument("--compaction-min-entries", type=int, default=2000)
    notify_default = RaftSettings.__dataclass_fields__["commit_notify_delay_s"].default
    p.add_argument("--commit-notify-delay", type=float, default=notify_default)
    quiesce_default = RaftSettings.__dataclass_fields__["quiesce_after_s"].default
    p.add_argument("--quiesce-after", type=float, default=quiesce_default, help="0: groups never quiesce")
    quiet_tick_default = RaftSettings.__dataclass_fields__["quiescent_tick_s"].default
    p.add_argument("--quiescent-tick", type=float, default=quiet_tick_default)
    p.add_argument("--log-level", default="WARNING")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(threadName)s %(name)s %(levelname)s %(message)s",
    )
    raise_open_files_limit()

    async def run() -> None:
        loop = asyncio.get_running_loop()
        host = Host(args, loop)
        host.start()
        lines: asyncio.Queue[str | None] = asyncio.Queue()

        def read_stdin() -> None:
            for line in sys.stdin:
                loop.call_soon_threadsafe(lines.put_nowait, line)
            loop.call_soon_threadsafe(lines.put_nowait, None)

        threading.Thread(target=read_stdin, daemon=True).start()
        print(json.dumps({"started": args.addr, "pid": os.getpid()}), flush=True)
        while True:
            line = await lines.get()
            if line is None:
                host.node.stop()
                return
            if not line.strip():
                continue
            req = json.loads(line)
            try:
                reply = await host.handle(req)
            except Exception as e:  # report, keep serving
                reply = {"error": type(e).__name__, "detail": str(e)}
            print(json.dumps(reply), flush=True)
            if req["op"] == "stop":
                return

    asyncio.run(run())


if __name__ == "__main__":
    main()
