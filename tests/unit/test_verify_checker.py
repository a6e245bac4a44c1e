"""``verify``'s checker, availability measures and history format on synthetic histories (pure: no cluster)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from verify.availability import compute_availability, fault_windows, first_after, longest_gap
from verify.checker import ANOMALY_KINDS, CheckResult, check
from verify.command import main as verify_main
from verify.history import HistoryError, HistoryWriter, read_history, write_history
from verify.report import EXIT_ANOMALY, EXIT_OK, EXIT_SLOW, exit_code, render_text

A, B, COPY = "a", "b", "a-copy"
Capture = pytest.CaptureFixture[str]


class H:
    """A synthetic history; times advance by 0.01 s per operation."""

    def __init__(self, copy: bool = False) -> None:
        self.t = 0.0
        self.ops: list[dict[str, Any]] = [{"type": "meta", "version": 1, "time": 0.0, "topics": [A, B]}]
        if copy:
            self.ops[0]["copy"] = {"from": A, "to": COPY}
        self.ops.append({"type": "run", "kind": "start", "time": 0.0})

    def _times(self) -> tuple[float, float]:
        self.t += 0.01
        return round(self.t, 2), round(self.t + 0.005, 3)

    def send(self, process: str, seq: int, topic: str, partition: int, offset: int | None, outcome: str = "ok") -> str:
        invoke, complete = self._times()
        value = f"{process}-{seq}"
        self.ops.append(
            {"type": "send", "process": process, "seq": seq, "invoke": invoke, "complete": complete,
             "outcome": outcome, "topic": topic, "partition": partition, "value": value, "offset": offset}
        )  # fmt: skip
        return value

    def txn(self, process: str, txn: int, records: list[tuple[str, int, int | None]], *, commit: bool = True,
            outcome: str = "ok") -> list[str]:  # fmt: skip
        invoke, complete = self._times()
        rows = [[t, p, f"{process}-{txn}-{i}", o] for i, (t, p, o) in enumerate(records)]
        self.ops.append(
            {"type": "txn-commit" if commit else "txn-abort", "process": process, "txn": txn, "invoke": invoke,
             "complete": complete, "outcome": outcome, "records": rows}
        )  # fmt: skip
        return [r[2] for r in rows]

    def assign(self, process: str, positions: list[tuple[str, int, int]]) -> None:
        invoke, complete = self._times()
        self.ops.append({"type": "assign", "process": process, "invoke": invoke, "complete": complete,
                         "outcome": "ok", "positions": [list(p) for p in positions]})  # fmt: skip

    def poll(self, process: str, records: list[tuple[str, int, int, str]]) -> None:
        invoke, complete = self._times()
        rows = [list(r) for r in records]
        self.ops.append({"type": "poll", "process": process, "invoke": invoke, "complete": complete,
                         "outcome": "ok", "isolation": "read_committed", "records": rows})  # fmt: skip

    def drain(self, topic: str, partition: int, end: int, complete: bool = True) -> None:
        self.ops.append({"type": "drain", "process": "drain", "topic": topic, "partition": partition,
                         "end_offset": end, "complete": complete, "time": round(self.t, 2)})  # fmt: skip

    def fault(self, kind: str, fault: str, nodes: list[int], time: float) -> None:
        self.ops.append({"type": "fault", "kind": kind, "fault": fault, "nodes": nodes, "time": time})

    def check(self) -> CheckResult:
        self.ops.append({"type": "run", "kind": "end", "time": round(self.t + 0.01, 2)})
        return check(self.ops)


def found(result: CheckResult) -> dict[str, int]:
    return {k: n for k, n in result.counts_by_kind.items() if n}


def clean_history(copy: bool = False) -> H:
    """Two sends, a committed and an aborted transaction, a consumer and a complete drain: no anomaly."""
    h = H(copy=copy)
    v1 = h.send("i0", 1, A, 0, 0)
    v2 = h.send("i0", 2, A, 0, 1)
    c1, c2 = h.txn("t0", 1, [(A, 0, 2), (B, 0, 0)])
    (aborted,) = h.txn("t0", 2, [(A, 0, 3)], commit=False)  # offset 3 aborted, 4 its marker
    v3 = h.send("i0", 3, A, 0, 5)
    h.assign("c0", [(A, 0, 0), (B, 0, 0)])
    h.poll("c0", [(A, 0, 0, v1), (A, 0, 1, v2), (B, 0, 0, c2)])
    h.poll("c0", [(A, 0, 2, c1), (A, 0, 5, v3)])
    h.assign("drain", [(A, 0, 0), (B, 0, 0)])
    h.poll("drain", [(A, 0, 0, v1), (A, 0, 1, v2), (A, 0, 2, c1), (A, 0, 5, v3), (B, 0, 0, c2)])
    h.drain(A, 0, 6)
    h.drain(B, 0, 2)
    if copy:
        h.ops.append({"type": "copier", "kind": "done", "caught_up": True, "time": h.t})
        h.assign("drain", [(COPY, 0, 0)])
        h.poll("drain", [(COPY, 0, 0, v1), (COPY, 0, 1, v2), (COPY, 0, 2, c1), (COPY, 0, 4, v3)])
        h.drain(COPY, 0, 5)
    assert aborted == "t0-2-0"
    return h


# ---- clean runs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("copy", [False, True])
def test_a_clean_history_has_no_anomaly(copy: bool) -> None:
    result = clean_history(copy).check()
    assert found(result) == {}, result.anomalies
    assert result.valid
    assert result.counts["txns-committed"] == 1
    assert result.counts["txns-aborted"] == 1
    assert result.counts["send:ok"] == 3
    assert result.counts["records-read"] == (14 if copy else 10)
    assert set(result.counts_by_kind) == set(ANOMALY_KINDS)
    assert exit_code(result) == EXIT_OK
    assert "VALID" in render_text(result)


# ---- one test per anomaly class ---------------------------------------------------------------------------


def test_lost_write_when_reads_went_past_an_acknowledged_send() -> None:
    h = H()
    v1 = h.send("i0", 1, A, 0, 0)
    h.send("i0", 2, A, 0, 1)  # acknowledged, never read
    v3 = h.send("i0", 3, A, 0, 2)
    h.assign("c0", [(A, 0, 0)])
    h.poll("c0", [(A, 0, 0, v1), (A, 0, 2, v3)])
    result = h.check()
    assert found(result) == {"lost-write": 1}
    (a,) = result.anomalies
    assert a.data["value"] == "i0-2"
    assert (a.data["topic"], a.data["partition"], a.data["offset"]) == (A, 0, 1)
    assert "i0-2" in a.detail
    assert exit_code(result) == EXIT_ANOMALY


def test_lost_write_of_a_committed_transaction_found_by_the_final_drain() -> None:
    h = H()
    h.txn("t1", 7, [(B, 2, 0)])
    h.drain(B, 2, 1)  # the drain covered offset 0 and returned nothing
    result = h.check()
    assert found(result) == {"lost-write": 1}
    assert result.anomalies[0].data["value"] == "t1-7-0"
    assert "transaction" in result.anomalies[0].detail


def test_a_write_beyond_every_read_is_unverified_not_lost() -> None:
    h = H()
    v1 = h.send("i0", 1, A, 0, 0)
    h.send("i0", 2, A, 0, 9)
    h.assign("c0", [(A, 0, 0)])
    h.poll("c0", [(A, 0, 0, v1)])
    result = h.check()
    assert found(result) == {}
    assert result.counts["unverified-writes"] == 1
    assert any("not checked" in n for n in result.notes)


def test_duplicate_when_one_value_sits_at_two_offsets() -> None:
    h = H()
    v1 = h.send("i0", 1, A, 0, 0)
    h.assign("c0", [(A, 0, 0)])
    h.poll("c0", [(A, 0, 0, v1), (A, 0, 1, v1)])
    result = h.check()
    assert found(result) == {"duplicate": 1}
    assert result.anomalies[0].data["locations"] == [[0, 0], [0, 1]]


@pytest.mark.parametrize(("commit", "outcome"), [(False, "ok"), (False, "info"), (True, "fail")])
def test_aborted_read_of_an_aborted_or_failed_transaction(commit: bool, outcome: str) -> None:
    h = H()
    v1 = h.send("i0", 1, A, 0, 0)
    (bad,) = h.txn("t0", 3, [(A, 0, 1)], commit=commit, outcome=outcome)
    h.assign("c0", [(A, 0, 0)])
    h.poll("c0", [(A, 0, 0, v1), (A, 0, 1, bad)])
    result = h.check()
    assert found(result) == {"aborted-read": 1}
    a = result.anomalies[0]
    assert (a.data["process"], a.data["txn"], a.data["value"], a.data["readers"]) == ("t0", 3, bad, ["c0"])


def test_a_transaction_with_unknown_outcome_may_be_read() -> None:
    h = H()
    (v,) = h.txn("t0", 3, [(A, 0, 0)], outcome="info")
    h.assign("c0", [(A, 0, 0)])
    h.poll("c0", [(A, 0, 0, v)])
    assert found(h.check()) == {}


def test_partial_transaction_of_an_unknown_commit() -> None:
    h = H()
    seen, unseen = h.txn("t0", 1, [(A, 0, 0), (B, 0, 0)], outcome="info")
    other = h.send("i0", 1, B, 0, 1)
    h.assign("c0", [(A, 0, 0), (B, 0, 0)])
    h.poll("c0", [(A, 0, 0, seen), (B, 0, 1, other)])  # read past b-0@0 without seeing it
    result = h.check()
    assert found(result) == {"partial-transaction": 1}
    a = result.anomalies[0]
    assert (a.data["process"], a.data["writer"], a.data["txn"]) == ("c0", "t0", 1)
    assert a.data["missing"] == [[B, 0, unseen, 0]]


def test_partial_transaction_of_a_committed_one_is_also_a_lost_write() -> None:
    h = H()
    seen, _unseen = h.txn("t0", 1, [(A, 0, 0), (B, 0, 0)])
    other = h.send("i0", 1, B, 0, 1)
    h.assign("c0", [(A, 0, 0), (B, 0, 0)])
    h.poll("c0", [(A, 0, 0, seen), (B, 0, 1, other)])
    assert found(h.check()) == {"partial-transaction": 1, "lost-write": 1}


def test_no_partial_transaction_while_the_reader_has_not_reached_the_rest() -> None:
    h = H()
    seen, _unseen = h.txn("t0", 1, [(A, 0, 0), (B, 0, 5)], outcome="info")
    h.assign("c0", [(A, 0, 0), (B, 0, 0)])
    h.poll("c0", [(A, 0, 0, seen)])
    assert found(h.check()) == {}


def test_inconsistent_offsets_when_two_reads_disagree() -> None:
    h = H()
    v1 = h.send("i0", 1, A, 0, 0)
    v2 = h.send("i0", 2, A, 0, None, outcome="info")
    h.assign("c0", [(A, 0, 0)])
    h.assign("c1", [(A, 0, 0)])
    h.poll("c0", [(A, 0, 0, v1)])
    h.poll("c1", [(A, 0, 0, v2)])
    result = h.check()
    assert found(result) == {"inconsistent-offsets": 1}
    assert result.anomalies[0].data["values"] == [v1, v2]
    assert result.anomalies[0].data["offset"] == 0


def test_inconsistent_offsets_when_an_acknowledged_offset_holds_another_value() -> None:
    h = H()
    v1 = h.send("i0", 1, A, 0, 0)  # acknowledged at 0 ...
    v2 = h.send("i0", 2, A, 0, None, outcome="info")
    h.assign("c0", [(A, 0, 0)])
    h.poll("c0", [(A, 0, 0, v2), (A, 0, 1, v1)])  # ... but read at 1
    result = h.check()
    assert found(result) == {"inconsistent-offsets": 1}
    assert result.anomalies[0].data["acknowledged"] == v1
    assert result.anomalies[0].data["read"] == v2


def test_non_monotonic_poll_going_backwards_without_a_seek() -> None:
    h = H()
    v0, v1 = h.send("i0", 1, A, 0, 0), h.send("i0", 2, A, 0, 1)
    h.assign("c0", [(A, 0, 0)])
    h.poll("c0", [(A, 0, 0, v0), (A, 0, 1, v1)])
    h.poll("c0", [(A, 0, 0, v0)])
    result = h.check()
    assert found(result) == {"non-monotonic-poll": 1}
    assert (result.anomalies[0].data["offset"], result.anomalies[0].data["previous"]) == (0, 1)


def test_a_seek_allows_reading_again() -> None:
    h = H()
    v0, v1 = h.send("i0", 1, A, 0, 0), h.send("i0", 2, A, 0, 1)
    h.assign("c0", [(A, 0, 0)])
    h.poll("c0", [(A, 0, 0, v0), (A, 0, 1, v1)])
    h.assign("c0", [(A, 0, 0)])
    h.poll("c0", [(A, 0, 0, v0), (A, 0, 1, v1)])
    assert found(h.check()) == {}


def test_non_monotonic_poll_skipping_a_record_another_reader_saw() -> None:
    h = H()
    v0, v1, v2 = (h.send("i0", n, A, 0, n - 1) for n in (1, 2, 3))
    h.assign("c0", [(A, 0, 0)])
    h.assign("c1", [(A, 0, 0)])
    h.poll("c0", [(A, 0, 0, v0), (A, 0, 2, v2)])
    h.poll("c1", [(A, 0, 0, v0), (A, 0, 1, v1), (A, 0, 2, v2)])
    result = h.check()
    assert found(result) == {"non-monotonic-poll": 1}
    a = result.anomalies[0]
    assert (a.data["process"], a.data["skipped"]) == ("c0", 1)


def test_gaps_of_aborted_records_and_markers_are_no_skip() -> None:
    h = H()
    v0 = h.send("i0", 1, A, 0, 0)
    h.txn("t0", 1, [(A, 0, 1)], commit=False)
    v3 = h.send("i0", 2, A, 0, 3)
    h.assign("c0", [(A, 0, 0)])
    h.poll("c0", [(A, 0, 0, v0), (A, 0, 3, v3)])
    assert found(h.check()) == {}


def test_producer_order_when_later_sends_sit_at_earlier_offsets() -> None:
    h = H()
    first = h.send("i0", 1, A, 0, 1)
    second = h.send("i0", 2, A, 0, 0)
    h.assign("c0", [(A, 0, 0)])
    h.poll("c0", [(A, 0, 0, second), (A, 0, 1, first)])
    result = h.check()
    assert found(result) == {"producer-order": 1}
    a = result.anomalies[0]
    assert (a.data["first"], a.data["second"]) == ([first, 1], [second, 0])


def test_phantom_read_of_a_value_nobody_wrote_or_whose_send_failed() -> None:
    h = H()
    failed = h.send("i0", 1, A, 0, None, outcome="fail")
    h.assign("c0", [(A, 0, 0)])
    h.poll("c0", [(A, 0, 0, failed), (A, 0, 1, "zz-1")])
    result = h.check()
    assert found(result) == {"phantom-read": 2}


def test_copy_lost_and_copy_duplicate() -> None:
    h = clean_history(copy=True)
    h.ops = [op for op in h.ops if not (op["type"] == "poll" and op["records"][0][0] == COPY)]
    h.poll("drain", [(COPY, 0, 0, "i0-1"), (COPY, 0, 1, "i0-1"), (COPY, 0, 2, "t0-1-0")])  # i0-2, i0-3 missing
    result = h.check()
    assert found(result) == {"copy-lost": 2, "copy-duplicate": 1}
    assert sorted(a.data["value"] for a in result.anomalies if a.kind == "copy-lost") == ["i0-2", "i0-3"]


def test_an_unfinished_copier_leaves_missing_copies_unverified() -> None:
    h = clean_history(copy=True)
    for op in h.ops:
        if op["type"] == "copier":
            op["caught_up"] = False
    h.ops = [op for op in h.ops if not (op["type"] == "poll" and op["records"][0][0] == COPY)]
    result = h.check()
    assert found(result) == {}
    assert result.counts["copy-unverified"] == 4


def test_details_are_capped_but_every_anomaly_counted() -> None:
    h = H()
    h.assign("c0", [(A, 0, 0)])
    h.poll("c0", [(A, 0, n, f"zz-{n}") for n in range(500)])
    result = h.check()
    assert result.counts_by_kind["phantom-read"] == 500
    assert len(result.anomalies) == 200


# ---- availability ------------------------------------------------------------------------------------------


def test_longest_gap_and_first_after() -> None:
    times = [1.0, 2.0, 3.0, 8.0, 9.0]
    assert longest_gap(times, 0.0, 10.0) == 5.0
    assert longest_gap(times, 3.5, 7.0) == 3.5  # nothing inside: the whole window
    assert longest_gap(times, 2.5, 8.5) == 5.0
    assert longest_gap([], 1.0, 4.0) == 3.0
    assert longest_gap(times, 5.0, 5.0) == 0.0
    assert first_after(times, 7.0) == 1.0
    assert first_after(times, 9.5) is None


def test_fault_windows_pair_starts_with_heals() -> None:
    windows = fault_windows([
        ("start", "kill", [2], 1.0), ("heal", "kill", [2], 4.0),
        ("start", "pause", [3], 6.0), ("start", "leader-isolation", [1], 7.0), ("heal", "pause", [3], 8.0),
        ("heal", "bridge", [1], 9.0),  # heals nothing
    ])  # fmt: skip
    assert [(w.fault, w.nodes, w.start, w.heal) for w in windows] == [
        ("kill", (2,), 1.0, 4.0),
        ("pause", (3,), 6.0, 8.0),
        ("leader-isolation", (1,), 7.0, None),
    ]


def test_availability_per_fault_window_and_outside() -> None:
    commits = [1.0, 2.0, 3.0, 8.0, 9.0]
    acks = [0.5, 4.0, 5.0, 7.5]
    a = compute_availability(commits, acks, [("start", "kill", [2], 3.5), ("heal", "kill", [2], 7.0)], 0.0, 10.0)
    (w,) = a.windows
    assert (w.commits, w.acks) == (0, 2)
    assert w.longest_commit_gap == pytest.approx(3.5)
    assert w.longest_ack_gap == pytest.approx(2.0)  # 5.0 .. 7.0
    assert w.commit_recovery == pytest.approx(1.0)
    assert w.ack_recovery == pytest.approx(0.5)
    assert a.outside_seconds == pytest.approx(6.5)
    assert a.outside_longest_commit_gap == pytest.approx(1.0)
    assert a.outside_longest_ack_gap == pytest.approx(3.0)  # 0.5 .. 3.5
    assert a.max_single_node_commit_gap() == pytest.approx(3.5)


def test_an_unhealed_fault_lasts_to_the_end_of_the_run() -> None:
    a = compute_availability([1.0], [], [("start", "majority-split", [3], 2.0)], 0.0, 6.0)
    (w,) = a.windows
    assert w.window.heal is None
    assert w.longest_commit_gap == pytest.approx(4.0)
    assert w.commit_recovery is None
    assert a.outside_longest_commit_gap == pytest.approx(1.0)


def test_max_commit_gap_makes_the_exit_code_non_zero() -> None:
    h = clean_history()
    h.fault("start", "kill", [2], 0.01)
    h.fault("heal", "kill", [2], 0.2)
    result = h.check()
    assert result.valid
    assert [w.window.fault for w in result.availability.windows] == ["kill"]
    gap = result.availability.max_single_node_commit_gap()
    assert gap is not None and gap > 0.05
    assert exit_code(result, max_commit_gap=gap + 1) == EXIT_OK
    assert exit_code(result, max_commit_gap=gap / 2) == EXIT_SLOW
    assert "exceeded" in render_text(result, gap / 2)


# ---- the history format ---------------------------------------------------------------------------------------


def test_history_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    with HistoryWriter(path) as w:
        w.meta(topics=[A])
        w.run("start")
        w.send("i0", 1, w.now(), "ok", A, 0, "i0-1", 0)
        w.txn("t0", 1, True, w.now(), "info", [(A, 0, "t0-1-0", None), (B, 1, "t0-1-1", 4)], "REQUEST_TIMED_OUT: x")
        w.assign("c0", w.now(), [(A, 0, 0)])
        w.poll("c0", w.now(), "ok", [(A, 0, 0, "i0-1")])
        w.fault("start", "kill", [2], time_=1.5)
        w.drain(A, 0, 1, True)
        w.run("end")
        assert w.lines == 9
    ops = list(read_history(path))
    kinds = ["meta", "run", "send", "txn-commit", "assign", "poll", "fault", "drain", "run"]
    assert [op["type"] for op in ops] == kinds
    assert ops[3]["records"] == [[A, 0, "t0-1-0", None], [B, 1, "t0-1-1", 4]]
    assert ops[3]["outcome"] == "info" and ops[3]["error"] == "REQUEST_TIMED_OUT: x"
    assert ops[5]["records"] == [[A, 0, 0, "i0-1"]]
    assert ops[6] == {"type": "fault", "kind": "start", "fault": "kill", "nodes": [2], "time": 1.5}
    assert all(op["complete"] >= op["invoke"] for op in ops if "invoke" in op)
    assert check(ops).valid
    copy = tmp_path / "copy.jsonl"
    assert write_history(copy, ops) == 9
    assert list(read_history(copy)) == ops


def test_a_torn_last_line_is_ignored_but_a_corrupt_line_is_an_error(tmp_path: Path) -> None:
    good = json.dumps({"type": "run", "kind": "start", "time": 0.0})
    torn = tmp_path / "torn.jsonl"
    torn.write_text(good + "\n" + '{"type": "po')
    assert [op["type"] for op in read_history(torn)] == ["run"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good + "\n{oops\n" + good + "\n")
    with pytest.raises(HistoryError, match=":2"):
        list(read_history(bad))
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text(json.dumps({"type": "send", "process": "i0", "invoke": 0, "complete": 1, "outcome": "maybe"}))
    with pytest.raises(HistoryError, match="outcome"):
        list(read_history(wrong))


# ---- the command, offline --------------------------------------------------------------------------------------


def test_verify_history_command_exit_codes_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clean = tmp_path / "clean.jsonl"
    write_history(clean, clean_history().ops)
    assert verify_main(["--history", str(clean)]) == EXIT_OK
    assert "VALID: no anomalies" in capsys.readouterr().out
    h = clean_history()
    h.poll("c9", [(A, 0, 0, "i0-1"), (A, 0, 0, "i0-2")])  # the same offset twice, with two values
    bad = tmp_path / "bad.jsonl"
    write_history(bad, h.ops)
    assert verify_main(["--history", str(bad), "--json"]) == EXIT_ANOMALY
    out = json.loads(capsys.readouterr().out)
    assert out["valid"] is False
    assert out["anomaly_counts"]["inconsistent-offsets"] == 1
    assert out["exit_code"] == EXIT_ANOMALY


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nemesis", "--bootstrap", "http://127.0.0.1:1"], "never runs against --bootstrap"),
        ([], "give --bootstrap"),
        (["--bootstrap", "http://127.0.0.1:1", "--faults", "kill"], "--faults needs --nemesis"),
        (["--bootstrap", "http://127.0.0.1:1", "--duration", "0"], "--duration"),
        (["--bootstrap", "http://127.0.0.1:1", "--node-python", "/usr/bin/python3"], "need --nemesis"),
        (["--nemesis", "--node-checkout", "/nonexistent"], "is no txbroker checkout"),
    ],
)
def test_verify_command_refuses_bad_arguments(argv: list[str], message: str, capsys: Capture) -> None:
    assert verify_main(argv) == 2
    assert message in capsys.readouterr().err


def test_verify_history_of_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert verify_main(["--history", str(tmp_path / "nope.jsonl")]) == 2
    assert "cannot check" in capsys.readouterr().err
