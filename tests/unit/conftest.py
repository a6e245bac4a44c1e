"""Unit-test fixtures: real RocksDB stores in the test's temporary directory, always closed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from storage.store import NodeStore


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """Where the ``store`` fixture's database lives (reopen it with ``open_store()``)."""
    return tmp_path / "db"


@pytest.fixture
def open_store(tmp_path: Path) -> Iterator[Callable[..., NodeStore]]:
    """Factory: ``open_store(name="db")`` opens the database ``tmp_path / name``, again after a close to reopen it.

    Every store it opened is closed at teardown (``NodeStore.close`` is idempotent).
    """
    opened: list[NodeStore] = []

    def factory(name: str = "db") -> NodeStore:
        store = NodeStore(tmp_path / name)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        store.close()


@pytest.fixture
def store(open_store: Callable[..., NodeStore]) -> NodeStore:
    """A fresh database at ``db_path``."""
    return open_store("db")
