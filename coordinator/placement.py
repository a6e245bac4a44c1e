"""Which ``__transaction_state`` partition owns a transactional id (or a commit group id).

Kafka's ``partitionFor``: ``Utils.abs(id.hashCode()) % numPartitions`` with
Java's ``String.hashCode`` (31-polynomial over UTF-16 code units, 32-bit
wrap). It is stable across processes and versions -- unlike Python's salted
``hash`` -- and places ids exactly where Kafka would.
"""

from __future__ import annotations

__all__ = ["coordinator_partition", "java_string_hash"]

_MASK = 0xFFFFFFFF


def java_string_hash(value: str) -> int:
    """Java's ``String.hashCode`` as a signed 32-bit int."""
    h = 0
    data = value.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & _MASK
    return h - (1 << 32) if h & 0x80000000 else h


def coordinator_partition(transactional_id: str, num_partitions: int) -> int:
    """The partition of ``transactional_id`` among ``num_partitions`` (Kafka's ``Utils.abs`` maps MIN_VALUE to 0)."""
    if num_partitions <= 0:
        raise ValueError("num_partitions must be positive")
    h = java_string_hash(transactional_id)
    return (0 if h == -(1 << 31) else abs(h)) % num_partitions
