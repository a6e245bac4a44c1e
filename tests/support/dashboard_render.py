"""Render a Grafana dashboard's panels as one PNG from a real Prometheus (matplotlib).

Grafana is not installable here; these plots let a person look at what each
panel would show for a test's workload.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from .prometheus import PrometheusServer, substitute_grafana_vars


def legend(fmt: str, labels: dict[str, str]) -> str:
    if not fmt or fmt == "__auto":
        return ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("job", "cluster")) or "value"
    # matplotlib hides legend labels that start with "_" (e.g. the __controller group)
    return " " + re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


def render_dashboard(
    prom: PrometheusServer, dashboard: dict[str, Any], start: float, end: float, out: Path, rate_interval: str
) -> int:
    """Write ``out`` (PNG); return how many panels got data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = dashboard["panels"]
    cols = 3
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.2 * rows), squeeze=False)
    fig.suptitle(f"{dashboard['title']}  ({end - start:.0f} s of a test workload)", fontsize=14)
    with_data = 0
    step = max(1.0, (end - start) / 300)
    for ax, panel in zip(axes.flat, panels, strict=False):
        ax.set_title(panel["title"], fontsize=9)
        ax.tick_params(labelsize=7)
        lines = 0
        texts = []
        for target in panel["targets"]:
            expr = substitute_grafana_vars(target["expr"], rate_interval)
            if panel["type"] == "timeseries":
                for series in prom.query_range(expr, start, end, step):
                    xs = [float(v[0]) - start for v in series["values"]]
                    ys = [float(v[1]) for v in series["values"]]
                    ax.plot(xs, ys, linewidth=1, label=legend(target.get("legendFormat", ""), series["metric"]))
                    lines += 1
            else:
                for series in prom.query(expr):
                    texts.append(f"{legend(target.get('legendFormat', ''), series['metric'])}: {series['value'][1]}")
        if lines:
            ax.set_xlabel("seconds", fontsize=7)
            if lines <= 8:
                ax.legend(fontsize=6, loc="upper left")
        elif texts:
            ax.axis("off")
            size = 20 if panel["type"] == "stat" and len(texts) == 1 else 6
            shown = texts if size == 6 else [texts[0].rsplit(": ", 1)[1]]
            ax.text(0.5, 0.5, "\n".join(shown[:12]), ha="center", va="center", fontsize=size, wrap=True)
        else:
            ax.axis("off")
            ax.text(0.5, 0.5, "no data", ha="center", va="center", fontsize=10, color="grey")
        with_data += bool(lines or texts)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.subplots_adjust(hspace=0.6, wspace=0.25, top=1 - 0.6 / rows / 3.2 - 0.02)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return with_data
