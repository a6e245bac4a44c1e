"""Asyncio twins of the sync clients: ``AsyncProducer``, ``AsyncConsumer``, ``AsyncAdmin``."""

from __future__ import annotations

from ._metadata import MetadataCache, PartitionInfo, parse_bootstrap
from ._session import HttpSession

__all__ = ["HttpSession", "MetadataCache", "PartitionInfo", "parse_bootstrap"]
