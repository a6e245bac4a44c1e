"""DESIGN.md package table: coordinator/ may import only ``storage``, ``raft`` and ``clients.protocol``."""

from __future__ import annotations

import ast
import pathlib

import pytest

COORDINATOR = pathlib.Path(__file__).resolve().parents[2] / "coordinator"
OURS = {"cluster", "raft", "coordinator", "clients", "storage", "spark_io", "tests", "ops"}
ALLOWED_PACKAGES = {"coordinator", "storage", "raft"}
ALLOWED_MODULES = {"clients.protocol"}


@pytest.mark.parametrize("path", sorted(COORDINATOR.glob("*.py")), ids=lambda p: p.name)
def test_coordinator_imports_only_storage_raft_and_the_wire_types(path: pathlib.Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            if top in OURS:
                assert top in ALLOWED_PACKAGES or name in ALLOWED_MODULES, f"{path.name} imports {name}"
