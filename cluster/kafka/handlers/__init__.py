"""One module per Kafka API; ``ALL_APIS`` is what the listener serves and what ApiVersions advertises."""

from __future__ import annotations

from ..api import KafkaApi
from . import (
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
    fetch,
    incremental_alter_configs,
    list_offsets,
    metadata,
    produce,
    sasl_authenticate,
    sasl_handshake,
)

__all__ = ["ALL_APIS"]

ALL_APIS: tuple[KafkaApi, ...] = (
    api_versions.API,
    metadata.API,
    produce.API,
    fetch.API,
    list_offsets.API,
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
