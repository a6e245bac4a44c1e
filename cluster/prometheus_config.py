"""The Prometheus scrape config for a cluster (written by ``txbroker cluster init``).

The alert rules live in ``ops/prometheus/alerts.yml`` (checked by promtool in
CI); the writer copies them next to ``prometheus.yml`` when the source tree is
available so ``prometheus --config.file=D/prometheus.yml`` loads both.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

JOB = "txbroker"  # the alert rules select up{job="txbroker"}
OPS_PROMETHEUS = Path(__file__).resolve().parents[1] / "ops" / "prometheus"
ALERTS_FILE = "alerts.yml"


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_prometheus_config(
    urls: Sequence[str],
    *,
    scrape_interval: str = "5s",
    evaluation_interval: str | None = None,
    rule_files: Sequence[str] = (),
    cluster: str = "local",
) -> str:
    """A prometheus.yml scraping every node's ``/metrics`` (``urls`` are the nodes' HTTP URLs)."""
    targets = ", ".join(_quote(u.split("://", 1)[-1].rstrip("/")) for u in urls)
    lines = [
        "# Prometheus scrape config for a txbroker cluster (written by `txbroker cluster init`)",
        "global:",
        f"  scrape_interval: {scrape_interval}",
        f"  evaluation_interval: {evaluation_interval or scrape_interval}",
        "  external_labels:",
        f"    cluster: {_quote(cluster)}",
    ]
    if rule_files:
        lines.append("rule_files:")
        lines += [f"  - {_quote(f)}" for f in rule_files]
    lines += [
        "scrape_configs:",
        f"  - job_name: {JOB}",
        "    metrics_path: /metrics",
        "    static_configs:",
        f"      - targets: [{targets}]",
        "",
    ]
    return "\n".join(lines)


def write_prometheus_files(directory: Path, urls: Sequence[str], *, scrape_interval: str = "5s") -> Path:
    """Write ``directory/prometheus.yml`` (plus ``alerts.yml`` when the rules are available); return its path."""
    directory.mkdir(parents=True, exist_ok=True)
    rules: list[str] = []
    source = OPS_PROMETHEUS / ALERTS_FILE
    if source.is_file():
        shutil.copyfile(source, directory / ALERTS_FILE)
        rules.append(ALERTS_FILE)
    path = directory / "prometheus.yml"
    path.write_text(render_prometheus_config(urls, scrape_interval=scrape_interval, rule_files=rules))
    return path
