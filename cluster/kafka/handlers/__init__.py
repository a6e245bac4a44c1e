"""One module per Kafka API; ``ALL_APIS`` is what the listener serves and what ApiVersions advertises."""

from __future__ import annotations

from ..api import KafkaApi
from . import (
    add_offsets_to_txn,
    add_partitions_to_txn,
    api_versions,
    describe_producers,
    describe_transactions,
    end_txn,
    fetch,
    find_coordinator,
    init_producer_id,
    list_offsets,
    list_transactions,
    metadata,
    produce,
    txn_offset_commit,
)

__all__ = ["ALL_APIS"]

ALL_APIS: tuple[KafkaApi, ...] = (
    api_versions.API,
    metadata.API,
    produce.API,
    fetch.API,
    list_offsets.API,
    find_coordinator.API,
    init_producer_id.API,
    add_partitions_to_txn.API,
    add_offsets_to_txn.API,
    end_txn.API,
    txn_offset_commit.API,
    describe_producers.API,
    list_transactions.API,
    describe_transactions.API,
)
