"""Auto-registration: PySpark registers ``DefaultSource`` of every top-level ``pyspark_*`` module it finds.

With txbroker installed, ``spark.read.format("txbroker")`` works without
calling ``spark_io.register``.
"""

from spark_io.source import TxBrokerDataSource as DefaultSource

__all__ = ["DefaultSource"]
