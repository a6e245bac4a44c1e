"""One SparkSession for every Spark test (local[2,3]: two cores, three attempts per task) and one 3-node cluster.

PySpark pickles the data source by reference, so ``spark_io`` must be
importable in every Python process the JVM starts: PYTHONPATH and the worker
interpreter are set before the JVM starts (setting them later does not reach
forked workers). The cluster is shared by the tests of this directory (each
test uses its own topics and write ids); tests that kill nodes make their own.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import LocalCluster

# Without the spark extra or Java these tests are not collected at all (CI installs both).
if not all(importlib.util.find_spec(m) for m in ("pyspark", "pyarrow", "numpy")) or shutil.which("java") is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from spark_io.session import local_session

    session = local_session(
        "local[2,3]",
        "txbroker-tests",
        **{
            "spark.default.parallelism": "2",
            "spark.sql.session.timeZone": "UTC",
            "spark.driver.memory": "1g",
            "spark.sql.streaming.stopTimeout": "10s",
        },
    )
    session.sparkContext.setLogLevel("FATAL")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(Path(tmp_path_factory.mktemp("spark-cluster")), 3, transaction_abort_scan_interval_ms=1000)
    try:
        yield c.start()
    finally:
        c.close()
