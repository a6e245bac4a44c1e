"""Real txbroker node processes on loopback for integration and fault tests.

Every process a ``LocalCluster`` starts is stopped by ``close()`` (the pytest
fixtures call it), ports are chosen at run time, and every wait polls with a
deadline.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from cluster.config import NodeConfig, free_ports, load_config, make_cluster_configs, write_configs
from cluster.security.node_calls import NODE_CALL_HEADER, NodeCallSigner

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll ``predicate`` until it returns a truthy value; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # the cluster may be mid-failover
            last_exc = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last_exc!r})")
        time.sleep(interval)


def http(
    method: str,
    url: str,
    body: Any = None,
    *,
    raw: bytes | None = None,
    content_type: str = "application/json",
    timeout: float = 30.0,
    headers: dict[str, str] | None = None,
    context: ssl.SSLContext | None = None,
) -> tuple[int, Any]:
    """(status, decoded JSON or bytes). Never raises for HTTP error statuses. ``context``: TLS for https URLs."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            status, payload, ctype = resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        status, payload, ctype = exc.code, exc.read(), exc.headers.get("Content-Type", "")
    if "json" in ctype:
        return status, json.loads(payload)
    return status, payload


def node_call(
    config: NodeConfig,
    to: int,
    method: str,
    path: str,
    body: Any = None,
    *,
    raw: bytes | None = None,
    principal: str | None = None,
    signed_at: float | None = None,
) -> dict[str, str]:
    """The node-call header of ``http(method, <node to's url> + path, body, raw=raw)``, signed as ``config``'s
    node would.

    ``principal``: a forwarded request acting for it (None: the node's own internal call); ``signed_at``:
    the signing time (Unix seconds; now by default)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
    clock = time.time if signed_at is None else (lambda: signed_at)
    signer = NodeCallSigner(config.cluster_secret, config.node_id, clock=clock)
    return {NODE_CALL_HEADER: signer.sign(method, path, data, principal, receiver=to)}


def plain_produce(url: str, topic: str, value: bytes, *, timeout_ms: int, timeout: float) -> tuple[int, Any]:
    """``POST /v1/produce`` of one plain (non-idempotent) record to partition 0 of ``topic``: (status, answer)."""
    body = {
        "acks": "all",
        "timeout_ms": timeout_ms,
        "partitions": [
            {
                "topic": topic,
                "partition": 0,
                "producer_id": -1,
                "producer_epoch": -1,
                "base_sequence": -1,
                "records": [{"value": base64.b64encode(value).decode()}],
            }
        ],
    }
    return http("POST", url + "/v1/produce", body, timeout=timeout)


def samples(url: str, name: str) -> list[tuple[dict[str, str], float]]:
    """``(labels, value)`` of every sample called ``name`` in a node's ``/metrics``."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return [(s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def free_port_range(n: int, host: str = "127.0.0.1", attempts: int = 200) -> int:
    """The first of ``n`` consecutive ports free right now (for ``txbroker cluster init --base-port``)."""
    import random

    for _ in range(attempts):
        base = random.randrange(20_000, 60_000 - n)
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError(f"no {n} consecutive free ports found")


def cluster_init_secure(directory: Path, n: int = 3) -> subprocess.CompletedProcess[str]:
    """``txbroker cluster init --secure`` as an operator runs it, on ``3n`` consecutive free ports."""
    base = free_port_range(3 * n)  # HTTP, Raft and Kafka ports
    return subprocess.run(
        [sys.executable, "-m", "cluster", "cluster", "init", "--secure", "--dir", str(directory), "--nodes", str(n),
         "--base-port", str(base)],
        capture_output=True, text=True, timeout=60, check=False, cwd=str(REPO),
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )  # fmt: skip


class LocalCluster:
    def __init__(self, directory: Path, n: int = 3, **config_overrides: Any) -> None:
        self.dir = directory
        self.n = n
        ports = free_ports(3 * n)
        self.configs: list[NodeConfig] = make_cluster_configs(
            n, directory, http_ports=ports[:n], raft_ports=ports[n : 2 * n], kafka_ports=ports[2 * n :]
        )
        if config_overrides:
            from dataclasses import replace

            self.configs = [replace(c, **config_overrides) for c in self.configs]
        self.paths = write_configs(self.configs, directory)  # renders every setting off its default
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.logs: dict[int, Any] = {}
        #: trusts the nodes' CA when they serve HTTPS (``from_dir`` of a ``cluster init --secure`` directory)
        self.ssl_context: ssl.SSLContext | None = None

    @classmethod
    def from_dir(cls, directory: Path) -> LocalCluster:
        """The cluster whose node configs ``directory`` already holds (``txbroker cluster init [--secure]``)."""
        self = cls.__new__(cls)
        self.dir = directory
        self.paths = sorted(directory.glob("node-*.toml"), key=lambda p: int(p.stem.removeprefix("node-")))
        self.configs = [load_config(p) for p in self.paths]
        self.n = len(self.configs)
        self.procs = {}
        self.logs = {}
        sec = self.configs[0].security
        self.ssl_context = None
        if sec is not None and sec.tls:
            self.ssl_context = ssl.create_default_context(cafile=str(sec.tls_ca_file) if sec.tls_ca_file else None)
        return self

    def adopt(self, path: Path) -> int:
        """Take in the node whose config ``txbroker cluster add-node`` wrote at ``path`` (the next id)."""
        cfg = load_config(path)
        assert cfg.node_id == len(self.configs) + 1, f"{path} is node {cfg.node_id}, not the next one"
        self.configs.append(cfg)
        self.paths.append(path)
        self.n += 1
        return cfg.node_id

    # ---- processes -------------------------------------------------------------

    def url(self, node_id: int) -> str:
        return self.configs[node_id - 1].url

    @property
    def urls(self) -> list[str]:
        return [c.url for c in self.configs]

    @property
    def bootstrap_servers(self) -> str:
        """The nodes' Kafka listeners, as Kafka clients' ``bootstrap.servers``."""
        return ",".join(c.self_address.kafka_address or "" for c in self.configs if c.kafka_port is not None)

    def start_node(self, node_id: int) -> None:
        assert node_id not in self.procs or self.procs[node_id].poll() is not None, f"node {node_id} is running"
        old = self.logs.pop(node_id, None)
        if old is not None:
            old.close()
        log = open(self.dir / f"node-{node_id}.log", "ab")  # noqa: SIM115 - closed in close()
        self.logs[node_id] = log
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.procs[node_id] = subprocess.Popen(
            [sys.executable, "-m", "cluster", "node", "start", "--config", str(self.paths[node_id - 1])],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(REPO),
        )

    def start(self, timeout: float = 60.0) -> LocalCluster:
        for i in range(1, self.n + 1):
            self.start_node(i)
        self.wait_ready(timeout=timeout)
        return self

    def start_live(self, timeout: float = 60.0) -> LocalCluster:
        """Start every node and wait until each serves ``/livez`` (readiness not awaited)."""
        for i in range(1, self.n + 1):
            self.start_node(i)
        self.wait_live(timeout=timeout)
        return self

    def wait_ready(self, nodes: list[int] | None = None, timeout: float = 60.0) -> None:
        for i in nodes or list(range(1, self.n + 1)):
            wait_for(lambda i=i: self.is_ready(i), timeout, f"node {i} /readyz")

    def is_ready(self, node_id: int) -> bool:
        return self._answers(node_id, "/readyz")

    def wait_live(self, nodes: list[int] | None = None, timeout: float = 60.0) -> None:
        """Every node's HTTP listener answers ``/livez`` (serving, not necessarily ready)."""
        for i in nodes or list(range(1, self.n + 1)):
            wait_for(lambda i=i: self._answers(i, "/livez"), timeout, f"node {i} /livez")

    def _answers(self, node_id: int, path: str) -> bool:
        try:
            status, _ = http("GET", self.url(node_id) + path, timeout=2, context=self.ssl_context)
        except OSError:
            return False
        return status == 200

    def signal(self, node_id: int, sig: signal.Signals) -> None:
        self.procs[node_id].send_signal(sig)

    def kill(self, node_id: int) -> None:
        p = self.procs[node_id]
        p.send_signal(signal.SIGKILL)
        p.wait(10)

    def stop_node(self, node_id: int, timeout: float = 30.0) -> int:
        p = self.procs[node_id]
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        return p.wait(timeout)

    def __enter__(self) -> LocalCluster:
        """``with LocalCluster(...) as c: yield c.start()``: every node is stopped when the block ends, also when
        the start failed."""
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGKILL)
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
        for f in self.logs.values():
            f.close()

    def log_text(self, node_id: int) -> str:
        return (self.dir / f"node-{node_id}.log").read_text(errors="replace")

    # ---- API helpers -------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 3, rf: int = 3, via: int = 1, **config: Any) -> Any:
        body: dict[str, Any] = {"name": name, "partitions": partitions, "replication_factor": rf}
        if config:
            body["config"] = config
        retried = False

        def attempt() -> Any:
            # A controller election right after start answers NOT_CONTROLLER (retriable); a retry
            # of a create that did land answers TOPIC_ALREADY_EXISTS, which is then success.
            nonlocal retried
            status, res = http("POST", self.url(via) + "/v1/topics", body)
            if status == 201 or (retried and res.get("error_code") == "TOPIC_ALREADY_EXISTS"):
                return res
            assert res.get("retriable"), (status, res)
            retried = True
            return None

        res = wait_for(attempt, 30, f"topic {name} created")
        self.wait_leaders(name, partitions)
        return res

    def metadata(self, via: int) -> Any:
        status, res = http("GET", self.url(via) + "/v1/metadata", timeout=5)
        assert status == 200, res
        return res

    def partition_meta(self, topic: str, partition: int, via: int) -> dict[str, Any]:
        for t in self.metadata(via)["topics"]:
            if t["name"] == topic:
                return t["partitions"][partition]
        raise KeyError(topic)

    def leader(self, topic: str, partition: int, via: int | None = None) -> int | None:
        nodes = [via] if via else [i for i in self.procs if self.procs[i].poll() is None]
        for v in nodes:
            try:
                leader = self.partition_meta(topic, partition, v)["leader"]
            except (OSError, KeyError, AssertionError):
                continue
            if leader is not None and self.procs.get(leader) and self.procs[leader].poll() is None:
                return int(leader)
        return None

    def wait_leaders(self, topic: str, partitions: int, timeout: float = 30.0) -> dict[int, int]:
        def all_led() -> dict[int, int] | None:
            out = {}
            for p in range(partitions):
                leader = self.leader(topic, p)
                if leader is None:
                    return None
                out[p] = leader
            return out

        return wait_for(all_led, timeout, f"leaders of all partitions of {topic}")
