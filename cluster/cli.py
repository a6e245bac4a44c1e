"""The ``txbroker`` command line (also ``python -m cluster``)."""

from __future__ import annotations

import argparse
import json
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from clients.admin import Admin
from clients.protocol import BrokerError

from .client_config import add_cluster_options, apply_command_config, client_options, urllib_security
from .config import ConfigError, NodeConfig, load_config, make_cluster_configs, write_configs
from .prometheus_config import write_prometheus_files
from .topic_commands import add_topic_admin_parsers

DEFAULT_BOOTSTRAP = "http://127.0.0.1:9091"
SECURE_HELP = "HTTPS with a generated CA, authentication and ACLs; writes D/admin.toml, the super user's client config"


def _print(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


# ---- cluster ----------------------------------------------------------------------


def _write_cluster(args: argparse.Namespace, d: Path) -> tuple[list[Path], Path | None]:
    """Node configs (secured with ``--secure``) and prometheus.yml in ``d``; the paths and the admin config's."""
    configs = make_cluster_configs(args.nodes, d, host=args.host, base_port=args.base_port)
    admin: Path | None = None
    if args.secure:
        from .security.secure_init import secure_cluster

        setup = secure_cluster(configs, d)
        configs, admin = setup.configs, setup.admin_config
        paths = write_configs(configs, d)
        write_prometheus_files(
            d,
            [c.url for c in configs],
            basic_auth=(setup.metrics_user, setup.metrics_password_file.name),
            ca_file=str(setup.ca_file.relative_to(d)),
        )
    else:
        paths = write_configs(configs, d)
        write_prometheus_files(d, [c.url for c in configs])
    return paths, admin


def cmd_cluster_init(args: argparse.Namespace) -> int:
    d = Path(args.dir)
    existing = sorted(d.glob("node-*.toml"))
    if existing and not args.force:
        print(f"{d} already holds node configs; use --force to overwrite", file=sys.stderr)
        return 1
    paths, admin = _write_cluster(args, d)
    configs = [load_config(p) for p in paths]
    for p, c in zip(paths, configs, strict=True):
        kafka = f", kafka {c.self_address.kafka_address}" if c.kafka_port is not None else ""
        print(f"node {c.node_id}: {c.url}  (raft {c.host}:{c.raft_port}{kafka}, config {p})")
    _print_kafka_bootstrap(configs)
    if admin is not None:
        print(f"admin client config (super user 'admin', keep it private): {admin}")
    return 0


def kafka_bootstrap(configs: list[NodeConfig]) -> str:
    """The nodes' Kafka listeners as Kafka clients' ``bootstrap.servers`` ("" when none has one)."""
    return ",".join(c.self_address.kafka_address or "" for c in configs if c.kafka_port is not None)


def _print_kafka_bootstrap(configs: list[NodeConfig]) -> None:
    servers = kafka_bootstrap(configs)
    if not servers:
        return
    sec = configs[0].security
    if sec is None:
        print(f"kafka bootstrap servers: {servers}", flush=True)
    else:
        protocol = "SASL_SSL" if sec.tls else "SASL_PLAINTEXT"
        print(f"kafka bootstrap servers: {servers}  ({protocol}; SASL PLAIN or SCRAM-SHA-256/512)", flush=True)


def _client_ssl(configs: list[NodeConfig]) -> ssl.SSLContext | None:
    """A context trusting the cluster's CA when its nodes serve HTTPS (system CAs without ``tls_ca_file``)."""
    sec = configs[0].security if configs else None
    if sec is None or not sec.tls:
        return None
    from .security.tls import client_context

    return client_context(sec.tls_ca_file)


def wait_ready(urls: list[str], timeout: float, ssl_context: ssl.SSLContext | None = None) -> bool:
    deadline = time.monotonic() + timeout
    pending = set(urls)
    while pending and time.monotonic() < deadline:
        for u in list(pending):
            try:
                with urllib.request.urlopen(u + "/readyz", timeout=1, context=ssl_context) as resp:
                    if resp.status == 200:
                        pending.discard(u)
            except OSError:
                pass
        if pending:
            time.sleep(0.2)
    return not pending


def cmd_cluster_up(args: argparse.Namespace) -> int:
    d = Path(args.dir)
    paths = sorted(d.glob("node-*.toml"))
    if not paths:
        paths, _ = _write_cluster(args, d)
    configs = [load_config(p) for p in paths]
    secure = any(c.security is not None and c.security.tls for c in configs)
    if args.secure and not secure:
        print(f"{d} holds node configs without TLS; `txbroker cluster init --secure --force --dir {d}` "
              "rewrites them", file=sys.stderr)  # fmt: skip
        return 2
    client_ssl = _client_ssl(configs)
    procs: list[subprocess.Popen[bytes]] = []
    stopping = False

    def stop(*_a: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for path, c in zip(paths, configs, strict=True):
        logf = open(d / f"node-{c.node_id}.log", "ab")  # noqa: SIM115 - lives as long as the child
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "cluster", "node", "start", "--config", str(path)],
                stdout=logf,
                stderr=subprocess.STDOUT,
            )
        )
    urls = [c.url for c in configs]
    try:
        if not wait_ready(urls, args.timeout, client_ssl):
            print("cluster did not become ready; see the node-*.log files in " + str(d), file=sys.stderr)
            return 1
        for c in configs:
            print(f"node {c.node_id} ready: {c.url}")
        print(f"bootstrap: {urls[0]}", flush=True)
        _print_kafka_bootstrap(configs)
        admin = d / "admin.toml"
        if secure and admin.is_file():
            print(f"admin client config: {admin}", flush=True)
        while not stopping and all(p.poll() is None for p in procs):
            time.sleep(0.2)
        for p, c in zip(procs, configs, strict=True):
            if p.poll() is not None and not stopping:
                print(f"node {c.node_id} exited with {p.returncode}", file=sys.stderr)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    return 0


def cmd_cluster_status(args: argparse.Namespace) -> int:
    from .health import cluster_status

    with urllib_security(args):
        print(cluster_status(args.bootstrap))
    return 0


def cmd_cluster_health(args: argparse.Namespace) -> int:
    """Exit 0 when healthy, 10 when not (rpk's convention); --watch reprints on change."""
    from .health import check_health

    deadline = time.monotonic() + args.timeout if args.timeout else None
    shown = None
    report = None
    try:
        while True:
            with urllib_security(args):
                report = check_health(args.bootstrap)
            text = json.dumps(report.to_json(), sort_keys=True) if args.format == "json" else report.render()
            done = not (args.watch or args.exit_when_healthy) or (args.exit_when_healthy and report.healthy)
            done = done or (deadline is not None and time.monotonic() > deadline)
            if (args.watch or done) and text != shown:
                if args.watch and args.format != "json":
                    print(time.strftime("%H:%M:%S"))
                print(text, flush=True)
                shown = text
            if done:
                break
            time.sleep(args.interval)
    except KeyboardInterrupt:
        pass
    return 0 if report is not None and report.healthy else 10


def cmd_node_start(args: argparse.Namespace) -> int:
    from .node import main_node

    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.log_format:
        from dataclasses import replace

        cfg = replace(cfg, log_format=args.log_format)
    return main_node(cfg)


# ---- topics ------------------------------------------------------------------------


def cmd_topic_create(args: argparse.Namespace) -> int:
    config = dict(kv.split("=", 1) for kv in args.config or [])
    res = Admin(args.bootstrap, **client_options(args)).create_topic(
        args.name, args.partitions, args.replication_factor, config or None
    )
    print(f"created topic {res['name']} ({len(res['partitions'])} partitions, RF {res['replication_factor']})")
    return 0


def cmd_topic_list(args: argparse.Namespace) -> int:
    for t in Admin(args.bootstrap, **client_options(args)).list_topics():
        print(f"{t['name']}\tpartitions={t['partitions']}\treplication_factor={t['replication_factor']}")
    return 0


def cmd_topic_describe(args: argparse.Namespace) -> int:
    _print(Admin(args.bootstrap, **client_options(args)).describe_topic(args.name))
    return 0


def cmd_topic_delete(args: argparse.Namespace) -> int:
    Admin(args.bootstrap, **client_options(args)).delete_topic(args.name)
    print(f"deleted topic {args.name}")
    return 0


# ---- transactions ------------------------------------------------------------------


def cmd_txn_list(args: argparse.Namespace) -> int:
    states = [s for s in (args.state or "").split(",") if s]
    txns = Admin(args.bootstrap, **client_options(args)).list_transactions(states or None, args.prefix or "")
    if args.json:
        _print(txns)
        return 0
    now = time.time() * 1000
    head = ("TRANSACTIONAL ID", "STATE", "PRODUCER", "EPOCH", "AGE s", "TIMEOUT s")
    print(f"{head[0]:<32} {head[1]:<15} {head[2]:>10} {head[3]:>6} {head[4]:>8} {head[5]:>9} PARTITIONS")
    for t in txns:
        age = f"{(now - t['start_time_ms']) / 1000:.1f}" if t.get("start_time_ms", -1) >= 0 else "-"
        parts = ",".join(f"{p['topic']}-{p['partition']}" for p in t["partitions"])
        print(
            f"{t['transactional_id']:<32} {t['state']:<15} {t['producer_id']:>10} {t['producer_epoch']:>6} "
            f"{age:>8} {t['timeout_ms'] / 1000:>9.1f} {parts}"
        )
    return 0


def cmd_txn_describe(args: argparse.Namespace) -> int:
    _print(Admin(args.bootstrap, **client_options(args)).describe_transaction(args.transactional_id))
    return 0


def cmd_txn_abort(args: argparse.Namespace) -> int:
    admin = Admin(args.bootstrap, **client_options(args))
    if args.prefix:
        for tid in admin.abort_transactions_with_prefix(args.transactional_id):
            print(f"aborted {tid}")
        return 0
    after = admin.abort_transaction(args.transactional_id)
    print(f"aborted {args.transactional_id}: now {after['state']} (producer {after['producer_id']}, "
          f"epoch {after['producer_epoch']})")  # fmt: skip
    return 0


def cmd_txn_producers(args: argparse.Namespace) -> int:
    _print(Admin(args.bootstrap, **client_options(args)).describe_producers(args.topic, args.partition))
    return 0


# ---- produce / consume ---------------------------------------------------------------


def cmd_produce(args: argparse.Namespace) -> int:
    from .client_commands import produce

    return produce(args, sys.stdin.buffer, sys.stderr)


def cmd_consume(args: argparse.Namespace) -> int:
    from .client_commands import consume

    return consume(args, sys.stdout.buffer, sys.stderr)


def cmd_copy(args: argparse.Namespace) -> int:
    from .copier import CopierConfig, main_copy

    try:
        config = CopierConfig(
            bootstrap=args.bootstrap, input_topic=args.from_topic, output_topic=args.to_topic, group_id=args.group,
            transactional_id=args.transactional_id, transform=args.transform, commit_every=args.commit_every,
            commit_every_ms=args.commit_every_ms, max_records=args.max_records, idle_exit_ms=args.idle_exit_ms,
            transaction_timeout_ms=args.transaction_timeout_ms, session_timeout_ms=args.session_timeout_ms,
            heartbeat_interval_ms=args.heartbeat_interval_ms, progress_interval_ms=args.progress_interval_ms,
            security=client_options(args),
        )  # fmt: skip
        config.validate()
        from .copier import load_transform

        load_transform(config.transform)
    except (ValueError, ImportError, AttributeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return main_copy(config)


# ---- parser --------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="txbroker", description="Raft-replicated exactly-once broker")
    sub = ap.add_subparsers(dest="command", required=True)

    def bootstrap(p: argparse.ArgumentParser) -> None:
        add_cluster_options(p, DEFAULT_BOOTSTRAP)

    cluster = sub.add_parser("cluster", help="local clusters").add_subparsers(dest="sub", required=True)
    p = cluster.add_parser("init", help="write node configs for an N-node cluster")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--dir", required=True)
    p.add_argument("--base-port", type=int, default=9091)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--force", action="store_true")
    p.add_argument("--secure", action="store_true", help=SECURE_HELP)
    p.set_defaults(fn=cmd_cluster_init)
    p = cluster.add_parser("up", help="start an N-node cluster as child processes")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--dir", required=True)
    p.add_argument("--base-port", type=int, default=9091)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for readiness")
    p.add_argument("--secure", action="store_true", help=SECURE_HELP + " (when D holds no node configs yet)")
    p.set_defaults(fn=cmd_cluster_up)
    p = cluster.add_parser("status", help="nodes, partitions, leaders, offsets and follower lag")
    bootstrap(p)
    p.set_defaults(fn=cmd_cluster_status)
    p = cluster.add_parser("health", help="every node up, every partition led and fully replicated? (else exit 10)")
    p.add_argument("--watch", action="store_true", help="keep checking and print the report whenever it changes")
    p.add_argument("--exit-when-healthy", action="store_true", help="wait until healthy, then exit 0")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between checks")
    p.add_argument("--timeout", type=float, help="give up (exit 10) after this many seconds")
    p.add_argument("--format", choices=["text", "json"], default="text")
    bootstrap(p)
    p.set_defaults(fn=cmd_cluster_health)

    node = sub.add_parser("node", help="run a node").add_subparsers(dest="sub", required=True)
    p = node.add_parser("start", help="run one node in the foreground until SIGTERM/SIGINT")
    p.add_argument("--config", required=True)
    p.add_argument("--log-format", choices=["text", "json"])
    p.set_defaults(fn=cmd_node_start)

    topic = sub.add_parser("topic", help="topics").add_subparsers(dest="sub", required=True)
    p = topic.add_parser("create")
    p.add_argument("name")
    p.add_argument("--partitions", type=int, default=1)
    p.add_argument("--replication-factor", type=int, default=3)
    p.add_argument("--config", action="append", metavar="KEY=VALUE")
    bootstrap(p)
    p.set_defaults(fn=cmd_topic_create)
    p = topic.add_parser("list")
    bootstrap(p)
    p.set_defaults(fn=cmd_topic_list)
    p = topic.add_parser("describe")
    p.add_argument("name")
    bootstrap(p)
    p.set_defaults(fn=cmd_topic_describe)
    p = topic.add_parser("delete")
    p.add_argument("name")
    bootstrap(p)
    p.set_defaults(fn=cmd_topic_delete)
    add_topic_admin_parsers(topic, bootstrap)

    p = sub.add_parser("produce", help="produce stdin lines as records (idempotent Python producer)")
    p.add_argument("topic")
    p.add_argument("--keyed", action="store_true", help="lines are key<TAB>value")
    p.add_argument("--partition", type=int, help="write every record to this partition (default: by key)")
    bootstrap(p)
    p.set_defaults(fn=cmd_produce)
    p = sub.add_parser("consume", help="print records (value, or key<TAB>value with --print-key)")
    p.add_argument("topic")
    p.add_argument("--from-beginning", action="store_true", help="start at the log start (default: at the end)")
    p.add_argument("--isolation", choices=["read_committed", "read_uncommitted"], default="read_uncommitted")
    p.add_argument("--partition", type=int, help="read only this partition (default: all)")
    p.add_argument(
        "--read-replica",
        choices=["leader", "any"],
        default="leader",
        help="leader (default): read from each partition's leader; any: from a replica on the bootstrap node",
    )
    p.add_argument("--max", type=int, help="exit after this many records")
    p.add_argument(
        "--timeout-ms", type=int, help="exit after this long without a record (default 2000; none with --max/--follow)"
    )
    p.add_argument("--timeout", type=float, help="exit after this many seconds in total")
    p.add_argument("--follow", action="store_true", help="keep waiting for new records")
    p.add_argument("--print-key", "--keyed", dest="print_key", action="store_true", help="print key<TAB>value")
    bootstrap(p)
    p.set_defaults(fn=cmd_consume)

    p = sub.add_parser("copy", help="exactly-once copy IN -> OUT: consume, transform, produce transactionally")
    p.add_argument("--from", dest="from_topic", required=True, metavar="IN", help="input topic")
    p.add_argument("--to", dest="to_topic", required=True, metavar="OUT", help="output topic")
    p.add_argument("--group", required=True, help="consumer group (members share the input partitions)")
    p.add_argument("--transactional-id", required=True, help="unique per copier instance; a restart reuses it")
    p.add_argument("--transform", default="identity", help="identity, upper or python:MODULE:FUNCTION")
    p.add_argument("--commit-every", type=int, default=500, help="records per transaction (0: no count limit)")
    p.add_argument("--commit-every-ms", type=int, default=100, help="transaction age limit (0: none)")
    p.add_argument("--max-records", type=int, help="exit 0 after copying this many records")
    p.add_argument(
        "--idle-exit-ms",
        type=int,
        help="exit 0 after this long without input once the group has committed the whole input",
    )
    p.add_argument("--transaction-timeout-ms", type=int, default=60_000)
    p.add_argument("--session-timeout-ms", type=int, default=10_000)
    p.add_argument("--heartbeat-interval-ms", type=int, default=3_000)
    p.add_argument("--progress-interval-ms", type=int, default=1_000, help="JSON progress lines at most this often")
    bootstrap(p)
    p.set_defaults(fn=cmd_copy)

    txn = sub.add_parser("txn", help="transactions: list, describe, abort (hanging transactions)")
    txn_sub = txn.add_subparsers(dest="sub", required=True)
    p = txn_sub.add_parser("list", help="every transaction of the cluster")
    p.add_argument("--state", help="comma-separated states, e.g. Ongoing,Prepared")
    p.add_argument("--prefix", help="only transactional ids starting with this")
    p.add_argument("--json", action="store_true")
    bootstrap(p)
    p.set_defaults(fn=cmd_txn_list)
    p = txn_sub.add_parser("describe", help="one transactional id's state")
    p.add_argument("transactional_id")
    bootstrap(p)
    p.set_defaults(fn=cmd_txn_describe)
    p = txn_sub.add_parser("abort", help="fence the producer and abort its open transaction")
    p.add_argument("transactional_id", help="the id (or, with --prefix, the prefix) to abort")
    p.add_argument("--prefix", action="store_true", help="abort every open/prepared transaction with this prefix")
    bootstrap(p)
    p.set_defaults(fn=cmd_txn_abort)
    p = txn_sub.add_parser("producers", help="producer state of a partition (pid, epoch, open txn start)")
    p.add_argument("topic")
    p.add_argument("partition", type=int)
    bootstrap(p)
    p.set_defaults(fn=cmd_txn_producers)

    # Every word after ``bench`` goes to the bench module's own parser, flags first too (``bench --help``,
    # ``bench --json``): with a prefix character no argument starts with, this parser reads them all as positionals.
    p = sub.add_parser(
        "bench",
        help="measure throughput, latency and failover (see BENCHMARKS.md)",
        add_help=False,
        prefix_chars="\x00",
    )
    p.add_argument("bench_args", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_bench)
    # ``verify`` hands its words to ``verify.command``'s parser the same way.
    p = sub.add_parser(
        "verify",
        help="Jepsen-style exactly-once check: run a workload (optionally with faults) and check its history",
        add_help=False,
        prefix_chars="\x00",
    )
    p.add_argument("verify_args", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_verify)
    from .security_commands import register as register_security_commands

    register_security_commands(sub, DEFAULT_BOOTSTRAP)  # acl, user, whoami
    from .operations_commands import register as register_operations

    register_operations(sub, cluster, DEFAULT_BOOTSTRAP)  # cluster add-node|decommission|nodes, partitions
    from .group_cli import register as register_group_commands

    register_group_commands(sub, DEFAULT_BOOTSTRAP)  # group list|describe|delete|reset-offsets
    return ap


# ``txbroker bench <scenario>``: modules of the top-level ``bench`` package (tools beside the server, which imports
# none of them), loaded by name when asked for. The broker scenarios (produce, fetch, failover, idle) live in
# ``BROKER_BENCH``, the others in their own modules.
BROKER_BENCH = "bench.produce"
EXTRA_BENCHES = {
    "clients": "bench.clients",  # Python producer vs JSON over raw HTTP vs the raw ceiling
    "send-path": "bench.send_path",  # the producer's client CPU per record, no cluster
    "consume": "bench.consume",  # consume throughput and end-to-end latency
    "load": "bench.load",  # a produce request's node cost at full load and below it (offered rates)
    "txn": "bench.txn",  # transactional overhead, read_committed cost, visibility latency, coordinator failover
    "copier": "bench.copier",  # consume-transform-produce throughput, rebalance time
    "metrics": "bench.metrics",  # cost of a 1 s Prometheus scrape
    "spark": "bench.spark",  # Spark batch read/write vs the Python clients
    "authz": "bench.authz",  # one authorization decision with 10,000 ACLs; credential cache hit vs miss
    "secure": "bench.secure",  # producer throughput and latency, TLS + Basic + ACLs against a plain cluster
    "catchup": "bench.catchup",  # a replaced node's catch-up time against the time the data took to write
    "reassign": "bench.reassign",  # moving a 1 GiB partition onto a new node: its time, the produce load meanwhile
    "kafka": "bench.kafka",  # librdkafka through the Kafka listener against the Python client over HTTP
}


def cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    argv = list(args.bench_args)
    extra = EXTRA_BENCHES.get(argv[0]) if argv else None
    if argv and argv[0] in ("-h", "--help"):
        print("extra scenarios: " + ", ".join(f"{k} ({v})" for k, v in EXTRA_BENCHES.items()))
    module = importlib.import_module(extra or BROKER_BENCH)
    rc: int = module.main(argv[1:] if extra else argv)
    return rc


# ``txbroker verify``: the top-level ``verify`` package (it imports the clients and the copier; nothing in the
# server imports it), loaded by name like the benchmarks.
VERIFY = "verify.command"


def cmd_verify(args: argparse.Namespace) -> int:
    import importlib

    rc: int = importlib.import_module(VERIFY).main(list(args.verify_args))
    return rc


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        apply_command_config(args)
        rc: int = args.fn(args)
        return rc
    except BrokerError as exc:
        print(f"error: {exc.error_code.name}: {exc.message}", file=sys.stderr)
        return 1
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
