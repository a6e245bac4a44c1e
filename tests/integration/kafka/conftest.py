"""The Kafka listener's tests: one 3-node cluster per module, reached by real Kafka client libraries."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import LocalCluster

_names = itertools.count()


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A started 3-node cluster shared by a module's tests (each test makes its own topics and groups)."""
    directory: Path = tmp_path_factory.mktemp("kafka")
    cluster = LocalCluster(directory, 3)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


def unique(prefix: str) -> str:
    """A name no other test of the session uses (topics, groups, transactional ids)."""
    return f"{prefix}-{next(_names)}"
