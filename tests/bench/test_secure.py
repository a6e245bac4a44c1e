"""``txbroker bench secure`` runs end to end on tiny numbers (results in BENCHMARKS.md)."""

from __future__ import annotations

import json

import pytest

from bench.secure import BENCH_USER, filler_acls, main, producer_acls
from cluster.security.acl import CLUSTER_NAME, Operation, Permission, ResourceType
from cluster.security.authorizer import Authorizer


def test_the_filler_acls_neither_allow_nor_deny_the_bench_producer() -> None:
    filler = filler_acls(300)
    assert len(set(filler)) == 300
    assert not any(a.principal == "User:*" and a.permission is Permission.DENY for a in filler)
    assert all(a.principal != f"User:{BENCH_USER}" for a in filler)
    me = f"User:{BENCH_USER}"
    without = Authorizer(filler, super_users=frozenset())
    assert not without.authorize(me, "127.0.0.1", Operation.WRITE, ResourceType.TOPIC, "bench-secure")
    with_producer = Authorizer([*filler, *producer_acls("bench-secure")], super_users=frozenset())
    for op, rt, name in (
        (Operation.WRITE, ResourceType.TOPIC, "bench-secure"),
        (Operation.DESCRIBE, ResourceType.TOPIC, "bench-secure"),
        (Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME),
    ):
        assert with_producer.authorize(me, "127.0.0.1", op, rt, name), (op, rt, name)
    assert not with_producer.authorize(me, "127.0.0.1", Operation.WRITE, ResourceType.TOPIC, "other")


@pytest.mark.integration
def test_bench_secure_reports_both_clusters_and_the_paired_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--rounds", "2", "--duration", "0.6", "--warmup", "0.3", "--filler-acls", "40", "--json"]
    # The leader balancer hands each partition to its preferred replica at once (not after its 10 s hold).
    argv += ["--node-setting", "leader_balance_hold_s=0", "--node-setting", "leader_balance_interval_s=0.2"]
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["leaders_balanced"] == {"plain": True, "secure": True}
    for name in ("plain", "secure"):
        r = res[name]
        assert r["records_per_s"] > 0 and r["p99_ms"] > 0 and r["nodes_cpu_us_per_record"] > 0, r
        assert r["errors"] == {} and len(r["records_per_s_all_rounds"]) == 2
    ratio = res["throughput_secure_vs_plain"]
    assert ratio["ratio_of_totals"] > 0 and len(ratio["per_round"]) == 2
    assert res["p99_secure_vs_plain"]["ratio_of_totals"] > 0
    assert res["nodes_cpu_per_record_secure_vs_plain"] > 0
    assert res["filler_acls"] == 40 and res["meets_target"] == (ratio["ratio_of_totals"] >= res["target_ratio"])
    assert res["config"]["idempotent"] and res["config"]["linger_ms"] == 5 and res["config"]["record_size"] == 1024
