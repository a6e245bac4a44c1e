"""What security costs a producer: one plain cluster against one with TLS, HTTP Basic and ACLs, side by side.

``txbroker bench secure [--rounds N] [--duration S] [--warmup S] [--filler-acls N] [--control] [--json]
[--profile DIR] [--node-setting KEY=VALUE ...]``
(also ``python -m bench.secure``) starts two 3-node clusters on loopback in
one run: a plain one, and a secure one set up as ``txbroker cluster init
--secure`` sets it up (HTTPS with certificates of a fresh CA, HTTP Basic
against SCRAM credentials, ACLs enforced, the super user ``admin``). Through
the admin, the secure cluster gets a limited user ``bench`` holding only what
an idempotent producer needs (WRITE on the topic, IDEMPOTENT_WRITE on the
cluster) and ``--filler-acls`` ACLs (default 1,000) of other principals on
other topics, groups and transactional ids, so each decision runs against a
realistic ACL table.

The workload is ``bench.clients``' ``AsyncProducer`` driver (idempotent,
linger 5 ms, 1 KiB records, 3 partitions with 3 replicas, as fast as it
accepts records), as ``bench`` on the secure cluster. The clusters take turns
(plain, secure; secure, plain in odd rounds) for ``--rounds`` rounds of
``--duration`` seconds after ``--warmup``, so drift of a shared machine hits
both alike. It reports each cluster's records/s and p99 ack latency (the
round with the median records/s), the nodes' CPU per acknowledged record, and
the paired ratios secure/plain of throughput (the target: 0.85 or more) and of
p99 latency, each with a 95 % interval resampled over the rounds (``--control``
makes the second cluster plain too: an A/A run, whose ratio is the noise of
the machine at the time). ``--json`` prints the result as one JSON object;
``--profile DIR`` records py-spy stacks of every node of both clusters during
the last round (when py-spy is installed next to the interpreter) and adds
their busiest frames to the result. ``--node-setting`` sets a node config
setting on every node of both clusters.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from clients.admin import Admin
from cluster.security.acl import CLUSTER_NAME, AclBinding, Operation, PatternType, Permission, ResourceType

from .authz import build_acls
from .clients import paired_ratio, run_client_produce_bench
from .harness import BenchCluster, add_node_setting_argument, fresh_clusters, node_settings_or_exit, wait_for
from .profiling import start_profile, summarize_profile

__all__ = ["BENCH_USER", "TARGET_RATIO", "filler_acls", "main", "producer_acls"]

TOPIC = "bench-secure"
BENCH_USER = "bench"
TARGET_RATIO = 0.85
_ACL_CHUNK = 500  # ACLs per create request (the broker takes up to 1,000)


def producer_acls(topic: str, user: str = BENCH_USER) -> list[AclBinding]:
    """What an idempotent producer of ``topic`` needs: WRITE on it (DESCRIBE follows), IDEMPOTENT_WRITE."""
    principal = f"User:{user}"
    return [
        AclBinding(principal, "*", ResourceType.TOPIC, topic, PatternType.LITERAL, Operation.WRITE, Permission.ALLOW),
        AclBinding(principal, "*", ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL,
                   Operation.IDEMPOTENT_WRITE, Permission.ALLOW),
    ]  # fmt: skip


def filler_acls(count: int, principals: int = 50) -> list[AclBinding]:
    """``count`` ACLs of other principals (``bench.authz``'s mix) that neither allow nor deny the bench user:
    no DENY for ``User:*`` (one on the cluster would deny everyone's idempotent writes)."""
    out: list[AclBinding] = []
    size = count
    while len(out) < count:
        mix = build_acls(size, principals)
        out = [a for a in mix if not (a.principal == "User:*" and a.permission is Permission.DENY)]
        size += max(16, count // 10)
    return out[:count]


def add_bench_user(cluster: BenchCluster, filler: int) -> dict[str, Any]:
    """Create the ``bench`` user with the producer's ACLs and ``filler`` other ACLs through the admin; the
    producer's security options (every node authenticates the user before this returns)."""
    if cluster.access.auth is None or cluster.ca_file is None:
        raise ValueError("add_bench_user needs a secure cluster")
    user, password = cluster.access.auth
    urls = ",".join(c.url for c in cluster.configs)
    admin = Admin(urls, sasl_plain_username=user, sasl_plain_password=password, ssl_cafile=str(cluster.ca_file))
    bench_password = secrets.token_urlsafe(18)
    admin.upsert_user(BENCH_USER, bench_password)
    acls = producer_acls(TOPIC) + filler_acls(filler)
    for i in range(0, len(acls), _ACL_CHUNK):
        admin.create_acls([a.to_json() for a in acls[i : i + _ACL_CHUNK]])
    me = Admin(urls, sasl_plain_username=BENCH_USER, sasl_plain_password=bench_password,
               ssl_cafile=str(cluster.ca_file))  # fmt: skip

    def knows_bench() -> bool:
        return me.whoami() == f"User:{BENCH_USER}"

    wait_for(knows_bench, 30, "the bench user authenticating")
    return {
        "sasl_plain_username": BENCH_USER,
        "sasl_plain_password": bench_password,
        "ssl_cafile": str(cluster.ca_file),
    }


@contextlib.contextmanager
def _profiles(cluster: BenchCluster, seconds: float, directory: str | None, tag: str) -> Iterator[dict[str, Any]]:
    """py-spy every node of ``cluster`` for ``seconds`` (when ``directory`` is given and py-spy is installed)."""
    found: dict[str, Any] = {}
    runs = []
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        for node, proc in sorted(cluster.procs.items()):
            out = Path(directory).resolve() / f"{tag}-node{node}.txt"
            runs.append((start_profile(proc.pid, seconds, out), out, node))
    try:
        yield found
    finally:
        for spy, out, node in runs:
            if spy is None:
                found[f"node{node}"] = "py-spy is not installed"
                continue
            spy.wait()
            if out.exists():
                found[f"node{node}"] = {"file": str(out), **summarize_profile(out)}


def http_requests(cluster: BenchCluster) -> dict[str, int]:
    """``"METHOD route status"`` -> requests the cluster's nodes served so far (their ``/metrics``)."""
    out: dict[str, int] = {}
    for samples in cluster.scrape_nodes():
        for labels, value in samples.get("txbroker_http_requests_total", []):
            key = f"{labels.get('method')} {labels.get('route')} {labels.get('status')}"
            out[key] = out.get(key, 0) + int(value)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _minus(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def _median_round(results: list[dict[str, Any]]) -> dict[str, Any]:
    return sorted(results, key=lambda r: r["records_per_s"])[len(results) // 2]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="txbroker bench secure", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds, each running both clusters (default 3)")
    p.add_argument("--duration", type=float, default=8.0, help="measured seconds per cluster and round (default 8)")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds before each measurement (default 2)")
    p.add_argument("--record-size", type=int, default=1024)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--linger-ms", type=int, default=5)
    p.add_argument("--filler-acls", type=int, default=1000, help="ACLs of other principals (default 1000)")
    p.add_argument("--control", action="store_true",
                   help="A/A control: the second cluster is plain too (its ratio is the run's noise)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--profile", metavar="DIR", help="py-spy every node of both clusters in the last round")
    add_node_setting_argument(p)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    opts = parser.parse_args(argv)
    settings = node_settings_or_exit(parser, opts)
    out: dict[str, Any] = {
        "command": "txbroker bench secure " + " ".join(argv or []),
        "cpus": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "filler_acls": opts.filler_acls,
        "control": opts.control,
    }
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "secure": []}
    second = "txbroker-bench-control-" if opts.control else "txbroker-bench-tls-"
    with fresh_clusters([("txbroker-bench-plain-", False), (second, not opts.control)], settings) as (plain, sec):
        clusters = {"plain": plain, "secure": sec}
        options: dict[str, dict[str, Any]] = {
            "plain": {},
            "secure": {} if opts.control else add_bench_user(sec, opts.filler_acls),
        }
        for c in clusters.values():
            c.create_topic(TOPIC, opts.partitions)
        out["leaders_balanced"] = {name: c.preferred_leaders(TOPIC)[1] for name, c in clusters.items()}
        served_before = {name: http_requests(c) for name, c in clusters.items()}
        for r in range(opts.rounds):
            order = ["plain", "secure"] if r % 2 == 0 else ["secure", "plain"]
            for name in order:
                cluster = clusters[name]
                urls = [c.url for c in cluster.configs]
                last = r == opts.rounds - 1
                n0, t0 = cluster.nodes_cpu(), time.monotonic()
                with _profiles(cluster, opts.duration, opts.profile if last else None, name) as prof:
                    result = asyncio.run(
                        run_client_produce_bench(
                            urls, TOPIC, opts.duration, opts.record_size, warmup_s=opts.warmup,
                            linger_ms=opts.linger_ms, client_options=options[name],
                        )
                    )  # fmt: skip
                busy = (cluster.nodes_cpu() - n0) / (time.monotonic() - t0)
                # The nodes' CPU per record over the whole call (warm-up and drain included).
                result["nodes_busy_cores"] = round(busy, 2)
                result["nodes_cpu_us_per_record"] = round(1e6 * busy / max(1, result["records_per_s"]), 1)
                if prof:
                    out.setdefault("profile", {})[name] = prof
                runs[name].append(result)
        # What the nodes served during the rounds (every route, by status): the produce requests, and whatever
        # else the clients and the nodes asked (metadata, node-to-node calls, any 401/403).
        out["http_requests_during_rounds"] = {
            name: _minus(http_requests(c), served_before[name]) for name, c in clusters.items()
        }
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    keys = ("records_per_s", "mb_per_s", "p50_ms", "p99_ms", "nodes_busy_cores", "nodes_cpu_us_per_record",
            "client_cpu_pct", "records_per_request", "retries", "errors")  # fmt: skip
    for name, results in runs.items():
        mid = _median_round(results)
        out[name] = {k: mid[k] for k in keys if k in mid}
        out[name]["records_per_s_all_rounds"] = [x["records_per_s"] for x in results]
        out[name]["p99_ms_all_rounds"] = [x["p99_ms"] for x in results]
    out["config"] = runs["plain"][0]["config"] | {"partitions": opts.partitions, "replication_factor": 3,
                                                   "rounds": opts.rounds, "duration_s": opts.duration,
                                                   "warmup_s": opts.warmup}  # fmt: skip
    pairs = list(zip(runs["secure"], runs["plain"], strict=True))
    out["throughput_secure_vs_plain"] = paired_ratio([(s["records_per_s"], p["records_per_s"]) for s, p in pairs])
    out["p99_secure_vs_plain"] = paired_ratio([(s["p99_ms"] or 0.0, p["p99_ms"] or 0.0) for s, p in pairs])
    cpu_s = sum(s["nodes_cpu_us_per_record"] for s, _ in pairs)
    cpu_p = sum(p["nodes_cpu_us_per_record"] for _, p in pairs)
    out["nodes_cpu_per_record_secure_vs_plain"] = round(cpu_s / max(1e-9, cpu_p), 3)
    ratio = out["throughput_secure_vs_plain"]["ratio_of_totals"]
    out["target_ratio"] = TARGET_RATIO
    out["meets_target"] = ratio >= TARGET_RATIO
    if opts.json:
        print(json.dumps(out))
        return 0
    print(json.dumps(out, indent=2))
    verdict = "meets" if out["meets_target"] else "MISSES"
    print(f"secure/plain throughput {ratio} ({verdict} the {TARGET_RATIO} target), "
          f"p99 {out['p99_secure_vs_plain']['ratio_of_totals']}, "
          f"node CPU per record {out['nodes_cpu_per_record_secure_vs_plain']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
