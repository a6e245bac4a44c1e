"""Shared fixtures: a factory for real local clusters that always cleans up."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import LocalCluster


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    made: list[LocalCluster] = []

    def factory(n: int = 3, **overrides: Any) -> LocalCluster:
        c = LocalCluster(tmp_path / f"cluster{len(made)}", n, **overrides)
        made.append(c)
        return c.start()

    yield factory
    for c in made:
        c.close()
