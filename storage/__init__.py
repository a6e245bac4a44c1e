"""The partition log in RocksDB: record batches by offset, high watermark,
producer state, open transactions and the last stable offset, the
aborted-transaction index, retention and snapshots (DESIGN.md "Storage layout").

Imports only ``clients.protocol`` from the rest of txbroker.
"""

from storage.commands import (
    AppendResult,
    RetentionResult,
    TxnMarkerResult,
    encode_append,
    encode_delete_records,
    encode_retention,
    encode_txn_marker,
)
from storage.errors import StorageCorruptionError, StorageError
from storage.partition_log import LogReadInfo, PartitionLog
from storage.producer_state import BatchMetadata, ProducerStateEntry
from storage.store import NodeStore
from storage.txn_index import AbortedTxn

__all__ = [
    "AbortedTxn",
    "AppendResult",
    "BatchMetadata",
    "LogReadInfo",
    "NodeStore",
    "PartitionLog",
    "ProducerStateEntry",
    "RetentionResult",
    "StorageCorruptionError",
    "StorageError",
    "TxnMarkerResult",
    "encode_append",
    "encode_delete_records",
    "encode_retention",
    "encode_txn_marker",
]
