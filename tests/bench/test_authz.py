"""The authorization benchmark runs end to end on tiny numbers and reports every figure."""

from __future__ import annotations

import json

import pytest

from bench.authz import build_acls, main


def test_the_acl_mix_has_the_requested_size_and_every_pattern() -> None:
    acls = build_acls(400, 5)
    assert len(set(acls)) == 400
    kinds = {(a.resource_type.value, a.pattern_type.value) for a in acls}
    assert {("TOPIC", "LITERAL"), ("TOPIC", "PREFIXED")} <= kinds
    assert any(a.resource_name == "*" for a in acls) and any(a.principal == "User:*" for a in acls)


def test_bench_authz_reports_decision_and_credential_costs(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--acls", "300", "--principals", "4", "--decisions", "500", "--misses", "2", "--hits", "50"]
    assert main([*argv, "--iterations", "4096", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    a, c = result["authorizer"], result["credentials"]
    assert a["acls"] == 300 and a["decisions"] == 500
    assert 0 < a["authorize_p50_us"] <= a["authorize_p99_us"] <= a["authorize_max_us"]
    assert a["authorize_mean_us"] > 0 and a["authorize_any_mean_us"] > 0
    assert c["iterations"] == 4096 and c["miss_mean_us"] > c["hit_cached_mean_us"] > 0
    assert main([*argv, "--iterations", "4096"]) == 0
    assert "us target" in capsys.readouterr().out
