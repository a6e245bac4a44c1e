"""``txbroker verify``: run the workload and check its history, or check a recorded history (docs/verify.md).

* ``--bootstrap URL[,URL...]``: the workload against an existing cluster (``--command-config FILE``: its
  URL, CA and credentials from a client config, as every ``txbroker`` command takes);
* ``--nemesis``: a fresh cluster with every node in its own network namespace (``verify.netns``), faults
  injected by ``verify.nemesis`` while the workload runs; never a cluster given by URL;
* ``--history FILE``: only the checker, over a recorded history (no cluster).

Exit status: 0 valid, 1 anomalies, 3 commits stopped longer than ``--max-commit-gap`` during a
single-node fault, 2 the run could not happen (bad arguments, unreachable cluster, no namespaces).
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clients.protocol import BrokerError
from clients.security import ClientSecurity, SecurityOptions
from cluster.client_config import load_client_config
from cluster.config import ConfigError

from .checker import CheckResult, check
from .history import HistoryError, HistoryWriter, read_history
from .report import exit_code as report_exit_code
from .report import render_json, render_text
from .workload import Workload, WorkloadConfig

__all__ = ["build_parser", "main"]

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="txbroker verify",
        description="Jepsen-style check of txbroker's exactly-once guarantees: lost, duplicated, aborted and "
        "partial reads, offset and order anomalies, availability per fault.",
    )
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--bootstrap", help="run the workload against this cluster (comma-separated node URLs)")
    src.add_argument("--history", type=Path, help="check a recorded history file; no cluster needed")
    ap.add_argument(
        "--command-config",
        metavar="FILE",
        help="client config of the cluster (TOML: bootstrap, username, password, ssl_cafile, ...)",
    )
    ap.add_argument(
        "--nemesis", action="store_true", help="start a namespaced cluster in a temp directory and inject faults (root)"
    )
    ap.add_argument("--duration", type=float, default=60.0, help="seconds the writers run (default 60)")
    ap.add_argument("--record", type=Path, help="where to write the history (default: a temporary file, printed)")
    ap.add_argument("--faults", help="comma-separated fault names for --nemesis (default: all)")
    ap.add_argument("--fault-seconds", type=float, default=10.0, help="how long each fault lasts (default 10)")
    ap.add_argument("--quiet-seconds", type=float, default=10.0, help="healthy time between faults (default 10)")
    ap.add_argument("--seed", type=int, help="random seed of the workload and the nemesis (default: random, printed)")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    ap.add_argument("--max-commit-gap", type=float, metavar="S",
                    help="exit 3 when commits stop longer than S seconds during any single-node fault")  # fmt: skip
    ap.add_argument("--txn-producers", type=int, default=3)
    ap.add_argument("--idempotent-producers", type=int, default=2)
    ap.add_argument("--consumers", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--replication-factor", type=int, default=3)
    ap.add_argument("--abort-ratio", type=float, default=0.2, help="share of transactions aborted on purpose")
    ap.add_argument("--rate", type=float, default=50.0, help="records per second per idempotent producer")
    ap.add_argument("--no-copier", dest="copier", action="store_false", help="do not run the exactly-once copier")
    ap.add_argument("--nodes", type=int, default=3, help="cluster size with --nemesis")
    ap.add_argument(
        "--node-checkout",
        type=Path,
        metavar="DIR",
        help="with --nemesis: run the nodes from this checkout of txbroker (to compare two builds)",
    )
    ap.add_argument(
        "--node-python",
        metavar="PATH",
        help="with --nemesis: the Python interpreter the nodes run with (default: this one)",
    )
    ap.add_argument("-v", "--verbose", action="store_true", help="log the clients' retries and errors")
    return ap


def _usage(msg: str) -> int:
    print(f"txbroker verify: error: {msg}", file=sys.stderr)
    return EXIT_USAGE


def _validate(args: argparse.Namespace) -> str | None:
    if args.history is not None:
        if args.nemesis:
            return "--history checks a recorded run; it takes no --nemesis"
        return None
    if args.nemesis and (args.bootstrap or args.command_config):
        return "--nemesis starts its own namespaced cluster; it never runs against --bootstrap"
    if not args.nemesis and not args.bootstrap and not args.command_config:
        return "give --bootstrap URL (existing cluster), --nemesis (namespaced cluster with faults) or --history FILE"
    if args.faults and not args.nemesis:
        return "--faults needs --nemesis"
    if (args.node_checkout or args.node_python) and not args.nemesis:
        return "--node-checkout and --node-python need --nemesis"
    if args.node_checkout is not None and not (args.node_checkout / "cluster" / "__main__.py").is_file():
        return f"--node-checkout {args.node_checkout} is no txbroker checkout (no cluster/__main__.py)"
    if args.duration <= 0 or args.fault_seconds <= 0 or args.quiet_seconds < 0:
        return "--duration and --fault-seconds must be positive, --quiet-seconds not negative"
    if not 0 <= args.abort_ratio < 1:
        return "--abort-ratio must be in [0, 1)"
    if min(args.txn_producers, args.idempotent_producers, args.consumers) < 0 or args.consumers < 1:
        return "producer counts must be >= 0 and --consumers >= 1"
    if args.partitions < 1 or args.replication_factor < 1 or args.nodes < 1:
        return "--partitions, --replication-factor and --nodes must be >= 1"
    return None


def _print_result(result: CheckResult, args: argparse.Namespace, **extra: Any) -> int:
    if args.json:
        print(render_json(result, args.max_commit_gap, **extra))
    else:
        print(render_text(result, args.max_commit_gap))
    return report_exit_code(result, args.max_commit_gap)


def _check_file(path: Path, args: argparse.Namespace, **extra: Any) -> int:
    try:
        result = check(read_history(path))
    except (OSError, HistoryError, KeyError, TypeError, ValueError) as exc:
        print(f"txbroker verify: cannot check {path}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return _print_result(result, args, history=str(path), **extra)


def _record_path(args: argparse.Namespace) -> Path:
    if args.record is not None:
        return Path(args.record)
    fd, name = tempfile.mkstemp(prefix="txbroker-verify-", suffix=".jsonl")
    os.close(fd)
    return Path(name)


def _config(args: argparse.Namespace, bootstrap: list[str], seed: int) -> WorkloadConfig:
    return WorkloadConfig(
        security=getattr(args, "client_security", SecurityOptions()),
        bootstrap=bootstrap, run_id=uuid.uuid4().hex[:8], seed=seed, txn_producers=args.txn_producers,
        idempotent_producers=args.idempotent_producers, consumers=args.consumers, partitions=args.partitions,
        replication_factor=args.replication_factor, abort_ratio=args.abort_ratio, idempotent_rate=args.rate,
        copier=args.copier,
    )  # fmt: skip


def _run_workload(
    workload: Workload,
    duration: float,
    after_start: Callable[[], None] | None = None,
    before_finish: Callable[[], None] | None = None,
) -> dict[str, bool]:
    """Setup, start, ``after_start()``, wait ``duration`` (Ctrl-C ends it early), stop the writers,
    ``before_finish()``, finish."""
    workload.setup()
    workload.start()
    if after_start is not None:
        after_start()
    try:
        workload.stop_writers_event.wait(duration)
    except KeyboardInterrupt:
        print("interrupted: stopping the writers and checking what ran", file=sys.stderr)
    finally:
        workload.stop_writers()
        if before_finish is not None:
            before_finish()
    return workload.finish()


def _live(args: argparse.Namespace, bootstrap: list[str], history: HistoryWriter, seed: int) -> dict[str, Any]:
    workload = Workload(_config(args, bootstrap, seed), history)
    status = _run_workload(workload, args.duration)
    return {"workload": workload.summary(), "status": status}


def _with_nemesis(args: argparse.Namespace, history: HistoryWriter, seed: int) -> dict[str, Any] | str:
    """The workload over a fresh namespaced cluster with faults; a string is why it could not run."""
    from verify.leadership import HealWatch
    from verify.nemesis import Fault, FaultEvent, Nemesis
    from verify.netns import NamespacedCluster, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        return f"--nemesis cannot run here: {reason}"
    names = [n.strip() for n in args.faults.split(",") if n.strip()] if args.faults else None
    try:
        faults = [Fault(n) for n in names] if names is not None else list(Fault)
    except ValueError:
        return f"unknown fault in {args.faults!r}; known: {', '.join(f.value for f in Fault)}"
    if not faults:
        return "--faults names no fault"

    watch_stop = threading.Event()
    watch: HealWatch | None = None

    def on_event(ev: FaultEvent) -> None:
        history.fault(ev.kind, ev.fault.value, ev.nodes, time_=history.at(ev.time))
        if ev.kind == "heal" and watch is not None:
            watch.healed(ev.fault.value, history.at(ev.time))

    with tempfile.TemporaryDirectory(prefix="txbroker-verify-") as tmp:
        print(f"starting a {args.nodes}-node namespaced cluster in {tmp}", file=sys.stderr, flush=True)
        nodes = NamespacedCluster(
            Path(tmp), nodes=args.nodes, python=args.node_python or sys.executable, cwd=args.node_checkout
        )
        with nodes as cluster:
            cluster.start()
            workload = Workload(_config(args, list(cluster.urls), seed), history)
            settle = max(1.0, min(5.0, args.quiet_seconds - 0.5))
            watch = HealWatch(cluster.urls, history.leadership, settle, watch_stop)
            rounds = max(1, int(args.duration // (args.fault_seconds + args.quiet_seconds)) or 1)
            nemesis = Nemesis(cluster, topic=workload.config.topics[0],
                              transactional_id=workload.first_transactional_id, rng=random.Random(seed),
                              on_event=on_event)  # fmt: skip
            stop_nemesis = threading.Event()
            thread = threading.Thread(
                target=nemesis.run, args=(faults,), daemon=True, name="verify-nemesis",
                kwargs={"rounds": rounds, "fault_s": args.fault_seconds, "quiet_s": args.quiet_seconds,
                        "stop": stop_nemesis},
            )  # fmt: skip

            def heal() -> None:
                stop_nemesis.set()
                if thread.is_alive():
                    thread.join(args.fault_seconds + 60)

            status = _run_workload(workload, args.duration, after_start=thread.start, before_finish=heal)
            watch.join(settle + 10)
            watch_stop.set()
            return {"workload": workload.summary(), "status": status, "faults": [f.value for f in faults]}


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR, format="%(name)s: %(message)s")
    problem = _validate(args)
    if problem is not None:
        return _usage(problem)
    if args.history is not None:
        return _check_file(args.history, args, record=None)
    if args.command_config is not None:
        try:
            cfg = load_client_config(args.command_config)
        except ConfigError as exc:
            return _usage(str(exc))
        if cfg.bootstrap is None:
            return _usage(f"--command-config {args.command_config} names no bootstrap")
        try:
            ClientSecurity.from_options(cfg.bootstrap.split(","), **cfg.security)
        except ValueError as exc:
            return _usage(f"--command-config {args.command_config}: {exc}")
        args.bootstrap, args.client_security = cfg.bootstrap, cfg.security
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)  # like Ctrl-C: stop the writers, heal, drain and check
    path = _record_path(args)
    print(f"history: {path} (seed {seed})", file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        with HistoryWriter(path) as history:
            if args.nemesis:
                extra = _with_nemesis(args, history, seed)
            else:
                extra = _live(args, [u.strip() for u in args.bootstrap.split(",") if u.strip()], history, seed)
    except (BrokerError, OSError) as exc:
        return _usage(f"the run failed: {exc} (history so far: {path})")
    except KeyboardInterrupt:
        return _usage(f"interrupted before the run could be checked (history so far: {path})")
    if isinstance(extra, str):
        return _usage(extra)
    extra["seed"] = seed
    extra["seconds"] = round(time.monotonic() - started, 1)
    return _check_file(path, args, **extra)
