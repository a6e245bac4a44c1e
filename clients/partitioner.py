"""Kafka's default partitioner hash (murmur2), so keys land where Kafka would put them."""

from __future__ import annotations

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (seed 0x9747b28c), as a signed 32-bit int."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    n4 = length // 4
    for i in range(n4):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length % 4
    tail = 4 * n4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """``toPositive(murmur2(key)) % numPartitions``, Kafka's keyed partition choice."""
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions
