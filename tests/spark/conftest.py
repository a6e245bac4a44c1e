"""One SparkSession for every Spark test (local[2,3]: two cores, three attempts per task) and one 3-node cluster.

PySpark pickles the data source by reference, so ``spark_io`` must be
importable in every Python process the JVM starts: PYTHONPATH and the worker
interpreter are set before the JVM starts (setting them later does not reach
forked workers). The cluster is shared by the tests of this directory (each
test uses its own topics and write ids); tests that kill nodes make their own.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import REPO, LocalCluster

pytest.importorskip("pyspark", reason="the spark extra is not installed")
pytest.importorskip("pyarrow", reason="the spark extra is not installed")
if shutil.which("java") is None:
    pytest.skip("Spark needs Java", allow_module_level=True)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2,3]")
        .appName("txbroker-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.stopTimeout", "10s")
        .getOrCreate()
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
