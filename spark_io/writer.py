"""Exactly-once writes: every task attempt writes into its own prepared transaction; the driver commits the group.

Batch (``df.write``): the commit group is the job's *write id* (option
``writeId``, else a fresh ``spark-<uuid>`` per job). Streaming
(``df.writeStream``): the group is ``<sink id>:<batch id>`` with the sink id
the ``sinkId`` option or the query id (stable across restarts, it lives in
the checkpoint). Transactional ids are ``<group prefix><partition>:<attempt>:<random>``,
so every attempt -- retries, speculative copies, a re-run of the whole job --
has its own transaction and none fences another.

Where things run (PySpark): ``write`` in an executor, once per task attempt;
``commit``/``abort`` in a fresh driver process holding the writer pickled at
planning time (streaming: a freshly built writer; everything it needs comes
from the commit messages and the batch id).
"""

from __future__ import annotations

import logging
import os
import secrets
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from clients.protocol import BrokerError, ErrorCode, Record

from . import _http
from .broker import BrokerClient
from .commit import Member, Outcome, commit_and_sweep, sweep, write_manifest
from .options import WriterOptions
from .txn_producer import TransactionalWriter

log = logging.getLogger("spark_io")


@dataclass
class TxnCommitMessage(WriterCommitMessage):
    """What a task attempt hands the driver: its prepared transaction and the group it belongs to."""

    group: str
    prefix: str
    transactional_id: str
    producer_id: int
    producer_epoch: int
    records: int
    payload_bytes: int

    @property
    def member(self) -> Member:
        return Member(self.transactional_id, self.producer_id, self.producer_epoch)


def batch_prefix(write_id: str) -> str:
    return f"{write_id}:w:"


def stream_group(sink_id: str, batch_id: int) -> str:
    return f"{sink_id}:{batch_id}"


# ---- rows ----------------------------------------------------------------------------------------------


def _as_binary(col: pa.Array | pa.ChunkedArray) -> list[bytes | None]:
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        col = pc.cast(col, pa.binary())
    elif not (pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type)):
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"key/value columns must be binary or string, not {col.type}")
    values: list[bytes | None] = col.to_pylist()
    return values


def _headers(col: pa.Array | None, n: int) -> list[tuple[tuple[str, bytes | None], ...]]:
    if col is None:
        return [()] * n
    out = []
    for hs in col.to_pylist():
        out.append(tuple((h["key"], h["value"]) for h in hs or () if h is not None))
    return out


def write_rows(w: TransactionalWriter, rb: pa.RecordBatch, topic_option: str | None, now_ms: int) -> int:
    """Append one Arrow batch's rows (columns value, key?, topic?, partition?, headers?); returns the row count."""
    names = set(rb.schema.names)
    if "value" not in names:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "a txbroker write needs a 'value' column (binary or string)")
    n = rb.num_rows
    values = _as_binary(rb.column("value"))
    keys = _as_binary(rb.column("key")) if "key" in names else [None] * n
    if topic_option is not None:
        topics: list[Any] = [topic_option] * n
    elif "topic" in names:
        topics = rb.column("topic").to_pylist()
    else:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "set the 'topic' option or give a 'topic' column")
    partitions = rb.column("partition").to_pylist() if "partition" in names else [None] * n
    headers = _headers(rb.column("headers") if "headers" in names else None, n)
    for topic, key, value, part, hdrs in zip(topics, keys, values, partitions, headers, strict=True):
        if topic is None:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "a row has a null topic and no 'topic' option is set")
        p = w.partition_for(topic, key, part)
        w.append(topic, p, Record(value=value, key=key, headers=hdrs, timestamp=now_ms))
    return int(n)


@dataclass(frozen=True)
class _FailHook:
    """``_test.failTask`` = ``PARTITION:ATTEMPT|*:AFTER_ROWS:raise|crash`` (tests only)."""

    partition: int
    attempt: int | None
    after_rows: int
    crash: bool

    @classmethod
    def parse(cls, spec: str | None) -> _FailHook | None:
        if not spec:
            return None
        p, a, rows, mode = spec.split(":")
        return cls(int(p), None if a == "*" else int(a), int(rows), mode == "crash")

    def fire(self, w: TransactionalWriter, partition: int, attempt: int) -> None:
        if partition != self.partition or (self.attempt is not None and attempt != self.attempt):
            return
        w.flush()  # the rows written so far are on the broker, in the open transaction
        if self.crash:
            os._exit(1)  # the Python worker dies: no abort, no message (a killed executor)
        raise RuntimeError(f"_test.failTask: partition {partition} attempt {attempt} after {w.records} rows")


def write_task(o: WriterOptions, group: str, prefix: str, batches: Iterator[pa.RecordBatch]) -> TxnCommitMessage:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    assert ctx is not None, "write_task runs in a Spark task"
    partition, attempt = ctx.partitionId(), ctx.attemptNumber()
    tid = f"{prefix}{partition}:{attempt}:{secrets.token_hex(4)}"
    hook = _FailHook.parse(o.test_fail_task)
    client = BrokerClient(o.bootstrap, request_timeout_s=o.request_timeout_ms / 1000, credentials=o.credentials)
    w = TransactionalWriter(client, tid, transaction_timeout_ms=o.transaction_timeout_ms, batch_bytes=o.batch_bytes,
                            request_timeout_ms=o.request_timeout_ms)  # fmt: skip
    try:
        w.begin()
        for rb in batches:
            now_ms = int(time.time() * 1000)
            if hook is not None and w.records + rb.num_rows > hook.after_rows:
                cut = max(0, hook.after_rows - w.records)
                write_rows(w, rb.slice(0, cut), o.topic, now_ms)
                hook.fire(w, partition, attempt)
                rb = rb.slice(cut)
            write_rows(w, rb, o.topic, now_ms)
        pid, epoch = w.prepare()
    except BaseException:
        w.abort_quietly()
        raise
    finally:
        w.close()
    return TxnCommitMessage(group, prefix, tid, pid, epoch, w.records, w.payload_bytes)


def _members(messages: list[Any]) -> list[TxnCommitMessage]:
    return [m for m in messages if isinstance(m, TxnCommitMessage)]


# ---- batch -----------------------------------------------------------------------------------------------


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, options: WriterOptions) -> None:
        self.options = options
        self.write_id = options.write_id or f"spark-{uuid.uuid4().hex}"  # planner: shared by tasks and commit

    @property
    def prefix(self) -> str:
        return batch_prefix(self.write_id)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TxnCommitMessage:
        return write_task(self.options, self.write_id, self.prefix, iterator)

    def commit(self, messages: list[Any]) -> None:
        o = self.options
        msgs = _members(messages)
        members = [m.member for m in msgs]
        if o.test_handoff_commit:
            write_manifest(o.test_handoff_commit, o.bootstrap, self.write_id, self.prefix, members)
            return
        client = BrokerClient(o.bootstrap, request_timeout_s=o.request_timeout_ms / 1000, credentials=o.credentials)
        outcome = commit_and_sweep(client, self.write_id, self.prefix, members, o.commit_timeout_ms / 1000)
        records = sum(m.records for m in msgs)
        if outcome is Outcome.ABORTED:
            raise BrokerError(ErrorCode.INVALID_TXN_STATE,
                              f"write id {self.write_id!r} was aborted before (a failed commit of an earlier run); "
                              "nothing of this run is visible: write again with a new writeId")  # fmt: skip
        if outcome is Outcome.DUPLICATE:
            log.warning("write id %s was already committed by an earlier run; this run's %d records were discarded",
                        self.write_id, records)  # fmt: skip
        else:
            log.info("write id %s: committed %d records from %d tasks", self.write_id, records, len(msgs))
        _http.close_all()

    def abort(self, messages: list[Any]) -> None:
        o = self.options
        client = BrokerClient(o.bootstrap, request_timeout_s=o.request_timeout_ms / 1000, credentials=o.credentials)
        swept = sweep(client, self.prefix)
        log.info("write id %s aborted: %d transaction(s) aborted", self.write_id, len(swept))
        _http.close_all()


# ---- streaming -------------------------------------------------------------------------------------------


class StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: WriterOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TxnCommitMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None, "write runs in a Spark task"
        sink = self.options.write_id or ctx.getLocalProperty("sql.streaming.queryId")
        batch_id = ctx.getLocalProperty("streaming.sql.batchId")
        if not sink or batch_id is None:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "streaming write without a query id / batch id")
        group = stream_group(sink, int(batch_id))
        return write_task(self.options, group, group + ":", iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:
        o = self.options
        msgs = _members(messages)
        if not msgs:
            return
        group = msgs[0].group
        if not group.endswith(f":{batchId}"):
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"commit of batch {batchId} got messages of group {group}")
        client = BrokerClient(o.bootstrap, request_timeout_s=o.request_timeout_ms / 1000, credentials=o.credentials)
        outcome = commit_and_sweep(client, group, msgs[0].prefix, [m.member for m in msgs], o.commit_timeout_ms / 1000)
        if outcome is Outcome.ABORTED:
            raise BrokerError(ErrorCode.INVALID_TXN_STATE, f"micro-batch group {group} was aborted before")
        if outcome is Outcome.DUPLICATE:
            log.warning("micro-batch %s was committed before (replay): this run's %d records were discarded",
                        group, sum(m.records for m in msgs))  # fmt: skip
        _http.close_all()

    def abort(self, messages: list[Any], batchId: int) -> None:
        o = self.options
        msgs = _members(messages)
        sink = o.write_id or (msgs[0].group.rsplit(":", 1)[0] if msgs else None)
        if sink is None:
            log.warning("abort of batch %d: no sink id known; open attempts end at their transaction timeout", batchId)
            return
        client = BrokerClient(o.bootstrap, request_timeout_s=o.request_timeout_ms / 1000, credentials=o.credentials)
        sweep(client, stream_group(sink, batchId) + ":")
        _http.close_all()
