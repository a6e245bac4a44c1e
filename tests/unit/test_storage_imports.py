"""DESIGN.md package table: storage/ may import only ``clients.protocol`` of txbroker's packages."""

from __future__ import annotations

import ast
import pathlib

import pytest

STORAGE = pathlib.Path(__file__).resolve().parents[2] / "storage"
OURS = {"cluster", "raft", "coordinator", "clients", "spark_io", "tests", "ops"}
ALLOWED = {"clients.protocol", "raft.state_machine"}


@pytest.mark.parametrize("path", sorted(STORAGE.glob("*.py")), ids=lambda p: p.name)
def test_storage_imports_only_the_wire_types(path: pathlib.Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            if name.split(".")[0] in OURS:
                assert name in ALLOWED, f"{path.name} imports {name}"
