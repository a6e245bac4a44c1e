"""Every ``txbroker bench`` scenario answers by name, and no server package imports the bench package."""

from __future__ import annotations

import ast
import pathlib

import pytest

from cluster.cli import EXTRA_BENCHES, main

REPO = pathlib.Path(__file__).resolve().parents[2]
SERVER_PACKAGES = ("cluster", "raft", "storage", "coordinator", "clients")
HELP_ARGV = [["bench", "--help"], ["bench", "produce", "--help"]]
HELP_ARGV += [["bench", name, "--help"] for name in EXTRA_BENCHES]


@pytest.mark.parametrize("argv", HELP_ARGV, ids=" ".join)
def test_every_bench_scenario_prints_its_usage(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "usage:" in out
    if argv == ["bench", "--help"]:  # the broker scenarios' usage, after the list of the others
        assert (
            out.startswith("extra scenarios: clients (bench.clients)")
            and "{produce,fetch,failover,idle,create,all}" in out
        )


def test_a_flag_before_the_scenario_reaches_the_bench_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--no-such-flag"])
    assert exc.value.code == 2
    assert "txbroker bench: error: unrecognized arguments: --no-such-flag" in capsys.readouterr().err


@pytest.mark.parametrize("package", SERVER_PACKAGES)
def test_no_server_package_imports_the_benchmarks(package: str) -> None:
    for path in sorted((REPO / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] != "bench", f"{path.relative_to(REPO)} imports {name}"
