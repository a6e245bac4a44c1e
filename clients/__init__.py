"""txbroker's Python clients, with kafka-python's names: ``Producer``, ``Consumer``, ``Admin``.

``clients.aio`` holds the asyncio twins. The exports are imported lazily so
that server code importing only ``clients.protocol`` (the wire types) does not
load the client stack.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .admin import Admin
    from .aio._batch import DeliveryTimeoutError
    from .aio._group import ConsumerRebalanceListener
    from .consumer import Consumer
    from .producer import Producer
    from .protocol import BrokerError, ErrorCode
    from .records import (
        ConsumerGroupMetadata,
        ConsumerRecord,
        OffsetAndMetadata,
        PreparedTransaction,
        RecordMetadata,
        TopicPartition,
    )
    from .security import AclBinding

_EXPORTS = {
    "AclBinding": "clients.security",
    "Admin": "clients.admin",
    "BrokerError": "clients.protocol",
    "Consumer": "clients.consumer",
    "ConsumerGroupMetadata": "clients.records",
    "ConsumerRebalanceListener": "clients.aio._group",
    "OffsetAndMetadata": "clients.records",
    "PreparedTransaction": "clients.records",
    "ConsumerRecord": "clients.records",
    "DeliveryTimeoutError": "clients.aio._batch",
    "ErrorCode": "clients.protocol",
    "Producer": "clients.producer",
    "RecordMetadata": "clients.records",
    "TopicPartition": "clients.records",
}

__all__ = [
    "AclBinding",
    "Admin",
    "BrokerError",
    "Consumer",
    "ConsumerGroupMetadata",
    "ConsumerRebalanceListener",
    "ConsumerRecord",
    "DeliveryTimeoutError",
    "ErrorCode",
    "OffsetAndMetadata",
    "PreparedTransaction",
    "Producer",
    "RecordMetadata",
    "TopicPartition",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'clients' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
