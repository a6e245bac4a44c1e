"""Consumer-group administration: reset targets, lag, describe rows, the DeleteGroups rule, bounded lag series."""

from __future__ import annotations

import argparse
import datetime
import io
import itertools
import tomllib
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from clients.protocol import BrokerError, ErrorCode
from cluster.config import ConfigError, make_cluster_configs, parse_config, render_config
from cluster.group_cli import parse_datetime_ms, parse_partitions, table
from cluster.metrics import GroupCoordinatorSample, GroupSample, NodeMetrics
from coordinator.group_admin import (
    NO_OFFSET,
    LogOffsets,
    ResetTo,
    lag,
    offset_rows,
    parse_reset_to,
    reset_rows,
    reset_target,
)
from coordinator.group_commands import (
    CommitOffsets,
    DeleteGroup,
    GroupsCommand,
    OffsetCommit,
    StoreGroup,
    TxnCommitOffsets,
    WriteTxnMarker,
    decode_group_command,
    encode_group_command,
)
from coordinator.group_metadata import CommittedOffset, MemberMetadata
from coordinator.group_rules import GroupDeleted
from coordinator.group_state_machine import GroupStateMachine
from coordinator.metadata import TopicPartition
from storage.store import NodeStore

PREFIX = b"O\x00\x00\x00\x02"

# ---- reset targets (kafka-consumer-groups.sh --to-*) ----------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("earliest", ResetTo("earliest")),
        ("latest", ResetTo("latest")),
        ({"offset": 0}, ResetTo("offset", 0)),
        ({"offset": 42}, ResetTo("offset", 42)),
        ({"timestamp": 1_700_000_000_000}, ResetTo("timestamp", 1_700_000_000_000)),
    ],
)
def test_reset_specs_parse(raw: Any, expected: ResetTo) -> None:
    assert parse_reset_to(raw) == expected
    assert parse_reset_to(expected.to_json()) == expected


@pytest.mark.parametrize(
    "raw",
    [None, "", "EARLIEST", "current", 5, {}, {"offset": -1}, {"offset": "5"}, {"offset": True}, {"offset": 1.5},
     {"timestamp": -3}, {"offset": 1, "timestamp": 2}, {"shift": 3}, ["earliest"], {"offset": 2**63}],
)  # fmt: skip
def test_bad_reset_specs_are_invalid_requests(raw: Any) -> None:
    with pytest.raises(BrokerError) as err:
        parse_reset_to(raw)
    assert err.value.error_code is ErrorCode.INVALID_REQUEST


LOG = LogOffsets(log_start_offset=10, high_watermark=50, timestamp_offset=30)


@pytest.mark.parametrize(
    ("to", "log", "expected"),
    [
        (ResetTo("earliest"), LOG, 10),
        (ResetTo("latest"), LOG, 50),
        (ResetTo("offset", 20), LOG, 20),
        (ResetTo("offset", 3), LOG, 10),  # below the log start: clamped up, like --to-offset
        (ResetTo("offset", 99), LOG, 50),  # past the end: clamped to the high watermark
        (ResetTo("offset", 50), LOG, 50),
        (ResetTo("timestamp", 1), LOG, 30),
        (ResetTo("timestamp", 1), LogOffsets(10, 50, None), 50),  # no record that new: the log end
        (ResetTo("timestamp", 1), LogOffsets(10, 50, 5), 10),  # retention moved the start meanwhile
        (ResetTo("earliest"), LogOffsets(0, 0), 0),  # an empty partition
        (ResetTo("latest"), LogOffsets(7, 7), 7),  # everything deleted
    ],
)
def test_reset_targets(to: ResetTo, log: LogOffsets, expected: int) -> None:
    assert reset_target(to, log) == expected


@pytest.mark.parametrize(
    ("committed", "hw", "expected"),
    [(5, 8, 3), (8, 8, 0), (9, 8, 0), (None, 8, None), (5, None, None), (NO_OFFSET, 8, None), (0, 0, 0)],
)
def test_lag_is_log_end_minus_committed_never_negative(committed: int | None, hw: int | None,
                                                       expected: int | None) -> None:  # fmt: skip
    assert lag(committed, hw) == expected


def _committed(topic: str, partition: int, offset: int) -> CommittedOffset:
    return CommittedOffset("g", topic, partition, offset, "m", 1234, 1)


def test_describe_rows_cover_committed_and_assigned_partitions() -> None:
    committed = {TopicPartition("t", 0): _committed("t", 0, 4), TopicPartition("u", 0): _committed("u", 0, 9)}
    assigned = {TopicPartition("t", 0): "m-1", TopicPartition("t", 1): "m-2"}
    hws = {("t", 0): 10, ("t", 1): 3}
    rows = offset_rows(committed, assigned, lambda t, p: hws.get((t, p)))
    assert [(r["topic"], r["partition"], r["offset"], r["log_end_offset"], r["lag"], r["member_id"]) for r in rows] == [
        ("t", 0, 4, 10, 6, "m-1"),
        ("t", 1, NO_OFFSET, 3, None, "m-2"),  # assigned, nothing committed: -1 and no lag
        ("u", 0, 9, None, None, None),  # committed, high watermark unknown: no lag
    ]
    assert rows[0]["high_watermark"] == 10 and rows[0]["metadata"] == "m" and rows[0]["commit_timestamp_ms"] == 1234


def test_reset_rows_show_current_and_new_offsets() -> None:
    committed = {TopicPartition("t", 1): _committed("t", 1, 7)}
    logs = {0: LogOffsets(0, 20), 1: LogOffsets(5, 20)}
    assert reset_rows("t", [1, 0], ResetTo("earliest"), logs, committed) == [
        {"topic": "t", "partition": 0, "current_offset": NO_OFFSET, "new_offset": 0},
        {"topic": "t", "partition": 1, "current_offset": 7, "new_offset": 5},
    ]


# ---- the DeleteGroups rule of the offsets partition -------------------------------------------------


class Offsets:
    def __init__(self, store: NodeStore) -> None:
        self.store = store
        self.sm = GroupStateMachine(store, PREFIX, 2)
        self.index = itertools.count(1)
        self.now = 1000

    def apply(self, cmd: GroupsCommand) -> object:
        self.now += 1
        return self.sm.apply(next(self.index), encode_group_command(cmd))

    def commit(self, group: str, offsets: dict[int, int]) -> object:
        offs = tuple(OffsetCommit("t", p, o) for p, o in offsets.items())
        return self.apply(CommitOffsets(group_id=group, offsets=offs, now_ms=self.now, coordinator_epoch=1))

    def store_group(self, group: str, *members: str) -> object:
        metas = tuple(MemberMetadata(m, ("t",), "range", 10_000, 30_000) for m in members)
        return self.apply(StoreGroup(group_id=group, protocol="range" if members else None,
                                     leader_id=members[0] if members else None, members=metas,
                                     topic_partitions=(("t", 4),), now_ms=self.now, coordinator_epoch=1))  # fmt: skip

    def txn_commit(self, group: str, pid: int, offsets: dict[int, int]) -> object:
        offs = tuple(OffsetCommit("t", p, o) for p, o in offsets.items())
        return self.apply(TxnCommitOffsets(group_id=group, transactional_id=f"tx{pid}", producer_id=pid,
                                           producer_epoch=0, offsets=offs, now_ms=self.now,
                                           coordinator_epoch=1))  # fmt: skip

    def marker(self, pid: int, commit: bool) -> object:
        return self.apply(WriteTxnMarker(producer_id=pid, producer_epoch=1, txn_coordinator_epoch=0, commit=commit,
                                         now_ms=self.now, coordinator_epoch=1))  # fmt: skip

    def delete(self, group: str) -> object:
        return self.apply(DeleteGroup(group_id=group, now_ms=self.now, coordinator_epoch=1))


def code(result: object) -> ErrorCode | None:
    return result.error_code if isinstance(result, BrokerError) else None


def test_delete_group_command_round_trips() -> None:
    cmd = DeleteGroup(group_id="g", now_ms=5, coordinator_epoch=2)
    assert decode_group_command(encode_group_command(cmd)) == cmd


def test_deleting_an_empty_group_removes_its_metadata_and_offsets_durably(store: NodeStore, open_store: Any) -> None:
    o = Offsets(store)
    o.store_group("g", "a")
    o.store_group("g")  # the last member left: Empty, generation 2
    o.commit("g", {0: 5, 1: 7})
    o.commit("other", {0: 1})
    assert o.delete("g") == GroupDeleted("g", 2)
    assert o.sm.group("g") is None and o.sm.committed_offsets("g") == {} and "g" not in o.sm.group_ids()
    assert o.sm.committed_offsets("other")[TopicPartition("t", 0)].offset == 1  # other groups keep theirs
    assert code(o.delete("g")) is ErrorCode.GROUP_ID_NOT_FOUND  # gone: a second delete finds nothing
    last = o.sm.last_applied
    store.close()
    reopened = GroupStateMachine(open_store("db"), PREFIX, 2)  # the tombstones are on disk
    assert reopened.last_applied == last
    assert reopened.group("g") is None and reopened.committed_offsets("g") == {}
    assert reopened.group_ids() == ["other"]


def test_a_group_with_only_committed_offsets_can_be_deleted(store: NodeStore) -> None:
    o = Offsets(store)
    o.commit("g", {3: 9})
    assert o.delete("g") == GroupDeleted("g", 1)
    assert o.sm.group_ids() == []


def test_a_deleted_group_starts_again_from_generation_one(store: NodeStore) -> None:
    o = Offsets(store)
    o.store_group("g", "a")
    o.store_group("g")
    o.delete("g")
    stored = o.store_group("g", "b")
    assert stored.metadata.generation_id == 1  # type: ignore[attr-defined]
    assert o.sm.committed_offsets("g") == {}


def test_a_group_with_members_is_not_deleted(store: NodeStore) -> None:
    o = Offsets(store)
    o.store_group("g", "a", "b")
    before = (o.sm.group("g"), o.sm.committed_offsets("g"))
    assert code(o.delete("g")) is ErrorCode.NON_EMPTY_GROUP
    assert (o.sm.group("g"), o.sm.committed_offsets("g")) == before


def test_an_unknown_group_is_not_found(store: NodeStore) -> None:
    assert code(Offsets(store).delete("nobody")) is ErrorCode.GROUP_ID_NOT_FOUND


def test_pending_transactional_offsets_hold_the_delete_until_their_marker(store: NodeStore) -> None:
    o = Offsets(store)
    o.commit("g", {0: 5})
    o.txn_commit("g", 7, {0: 9})
    assert code(o.delete("g")) is ErrorCode.CONCURRENT_TRANSACTIONS
    assert o.sm.committed_offsets("g")[TopicPartition("t", 0)].offset == 5  # nothing changed
    o.marker(7, commit=True)
    assert o.sm.committed_offsets("g")[TopicPartition("t", 0)].offset == 9
    assert o.delete("g") == GroupDeleted("g", 1)
    assert o.sm.group_ids() == []


def test_a_pending_only_group_is_known_but_held(store: NodeStore) -> None:
    o = Offsets(store)
    o.txn_commit("g", 8, {1: 2})
    assert code(o.delete("g")) is ErrorCode.CONCURRENT_TRANSACTIONS
    o.marker(8, commit=False)
    assert code(o.delete("g")) is ErrorCode.GROUP_ID_NOT_FOUND  # aborted: nothing was ever committed


def test_a_snapshot_after_a_delete_holds_no_trace_of_the_group(store: NodeStore, open_store: Any) -> None:
    o = Offsets(store)
    o.store_group("g")
    o.commit("g", {0: 1})
    o.commit("h", {0: 2})
    o.delete("g")
    buf = io.BytesIO()
    o.sm.write_snapshot(buf)
    other = GroupStateMachine(open_store("db2"), PREFIX, 2)
    other.read_snapshot(io.BytesIO(buf.getvalue()), o.sm.last_applied)
    assert other.group_ids() == ["h"]


# ---- bounded lag series ---------------------------------------------------------------------------------


def test_per_partition_series_stop_at_the_budget_but_the_sums_cover_everything() -> None:
    committed = {("a", 0): 1, ("a", 1): 2, ("b", 0): 3}
    s = GroupSample.from_offsets("g", 0, committed, lambda t, p: 10, max_series=2)
    assert s.series == 2
    assert dict(s.committed) == {("a", 0): 1, ("a", 1): 2}
    assert dict(s.partition_lag) == {("a", 0): 9, ("a", 1): 8}
    assert s.lag == {"a": 17, "b": 7} and s.lag_sum == 24
    none = GroupSample.from_offsets("g", 0, committed, lambda t, p: 10, max_series=0)
    assert none.series == 0 and none.partition_lag == {} and none.lag_sum == 24


def _scrape(m: NodeMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(m.registry).decode()
    return {(x.name, tuple(sorted(x.labels.items()))): x.value
            for f in text_string_to_metric_families(text) for x in f.samples}  # fmt: skip


def test_the_lag_gauges_are_exported_per_partition_and_per_group() -> None:
    m = NodeMetrics()
    hw = {("t", 0): 10, ("t", 1): 4}
    m.set_group_source(lambda: GroupCoordinatorSample(1, [
        GroupSample.from_offsets("g", 1, {("t", 0): 6, ("t", 1): 4}, lambda t, p: hw[(t, p)], max_series=1),
    ]))  # fmt: skip
    v = _scrape(m)
    assert v[("txbroker_consumer_group_lag", (("group", "g"), ("partition", "0"), ("topic", "t")))] == 4
    assert ("txbroker_consumer_group_lag", (("group", "g"), ("partition", "1"), ("topic", "t"))) not in v
    assert v[("txbroker_consumer_group_total_lag", (("group", "g"),))] == 4


# ---- the CLI's pure parts -------------------------------------------------------------------------------


def test_cli_tables_align_columns_and_show_missing_values_as_dashes() -> None:
    text = table(("GROUP", "LAG"), [("a-long-group", 5), ("g", None)])
    assert text.splitlines() == ["GROUP         LAG", "a-long-group  5", "g             -"]


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("2024-05-01T12:00:00Z", 1_714_564_800_000),
        ("2024-05-01T12:00:00+02:00", 1_714_557_600_000),
        ("2024-05-01T12:00:00.250Z", 1_714_564_800_250),
    ],
)
def test_datetimes_are_iso_8601(text: str, ms: int) -> None:
    assert parse_datetime_ms(text) == ms


def test_a_datetime_without_a_zone_is_local_time() -> None:
    local = datetime.datetime(2024, 5, 1, 12, 0, 0).astimezone()
    assert parse_datetime_ms("2024-05-01T12:00:00") == int(local.timestamp() * 1000)


@pytest.mark.parametrize("text", ["yesterday", "2024-13-01T00:00:00", "1960-01-01T00:00:00Z"])
def test_bad_datetimes_are_usage_errors(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_datetime_ms(text)


def test_partition_lists() -> None:
    assert parse_partitions("0,1, 5") == [0, 1, 5]
    for bad in ("", "a", "-1", "1,,x"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_partitions(bad)


def test_metrics_max_lag_series_must_not_be_negative(tmp_path: Path) -> None:
    [cfg] = make_cluster_configs(1, tmp_path)
    raw = tomllib.loads(render_config(cfg))
    assert parse_config(raw, base_dir=tmp_path).metrics_max_lag_series == 1000
    raw["metrics_max_lag_series"] = -1
    with pytest.raises(ConfigError, match="metrics_max_lag_series"):
        parse_config(raw, base_dir=tmp_path)
