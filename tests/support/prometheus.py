"""Prometheus-side test helpers: promtool/prometheus binaries, query extraction, a real server.

The binaries come from Debian's ``prometheus`` package, which ops/test.sh
installs. Without them a test is skipped with the reason shown by ``-ra`` --
except in CI (``CI`` set), where a missing binary is a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cluster.config import free_ports

REPO = Path(__file__).resolve().parents[2]
OPS = REPO / "ops"
ALERTS = OPS / "prometheus" / "alerts.yml"
ALERTS_TEST = OPS / "prometheus" / "alerts_test.yml"
DASHBOARD_DIR = OPS / "grafana" / "dashboards"
# Series Prometheus itself adds to every target; dashboards may name them.
PROMETHEUS_SYNTHETIC = {"up"}


def require_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        msg = f"{name} not installed (Debian package 'prometheus'; ops/test.sh installs it)"
        if os.environ.get("CI"):
            pytest.fail(msg + " -- CI must run this test")
        pytest.skip(msg)
    return path


def artifacts_dir(name: str) -> Path:
    """Where tests leave files for a person to look at ($TXBROKER_TEST_ARTIFACTS, default test-artifacts/)."""
    base = Path(os.environ.get("TXBROKER_TEST_ARTIFACTS", REPO / "test-artifacts"))
    d = base / name
    d.mkdir(parents=True, exist_ok=True)
    return d


# ---- PromQL text -----------------------------------------------------------------------------

_KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
    "inf", "nan", "atan2",
}  # fmt: skip
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_BRACES = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w:.$])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$", re.S)


def substitute_grafana_vars(expr: str, rate_interval: str = "5m") -> str:
    """Replace Grafana's variables the way grafana/dashboard-linter does, so the text is plain PromQL."""
    for var in ("$__rate_interval", "${__rate_interval}", "$__interval", "${__interval}", "$__range", "${__range}"):
        expr = expr.replace(var, rate_interval)
    return re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", ".*", expr)


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (functions, keywords and label names excluded)."""
    m = _LABEL_VALUES.match(expr)
    if m:
        expr = m.group(1)
    s = _STRING.sub('""', expr)
    s = _BRACES.sub(" ", s)
    s = _RANGES.sub(" ", s)
    s = _GROUPING.sub(" ", s)
    names = set()
    for ident, call in _IDENT.findall(s):
        if call or ident.lower() in _KEYWORDS:
            continue
        names.add(ident)
    return names


@dataclass(frozen=True)
class Query:
    source: str  # "dashboard file: panel title" or "alert NAME"
    expr: str
    kind: str  # "panel" | "variable" | "alert"


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARD_DIR.glob("*.json"))}


def dashboard_queries() -> list[Query]:
    out = []
    for name, d in dashboards().items():
        for v in d.get("templating", {}).get("list", []):
            q = v.get("query")
            out.append(Query(f"{name}: variable {v['name']}", q["query"] if isinstance(q, dict) else q, "variable"))
        for p in d["panels"]:
            for tg in p.get("targets", []):
                out.append(Query(f"{name}: {p['title']} [{tg['refId']}]", tg["expr"], "panel"))
    return out


def alert_queries() -> list[Query]:
    import yaml

    rules = yaml.safe_load(ALERTS.read_text())
    return [Query(f"alert {r['alert']}", r["expr"], "alert") for g in rules["groups"] for r in g["rules"]]


# ---- a real Prometheus -------------------------------------------------------------------------


class PrometheusServer:
    """``prometheus`` on a free loopback port with a throwaway TSDB; ``close()`` stops it."""

    def __init__(self, config: Path, workdir: Path) -> None:
        self.binary = require_binary("prometheus")
        self.port = free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "prometheus.log"
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                self.binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited {self.proc.returncode}: {self.log_path.read_text()[-2000:]}")
            with contextlib.suppress(OSError), urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                if r.status == 200:
                    return
            time.sleep(0.2)
        raise AssertionError("prometheus not ready in time")

    def api(self, path: str, **params: Any) -> Any:
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read())
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"] if data["resultType"] in ("vector", "matrix") else [data]
        return result

    def scalar(self, expr: str) -> float | None:
        res = self.query(expr)
        return float(res[0]["value"][1]) if res else None

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        data = self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step:g}")
        result: list[dict[str, Any]] = data["result"]
        return result

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


@contextlib.contextmanager
def prometheus(config: Path, workdir: Path) -> Iterator[PrometheusServer]:
    server = PrometheusServer(config, workdir)
    try:
        server.wait_ready()
        yield server
    finally:
        server.close()


def promtool(*args: str, stdin: bytes | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [require_binary("promtool"), *args], input=stdin, capture_output=True, cwd=cwd, timeout=120, check=False
    )
