"""``txbroker bench produce|fetch|failover|idle|all``: throughput, latency, failover time and idle cost.

Every scenario starts its own fresh 3-node cluster (node processes on loopback,
ports chosen at run time, data in a temp dir) and stops every process it
started, on error and Ctrl-C too. ``all`` runs fetch on the produce cluster.
The produce scenario also measures, in the same run, bare Raft replication of
the same batch bytes (``bench.raft_replication`` when present, else 3
``raft.node_host`` processes with the broker's Raft settings) and raw rocksdict
puts (``bench.storage_apply``), and reports the broker's rate as ratios of both.
See BENCHMARKS.md for results and what limits them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from clients.aio._http1 import Http1Pool
from clients.protocol import (
    BATCHES_CONTENT_TYPE,
    PRODUCE_CONTENT_TYPE,
    BrokerError,
    ErrorCode,
    ProducePartition,
    ProduceRequest,
    Record,
    decode_fetch_batches,
    encode_batch,
    encode_produce_request,
)
from cluster.config import NodeConfig, free_ports, make_cluster_configs, write_configs
from cluster.health import Samples, scrape

REPO = Path(__file__).resolve().parents[1]
TOPIC = "bench"
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")
SCENARIOS = ("produce", "fetch", "failover", "idle")


# ---- helpers ------------------------------------------------------------------------


def proc_stat(pid: int) -> tuple[float, float, int]:
    """(cpu seconds user+system, RSS MB, threads) of a process from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK, int(fields[21]) * _PAGE / 1e6, int(fields[17])


def threads_cpu_by_kind(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of a process's threads, summed by kind: ``event-loop`` (a node's main thread),
    else the thread's OS name without its number (``raft-ticker``, ``raft-listener``, ``rocksdb``), or ``other``
    for threads that kept the process's name. ``<kind>:sys`` is the part of ``<kind>`` spent in the kernel."""
    out: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        if tid == str(pid):
            kind = "event-loop"
        elif comm.startswith("rocksdb"):
            kind = "rocksdb"
        elif comm.startswith("python") or comm.startswith("txbroker"):
            kind = "other"
        else:
            kind = comm.rstrip("0123456789").rstrip("-:") or comm
        out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / _CLK_TCK
        out[f"{kind}:sys"] = out.get(f"{kind}:sys", 0.0) + int(fields[12]) / _CLK_TCK  # the kernel's part
    return out


def host_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole host (all cores) from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / _CLK_TCK, sum(v) / _CLK_TCK


def self_cpu() -> float:
    t = os.times()
    return t.user + t.system


def pct(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def machine_info() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"nproc": os.cpu_count(), "cpu": model, "python": platform.python_version(), "kernel": platform.release()}


def http_json(method: str, url: str, body: Any = None, timeout: float = 10.0) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def sum_samples(scrapes: list[Samples], name: str, **labels: str) -> float:
    """Sample ``name`` summed over ``scrapes``, over the samples carrying ``labels``."""
    return sum(v for s in scrapes for lv, v in s.get(name, []) if all(lv.get(k) == w for k, w in labels.items()))


def add_node_setting_argument(p: argparse.ArgumentParser) -> None:
    """``--node-setting KEY=VALUE`` (repeatable), for ``parse_node_settings``."""
    p.add_argument(
        "--node-setting",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a node config setting for every node (TOML value), e.g. store_direct_io=false; repeatable",
    )


def node_settings_or_exit(p: argparse.ArgumentParser, opts: argparse.Namespace) -> dict[str, Any]:
    """The parsed ``--node-setting`` values; a bad one ends the program with argparse's usage error (status 2)."""
    try:
        return parse_node_settings(opts.node_setting)
    except ValueError as exc:
        p.error(str(exc))


def parse_node_settings(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs (a TOML value: ``store_direct_io=false``) checked against the node config's fields."""
    known = {f.name for f in dataclasses.fields(NodeConfig)}
    settings: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or key not in known:
            raise ValueError(f"--node-setting wants KEY=VALUE with a node config key, got {pair!r}")
        try:
            settings[key] = tomllib.loads(f"v = {value.strip()}")["v"]
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"--node-setting {pair!r}: not a TOML value ({exc})") from exc
    return settings


def wait_for(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = pred()
            if value:
                return value
        except (OSError, ValueError, KeyError) as exc:
            last = exc
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what} (last error: {last!r})")


# ---- cluster ------------------------------------------------------------------------


class BenchCluster:
    """3 ``txbroker node start`` processes on loopback; ``close()`` stops every one it started."""

    def __init__(self, workdir: Path, n: int = 3, settings: dict[str, Any] | None = None) -> None:
        """``settings``: node settings (``NodeConfig`` fields) off their defaults, the same on every node."""
        self.dir = workdir
        ports = free_ports(2 * n)
        configs = make_cluster_configs(n, workdir, http_ports=ports[:n], raft_ports=ports[n:])
        self.configs: list[NodeConfig] = [dataclasses.replace(c, **(settings or {})) for c in configs]
        self.paths = write_configs(self.configs, workdir)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def url(self, node_id: int) -> str:
        return self.configs[node_id - 1].url

    def node_of_url(self, url: str) -> int:
        return next(c.node_id for c in self.configs if c.url == url.rstrip("/"))

    def alive(self, node_id: int) -> bool:
        p = self.procs.get(node_id)
        return p is not None and p.poll() is None

    def live_urls(self) -> list[str]:
        return [c.url for c in self.configs if self.alive(c.node_id)]

    def start_node(self, node_id: int) -> None:
        with open(self.dir / f"node-{node_id}.log", "ab") as log:
            self.procs[node_id] = subprocess.Popen(
                [sys.executable, "-m", "cluster", "node", "start", "--config", str(self.paths[node_id - 1])],
                stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO),
                env=dict(os.environ, PYTHONPATH=str(REPO)),
            )  # fmt: skip

    def ready(self, node_id: int) -> bool:
        try:
            return http_json("GET", self.url(node_id) + "/readyz", timeout=2)[0] == 200
        except (OSError, ValueError):
            return False

    def start(self, timeout: float = 60.0) -> BenchCluster:
        for c in self.configs:
            self.start_node(c.node_id)
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        for i in self.procs:
            wait_for(functools.partial(self.ready, i), timeout, f"node {i} /readyz")

    def nodes_cpu(self) -> float:
        """CPU seconds (user + system) used so far by the live node processes."""
        return sum(proc_stat(p.pid)[0] for p in self.procs.values() if p.poll() is None)

    def nodes_cpu_by_kind(self) -> dict[str, float]:
        """CPU seconds used so far by the live nodes' threads, summed by kind (``threads_cpu_by_kind``)."""
        out: dict[str, float] = {}
        for p in self.procs.values():
            if p.poll() is None:
                for kind, cpu in threads_cpu_by_kind(p.pid).items():
                    out[kind] = out.get(kind, 0.0) + cpu
        return out

    def counters(self) -> dict[str, float]:
        """Counters of the live nodes so far (their ``/metrics``): Raft frames sent (all groups), and how partition
        leaders admitted the batches that opened transactions (checked with the coordinator, or by a token)."""
        scrapes = self.scrape_nodes()
        checks = "txbroker_transaction_partition_checks_total"
        return {
            "raft_messages": sum_samples(scrapes, "txbroker_raft_messages_sent_total"),
            "coordinator_checks": sum_samples(scrapes, checks, how="coordinator"),
            "token_checks": sum_samples(scrapes, checks, how="token"),
        }

    def kill(self, node_id: int) -> None:
        p = self.procs[node_id]
        p.send_signal(signal.SIGKILL)
        p.wait(10)

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def __enter__(self) -> BenchCluster:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ---- API ------------------------------------------------------------------------

    def leader_changes(self) -> int:
        """Partition leadership changes the live nodes observed so far (one change counts once per node)."""
        return int(self.counter_sum("txbroker_raft_leader_changes_total"))

    def ticker_stalls(self) -> int:
        """Raft ticker steps of 0.5 s or more on the live nodes so far (``txbroker_raft_ticker_stalls_total``)."""
        return int(self.counter_sum("txbroker_raft_ticker_stalls_total"))

    def counter_sum(self, name: str, **labels: str) -> float:
        """Sample ``name`` summed over the live nodes' ``/metrics``, over the samples carrying ``labels``."""
        return sum_samples(self.scrape_nodes(), name, **labels)

    def scrape_nodes(self) -> list[Samples]:
        """Every live node's ``/metrics`` (an empty one for a node that does not answer)."""
        return [scrape(url, timeout=5) or {} for url in self.live_urls()]

    def leaders(self, topic: str) -> dict[int, str | None]:
        """partition -> leader URL, from the first live node that answers."""
        for url in self.live_urls():
            with contextlib.suppress(OSError, ValueError):
                status, meta = http_json("GET", url + "/v1/metadata", timeout=3)
                if status != 200:
                    continue
                for t in meta["topics"]:
                    if t["name"] == topic:
                        return {p["partition"]: p.get("leader_url") for p in t["partitions"]}
        return {}

    def create_topic(self, topic: str, partitions: int, rf: int = 3, timeout: float = 60.0) -> dict[int, str]:
        body = {"name": topic, "partitions": partitions, "replication_factor": rf}
        attempts: list[str] = []

        def created() -> bool | None:
            """POST to the controller: a 421 names it; other retriable answers (no controller yet) wait."""
            url = self.url(1)
            for _hop in range(3):
                attempts.append(url)
                status, res = http_json("POST", url + "/v1/topics", body)
                if status == 201 or (res.get("error_code") == "TOPIC_ALREADY_EXISTS" and len(attempts) > 1):
                    return True  # (already there after a retry: an earlier attempt whose answer was lost made it)
                if status == 421 and res.get("leader_url"):
                    url = str(res["leader_url"])
                    continue
                if not res.get("retriable"):
                    raise RuntimeError(f"create topic {topic}: {status} {res}")
                return None
            return None

        wait_for(created, timeout, f"create topic {topic}", 0.2)

        def all_led() -> dict[int, str] | None:
            led = self.leaders(topic)
            live = set(self.live_urls())
            ok = len(led) == partitions and all(u in live for u in led.values())
            return {p: str(u) for p, u in led.items()} if ok else None

        led: dict[int, str] = wait_for(all_led, timeout, f"leaders of {partitions} partitions")
        return led

    def preferred_leaders(self, topic: str, timeout: float = 20.0) -> tuple[dict[int, str], bool]:
        """partition -> leader URL once every partition is led by its preferred replica (the broker's
        leader balancer moves them within ~5 s); after ``timeout``, the current leaders and False."""

        def balanced() -> dict[int, str] | None:
            for url in self.live_urls():
                with contextlib.suppress(OSError, ValueError):
                    status, meta = http_json("GET", url + "/v1/metadata", timeout=3)
                    topics = [t["partitions"] for t in meta["topics"] if t["name"] == topic]
                    parts: list[dict[str, Any]] = topics[0] if topics else []
                    if status == 200 and parts and all(p["leader"] == p["replicas"][0] for p in parts):
                        return {p["partition"]: str(p["leader_url"]) for p in parts}
            return None

        try:
            return wait_for(balanced, timeout, f"preferred leaders of {topic}", 0.2), True
        except TimeoutError:
            return {p: str(u) for p, u in self.leaders(topic).items()}, False

    def init_producer(self) -> tuple[int, int]:
        status, res = http_json("POST", self.url(1) + "/v1/producers/init", {"transactional_id": None})
        if status != 200:
            raise RuntimeError(f"init producer: {status} {res}")
        return int(res["producer_id"]), int(res["producer_epoch"])


# ---- produce load -------------------------------------------------------------------


@dataclass
class Load:
    """Acked batches: (completion time, payload bytes, records, latency s), plus error counts."""

    acks: list[tuple[float, int, int, float]] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    retries: int = 0

    def window(self, t0: float, t1: float) -> dict[str, Any]:
        sel = [a for a in self.acks if t0 <= a[0] < t1]
        lat = sorted(a[3] for a in sel)
        wall = t1 - t0
        payload = sum(a[1] for a in sel)
        return {
            "seconds": round(wall, 2),
            "mb_per_s": round(payload / wall / 1e6, 2),
            "records_per_s": round(sum(a[2] for a in sel) / wall),
            "requests_per_s": round(len(sel) / wall, 1),
            "p50_ms": round(pct(lat, 0.50) * 1e3, 1),
            "p99_ms": round(pct(lat, 0.99) * 1e3, 1),
            "max_ms": round(lat[-1] * 1e3, 1) if lat else None,
            "errors": dict(self.errors),
            "retries": self.retries,
        }


PostFn = Callable[[str, bytes], Awaitable[Any]]


async def aiohttp_post(session: aiohttp.ClientSession, url: str, body: bytes) -> Any:
    """POST a binary produce request; the parsed JSON answer."""
    async with session.post(url, data=body, headers={"Content-Type": PRODUCE_CONTENT_TYPE}) as resp:
        return await resp.json()


class ProduceHttp:
    """The produce load generator's HTTP: the Python producer's lean keep-alive transport.

    The bench shares the host's cores with the nodes it measures, and aiohttp's client costs
    about 0.3 ms of CPU per request; ``clients.aio._http1`` costs a fraction of that. Every
    transport failure surfaces as ``ConnectionError``; any HTTP status returns its JSON body.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._pool = Http1Pool()

    async def post(self, url: str, body: bytes) -> Any:
        try:
            answer = await self._pool.post(url, body, PRODUCE_CONTENT_TYPE, self.timeout)
        except BrokerError as exc:
            raise ConnectionError(f"POST {url}: {exc}") from exc
        return json.loads(answer.body)

    async def close(self) -> None:
        await self._pool.close()


class PartitionWriter:
    """Idempotent writes of fixed batches to one partition's leader, up to K in flight.

    A batch keeps its sequence across retries; a retriable error (or an
    out-of-order answer while an earlier batch is still unacknowledged) resends
    it after its predecessor has been acknowledged.
    """

    def __init__(self, cluster: BenchCluster, post: PostFn | aiohttp.ClientSession, partition: int, leader: str,
                 pid: int, epoch: int, records: list[Record], value_bytes: int, load: Load) -> None:  # fmt: skip
        if isinstance(post, aiohttp.ClientSession):
            post = functools.partial(aiohttp_post, post)
        self.cluster, self.post, self.partition, self.leader = cluster, post, partition, leader
        self.pid, self.epoch, self.records, self.load = pid, epoch, records, load
        self.payload = value_bytes * len(records)
        self.next_seq = 0
        self.done: dict[int, asyncio.Event] = {}
        self.stop = False
        self.wire_bytes = 0

    def body(self, seq: int) -> bytes:
        batch = encode_batch(self.records, producer_id=self.pid, producer_epoch=self.epoch,
                             base_sequence=seq if self.pid >= 0 else -1)  # fmt: skip
        self.wire_bytes = len(batch)
        return encode_produce_request(ProduceRequest((ProducePartition(TOPIC, self.partition, batch),)))

    async def refresh_leader(self, hint: str | None) -> None:
        if hint and hint in self.cluster.live_urls():
            self.leader = hint
            return
        led = await asyncio.to_thread(self.cluster.leaders, TOPIC)
        url = led.get(self.partition)
        if url:
            self.leader = url
        await asyncio.sleep(0.02)

    async def send_one(self) -> tuple[float, str]:
        """Send the next batch until acknowledged; returns (latency, leader url that acked)."""
        seq = self.next_seq
        self.next_seq += len(self.records)
        prev, mine = self.done.get(seq - len(self.records)), asyncio.Event()
        self.done[seq] = mine
        body = self.body(seq)
        t0 = time.perf_counter()
        try:
            while True:
                leader = self.leader
                code, hint = "NONE", None
                try:
                    res = await self.post(leader + "/v1/produce", body)
                    part = res["partitions"][0]
                    code, hint = part.get("error_code") or "NONE", part.get("leader_url") or res.get("leader_url")
                except (aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError, IndexError) as exc:
                    code = "CONNECTION:" + type(exc).__name__
                if code == "NONE":
                    return time.perf_counter() - t0, leader
                self.load.errors[code] += 1
                self.load.retries += 1
                if code == "OUT_OF_ORDER_SEQUENCE_NUMBER" and prev is not None and not prev.is_set():
                    await prev.wait()
                    continue
                retriable = code.startswith("CONNECTION:") or ErrorCode.from_name(code).retriable
                if not retriable:
                    raise RuntimeError(f"partition {self.partition} seq {seq}: {code}")
                await self.refresh_leader(hint if code == "NOT_LEADER_OR_FOLLOWER" else None)
        finally:
            mine.set()
            self.done.pop(seq - 2 * len(self.records), None)

    async def run_slot(self) -> None:
        while not self.stop:
            latency, _ = await self.send_one()
            self.load.acks.append((time.monotonic(), self.payload, len(self.records), latency))


def make_records(record_size: int, batch_bytes: int) -> list[Record]:
    value = os.urandom(record_size)
    ts = int(time.time() * 1000)
    return [Record(value=value, timestamp=ts)] * max(1, batch_bytes // record_size)


async def drive_produce(cluster: BenchCluster, leaders: dict[int, str], opts: argparse.Namespace,
                        on_window: Callable[[], Any] | None = None) -> dict[str, Any]:  # fmt: skip
    pid, epoch = cluster.init_producer() if opts.idempotence else (-1, -1)
    records = make_records(opts.record_size, opts.batch_bytes)
    load = Load()
    http = ProduceHttp(timeout=30.0)
    try:
        writers = [PartitionWriter(cluster, http.post, p, url, pid, epoch, records, opts.record_size, load)
                   for p, url in sorted(leaders.items())]  # fmt: skip
        tasks = [asyncio.create_task(w.run_slot()) for w in writers for _ in range(opts.concurrency)]
        try:
            await asyncio.sleep(opts.warmup)
            t0, c0, h0 = time.monotonic(), self_cpu(), host_cpu()
            n0 = {i: proc_stat(p.pid)[0] for i, p in cluster.procs.items()}
            extra = on_window() if on_window else None
            await asyncio.sleep(opts.duration)
            t1, c1, h1 = time.monotonic(), self_cpu(), host_cpu()
            n1 = {i: proc_stat(p.pid)[0] for i, p in cluster.procs.items()}
        finally:
            for w in writers:
                w.stop = True
            done, _ = await asyncio.wait(tasks, timeout=30)
            for t in tasks:
                t.cancel()
        for t in done:
            if not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
    finally:
        await http.close()
    out = load.window(t0, t1)
    out["batch_wire_bytes"] = writers[0].wire_bytes
    out["idempotent"] = pid >= 0
    out["client_cpu_pct"] = round(100 * (c1 - c0) / (t1 - t0), 1)
    out["node_cpu_pct"] = {f"node{i}": round(100 * (n1[i] - n0[i]) / (t1 - t0), 1) for i in n0}
    out["host_cpu_busy_pct"] = round(100 * (h1[0] - h0[0]) / (h1[1] - h0[1]), 1)  # of all cores
    out["host_cpu_other_pct"] = round(  # busy time of processes outside this benchmark, % of one core
        100 * ((h1[0] - h0[0]) - (c1 - c0) - sum(n1[i] - n0[i] for i in n0)) / (t1 - t0), 1)  # fmt: skip
    out["leaders"] = {p: cluster.node_of_url(u) for p, u in leaders.items()}
    if extra is not None:
        out["_extra"] = extra
    return out


# ---- baselines ----------------------------------------------------------------------


def replication_rate(stock: bool, size: int, outstanding: int, seconds: float) -> dict[str, Any]:
    """Replication MB/s of ``size``-byte commands, one group on 3 processes, leader-local submits.

    ``stock``: stock PySyncObj as ``bench.raft_replication --bare`` configures it; else the raft/ layer
    (``raft.node_host``) with a node's default Raft settings. bench/raft_replication.py exports no function,
    so this drives its child processes (same JSON-lines protocol) directly.
    """
    from raft.node_host import HostProcess

    defaults = NodeConfig.__dataclass_fields__
    with tempfile.TemporaryDirectory(prefix="txbroker-bench-raft-") as tmp:
        addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
        procs: list[HostProcess] = []
        try:
            for i, addr in enumerate(addrs):
                data, log = os.path.join(tmp, f"n{i}"), os.path.join(tmp, f"n{i}.log")
                if stock:
                    from bench.raft_replication import _spawn_bare

                    procs.append(_spawn_bare(addr, addrs, data, log))
                else:
                    hb, compact = (defaults[k].default for k in ("raft_heartbeat_s", "raft_log_compaction_min_entries"))
                    args = ["--addr", addr, "--members", ",".join(addrs), "--data", data, "--groups", "0",
                            "--extra-groups", "bench", "--heartbeat", str(hb),
                            "--compaction-min-entries", str(compact)]  # fmt: skip
                    procs.append(HostProcess(args, stderr_path=log))

            def leader() -> Any:
                return next((p for p in procs if p.request({"op": "leaders"})["ready"]), None)

            lead = wait_for(leader, 60, "replication bench leader", 0.2)
            req = {"op": "bench", "group": "bench", "n": 100, "size": size, "outstanding": outstanding}
            warm = lead.request(req, timeout=120)
            req["n"] = max(100, int(warm["cmds_per_s"] * seconds))
            c0, h0, s0 = sum(proc_stat(p.proc.pid)[0] for p in procs), host_cpu(), self_cpu()
            res = lead.request(req, timeout=seconds * 10 + 60)
            procs_cpu, h1 = sum(proc_stat(p.proc.pid)[0] for p in procs) - c0, host_cpu()
            res["cpu_pct_3_procs"] = 100 * procs_cpu / res["elapsed_s"]
            # busy time of processes outside this measurement, % of one core (the machine may be shared)
            res["host_cpu_other_pct"] = 100 * ((h1[0] - h0[0]) - procs_cpu - (self_cpu() - s0)) / res["elapsed_s"]
        finally:
            for p in procs:
                p.stop()
    res.update(outstanding=outstanding, commands=req["n"])
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in res.items()}


def baseline(stock: bool, size: int, outstanding: int, seconds: float) -> dict[str, Any]:
    try:
        return replication_rate(stock, size, outstanding, seconds)
    except Exception as exc:  # a colleague's module changed or is missing: report, do not abort the run
        return {"error": f"{type(exc).__name__}: {exc}"}


def rocksdict_rates(size: int, count: int) -> dict[str, Any]:
    from bench.storage_apply import apply_rate, raw_put_rate

    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        raw = raw_put_rate(a, size, count)
        applied = apply_rate(b, size, count)
    return {"raw_put_mb_per_s": round(raw, 1), "partitionlog_apply_mb_per_s": round(applied, 1), "count": count}


# ---- profiling ----------------------------------------------------------------------


def start_profile(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes] | None:
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        return None
    cmd = [str(spy), "record", "-d", str(int(seconds)), "-p", str(pid), "-o", str(out), "--format", "raw", "-n"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


_IDLE_LEAVES = ("epoll_wait", "poll", "select", "select_epoll_poll_impl", "pthread_cond_wait", "sem_wait",
                "pthread_cond_timedwait", "sem_timedwait", "nanosleep", "clock_nanosleep", "time_sleep",
                "acquire_timed", "lock_PyThread_acquire_lock", "PyThread_acquire_lock_timed")  # fmt: skip
_NOISE = ("threading.py", "libpython", "libc.so", "runpy", "<module>", "thread_run")


def summarize_profile(path: Path, top: int = 12) -> dict[str, Any]:
    """Busy-sample shares of a py-spy collapsed-stack file: by leaf frame (self) and by frame (inclusive).

    Samples whose leaf is a wait (epoll_wait, cond wait, ...) count as idle; unresolved libc leaves stay in.
    """
    self_c: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    busy = idle = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = []
        for f in stack.split(";"):
            name, _, loc = f.partition(" (")
            frames.append(f"{name} ({'/'.join(loc.rstrip(')').split(':')[0].split('/')[-2:])})")
        resolved = [f for f in frames if not f.startswith("0x")] or frames
        if any(resolved[-1].startswith(w + " ") for w in _IDLE_LEAVES):
            idle += int(n)
            continue
        busy += int(n)
        self_c[frames[-1]] += int(n)
        for f in set(frames):
            if not any(x in f for x in _NOISE):
                incl[f] += int(n)

    def share(c: Counter[str]) -> list[str]:
        return [f"{100 * v / max(1, busy):5.1f}% {k}" for k, v in c.most_common(top)]

    return {"busy_samples": busy, "idle_samples": idle, "self": share(self_c), "inclusive": share(incl)}


# ---- scenarios ----------------------------------------------------------------------


def new_cluster(stack: contextlib.ExitStack, opts: argparse.Namespace) -> BenchCluster:
    tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="txbroker-bench-"))
    return stack.enter_context(BenchCluster(Path(tmp))).start()


def scenario_produce(opts: argparse.Namespace, shared: dict[str, Any]) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        cluster = new_cluster(stack, opts)
        cluster.create_topic(TOPIC, opts.partitions)
        leaders, balanced = cluster.preferred_leaders(TOPIC)
        prof: list[Any] = []

        def on_window() -> None:
            if opts.profile:  # every node: leaders and followers do different work
                for node, proc in cluster.procs.items():
                    out = Path(opts.profile).resolve() / f"produce-node{node}.txt"
                    out.parent.mkdir(parents=True, exist_ok=True)
                    prof.append((start_profile(proc.pid, opts.duration, out), out, node))

        res = asyncio.run(drive_produce(cluster, leaders, opts, on_window))
        res["leaders_balanced"] = balanced
        for proc, out, node in prof:
            if proc is not None and proc.wait(60) == 0 and out.exists():
                res.setdefault("profile", {})[f"node{node}"] = {"file": str(out), **summarize_profile(out)}
        if "fetch" in opts.scenarios:
            shared["fetch_cluster"] = asyncio.run(drive_fetch(cluster, opts))
    size, outstanding = res["batch_wire_bytes"], opts.baseline_outstanding
    bare = baseline(True, size, outstanding, opts.duration)
    layer = baseline(False, size, outstanding, opts.duration)
    rocks = rocksdict_rates(size, 1000)
    wire = res["mb_per_s"] * size / (opts.record_size * max(1, opts.batch_bytes // opts.record_size))
    res["wire_mb_per_s"] = round(wire, 2)
    res["bare_pysyncobj"] = bare
    res["raft_layer"] = layer
    res["rocksdict"] = rocks
    res["ratio_vs_bare_pysyncobj"] = round(wire / bare["mb_per_s"], 3) if bare.get("mb_per_s") else None
    res["ratio_vs_raft_layer"] = round(wire / layer["mb_per_s"], 3) if layer.get("mb_per_s") else None
    res["ratio_vs_rocksdict_put"] = round(wire / rocks["raw_put_mb_per_s"], 3)
    res["targets"] = {  # the raft layer runs the broker's own transport and settings: the honest ratio
        ">=25MB/s": res["mb_per_s"] >= 25,
        ">=70%_of_raft_layer": (res["ratio_vs_raft_layer"] or 0) >= 0.7,
        ">=70%_of_stock_pysyncobj": (res["ratio_vs_bare_pysyncobj"] or 0) >= 0.7,
    }
    res.pop("_extra", None)
    return res


async def drive_fetch(cluster: BenchCluster, opts: argparse.Namespace) -> dict[str, Any]:
    """Read every partition from offset 0 to its high watermark from its leader (binary batches).

    Passes over the whole log repeat for at least min(duration, 5) s.
    """
    leaders = cluster.leaders(TOPIC)
    total_bytes = total_records = requests = passes = 0
    lat: list[float] = []
    until = time.monotonic() + min(opts.duration, 5.0)
    async with aiohttp.ClientSession() as session:

        async def read(partition: int, url: str) -> None:
            nonlocal total_bytes, total_records, requests, passes
            offset = 0
            while time.monotonic() < until or offset > 0:
                t0 = time.perf_counter()
                async with session.get(f"{url}/v1/topics/{TOPIC}/partitions/{partition}/records",
                                       params={"offset": offset, "max_bytes": opts.fetch_max_bytes,
                                               "format": "binary"}) as resp:  # fmt: skip
                    if resp.content_type != BATCHES_CONTENT_TYPE:
                        raise RuntimeError(f"fetch {partition}@{offset}: {resp.status} {await resp.text()}")
                    data = decode_fetch_batches(await resp.read())
                lat.append(time.perf_counter() - t0)
                requests += 1
                for b in data.batches:
                    total_records += b.header.record_count
                    total_bytes += len(b.data)
                if not data.batches:
                    return
                offset = data.batches[-1].last_offset + 1
                if offset >= data.high_watermark:  # whole log read: start another pass while time is left
                    offset, passes = 0, passes + 1

        c0, t0 = self_cpu(), time.monotonic()
        await asyncio.gather(*(read(p, str(u)) for p, u in leaders.items()))
        wall, cpu = time.monotonic() - t0, self_cpu() - c0
    lat.sort()
    return {"seconds": round(wall, 2), "wire_mb_per_s": round(total_bytes / wall / 1e6, 2),
            "records_per_s": round(total_records / wall), "records": total_records, "requests": requests,
            "log_passes": passes,
            "p50_ms": round(pct(lat, 0.5) * 1e3, 1), "p99_ms": round(pct(lat, 0.99) * 1e3, 1),
            "client_cpu_pct": round(100 * cpu / wall, 1)}  # fmt: skip


def scenario_fetch(opts: argparse.Namespace, shared: dict[str, Any]) -> dict[str, Any]:
    if "fetch_cluster" in shared:  # `all`: read what the produce scenario wrote, on its cluster
        return dict(shared["fetch_cluster"])
    with contextlib.ExitStack() as stack:
        cluster = new_cluster(stack, opts)
        leaders = cluster.create_topic(TOPIC, opts.partitions)
        produced = asyncio.run(drive_produce(cluster, leaders, opts))
        res = asyncio.run(drive_fetch(cluster, opts))
    res["produced_mb_per_s"] = produced["mb_per_s"]
    return res


def scenario_failover(opts: argparse.Namespace, shared: dict[str, Any]) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        cluster = new_cluster(stack, opts)
        leaders = cluster.create_topic(TOPIC, 1)
        pid, epoch = cluster.init_producer()
        records = make_records(opts.record_size, opts.batch_bytes)
        rounds: list[dict[str, Any]] = []

        async def run() -> None:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
                w = PartitionWriter(cluster, session, 0, leaders[0], pid, epoch, records, opts.record_size, Load())
                for _ in range(opts.failovers):
                    for c in cluster.configs:  # every node up and ready, a few seconds of steady writes
                        if not cluster.alive(c.node_id):
                            cluster.start_node(c.node_id)
                    await asyncio.to_thread(cluster.wait_ready)
                    steady = time.monotonic() + 3
                    while time.monotonic() < steady:
                        await w.send_one()
                    victim = cluster.node_of_url(w.leader)
                    t_kill = time.monotonic()
                    cluster.kill(victim)
                    while True:
                        _, acked_by = await w.send_one()
                        if cluster.node_of_url(acked_by) != victim:
                            break
                    took = time.monotonic() - t_kill
                    rounds.append({"killed": victim, "new_leader": cluster.node_of_url(acked_by),
                                   "seconds": round(took, 3)})  # fmt: skip

        asyncio.run(run())
    times = [r["seconds"] for r in rounds]
    med = statistics.median(times)
    return {"rounds": rounds, "median_s": round(med, 3), "max_s": max(times), "target_le_3s": med <= 3.0}


def scenario_idle(opts: argparse.Namespace, shared: dict[str, Any]) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        cluster = new_cluster(stack, opts)
        t0 = time.monotonic()
        cluster.create_topic(TOPIC, opts.idle_partitions, timeout=180)
        elected = time.monotonic() - t0
        time.sleep(3.0)  # let the startup traffic settle
        before = {i: proc_stat(p.pid)[0] for i, p in cluster.procs.items()}
        t0, h0 = time.monotonic(), host_cpu()
        time.sleep(opts.idle_seconds)
        wall, h1 = time.monotonic() - t0, host_cpu()
        nodes = {}
        for i, p in cluster.procs.items():
            cpu, rss, threads = proc_stat(p.pid)
            nodes[f"node{i}"] = {"cpu_pct": round(100 * (cpu - before[i]) / wall, 2), "rss_mb": round(rss, 1),
                                 "threads": threads}  # fmt: skip
    return {"partitions": opts.idle_partitions, "all_leaders_after_s": round(elected, 1), "seconds": round(wall, 1),
            "nodes": nodes, "total_cpu_pct": round(sum(n["cpu_pct"] for n in nodes.values()), 2),
            "host_cpu_busy_pct": round(100 * (h1[0] - h0[0]) / (h1[1] - h0[1]), 1)}  # fmt: skip


RUNNERS: dict[str, Callable[[argparse.Namespace, dict[str, Any]], dict[str, Any]]] = {
    "produce": scenario_produce, "fetch": scenario_fetch, "failover": scenario_failover, "idle": scenario_idle,
}  # fmt: skip


# ---- output -------------------------------------------------------------------------


def render(value: Any, indent: int = 0) -> list[str]:
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if (isinstance(v, dict) and v) or (isinstance(v, list) and v and isinstance(v[0], dict)):
                lines.append(f"{pad}{k}:")
                lines += render(v, indent + 1)
            elif isinstance(v, list) and v:
                lines.append(f"{pad}{k}:")
                lines += [f"{pad}  {x}" for x in v]
            else:
                lines.append(f"{pad}{str(k) + ':':<28} {v}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            lines.append(f"{pad}- [{i}]")
            lines += render(v, indent + 1)
    else:
        lines.append(f"{pad}{value}")
    return lines


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="txbroker bench", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("scenario", nargs="?", default="all", choices=[*SCENARIOS, "all"])
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    p.add_argument("--duration", type=float, default=15.0, help="measured seconds of load (after the warm-up)")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--record-size", type=int, default=1024)
    p.add_argument("--batch-bytes", type=int, default=64 * 1024, help="record payload bytes per batch")
    p.add_argument("--partitions", type=int, default=3, help="partitions of the produce topic (RF 3)")
    p.add_argument("--concurrency", type=int, default=5, choices=range(1, 6), metavar="K",
                   help="requests in flight per partition (1..5; 5 = the Python client's default "
                        "max_in_flight_requests_per_connection)")  # fmt: skip
    p.add_argument("--no-idempotence", dest="idempotence", action="store_false",
                   help="plain writes (producer id -1) instead of idempotent ones")  # fmt: skip
    p.add_argument("--baseline-outstanding", type=int, default=32,
                   help="commands in flight in the bare replication baselines")  # fmt: skip
    p.add_argument("--fetch-max-bytes", type=int, default=1 << 20)
    p.add_argument("--failovers", type=int, default=3)
    p.add_argument("--idle-partitions", type=int, default=64)
    p.add_argument("--idle-seconds", type=float, default=20.0)
    p.add_argument("--profile", metavar="DIR", help="py-spy every node during the produce window; stacks to DIR")
    args = p.parse_args(argv)
    args.scenarios = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    return args


def main(argv: list[str]) -> int:
    opts = parse_args(argv)

    def on_term(*_a: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    report: dict[str, Any] = {"command": "txbroker bench " + shlex.join(argv), "machine": machine_info(),
                              "scenarios": {}}  # fmt: skip
    shared: dict[str, Any] = {}
    status = 0
    for name in opts.scenarios:
        if not opts.json:
            print(f"== {name} ...", file=sys.stderr, flush=True)
        try:
            report["scenarios"][name] = RUNNERS[name](opts, shared)
        except KeyboardInterrupt:
            print("interrupted; every node process was stopped", file=sys.stderr)
            return 130
        except Exception as exc:  # report and go on with the next scenario
            report["scenarios"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            status = 1
    if opts.json:
        print(json.dumps(report, indent=2))
    else:
        print("\n".join(render(report)))
    return status
