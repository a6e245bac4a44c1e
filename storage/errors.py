"""The storage package's exceptions.

``StorageError`` is the root of every exception this package raises on its
own account. Errors that go back to a client are ``clients.protocol.BrokerError``
values instead (``apply`` returns them; ``read`` raises them).
"""

from __future__ import annotations

__all__ = ["StorageCorruptionError", "StorageError"]


class StorageError(Exception):
    """Root of the storage package's own exceptions."""


class StorageCorruptionError(StorageError):
    """Bytes on disk fail their checksum, version or consistency check.

    Raised while loading a partition (meta, producer entries, the tail batch).
    The message names the partition and the key so an operator can act: the
    usual fix is to wipe the partition and let Raft install a snapshot.
    """
