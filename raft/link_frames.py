"""The plaintext of one node-link frame: the messages of many groups, packed (pure functions).

A node link (``raft.links``) carries every group's messages between two nodes on one
authenticated connection. What one ticker pass queued for a peer goes out as one frame
(or a few, split at ``MAX_BATCH_BYTES``); its plaintext (after AES-GCM verified it) is::

    repeat: <u16 channel length><u32 payload length><channel, UTF-8><payload>

*channel*: a group id, or ``CONTROL`` (empty) for the link's own messages (hello, node
heartbeat). *payload*: one pickled message; it is unpickled only after the receiver checked
that the sending node is a member of that group (``raft.links``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence

CONTROL = b""
ITEM_HEADER = struct.Struct("<HI")
MAX_CHANNEL_BYTES = 1024
# A frame's plaintext stops growing past this (a single larger message travels alone): a big
# AppendEntries delays the small messages queued behind it by one frame, not by all of them.
MAX_BATCH_BYTES = 1 << 20

Item = tuple[bytes, bytes]  # (channel, payload)


class MalformedBatch(ValueError):
    """A verified frame whose plaintext is not a well-formed batch (the link must be closed)."""


def item_size(channel: bytes, payload: bytes) -> int:
    """Bytes one item takes in a frame."""
    return ITEM_HEADER.size + len(channel) + len(payload)


def pack(items: Sequence[Item]) -> bytes:
    """One frame's plaintext carrying ``items`` in order."""
    parts: list[bytes] = []
    header = ITEM_HEADER.pack
    for channel, payload in items:
        if len(channel) > MAX_CHANNEL_BYTES:
            raise ValueError(f"channel of {len(channel)} bytes exceeds {MAX_CHANNEL_BYTES}")
        parts.append(header(len(channel), len(payload)))
        parts.append(channel)
        parts.append(payload)
    return b"".join(parts)


def batches(items: Sequence[Item], max_bytes: int = MAX_BATCH_BYTES) -> Iterator[bytes]:
    """``items`` in order as frame plaintexts of at most ``max_bytes`` each (an item larger than that alone)."""
    start = 0
    size = 0
    for i, (channel, payload) in enumerate(items):
        n = item_size(channel, payload)
        if size and size + n > max_bytes:
            yield pack(items[start:i])
            start, size = i, 0
        size += n
    if start < len(items):
        yield pack(items[start:])


def unpack(plain: bytes) -> list[tuple[str, bytes]]:
    """The (channel, payload) items of a frame's plaintext; raises ``MalformedBatch``."""
    items: list[tuple[str, bytes]] = []
    pos, end = 0, len(plain)
    header = ITEM_HEADER.unpack_from
    hsize = ITEM_HEADER.size
    while pos < end:
        if end - pos < hsize:
            raise MalformedBatch("truncated item header")
        clen, plen = header(plain, pos)
        pos += hsize
        if clen > MAX_CHANNEL_BYTES:
            raise MalformedBatch(f"channel of {clen} bytes exceeds {MAX_CHANNEL_BYTES}")
        if end - pos < clen + plen:
            raise MalformedBatch("truncated item")
        try:
            channel = plain[pos : pos + clen].decode("utf-8")
        except UnicodeDecodeError as e:
            raise MalformedBatch("channel is not UTF-8") from e
        pos += clen
        items.append((channel, plain[pos : pos + plen]))
        pos += plen
    return items
