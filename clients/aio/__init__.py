"""Asyncio twins of the sync clients: ``AsyncProducer``, ``AsyncConsumer``, ``AsyncAdmin``."""

from __future__ import annotations

from ._group import ConsumerRebalanceListener
from ._http1 import Http1Pool
from ._metadata import MetadataCache, PartitionInfo, parse_bootstrap
from ._session import HttpSession
from .admin import AsyncAdmin
from .batch_builder import BatchBuilder
from .consumer import AsyncConsumer
from .producer import AsyncProducer

__all__ = [
    "AsyncAdmin",
    "AsyncConsumer",
    "AsyncProducer",
    "BatchBuilder",
    "ConsumerRebalanceListener",
    "Http1Pool",
    "HttpSession",
    "MetadataCache",
    "PartitionInfo",
    "parse_bootstrap",
]
