"""The storage apply benchmark's rate functions (the rocksdict baseline of ``txbroker bench produce``)."""

from __future__ import annotations

import pathlib

from bench.storage_apply import apply_rate, raw_put_rate


def test_bench_functions_report_rates(tmp_path: pathlib.Path) -> None:
    assert raw_put_rate(tmp_path / "raw", 4096, 20) > 0
    assert apply_rate(tmp_path / "apply", 4096, 20) > 0
