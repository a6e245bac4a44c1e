"""Tokens and receipts of carried markers (docs/carried-markers.md). Pure.

* A **token** lets a producer's next transactional batch carry the marker of
  its previous transaction into a partition: "transaction ``(pid, epoch - 1)``
  of ``transactional_id`` is decided COMMIT/ABORT by coordinator epoch ``c``;
  ``(pid, epoch)`` is reserved on ``topic-partition``". The producer id, the
  epoch and the partition are not in the token: the batch and the request
  carry them, and the MAC covers them, so a token works for exactly one
  (transactional id, producer id, epoch, partition).
* A **receipt** is the partition leader's word that the producer has
  transactional data of ``epoch`` on ``topic-partition``, and so that the
  previous transaction's marker is in that partition's log.

Both are HMAC-SHA256 (truncated to 16 bytes) under a key derived from the
cluster secret, so only nodes of the cluster can make them. Wire form:
URL-safe base64 without padding (``clients.protocol.encode_token``). Token bytes: version u8 | control type u8 |
coordinator epoch i32 | MAC; receipt bytes: version u8 | MAC.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass

from clients.protocol import BrokerError, ControlType, ErrorCode

__all__ = ["CarriedMarker", "TxnTokens"]

_VERSION = 1
_MAC_BYTES = 16
_TOKEN_HEAD = struct.Struct(">BBi")
_TOKEN_BYTES = _TOKEN_HEAD.size + _MAC_BYTES
_RECEIPT_BYTES = 1 + _MAC_BYTES
_KEY_LABEL = b"txbroker carried-marker tokens v1"


@dataclass(frozen=True, slots=True)
class CarriedMarker:
    """What a valid token lets the partition write in front of the batch."""

    control_type: ControlType
    coordinator_epoch: int


class TxnTokens:
    """Makes and checks tokens and receipts under one cluster's key."""

    def __init__(self, cluster_secret: str) -> None:
        if not cluster_secret:
            raise ValueError("the cluster secret must not be empty")
        self._key = hmac.new(cluster_secret.encode("utf-8"), _KEY_LABEL, hashlib.sha256).digest()

    def _mac(self, *fields: object) -> bytes:
        msg = "\x1f".join(str(f) for f in fields).encode("utf-8")
        return hmac.new(self._key, msg, hashlib.sha256).digest()[:_MAC_BYTES]

    def token(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        topic: str,
        partition: int,
        marker: CarriedMarker,
    ) -> bytes:
        """The token for ``(producer_id, producer_epoch)``'s first batch on ``topic-partition``."""
        head = _TOKEN_HEAD.pack(_VERSION, int(marker.control_type), marker.coordinator_epoch)
        mac = self._mac("token", head.hex(), transactional_id, producer_id, producer_epoch, topic, partition)
        return head + mac

    def open_token(
        self, raw: bytes, transactional_id: str, producer_id: int, producer_epoch: int, topic: str, partition: int
    ) -> CarriedMarker:
        """The marker ``raw`` carries for this batch; ``INVALID_REQUEST`` if it was not made for it."""
        if len(raw) != _TOKEN_BYTES or raw[0] != _VERSION:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "malformed transaction token")
        head, mac = raw[: _TOKEN_HEAD.size], raw[_TOKEN_HEAD.size :]
        want = self._mac("token", head.hex(), transactional_id, producer_id, producer_epoch, topic, partition)
        if not hmac.compare_digest(mac, want):
            raise BrokerError(
                ErrorCode.INVALID_REQUEST,
                f"the transaction token was not made for producer {producer_id} epoch {producer_epoch} "
                f"of {transactional_id!r} on {topic}-{partition}",
            )
        _version, ctype, coordinator_epoch = _TOKEN_HEAD.unpack(head)
        try:
            control = ControlType(ctype)
        except ValueError as exc:  # a node of this cluster made it: a bug, not the client's fault
            raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"token with control type {ctype}") from exc
        return CarriedMarker(control, coordinator_epoch)

    def receipt(
        self, transactional_id: str, producer_id: int, producer_epoch: int, topic: str, partition: int
    ) -> bytes:
        mac = self._mac("receipt", transactional_id, producer_id, producer_epoch, topic, partition)
        return bytes((_VERSION,)) + mac

    def check_receipt(
        self, raw: bytes, transactional_id: str, producer_id: int, producer_epoch: int, topic: str, partition: int
    ) -> bool:
        """Whether ``raw`` is this cluster's receipt for exactly these fields."""
        if len(raw) != _RECEIPT_BYTES:
            return False
        want = self.receipt(transactional_id, producer_id, producer_epoch, topic, partition)
        return hmac.compare_digest(raw, want)
