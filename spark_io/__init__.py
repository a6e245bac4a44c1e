"""Spark connector for txbroker: exactly-once batch and streaming reads and writes (PySpark >= 4.2).

``spark_io.register(spark)`` registers the ``txbroker`` format; installing the
package also ships ``pyspark_txbroker``, which PySpark discovers by itself
(top-level ``pyspark_*`` modules exporting ``DefaultSource``), so
``spark.read.format("txbroker")`` works with no call at all. See docs/spark.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .source import TxBrokerDataSource

__all__ = ["TxBrokerDataSource", "register"]


def register(spark: Any) -> None:
    """Register the ``txbroker`` data source with ``spark`` (a ``SparkSession``)."""
    from .source import TxBrokerDataSource

    spark.dataSource.register(TxBrokerDataSource)


def __getattr__(name: str) -> Any:
    if name == "TxBrokerDataSource":
        from .source import TxBrokerDataSource

        return TxBrokerDataSource
    raise AttributeError(f"module 'spark_io' has no attribute {name!r}")
