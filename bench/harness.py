"""The cluster a benchmark measures, and what the benchmarks' command lines share.

``BenchCluster`` runs 3 ``txbroker node start`` processes on loopback (ports
chosen at run time, configs and data in a directory it is given) and stops
every one it started; ``add_node`` grows it by one node the way an operator
does (``txbroker cluster add-node``, then ``node start``). ``fresh_cluster``
starts one in a temporary directory for the length of a ``with`` block. ``--node-setting KEY=VALUE`` sets a node
config field on every node of the benches that take it.

``secure=True`` gives the nodes what ``txbroker cluster init --secure`` writes
(``cluster.security.secure_init``: HTTPS with certificates of a fresh CA, HTTP
Basic against SCRAM users, ACLs enforced, the super user ``admin``); the
cluster's own calls (readiness, topics, metadata, ``/metrics``) then go over
HTTPS as ``admin`` (``access``), and ``admin_config`` / ``ca_file`` are the
files a client of it needs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from cluster.config import NodeConfig, free_ports, load_config, make_cluster_configs, write_configs
from cluster.health import OPEN, Access, Samples, scrape
from cluster.security.secure_init import ADMIN_USER, secure_cluster

from .measure import proc_stat, sum_samples, threads_cpu_by_kind

REPO = Path(__file__).resolve().parents[1]


def http_json(method: str, url: str, body: Any = None, timeout: float = 10.0, access: Access = OPEN) -> tuple[int, Any]:
    """(status, parsed JSON answer) of one request with a JSON ``body``; an HTTP error status answers too.

    ``access``: the TLS context and HTTP Basic credentials of a secure cluster (none by default)."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json", **access.headers()}
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=access.ssl_context) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def add_partition_write_arguments(p: argparse.ArgumentParser, what: str) -> None:
    """The options of a bench that writes ``--mib`` MiB to one partition (``produce_load.PartitionWriter``) and
    waits for ``what``: record and batch sizes, requests in flight, the timeout, ``--keep``, ``--node-setting``
    and ``--json``."""
    p.add_argument("--record-size", type=int, default=1024)
    p.add_argument("--batch-bytes", type=int, default=64 * 1024, help="record payload bytes per batch")
    p.add_argument("--concurrency", type=int, default=5, choices=range(1, 6), metavar="K",
                   help="produce requests in flight per partition (1-5, default 5)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=3600.0, help=f"seconds {what} may take (default 3600)")
    p.add_argument("--keep", metavar="DIR", help="run the cluster in DIR and keep its logs and data")
    add_node_setting_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")


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
    """``pred()``'s first true value, polled every ``interval`` s (OSError, ValueError and KeyError count as not
    yet); TimeoutError after ``timeout`` s."""
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


class BenchCluster:
    """3 ``txbroker node start`` processes on loopback; ``close()`` stops every one it started."""

    def __init__(
        self, workdir: Path, n: int = 3, settings: dict[str, Any] | None = None, *, secure: bool = False
    ) -> None:
        """``settings``: node settings (``NodeConfig`` fields) off their defaults, the same on every node;
        ``secure``: TLS, authentication and ACLs as ``cluster init --secure`` sets them up (module docstring)."""
        self.dir = workdir
        ports = free_ports(2 * n)
        configs = make_cluster_configs(n, workdir, http_ports=ports[:n], raft_ports=ports[n:])
        configs = [dataclasses.replace(c, **(settings or {})) for c in configs]
        #: How the harness reaches the nodes (a secure cluster: its CA and the admin's credentials).
        self.access: Access = OPEN
        self.admin_config: Path | None = None
        self.ca_file: Path | None = None
        if secure:
            setup = secure_cluster(configs, workdir)
            configs = setup.configs
            password = str(tomllib.loads(setup.admin_config.read_text())["password"])
            self.admin_config, self.ca_file = setup.admin_config, setup.ca_file
            self.access = Access(ssl.create_default_context(cafile=str(setup.ca_file)), (ADMIN_USER, password))
        self.configs: list[NodeConfig] = configs
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

    def add_node(self, timeout: float = 120.0) -> int:
        """Grow the cluster by one node as an operator does: ``txbroker cluster add-node --dir`` registers it and
        writes its config beside the others, then it starts; its id once it answers ``/readyz`` (plain clusters)."""
        if self.access.auth is not None:
            raise NotImplementedError("add_node runs the CLI without credentials: plain clusters only")
        cmd = [sys.executable, "-m", "cluster", "cluster", "add-node", "--dir", str(self.dir),
               "--bootstrap", ",".join(self.live_urls())]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(REPO), check=False,
                             env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(f"cluster add-node: exit {out.returncode}: {out.stderr.strip()}")
        node_id = len(self.configs) + 1
        path = self.dir / f"node-{node_id}.toml"
        cfg = load_config(path)
        if cfg.node_id != node_id:
            raise RuntimeError(f"cluster add-node registered node {cfg.node_id}, not {node_id}")
        self.configs.append(cfg)
        self.paths.append(path)
        self.start_node(node_id)
        wait_for(functools.partial(self.ready, node_id), timeout, f"node {node_id} /readyz")
        return node_id

    def ready(self, node_id: int) -> bool:
        try:
            return http_json("GET", self.url(node_id) + "/readyz", timeout=2, access=self.access)[0] == 200
        except (OSError, ValueError):
            return False

    def start(self, timeout: float = 60.0) -> BenchCluster:
        self.start_nodes()
        self.wait_ready(timeout)
        return self

    def start_nodes(self) -> None:
        """Start every node, not waiting for them (``wait_ready`` does)."""
        for c in self.configs:
            self.start_node(c.node_id)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Every started node ready; on a secure cluster, also knowing the admin (the bootstrap users recorded)."""
        for i in self.procs:
            wait_for(functools.partial(self.ready, i), timeout, f"node {i} /readyz")
        if self.access.auth is not None:
            for i in self.procs:
                wait_for(functools.partial(self.admin_known, i), timeout, f"node {i} knowing the admin user")

    def admin_known(self, node_id: int) -> bool:
        """The node authenticates the harness's admin credentials (``GET /v1/whoami`` answers 200)."""
        return http_json("GET", self.url(node_id) + "/v1/whoami", timeout=2, access=self.access)[0] == 200

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
        return [scrape(url, timeout=5, access=self.access) or {} for url in self.live_urls()]

    def leaders(self, topic: str) -> dict[int, str | None]:
        """partition -> leader URL, from the first live node that answers."""
        for url in self.live_urls():
            with contextlib.suppress(OSError, ValueError):
                status, meta = http_json("GET", url + "/v1/metadata", timeout=3, access=self.access)
                if status != 200:
                    continue
                for t in meta["topics"]:
                    if t["name"] == topic:
                        return {p["partition"]: p.get("leader_url") for p in t["partitions"]}
        return {}

    def create_topic(self, topic: str, partitions: int, rf: int = 3, timeout: float = 60.0) -> dict[int, str]:
        """Create ``topic`` and wait until every partition has a live leader: partition -> leader URL."""
        self._post_topic(topic, partitions, rf, timeout)
        return self._wait_led(topic, partitions, timeout)

    def create_topics(
        self, topics: Sequence[str], partitions: int, rf: int = 3, timeout: float = 60.0
    ) -> dict[str, dict[int, str]]:
        """Create every topic of ``topics``, then wait until each has live leaders (their elections overlap):
        topic -> partition -> leader URL."""
        for topic in topics:
            self._post_topic(topic, partitions, rf, timeout)
        return {topic: self._wait_led(topic, partitions, timeout) for topic in topics}

    def _post_topic(self, topic: str, partitions: int, rf: int, timeout: float) -> None:
        body = {"name": topic, "partitions": partitions, "replication_factor": rf}
        attempts: list[str] = []

        def created() -> bool | None:
            """POST to the controller: a 421 names it; other retriable answers (no controller yet) wait."""
            url = self.url(1)
            for _hop in range(3):
                attempts.append(url)
                status, res = http_json("POST", url + "/v1/topics", body, access=self.access)
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

    def _wait_led(self, topic: str, partitions: int, timeout: float) -> dict[int, str]:
        def all_led() -> dict[int, str] | None:
            led = self.leaders(topic)
            live = set(self.live_urls())
            ok = len(led) == partitions and all(u in live for u in led.values())
            return {p: str(u) for p, u in led.items()} if ok else None

        led: dict[int, str] = wait_for(all_led, timeout, f"leaders of {partitions} partitions of {topic}")
        return led

    def preferred_leaders(self, topic: str, timeout: float = 40.0) -> tuple[dict[int, str], bool]:
        """partition -> leader URL once every partition is led by its preferred replica (the broker's
        leader balancer moves them within ~5 s); after ``timeout``, the current leaders and False."""

        def balanced() -> dict[int, str] | None:
            for url in self.live_urls():
                with contextlib.suppress(OSError, ValueError):
                    status, meta = http_json("GET", url + "/v1/metadata", timeout=3, access=self.access)
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
        status, res = http_json("POST", self.url(1) + "/v1/producers/init", {"transactional_id": None},
                                access=self.access)  # fmt: skip
        if status != 200:
            raise RuntimeError(f"init producer: {status} {res}")
        return int(res["producer_id"]), int(res["producer_epoch"])


@contextlib.contextmanager
def fresh_cluster(
    prefix: str = "txbroker-bench-", settings: dict[str, Any] | None = None, *, secure: bool = False
) -> Iterator[BenchCluster]:
    """A started ``BenchCluster`` in a new temporary directory named ``prefix...``; stopped and removed on exit."""
    with fresh_clusters([(prefix, secure)], settings) as (cluster,):
        yield cluster


@contextlib.contextmanager
def fresh_clusters(
    kinds: Sequence[tuple[str, bool]], settings: dict[str, Any] | None = None
) -> Iterator[tuple[BenchCluster, ...]]:
    """One started ``BenchCluster`` per ``(prefix, secure)`` of ``kinds``, each as ``fresh_cluster`` makes it; their
    nodes start together (one wait for all of them to be ready), and all are stopped and removed on exit."""
    with contextlib.ExitStack() as stack:
        clusters: list[BenchCluster] = []
        for prefix, secure in kinds:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix))
            clusters.append(stack.enter_context(BenchCluster(Path(tmp), settings=settings, secure=secure)))
        for cluster in clusters:
            cluster.start_nodes()
        for cluster in clusters:
            cluster.wait_ready()
        yield tuple(clusters)
