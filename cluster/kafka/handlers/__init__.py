"""One module per Kafka API; ``ALL_APIS`` is what the listener serves and what ApiVersions advertises."""

from __future__ import annotations

from ..api import KafkaApi
from . import (
    add_offsets_to_txn,
    add_partitions_to_txn,
    api_versions,
    delete_groups,
    describe_groups,
    describe_producers,
    describe_transactions,
    end_txn,
    fetch,
    find_coordinator,
    heartbeat,
    init_producer_id,
    join_group,
    leave_group,
    list_groups,
    list_offsets,
    list_transactions,
    metadata,
    offset_commit,
    offset_delete,
    offset_fetch,
    produce,
    sync_group,
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
    join_group.API,
    sync_group.API,
    heartbeat.API,
    leave_group.API,
    offset_commit.API,
    offset_fetch.API,
    list_groups.API,
    describe_groups.API,
    delete_groups.API,
    offset_delete.API,
)
