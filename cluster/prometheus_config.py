"""The Prometheus scrape config for a cluster (written by ``txbroker cluster init``).

The alert rules live in ``ops/prometheus/alerts.yml`` (checked by promtool in
CI); the writer copies them next to ``prometheus.yml`` when the source tree is
available so ``prometheus --config.file=D/prometheus.yml`` loads both.

For a cluster serving HTTPS (``cluster init --secure``) the job scrapes with
``scheme: https``, trusts the cluster CA (``tls_config.ca_file``) and sends
the metrics user's credentials (``basic_auth`` with a ``password_file``).
Prometheus resolves relative file names from the config file's folder.
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
    basic_auth: tuple[str, str] | None = None,
    ca_file: str | None = None,
) -> str:
    """A prometheus.yml scraping every node's ``/metrics`` (``urls`` are the nodes' HTTP URLs).

    ``basic_auth`` is (username, password file); ``ca_file`` the CA that signed the nodes' certificates.
    The scheme is https when the URLs are."""
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
    ]
    if urls and all(u.startswith("https://") for u in urls):
        lines.append("    scheme: https")
    if basic_auth is not None:
        lines += ["    basic_auth:", f"      username: {_quote(basic_auth[0])}",
                  f"      password_file: {_quote(basic_auth[1])}"]  # fmt: skip
    if ca_file is not None:
        lines += ["    tls_config:", f"      ca_file: {_quote(ca_file)}"]
    lines += [
        "    static_configs:",
        f"      - targets: [{targets}]",
        "",
    ]
    return "\n".join(lines)


def write_prometheus_files(
    directory: Path,
    urls: Sequence[str],
    *,
    scrape_interval: str = "5s",
    basic_auth: tuple[str, str] | None = None,
    ca_file: str | None = None,
) -> Path:
    """Write ``directory/prometheus.yml`` (plus ``alerts.yml`` when the rules are available); return its path.

    ``basic_auth`` (username, password file) and ``ca_file``: as ``render_prometheus_config`` takes them."""
    directory.mkdir(parents=True, exist_ok=True)
    rules: list[str] = []
    source = OPS_PROMETHEUS / ALERTS_FILE
    if source.is_file():
        shutil.copyfile(source, directory / ALERTS_FILE)
        rules.append(ALERTS_FILE)
    path = directory / "prometheus.yml"
    path.write_text(
        render_prometheus_config(
            urls, scrape_interval=scrape_interval, rule_files=rules, basic_auth=basic_auth, ca_file=ca_file
        )
    )
    return path
