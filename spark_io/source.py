"""The ``txbroker`` Spark data source (PySpark >= 4.2 Python Data Source API).

This class is pickled *by reference*, so ``spark_io`` must be importable in
every Python process Spark starts (driver planner, streaming runner, commit
process, executors): install the package on every node or ship a packed
virtualenv (docs/spark.md). Options are parsed here, in the planner, so a bad
option fails the query before any task starts.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from clients.protocol import BrokerError, ErrorCode

from .options import ReaderOptions, WriterOptions

NAME = "txbroker"


def kafka_schema(include_headers: bool = True) -> StructType:
    """Spark's Kafka source schema (``headers`` only with ``includeHeaders``, on by default here)."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


class TxBrokerDataSource(DataSource):
    """``spark.read/readStream.format("txbroker")`` and ``df.write/writeStream.format("txbroker")``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def _include_headers(self) -> bool:
        v = {k.lower(): str(val) for k, val in self.options.items()}.get("includeheaders", "true")
        return v.strip().lower() not in ("false", "0", "no")

    def schema(self) -> StructType:
        return kafka_schema(self._include_headers())

    def _check_schema(self, schema: StructType) -> None:
        expected = kafka_schema(self._include_headers())
        if schema != expected:
            raise BrokerError(ErrorCode.INVALID_CONFIG,
                              f"the txbroker source has a fixed schema: {expected.simpleString()}")  # fmt: skip

    def reader(self, schema: StructType) -> DataSourceReader:
        from .reader import BatchReader

        self._check_schema(schema)
        return BatchReader(ReaderOptions.parse(self.options, streaming=False), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from .stream_reader import StreamReader

        self._check_schema(schema)
        return StreamReader(ReaderOptions.parse(self.options, streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        from .writer import BatchWriter

        if overwrite:
            raise BrokerError(ErrorCode.INVALID_CONFIG, "a topic is a log: use mode('append')")
        return BatchWriter(WriterOptions.parse(self.options, streaming=False))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        from .writer import StreamWriter

        return StreamWriter(WriterOptions.parse(self.options, streaming=True))
