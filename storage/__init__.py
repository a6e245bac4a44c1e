"""The partition log in RocksDB: record batches by offset, high watermark,
producer state, retention and snapshots (DESIGN.md "Storage layout").

Imports only ``clients.protocol`` from the rest of txbroker.
"""

from storage.commands import (
    AppendResult,
    RetentionResult,
    encode_append,
    encode_delete_records,
    encode_retention,
)
from storage.errors import StorageCorruptionError, StorageError
from storage.partition_log import PartitionLog
from storage.producer_state import BatchMetadata, ProducerStateEntry
from storage.store import NodeStore

__all__ = [
    "AppendResult",
    "BatchMetadata",
    "NodeStore",
    "PartitionLog",
    "ProducerStateEntry",
    "RetentionResult",
    "StorageCorruptionError",
    "StorageError",
    "encode_append",
    "encode_delete_records",
    "encode_retention",
]
