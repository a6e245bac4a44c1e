"""One module per Kafka API; ``ALL_APIS`` is what the listener serves and what ApiVersions advertises."""

from __future__ import annotations

from ..api import KafkaApi
from . import (
    api_versions,
    delete_groups,
    describe_groups,
    fetch,
    find_coordinator,
    heartbeat,
    join_group,
    leave_group,
    list_groups,
    list_offsets,
    metadata,
    offset_commit,
    offset_delete,
    offset_fetch,
    produce,
    sync_group,
)

__all__ = ["ALL_APIS"]

ALL_APIS: tuple[KafkaApi, ...] = (
    api_versions.API,
    metadata.API,
    produce.API,
    fetch.API,
    list_offsets.API,
    find_coordinator.API,
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
