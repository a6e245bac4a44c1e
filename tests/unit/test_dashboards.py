"""The Grafana dashboards and provisioning files: shape, datasource binding, and metric names.

Grafana cannot be installed here, so the dashboards are checked against the
shape the file provisioner expects (ops/grafana/dashboard.schema.json), every
query is parsed by promtool, and every metric a query names must be exported
by cluster/metrics.py (read from the code's registry).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from cluster.metrics import exported_series_names
from tests.support.prometheus import (
    DASHBOARD_DIR,
    OPS,
    PROMETHEUS_SYNTHETIC,
    dashboard_queries,
    dashboards,
    metric_names,
    promtool,
    substitute_grafana_vars,
)

DATASOURCE_UID = "txbroker-prometheus"
EXPECTED = {
    "txbroker-overview.json",
    "txbroker-raft.json",
    "txbroker-topics.json",
    "txbroker-transactions.json",
    "txbroker-node.json",
}


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("build_dashboards", OPS / "grafana" / "build_dashboards.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


def test_the_five_dashboards_exist_and_match_their_generator() -> None:
    assert set(dashboards()) == EXPECTED
    gen = _generator()
    for name, d in gen.build().items():
        assert (DASHBOARD_DIR / name).read_text() == gen.render(d), f"{name} is stale: run build_dashboards.py"


def test_dashboards_match_the_provisioning_schema() -> None:
    schema = json.loads((OPS / "grafana" / "dashboard.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for name, d in dashboards().items():
        errors = sorted(validator.iter_errors(d), key=lambda e: list(e.path))
        assert not errors, f"{name}: " + "; ".join(f"{list(e.path)}: {e.message}" for e in errors[:5])


def test_the_schema_rejects_what_provisioning_cannot_load() -> None:
    schema = json.loads((OPS / "grafana" / "dashboard.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    good = dashboards()["txbroker-raft.json"]
    assert validator.is_valid(good)
    exported = json.loads(json.dumps(good))
    exported["__inputs"] = [{"name": "DS_PROMETHEUS", "type": "datasource"}]
    by_name = json.loads(json.dumps(good))
    by_name["panels"][0]["datasource"] = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
    too_wide = json.loads(json.dumps(good))
    too_wide["panels"][0]["gridPos"]["w"] = 30
    wrapped = {"dashboard": good}
    for bad in (exported, by_name, too_wide, wrapped):
        assert not validator.is_valid(bad)


def test_layout_ids_and_uids_are_consistent() -> None:
    uids = set()
    for name, d in dashboards().items():
        assert d["uid"] not in uids, f"duplicate uid {d['uid']}"
        uids.add(d["uid"])
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
        cells: set[tuple[int, int]] = set()
        for p in d["panels"]:
            g = p["gridPos"]
            assert g["x"] + g["w"] <= 24, f"{name}: {p['title']} wider than the grid"
            mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
            assert not mine & cells, f"{name}: {p['title']} overlaps another panel"
            cells |= mine
            refs = [t["refId"] for t in p["targets"]]
            assert len(refs) == len(set(refs)), f"{name}: {p['title']} repeats a refId"


def test_provisioning_points_at_the_dashboards_datasource() -> None:
    ds = yaml.safe_load((OPS / "grafana" / "provisioning" / "datasources" / "txbroker.yaml").read_text())
    assert ds["apiVersion"] == 1
    [source] = ds["datasources"]
    assert source["uid"] == DATASOURCE_UID and source["type"] == "prometheus" and source["url"].startswith("http")
    prov = yaml.safe_load((OPS / "grafana" / "provisioning" / "dashboards" / "txbroker.yaml").read_text())
    assert prov["apiVersion"] == 1
    [provider] = prov["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    for name, d in dashboards().items():
        text = json.dumps(d)
        assert "${DS_" not in text and "__inputs" not in d, name
        sources = [p["datasource"] for p in d["panels"]] + [t["datasource"] for p in d["panels"] for t in p["targets"]]
        sources += [v["datasource"] for v in d["templating"]["list"]]
        assert all(s == {"type": "prometheus", "uid": DATASOURCE_UID} for s in sources), name


def test_every_dashboard_query_names_only_exported_metrics() -> None:
    exported = exported_series_names() | PROMETHEUS_SYNTHETIC
    queries = dashboard_queries()
    assert len(queries) > 50
    missing = {}
    for q in queries:
        names = metric_names(substitute_grafana_vars(q.expr))
        assert names, f"{q.source}: no metric found in {q.expr!r}"
        if names - exported:
            missing[q.source] = sorted(names - exported)
    assert not missing, f"dashboards name metrics the code does not export: {missing}"


def test_the_name_check_catches_an_unknown_metric() -> None:
    exported = exported_series_names()
    assert "txbroker_records_produced_total" in exported
    assert "txbroker_records_produced" not in exported  # a counter is only exported with _total
    assert metric_names("sum(rate(txbroker_records_producd_total[5m]))") - exported == {
        "txbroker_records_producd_total"
    }


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (topic) (rate(a_total{topic=~"$topic", x="by (y)"}[5m]))', {"a_total"}),
        ("histogram_quantile(0.99, sum by (le) (rate(h_bucket[5m])))", {"h_bucket"}),
        ("max by (topic, partition) (hw) - on (topic, partition) group_right max by (group) (co)", {"hw", "co"}),
        ("time() - process_start_time_seconds offset 5m", {"process_start_time_seconds"}),
        ("deriv(max by (g) (lag)[10m:1m]) > 0 and max by (g) (lag) > 0", {"lag"}),
        ("a > b + 300", {"a", "b"}),
        ("label_values(txbroker_build_info, instance)", {"txbroker_build_info"}),
        ('sum(up{job="txbroker"}) / 1e3', {"up"}),
    ],
)
def test_metric_name_extraction(expr: str, names: set[str]) -> None:
    assert metric_names(substitute_grafana_vars(expr)) == names


def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    """promtool parses each query as a recording rule (variable queries: their selector)."""
    rules = []
    for i, q in enumerate(dashboard_queries()):
        expr = substitute_grafana_vars(q.expr)
        if q.kind == "variable":
            expr = expr.split("(", 1)[1].rsplit(",", 1)[0]  # label_values(<selector>, label)
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    res = promtool("check", "rules", str(path))
    assert res.returncode == 0, res.stdout.decode() + res.stderr.decode()
    assert f"SUCCESS: {len(rules)} rules found" in res.stdout.decode()
