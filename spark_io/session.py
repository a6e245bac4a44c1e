"""A local SparkSession whose Python processes can import this package (tests, bench, demo).

PySpark starts planner, commit and worker processes from the JVM; they must
run an interpreter that has pyarrow and must import ``spark_io`` by name. Both
come from the environment *before* the JVM starts: ``PYSPARK_PYTHON`` (this
interpreter) and ``PYTHONPATH`` (the directory holding ``spark_io``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

SOURCE_ROOT = Path(__file__).resolve().parents[1]


def local_session(master: str = "local[2]", app_name: str = "txbroker", **conf: str) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [str(SOURCE_ROOT), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
