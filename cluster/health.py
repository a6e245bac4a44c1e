"""Cluster health and status for operators (``txbroker cluster health|status``).

Health follows ``rpk cluster health``: the cluster is healthy when every node
answers and is ready, a controller leader is known, no partition lacks a
leader, and (stricter than rpk, so a rolling restart can wait on it) no
partition is under-replicated. Partition lag and per-node figures come from
each node's own ``/metrics`` -- the same numbers the dashboards show.

A secure cluster is read over HTTPS: ``ssl_context`` trusts its CA (see
``cluster.security.tls.client_context``) and ``auth`` is a (username,
password) pair sent as HTTP Basic. ``bootstrap`` may list several node URLs,
comma-separated (as the clients take it); the first that answers is used.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[str, list[tuple[dict[str, str], float]]]


@dataclass(frozen=True)
class Access:
    """How to reach a cluster's nodes: the TLS context trusting their CA, HTTP Basic credentials."""

    ssl_context: ssl.SSLContext | None = None
    auth: tuple[str, str] | None = None

    def headers(self) -> dict[str, str]:
        if self.auth is None:
            return {}
        token = base64.b64encode(f"{self.auth[0]}:{self.auth[1]}".encode()).decode()
        return {"Authorization": f"Basic {token}"}


OPEN = Access()


def _get(url: str, timeout: float, access: Access = OPEN) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=access.headers())
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=access.ssl_context) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())


def _bootstrap_urls(bootstrap: str) -> list[str]:
    return [u.strip().rstrip("/") for u in bootstrap.split(",") if u.strip()] or [bootstrap]


def _metadata(bootstrap: str, timeout: float, access: Access) -> tuple[str, Any]:
    """(the URL that answered, its /v1/metadata); raises the last error when none does."""
    last: Exception = OSError(f"no bootstrap URL in {bootstrap!r}")
    for base in _bootstrap_urls(bootstrap):
        try:
            return base, _json(base + "/v1/metadata", timeout, access)
        except (OSError, ValueError) as exc:
            last = exc
    raise last


def scrape(url: str, timeout: float = 3.0, access: Access = OPEN) -> Samples | None:
    """A node's /metrics as {sample name: [(labels, value)]}; None when it does not answer."""
    try:
        status, body = _get(url.rstrip("/") + "/metrics", timeout, access)
    except OSError:
        return None
    if status != 200:
        return None
    out: Samples = defaultdict(list)
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out[s.name].append((dict(s.labels), float(s.value)))
    return out


def _json(url: str, timeout: float, access: Access = OPEN) -> Any:
    status, body = _get(url, timeout, access)
    if status != 200:
        raise OSError(f"GET {url}: HTTP {status}")
    return json.loads(body)


@dataclass
class NodeHealth:
    id: int
    url: str
    responding: bool
    ready: bool
    alive_per_bootstrap: bool


@dataclass
class HealthReport:
    bootstrap: str
    healthy: bool = False
    error: str | None = None
    controller_leader: int | None = None
    nodes: list[NodeHealth] = field(default_factory=list)
    leaderless: list[str] = field(default_factory=list)  # "topic/partition"
    under_replicated: dict[str, int] = field(default_factory=dict)  # topic -> partitions

    @property
    def nodes_down(self) -> list[int]:
        return [n.id for n in self.nodes if not (n.responding and n.ready)]

    def reasons(self) -> list[str]:
        if self.error:
            return [self.error]
        out = []
        if self.nodes_down:
            out.append(f"nodes down or not ready: {self.nodes_down}")
        if self.controller_leader is None:
            out.append("no controller leader")
        elif self.controller_leader in self.nodes_down:
            out.append(f"controller leader {self.controller_leader} is down (election pending)")
        if self.leaderless:
            out.append(f"{len(self.leaderless)} leaderless partitions")
        if self.under_replicated:
            out.append(f"{sum(self.under_replicated.values())} under-replicated partitions")
        return out

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["nodes_down"] = self.nodes_down
        d["reasons"] = self.reasons()
        return d

    def render(self) -> str:
        under = ", ".join(f"{t}: {n}" for t, n in sorted(self.under_replicated.items()))
        rows = [
            ("Healthy:", str(self.healthy).lower()),
            ("Controller ID:", "none" if self.controller_leader is None else str(self.controller_leader)),
            ("All nodes:", str([n.id for n in self.nodes])),
            ("Nodes down:", str(self.nodes_down)),
            (f"Leaderless partitions ({len(self.leaderless)}):", str(self.leaderless)),
            (f"Under-replicated partitions ({sum(self.under_replicated.values())}):", f"[{under}]"),
        ]
        if self.error:
            rows.insert(1, ("Error:", self.error))
        width = max(len(k) for k, _ in rows) + 2
        return "CLUSTER HEALTH OVERVIEW\n=======================\n" + "\n".join(f"{k:<{width}}{v}" for k, v in rows)


def check_health(bootstrap: str, timeout: float = 3.0, access: Access = OPEN) -> HealthReport:
    report = HealthReport(bootstrap.rstrip("/"))
    try:
        base, meta = _metadata(bootstrap, timeout, access)
    except (OSError, ValueError) as exc:
        report.error = f"bootstrap {report.bootstrap} unreachable: {exc}"
        return report
    report.bootstrap = base
    report.controller_leader = meta.get("controller_leader")
    for n in meta["nodes"]:
        try:
            status, _ = _get(n["url"] + "/readyz", timeout, access)
            responding, ready = True, status == 200
        except OSError:
            responding = ready = False
        report.nodes.append(NodeHealth(n["id"], n["url"], responding, ready, bool(n.get("alive"))))
        if responding:
            metrics = scrape(n["url"], timeout, access) or {}
            for labels, value in metrics.get("txbroker_partitions_under_replicated", []):
                if value > 0:
                    topic = labels.get("topic", "?")
                    report.under_replicated[topic] = report.under_replicated.get(topic, 0) + int(value)
    for t in meta["topics"]:
        report.leaderless += [f"{t['name']}/{p['partition']}" for p in t["partitions"] if p.get("leader") is None]
    report.healthy = not report.reasons()
    return report


# ---- status ---------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[int] = ()) -> str:
    """Aligned plain-text columns (``right``: indexes of right-aligned numeric columns)."""
    cells = [[str(c) for c in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _by_labels(samples: Samples | None, name: str, *keys: str) -> dict[tuple[str, ...], float]:
    return {tuple(lv.get(k, "") for k in keys): v for lv, v in (samples or {}).get(name, [])}


def cluster_status(bootstrap: str, timeout: float = 3.0, access: Access = OPEN) -> str:
    """Nodes, partitions (leader, replicas, offsets, per-replica lag) and consumer lag as tables."""
    _base, meta = _metadata(bootstrap, timeout, access)
    scraped = {n["id"]: scrape(n["url"], timeout, access) for n in meta["nodes"]}
    out = []
    node_rows = []
    for n in meta["nodes"]:
        m = scraped[n["id"]]
        roles = _by_labels(m, "txbroker_partitions", "role")
        rss = _by_labels(m, "process_resident_memory_bytes").get((), None)
        node_rows.append([
            n["id"], n["url"], "up" if m is not None else "DOWN",
            "*" if n["id"] == meta.get("controller_leader") else "",
            int(roles.get(("leader",), 0)) if m else "-", int(sum(roles.values())) if m else "-",
            f"{rss / 1e6:.0f} MB" if rss is not None else "-",
        ])  # fmt: skip
    out.append(table(["NODE", "URL", "STATE", "CONTROLLER", "LEADERS", "REPLICAS", "RSS"], node_rows, right=(4, 5, 6)))
    hws = {i: _by_labels(m, "txbroker_partition_high_watermark", "topic", "partition") for i, m in scraped.items()}
    part_rows = []
    for t in meta["topics"]:
        for p in t["partitions"]:
            key = (t["name"], str(p["partition"]))
            leader_hw = hws.get(p["leader"], {}).get(key) if p["leader"] is not None else None
            lags = []
            for r in p["replicas"]:
                if r == p["leader"]:
                    continue
                hw = hws.get(r, {}).get(key)
                if scraped.get(r) is None:
                    lags.append(f"{r}:down")
                elif hw is None or leader_hw is None:
                    lags.append(f"{r}:?")
                else:
                    lags.append(f"{r}:{int(max(0, leader_hw - hw))}")
            part_rows.append([
                t["name"], p["partition"], p["leader"] if p["leader"] is not None else "NONE",
                ",".join(str(r) for r in p["replicas"]), p["high_watermark"], p["last_stable_offset"],
                p["log_start_offset"], " ".join(lags) or "-",
            ])  # fmt: skip
    headers = ["TOPIC", "PARTITION", "LEADER", "REPLICAS", "HW", "LSO", "START", "FOLLOWER LAG (node:records)"]
    out.append(table(headers, part_rows, right=(1, 4, 5, 6)) if part_rows else "(no topics)")
    lag: dict[tuple[str, ...], float] = {}
    for m in scraped.values():
        for k, v in _by_labels(m, "txbroker_consumer_group_lag_records", "group", "topic").items():
            lag[k] = max(v, lag.get(k, 0.0))
    if lag:
        rows = [[g, t, int(v)] for (g, t), v in sorted(lag.items())]
        out.append(table(["GROUP", "TOPIC", "LAG (records)"], rows, right=(2,)))
    return "\n\n".join(out)
