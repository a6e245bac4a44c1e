"""The verify workload against any cluster: writers, readers, the copier, the final drain; all into a history.

Phases (``Workload.run`` runs them in order; ``txbroker verify --nemesis`` interleaves the nemesis):

1. ``setup``: create two topics (``partitions`` x ``replication_factor``) and, with the copier, the copy
   topic; write the ``meta`` line;
2. ``start``: readers (read_committed, every partition from 0), the copier, then the transactional and
   idempotent writers; a ``run start`` line;
3. ``stop_writers``: the writers finish their current operation and close; a ``run end`` line;
4. ``finish``: the copier runs until the group has committed the whole input (a ``copier done``
   line), the readers stop, the cluster settles (no open transaction), and the final drain reads
   every partition to its end.

Nothing here raises on a client error: every error is an outcome in the history.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from clients.admin import Admin
from clients.protocol import BrokerError, ErrorCode
from clients.security import SecurityOptions
from cluster.copier import CopierConfig

from .copying import CopierRunner
from .history import HistoryWriter
from .readers import Reader, drain, wait_stable
from .writers import IdempotentWriter, TxnWriter, WriterConfig

__all__ = ["Workload", "WorkloadConfig"]

log = logging.getLogger("verify.workload")


@dataclass(frozen=True)
class WorkloadConfig:
    bootstrap: Sequence[str]
    run_id: str
    seed: int = 0
    txn_producers: int = 3
    idempotent_producers: int = 2
    consumers: int = 2
    partitions: int = 3
    replication_factor: int = 3
    abort_ratio: float = 0.2
    idempotent_rate: float = 50.0
    copier: bool = True
    setup_timeout_s: float = 60.0
    finish_timeout_s: float = 120.0
    request_timeout_ms: int = 5_000
    transaction_timeout_ms: int = 15_000
    #: Every client's TLS and credential options (``--command-config``); never in the history (a password).
    security: SecurityOptions = field(default_factory=lambda: SecurityOptions(), repr=False)

    @property
    def topics(self) -> list[str]:
        return [f"verify-{self.run_id}-a", f"verify-{self.run_id}-b"]

    @property
    def copy_topic(self) -> str:
        return f"verify-{self.run_id}-copy"

    def writer_config(self) -> WriterConfig:
        return WriterConfig(
            bootstrap=list(self.bootstrap), topics=self.topics, partitions=self.partitions, run_id=self.run_id,
            abort_ratio=self.abort_ratio, idempotent_rate=self.idempotent_rate,
            request_timeout_ms=self.request_timeout_ms, transaction_timeout_ms=self.transaction_timeout_ms,
            producer_options=dict(self.security),
        )  # fmt: skip


class Workload:
    def __init__(self, config: WorkloadConfig, history: HistoryWriter) -> None:
        self.config = config
        self.h = history
        self.stop_writers_event = threading.Event()
        self.stop_readers_event = threading.Event()
        self.writers: list[TxnWriter | IdempotentWriter] = []
        self.readers: list[Reader] = []
        self.copier: CopierRunner | None = None

    @property
    def first_transactional_id(self) -> str:
        return self.config.writer_config().transactional_id(0)

    def _all_topics(self) -> list[str]:
        return self.config.topics + ([self.config.copy_topic] if self.config.copier else [])

    # ---- 1. setup ---------------------------------------------------------------------------------

    def setup(self) -> None:
        """Create the topics and wait for their leaders; raises ``BrokerError`` when the cluster cannot."""
        cfg = self.config
        admin = Admin(list(cfg.bootstrap), request_timeout_ms=cfg.request_timeout_ms, **cfg.security)
        deadline = time.monotonic() + cfg.setup_timeout_s
        for name in self._all_topics():
            retried = False
            while True:
                try:
                    admin.create_topic(name, cfg.partitions, cfg.replication_factor)
                    break
                except BrokerError as exc:
                    if retried and exc.error_code is ErrorCode.TOPIC_ALREADY_EXISTS:
                        break  # a retry of a create that did land
                    if not exc.retriable or time.monotonic() >= deadline:
                        raise
                    retried = True
                    time.sleep(0.2)
            admin.wait_for_leaders(name, max(1.0, deadline - time.monotonic()))
        meta = {k: v for k, v in asdict(self.config).items() if k not in ("bootstrap", "security")}
        self.h.meta(
            bootstrap=list(cfg.bootstrap), topics=cfg.topics, config=meta,
            copy={"from": cfg.topics[0], "to": cfg.copy_topic} if cfg.copier else None,
        )  # fmt: skip

    # ---- 2. start -----------------------------------------------------------------------------------

    def start(self) -> None:
        cfg = self.config
        wcfg = cfg.writer_config()
        tps = [(t, p) for t in cfg.topics for p in range(cfg.partitions)]
        timeout_ms = cfg.request_timeout_ms
        for n in range(cfg.consumers):
            self.readers.append(
                Reader(n, cfg.bootstrap, tps, self.h, self.stop_readers_event, timeout_ms, cfg.security)
            )
        rng = random.Random(cfg.seed)
        for n in range(cfg.txn_producers):
            self.writers.append(TxnWriter(n, wcfg, self.h, self.stop_writers_event, rng.randrange(2**32)))
        for n in range(cfg.idempotent_producers):
            self.writers.append(IdempotentWriter(n, wcfg, self.h, self.stop_writers_event, rng.randrange(2**32)))
        for r in self.readers:
            r.start()
        if cfg.copier:
            copier = CopierConfig(
                bootstrap=",".join(cfg.bootstrap), input_topic=cfg.topics[0], output_topic=cfg.copy_topic,
                group_id=f"verify-{cfg.run_id}-copier", transactional_id=f"verify-{cfg.run_id}-copier",
                commit_every=100, commit_every_ms=200, transaction_timeout_ms=cfg.transaction_timeout_ms,
                session_timeout_ms=6_000, heartbeat_interval_ms=1_000, security=cfg.security,
            )  # fmt: skip
            self.copier = CopierRunner(copier)
            self.copier.start()
        self.h.run("start")
        for w in self.writers:
            w.start()

    # ---- 3. stop the writers -------------------------------------------------------------------------

    def stop_writers(self, timeout: float = 60.0) -> None:
        self.stop_writers_event.set()
        deadline = time.monotonic() + timeout
        for w in self.writers:
            w.join(max(0.1, deadline - time.monotonic()))
        alive = [w.name for w in self.writers if w.is_alive()]
        if alive:
            log.warning("writers still running after %.0fs: %s", timeout, alive)
        self.h.run("end")

    # ---- 4. finish -------------------------------------------------------------------------------------

    def finish(self) -> dict[str, bool]:
        cfg = self.config
        deadline = time.monotonic() + cfg.finish_timeout_s
        status: dict[str, bool] = {}
        if self.copier is not None:
            self.copier.stop()
            caught_up = self.copier.finish(time.monotonic() + cfg.finish_timeout_s / 2)
            self.h.write({"type": "copier", "kind": "done", "caught_up": caught_up, "time": self.h.now(),
                          "restarts": self.copier.restarts})  # fmt: skip
            status["copier_caught_up"] = caught_up
        self.stop_readers_event.set()
        for r in self.readers:
            r.join(max(0.1, deadline - time.monotonic()))
        topics = self._all_topics()
        status["stable"] = wait_stable(cfg.bootstrap, topics, min(deadline, time.monotonic() + 60), cfg.security)
        tps = [(t, p) for t in topics for p in range(cfg.partitions)]
        done = drain(cfg.bootstrap, tps, self.h, deadline, cfg.security)
        status["drained"] = all(done.values())
        return status

    def run(self, duration: float, stop: threading.Event | None = None) -> dict[str, bool]:
        """All phases, with the writers running ``duration`` seconds (or until ``stop``)."""
        self.setup()
        self.start()
        try:
            (stop or threading.Event()).wait(duration)
        finally:
            self.stop_writers()
        return self.finish()

    def summary(self) -> dict[str, int]:
        return {
            "transactions_committed": sum(w.transactions for w in self.writers if isinstance(w, TxnWriter)),
            "sends_acked": sum(w.acked for w in self.writers if isinstance(w, IdempotentWriter)),
            "records_read": sum(r.records for r in self.readers),
        }
