"""The produce scenario's baselines: bare replication and raw storage writes of the same batch bytes.

``replication_rate`` replicates commands of a batch's size on one group of 3
processes, either stock PySyncObj (``bench.raft_replication --bare``) or the
raft/ layer with a node's default Raft settings; ``rocksdict_rates`` times raw
rocksdict puts and ``PartitionLog.apply`` (``bench.storage_apply``).
"""

from __future__ import annotations

import tempfile
from typing import Any

from cluster.config import NodeConfig

from .measure import host_cpu, proc_stat, self_cpu
from .raft_replication import start_group, wait_leader
from .storage_apply import apply_rate, raw_put_rate


def replication_rate(stock: bool, size: int, outstanding: int, seconds: float) -> dict[str, Any]:
    """Replication MB/s of ``size``-byte commands, one group on 3 processes, leader-local submits.

    ``stock``: stock PySyncObj as ``bench.raft_replication --bare`` configures it; else the raft/ layer
    (``raft.node_host``) with a node's default Raft settings.
    """
    defaults = NodeConfig.__dataclass_fields__
    hb, compact = (defaults[k].default for k in ("raft_heartbeat_s", "raft_log_compaction_min_entries"))
    with tempfile.TemporaryDirectory(prefix="txbroker-bench-raft-") as tmp:
        procs = start_group(tmp, stock, ["--heartbeat", str(hb), "--compaction-min-entries", str(compact)])
        try:
            lead = wait_leader(procs, 60)
            req = {"op": "bench", "group": "bench", "n": 100, "size": size, "outstanding": outstanding}
            warm = lead.request(req, timeout=120)
            req["n"] = max(100, int(warm["cmds_per_s"] * seconds))
            c0, h0, s0 = sum(proc_stat(p.proc.pid)[0] for p in procs), host_cpu(), self_cpu()
            res = lead.request(req, timeout=seconds * 10 + 60)
            procs_cpu, h1 = sum(proc_stat(p.proc.pid)[0] for p in procs) - c0, host_cpu()
            res["cpu_pct_3_procs"] = 100 * procs_cpu / res["elapsed_s"]
            # busy time of processes outside this measurement, % of one core (the machine may be shared)
            res["host_cpu_other_pct"] = 100 * ((h1[0] - h0[0]) - procs_cpu - (self_cpu() - s0)) / res["elapsed_s"]
        finally:
            for p in procs:
                p.stop()
    res.update(outstanding=outstanding, commands=req["n"])
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in res.items()}


def baseline(stock: bool, size: int, outstanding: int, seconds: float) -> dict[str, Any]:
    """``replication_rate``, or the error that stopped it: a failed baseline is reported, the run goes on."""
    try:
        return replication_rate(stock, size, outstanding, seconds)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def rocksdict_rates(size: int, count: int) -> dict[str, Any]:
    """MB/s of ``count`` raw rocksdict puts and ``PartitionLog.apply`` calls of ``size``-byte batches."""
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        raw = raw_put_rate(a, size, count)
        applied = apply_rate(b, size, count)
    return {"raw_put_mb_per_s": round(raw, 1), "partitionlog_apply_mb_per_s": round(applied, 1), "count": count}
