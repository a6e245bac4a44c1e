"""One module per Kafka API; ``ALL_APIS`` is what the listener serves and what ApiVersions advertises."""

from __future__ import annotations

from ..api import KafkaApi
from . import (
    add_offsets_to_txn,
    add_partitions_to_txn,
    alter_configs,
    api_versions,
    create_acls,
    create_partitions,
    create_topics,
    delete_acls,
    delete_topics,
    describe_acls,
    describe_cluster,
    describe_configs,
    describe_producers,
    describe_transactions,
    end_txn,
    fetch,
    find_coordinator,
    incremental_alter_configs,
    init_producer_id,
    list_offsets,
    list_transactions,
    metadata,
    produce,
    sasl_authenticate,
    sasl_handshake,
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
    # admin
    create_topics.API,
    delete_topics.API,
    create_partitions.API,
    describe_configs.API,
    alter_configs.API,
    incremental_alter_configs.API,
    describe_cluster.API,
    describe_acls.API,
    create_acls.API,
    delete_acls.API,
    # SASL
    sasl_handshake.API,
    sasl_authenticate.API,
)
