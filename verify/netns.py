"""A txbroker cluster whose nodes each run in their own Linux network namespace.

Node ``i`` runs as ``ip netns exec <prefix>-<run>-<i> <python> -m cluster node start --config F``
(working directory: the repository) and binds its HTTP and Raft ports, chosen free inside
its namespace, to its namespace's address 10.x.y.(10+i) on a bridge whose address the root
namespace holds: the test and the workload reach every node at all times, and faults
(``cut``, ``isolate``, ``split``: silent drops between nodes; ``kill``, ``pause``) never cut
the client. ``verify.netns_network`` builds the namespaces, links and fault rules and
describes them.

``close()`` SIGKILLs every node's process group and removes every namespace, link and nft
table, even after a partial ``start()``; ``sweep()`` removes what a crashed run left.

Thread-safety: one thread drives a ``NamespacedCluster`` at a time, except that
``leader_of``, ``coordinator_of``, ``url`` and ``urls`` may be called from any thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from cluster.config import NodeConfig, make_cluster_configs, write_configs

from .netns_network import NetnsError, Network, majority, run_command, sweep, unavailable_reason

__all__ = ["NamespacedCluster", "NetnsError", "sweep", "unavailable_reason"]

REPO = Path(__file__).resolve().parents[1]


# ---- the cluster ---------------------------------------------------------------------------


def _get_json(url: str, timeout: float) -> Any:
    """The decoded JSON answer of a 200, else ``None`` (a silent, paused or failing node)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return json.loads(resp.read()) if resp.status == 200 else None
    except (OSError, ValueError):
        return None


def _status(url: str, timeout: float) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


class NamespacedCluster:
    """A txbroker cluster of ``nodes`` node processes, each in its own network namespace on a bridge.

    ``python`` and ``cwd`` are the interpreter and working directory the node processes run
    with (``cwd`` also goes first on their ``PYTHONPATH``; default: this checkout), so a
    benchmark can run another checkout's nodes. ``config_overrides`` are ``NodeConfig``
    fields set on every node. Data, configs and node logs (``node-<i>.log``) live in
    ``directory``.
    """

    def __init__(
        self,
        directory: Path,
        nodes: int = 3,
        *,
        python: str = sys.executable,
        cwd: Path | None = None,
        prefix: str = "txb",
        **config_overrides: Any,
    ) -> None:
        self.dir = Path(directory)
        self.python = python
        self.cwd = Path(cwd or REPO).resolve()
        self.network = Network(nodes, prefix)
        self.configs: list[NodeConfig] = []
        self.paths: list[Path] = []
        self._overrides = config_overrides
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._logs: dict[int, IO[bytes]] = {}
        self._paused: set[int] = set()
        self._state = "new"  # new -> started -> closed

    # ---- life cycle -----------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> NamespacedCluster:
        """Build the network, write the configs, start every node and wait until all are ready and see each other."""
        if self._state != "new":
            raise NetnsError(f"a cluster is started once (this one is {self._state})")
        self._state = "started"
        deadline = time.monotonic() + timeout
        try:
            self.network.create()
            ids = self.node_ids
            ports = [self._free_ports(i, 2) for i in ids]
            configs = make_cluster_configs(
                len(ids),
                self.dir,
                hosts=[self.network.address(i) for i in ids],
                http_ports=[p[0] for p in ports],
                raft_ports=[p[1] for p in ports],
            )
            self.configs = [dataclasses.replace(c, **self._overrides) for c in configs]
            self.paths = write_configs(self.configs, self.dir)
            for i in ids:
                self._spawn(i)
            self.wait_ready(timeout=max(1.0, deadline - time.monotonic()))
            self.wait_connected(timeout=max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """SIGKILL every node's process group, then remove the nft tables, namespaces, veths and bridge."""
        for p in self._procs.values():
            if p.poll() is None:  # not reaped: its pid (and process group id) is still its own
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
        for p in self._procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
        self._paused.clear()
        self.network.close()
        for f in self._logs.values():
            f.close()
        self._logs.clear()
        self._state = "closed"

    def __enter__(self) -> NamespacedCluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ---- addresses ------------------------------------------------------------------------

    @property
    def node_ids(self) -> list[int]:
        return list(range(1, self.network.nodes + 1))

    def url(self, node_id: int) -> str:
        """``http://10.x.y.(10+i):port``: reachable from the root namespace whatever the faults."""
        return self._config(node_id).url

    @property
    def urls(self) -> list[str]:
        return [self.url(i) for i in self.node_ids]

    def address(self, node_id: int) -> str:
        return self.network.address(node_id)

    def namespace(self, node_id: int) -> str:
        return self.network.namespace(node_id)

    @property
    def fault_backend(self) -> str:
        """``"nft"`` (silent drops) or ``"blackhole"`` (routes; senders see errors)."""
        return self.network.backend

    def exec_in(self, node_id: int, argv: Sequence[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside node ``node_id``'s namespace (never raises for its exit status)."""
        return subprocess.run(
            self.network.exec_argv(node_id, argv), capture_output=True, text=True, timeout=timeout, check=False
        )

    def log_text(self, node_id: int) -> str:
        path = self.dir / f"node-{node_id}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # ---- faults ---------------------------------------------------------------------------

    def cut(self, a: int, b: int) -> None:
        """Silently drop all traffic between nodes ``a`` and ``b`` (both directions)."""
        self.network.cut([(a, b)])

    def cut_links(self, pairs: Iterable[tuple[int, int]]) -> None:
        """``cut`` every pair, with one rule update per namespace touched."""
        self.network.cut(pairs)

    def isolate(self, node_id: int) -> None:
        """Cut ``node_id`` from every other node; the root namespace still reaches it."""
        self.split({node_id})

    def split(self, side: set[int]) -> None:
        """Cut every link between ``side`` and the rest of the nodes."""
        rest = [n for n in self.node_ids if n not in side]
        self.network.cut([(a, b) for a in sorted(side) for b in rest])

    def heal(self) -> None:
        """Remove every cut."""
        self.network.heal()

    @property
    def cuts(self) -> frozenset[tuple[int, int]]:
        """The node pairs cut right now, each as ``(smaller id, larger id)``."""
        return self.network.cuts

    def kill(self, node_id: int) -> None:
        """SIGKILL the node's process group and reap it."""
        p = self._procs[node_id]
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)
        self._paused.discard(node_id)

    def restart(self, node_id: int) -> None:
        """Start a killed node again with the same config and data directory (does not wait for it)."""
        if self.is_running(node_id):
            raise NetnsError(f"node {node_id} is running")
        self._spawn(node_id)

    def pause(self, node_id: int) -> None:
        """SIGSTOP the node's process group."""
        os.killpg(self._procs[node_id].pid, signal.SIGSTOP)
        self._paused.add(node_id)

    def resume(self, node_id: int) -> None:
        """SIGCONT the node's process group."""
        os.killpg(self._procs[node_id].pid, signal.SIGCONT)
        self._paused.discard(node_id)

    def is_running(self, node_id: int) -> bool:
        p = self._procs.get(node_id)
        return p is not None and p.poll() is None

    @property
    def pids(self) -> dict[int, int]:
        """Each started node's process id (also its process group id)."""
        return {i: p.pid for i, p in self._procs.items()}

    @property
    def paused(self) -> frozenset[int]:
        return frozenset(self._paused)

    # ---- what the nodes say ---------------------------------------------------------------

    def wait_ready(self, node_ids: Iterable[int] | None = None, timeout: float = 60.0) -> None:
        """Wait (``timeout`` in all) until each node in ``node_ids`` (default: all) answers ``GET /readyz`` 200."""
        deadline = time.monotonic() + timeout
        for i in list(node_ids or self.node_ids):
            self._poll(functools.partial(self.is_ready, i), deadline, f"node {i} /readyz", i)

    def wait_connected(self, timeout: float = 60.0) -> None:
        """Wait (``timeout`` in all) until every node's ``GET /v1/cluster`` lists every node alive."""
        deadline = time.monotonic() + timeout
        for i in self.node_ids:
            self._poll(functools.partial(self.sees_all, i), deadline, f"node {i} to see every node alive", i)

    def is_ready(self, node_id: int) -> bool:
        return _status(self.url(node_id) + "/readyz", 2.0) == 200

    def sees_all(self, node_id: int) -> bool:
        return self.alive_seen_by(node_id) == set(self.node_ids)

    def alive_seen_by(self, node_id: int) -> set[int] | None:
        """The nodes ``node_id``'s ``/v1/cluster`` lists alive, ``None`` if it does not answer."""
        view = _get_json(self.url(node_id) + "/v1/cluster", 2.0)
        if not isinstance(view, dict):
            return None
        return {int(n["id"]) for n in view.get("nodes", []) if n.get("alive")}

    def leader_of(self, topic: str, partition: int) -> int | None:
        """The leader of (topic, partition) a majority of the nodes name in ``/v1/metadata``, else ``None``."""

        def leader(view: Any) -> int | None:
            for t in view.get("topics", []):
                if t.get("name") == topic:
                    for p in t.get("partitions", []):
                        if p.get("partition") == partition and p.get("leader") is not None:
                            return int(p["leader"])
            return None

        return self._majority("/v1/metadata", leader)

    def coordinator_of(self, transactional_id: str) -> int | None:
        """The transaction coordinator of ``transactional_id`` a majority of the nodes name, else ``None``."""
        path = "/v1/coordinators/transaction/" + urllib.parse.quote(transactional_id, safe="")
        return self._majority(path, lambda view: int(view["node_id"]) if view.get("node_id") is not None else None)

    def _majority(self, path: str, extract: Callable[[Any], int | None]) -> int | None:
        def ask(node_id: int) -> int | None:
            view = _get_json(self.url(node_id) + path, 2.0)
            if not isinstance(view, dict):
                return None
            try:
                answer = extract(view)
            except (KeyError, TypeError, ValueError):
                return None
            return answer if answer in self.node_ids else None

        asked = [i for i in self.node_ids if self.is_running(i) and i not in self._paused]
        with ThreadPoolExecutor(max_workers=max(1, len(asked))) as pool:
            answers = list(pool.map(ask, asked))
        return majority(answers, len(self.node_ids))

    # ---- internals ------------------------------------------------------------------------

    def _config(self, node_id: int) -> NodeConfig:
        if not self.configs:
            raise NetnsError("the cluster is not started")
        if node_id not in self.node_ids:
            raise ValueError(f"no node {node_id}")
        return self.configs[node_id - 1]

    def _free_ports(self, node_id: int, count: int) -> list[int]:
        script = (
            "import socket, sys\n"
            "ss = [socket.socket() for _ in range(int(sys.argv[2]))]\n"
            "[s.bind((sys.argv[1], 0)) for s in ss]\n"
            "print(' '.join(str(s.getsockname()[1]) for s in ss))\n"
        )
        out = run_command(
            self.network.exec_argv(node_id, [self.python, "-c", script, self.address(node_id), str(count)])
        )
        return [int(p) for p in out.split()]

    def _spawn(self, node_id: int) -> None:
        old = self._logs.pop(node_id, None)
        if old is not None:
            old.close()
        log = open(self.dir / f"node-{node_id}.log", "ab")  # noqa: SIM115 - closed in close()
        self._logs[node_id] = log
        path = os.pathsep.join(p for p in (str(self.cwd), os.environ.get("PYTHONPATH", "")) if p)
        argv = [self.python, "-m", "cluster", "node", "start", "--config", str(self.paths[node_id - 1])]
        self._procs[node_id] = subprocess.Popen(
            self.network.exec_argv(node_id, argv),  # `ip netns exec` execs the node: the pid is the node's
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONPATH=path),
            cwd=str(self.cwd),
            start_new_session=True,  # its own process group: kill/pause reach everything it starts
        )

    def _poll(self, predicate: Callable[[], bool], deadline: float, what: str, node_id: int) -> None:
        while not predicate():
            p = self._procs.get(node_id)
            if p is not None and p.poll() is not None:
                raise NetnsError(f"node {node_id} exited ({p.returncode}) waiting for {what}:\n{self._tail(node_id)}")
            if time.monotonic() > deadline:
                raise NetnsError(f"timed out waiting for {what}:\n{self._tail(node_id)}")
            time.sleep(0.1)

    def _tail(self, node_id: int, lines: int = 20) -> str:
        return "\n".join(self.log_text(node_id).splitlines()[-lines:])
