"""Drive a real PartitionLog through transactional appends and markers (unit-test support)."""

from __future__ import annotations

from clients.protocol import BrokerError, ControlType, Record, encode_batch
from clients.txn_filter import visible_records
from storage.commands import (
    AppendResult,
    RevokeResult,
    TxnMarkerCommand,
    TxnMarkerResult,
    encode_append,
    encode_carried_append,
    encode_revoke_marker,
    encode_txn_marker,
)
from storage.partition_log import PartitionLog


def make_batch(
    pid: int = -1,
    epoch: int = -1,
    seq: int = -1,
    *,
    records: int = 1,
    txn: bool = False,
    ts: int = 1000,
    tag: str = "r",
) -> bytes:
    """A batch whose record values are ``tag0``, ``tag1``, ..."""
    values = [Record(value=f"{tag}{i}".encode(), timestamp=ts) for i in range(records)]
    return encode_batch(values, producer_id=pid, producer_epoch=epoch, base_sequence=seq, transactional=txn)


class TxnLog:
    """Applies commands to ``log`` at consecutive Raft indexes, with a clock that moves 1 ms per command."""

    def __init__(self, log: PartitionLog, now: int = 1000) -> None:
        self.log = log
        self.now = now

    def _next(self) -> tuple[int, int]:
        self.now += 1
        return self.log.last_applied + 1, self.now

    def send(
        self, pid: int = -1, epoch: int = -1, seq: int = -1, *, records: int = 1, txn: bool = False, tag: str = "r"
    ) -> AppendResult | BrokerError:
        index, now = self._next()
        batch = make_batch(pid, epoch, seq, records=records, txn=txn, tag=tag)
        result = self.log.apply(index, encode_append(batch, now))
        assert isinstance(result, (AppendResult, BrokerError)), result
        return result

    def ok(
        self, pid: int = -1, epoch: int = -1, seq: int = -1, *, records: int = 1, txn: bool = False, tag: str = "r"
    ) -> AppendResult:
        result = self.send(pid, epoch, seq, records=records, txn=txn, tag=tag)
        assert isinstance(result, AppendResult), result
        return result

    def plain(self, records: int = 1) -> AppendResult:
        return self.ok(records=records)

    def marker(
        self, pid: int, epoch: int, ctype: ControlType, coordinator_epoch: int = 0
    ) -> TxnMarkerResult | BrokerError:
        index, now = self._next()
        result = self.log.apply(index, encode_txn_marker(pid, epoch, coordinator_epoch, ctype, now))
        assert isinstance(result, (TxnMarkerResult, BrokerError)), result
        return result

    def end(self, pid: int, epoch: int, ctype: ControlType, coordinator_epoch: int = 0) -> TxnMarkerResult:
        result = self.marker(pid, epoch, ctype, coordinator_epoch)
        assert isinstance(result, TxnMarkerResult), result
        return result

    def carried(
        self,
        pid: int,
        epoch: int,
        seq: int,
        ctype: ControlType,
        coordinator_epoch: int = 0,
        *,
        records: int = 1,
        tag: str = "r",
        batch: bytes | None = None,
    ) -> AppendResult | BrokerError:
        """A marker of ``epoch`` carried by the producer's transactional batch of that epoch (CARRIED_APPEND)."""
        index, now = self._next()
        body = make_batch(pid, epoch, seq, records=records, txn=True, tag=tag) if batch is None else batch
        marker = TxnMarkerCommand(pid, epoch, coordinator_epoch, ctype, now)
        result = self.log.apply(index, encode_carried_append(marker, body))
        assert isinstance(result, (AppendResult, BrokerError)), result
        return result

    def revoke(
        self, pid: int, epoch: int, ctype: ControlType, coordinator_epoch: int = 0
    ) -> RevokeResult | BrokerError:
        index, now = self._next()
        result = self.log.apply(
            index, encode_revoke_marker(TxnMarkerCommand(pid, epoch, coordinator_epoch, ctype, now))
        )
        assert isinstance(result, (RevokeResult, BrokerError)), result
        return result


def read_committed(log: PartitionLog, from_offset: int, max_bytes: int = 1 << 20) -> list[tuple[int, bytes | None]]:
    """``(offset, value)`` a read_committed consumer gets from ``from_offset`` up to the LSO."""
    out: list[tuple[int, bytes | None]] = []
    position = from_offset
    while True:
        info = log.fetch(position, max_bytes, read_committed=True)
        if not info.batches:
            return out
        out.extend(
            (o, r.value) for o, r in visible_records(info.batches, info.aborted_transactions, from_offset=position)
        )
        position = info.batches[-1].last_offset + 1
