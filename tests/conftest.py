"""Shared fixtures: a factory for real local clusters that always cleans up, and one bytecode cache for the
Python processes the tests start."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import LocalCluster


@pytest.fixture(scope="session", autouse=True)
def subprocess_bytecode_cache() -> Iterator[Path]:
    """Every Python process the tests start (``txbroker node start``, CLI runs) compiles each module once per
    session: its bytecode goes to one directory of the session (``PYTHONPYCACHEPREFIX``), removed at its end.

    Without it, where ``PYTHONDONTWRITEBYTECODE`` is set, each of a cluster's node processes compiles the
    whole product from source at start (about a second of CPU per cluster on two cores); the source tree
    itself gets no ``__pycache__``.
    """
    saved = {k: os.environ.get(k) for k in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE")}
    directory = Path(tempfile.mkdtemp(prefix="txbroker-pyc-"))
    os.environ["PYTHONPYCACHEPREFIX"] = str(directory)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    try:
        yield directory
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(directory, ignore_errors=True)


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
