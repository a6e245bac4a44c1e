"""The controller: cluster metadata as a Raft-replicated state machine.

The controller group spans every node. Its state -- topics with their replica
placement and config, the next topic id, and the next producer-id block -- is
small, so it is kept as one immutable ``ControllerView`` and persisted as a
single checksummed JSON value together with the last applied Raft index (one
RocksDB WriteBatch, DESIGN rule 3).

Users and ACLs (``cluster.security_state.SecurityView``) are part of the same
replicated state, kept beside the view and persisted under their own key
(``C/security``), written only when they change, in the same WriteBatch as
the applied index. A store without that key holds no users and no ACLs. A
snapshot carries both (format 2; a format-1 snapshot has no security part).
A security command answers ``SecurityChange(index, result)`` so its proposer
can wait until every node applied that index.

Thread-safety: ``apply``/``write_snapshot``/``read_snapshot`` run on the Raft
ticker thread. Other threads read ``view`` and ``security`` (immutable values replaced
atomically) and never see a half-applied command. ``on_change`` is called on
the ticker thread after every state change; it must only hand off (e.g.
``loop.call_soon_threadsafe``).
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, BinaryIO

import crc32c
from rocksdict import WriteBatch

from clients.protocol import BrokerError, ErrorCode
from raft.state_machine import NOOP_COMMAND
from storage.store import NodeStore

from .controller_view import ControllerView
from .membership import MEMBERSHIP_OPS, apply_membership
from .security_state import SECURITY_OPS, SecurityChange, SecurityView, apply_security
from .topic_admin import ADD_PARTITIONS, ALTER_TOPIC_CONFIG, apply_add_partitions, apply_alter_config
from .topics import PartitionAssignment, TopicMetadata

log = logging.getLogger(__name__)

PRODUCER_ID_BLOCK_SIZE = 1000
_STATE_KEY = b"C/state"
_SECURITY_KEY = b"C/security"
_FORMAT_VERSION = 1
_SNAPSHOT_VERSION = 2  # a snapshot with its security part
_SECURITY_VERSION = 1
_HEAD = struct.Struct(">BIq")  # version, crc32c(json), last_applied


class ControllerCorruptionError(Exception):
    """The persisted controller state failed its checksum."""


# ---- commands (JSON; small and rare) -------------------------------------


def create_topic_command(
    name: str,
    assignment: tuple[PartitionAssignment, ...],
    config: Mapping[str, int | str],
    now_ms: int,
) -> bytes:
    return json.dumps(
        {
            "op": "create_topic",
            "name": name,
            "partitions": [[a.partition, list(a.replicas)] for a in assignment],
            "config": dict(config),
            "now_ms": now_ms,
        }
    ).encode()


def delete_topic_command(name: str) -> bytes:
    return json.dumps({"op": "delete_topic", "name": name}).encode()


def allocate_producer_ids_command(node_id: int) -> bytes:
    return json.dumps({"op": "allocate_producer_ids", "node_id": node_id}).encode()


@dataclass(frozen=True, slots=True)
class ProducerIdBlock:
    first: int
    size: int

    @property
    def last(self) -> int:
        return self.first + self.size - 1


class ControllerStateMachine:
    """Implements ``raft.state_machine.StateMachine`` for the controller group."""

    def __init__(self, store: NodeStore) -> None:
        self._store = store
        self._last_applied = 0
        self.view = ControllerView()
        self.security = SecurityView()
        self.on_change: Callable[[ControllerView], None] | None = None
        #: Called (ticker thread) with the applied index after every change of ``security``.
        self.on_security_change: Callable[[int], None] | None = None
        raw = store.db.get(_STATE_KEY)
        if raw is not None:
            self.view, self._last_applied = self._decode(raw)
        raw = store.db.get(_SECURITY_KEY)
        if raw is not None:
            self.security = self._decode_security(raw)

    @staticmethod
    def _encode(view: ControllerView, last_applied: int) -> bytes:
        body = json.dumps(view.to_json(), separators=(",", ":")).encode()
        return _HEAD.pack(_FORMAT_VERSION, crc32c.crc32c(body), last_applied) + body

    @staticmethod
    def _decode(raw: bytes) -> tuple[ControllerView, int]:
        if len(raw) < _HEAD.size:
            raise ControllerCorruptionError("controller state is truncated")
        version, crc, last_applied = _HEAD.unpack_from(raw, 0)
        body = raw[_HEAD.size :]
        if version != _FORMAT_VERSION:
            raise ControllerCorruptionError(f"unknown controller state version {version}")
        if crc32c.crc32c(body) != crc:
            raise ControllerCorruptionError("controller state failed its checksum")
        try:
            return ControllerView.from_json(json.loads(body)), int(last_applied)
        except (ValueError, KeyError, TypeError) as exc:
            raise ControllerCorruptionError(f"controller state is unreadable: {exc}") from exc

    @staticmethod
    def _encode_security(security: SecurityView) -> bytes:
        body = json.dumps(security.to_json(), separators=(",", ":")).encode()
        return _HEAD.pack(_SECURITY_VERSION, crc32c.crc32c(body), 0) + body

    @staticmethod
    def _decode_security(raw: bytes) -> SecurityView:
        if len(raw) < _HEAD.size:
            raise ControllerCorruptionError("controller security state is truncated")
        version, crc, _ = _HEAD.unpack_from(raw, 0)
        body = raw[_HEAD.size :]
        if version != _SECURITY_VERSION:
            raise ControllerCorruptionError(f"unknown controller security state version {version}")
        if crc32c.crc32c(body) != crc:
            raise ControllerCorruptionError("controller security state failed its checksum")
        try:
            return SecurityView.from_json(json.loads(body))
        except (ValueError, KeyError, TypeError, BrokerError) as exc:
            raise ControllerCorruptionError(f"controller security state is unreadable: {exc}") from exc

    @property
    def last_applied(self) -> int:
        return self._last_applied

    def _persist(self, view: ControllerView, index: int, security: SecurityView | None = None) -> None:
        new_security = security if security is not None and security is not self.security else None
        wb = WriteBatch(raw_mode=True)
        wb.put(_STATE_KEY, self._encode(view, index))
        if new_security is not None:
            wb.put(_SECURITY_KEY, self._encode_security(new_security))
        self._store.write(wb)
        changed = view is not self.view
        self.view = view
        if new_security is not None:
            self.security = new_security
        self._last_applied = index
        if changed and self.on_change is not None:
            self.on_change(view)
        if new_security is not None and self.on_security_change is not None:
            self.on_security_change(index)

    def apply(self, index: int, command: bytes) -> Any:
        if index <= self._last_applied:
            return None
        try:
            if command == NOOP_COMMAND:
                self._persist(self.view, index)
                return None
            cmd = json.loads(command)
            if isinstance(cmd, dict) and cmd.get("op") in SECURITY_OPS:
                result, security = apply_security(self.security, cmd)
                self._persist(self.view, index, security)
                return result if isinstance(result, BrokerError) else SecurityChange(index, result)
            result, view = self._apply(cmd)
            self._persist(view, index)
            return result
        except Exception as exc:  # a raise here would wedge the group on every replica
            log.exception("controller apply failed at index %d", index)
            try:
                self._persist(self.view, index)
            except Exception:
                log.exception("controller could not record index %d", index)
            return BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"controller apply failed: {exc}")

    def _apply(self, cmd: Mapping[str, Any]) -> tuple[Any, ControllerView]:
        """Pure transition: (result, next view). Errors are results, not exceptions."""
        v = self.view
        op = cmd.get("op")
        if op in MEMBERSHIP_OPS:
            return apply_membership(v, cmd)
        if op == "create_topic":
            name = str(cmd["name"])
            if name in v.topics:
                return BrokerError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists"), v
            meta = TopicMetadata(
                name=name,
                topic_id=v.next_topic_id,
                partitions=tuple(
                    PartitionAssignment(int(p), tuple(int(r) for r in reps)) for p, reps in cmd["partitions"]
                ),
                config=dict(cmd["config"]),
                created_ms=int(cmd["now_ms"]),
            )
            topics = dict(v.topics)
            topics[name] = meta
            return meta, replace(
                v,
                topics=topics,
                next_topic_id=v.next_topic_id + 1,
                placement_cursor=v.placement_cursor + 1,
            )
        if op == "delete_topic":
            name = str(cmd["name"])
            if name not in v.topics:
                return BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}"), v
            topics = dict(v.topics)
            deleted = topics.pop(name)
            moves = {g: m for g, m in v.reassignments.items() if m.topic != name}
            return deleted, replace(v, topics=topics, reassignments=moves)
        if op in (ADD_PARTITIONS, ALTER_TOPIC_CONFIG):  # cluster.topic_admin: grow a topic, change its config
            transition = apply_add_partitions if op == ADD_PARTITIONS else apply_alter_config
            result, grown = transition(v.topics, cmd)
            return result, v if grown is v.topics else replace(v, topics=grown)
        if op == "allocate_producer_ids":
            block = ProducerIdBlock(v.next_producer_id, PRODUCER_ID_BLOCK_SIZE)
            return block, replace(v, next_producer_id=v.next_producer_id + PRODUCER_ID_BLOCK_SIZE)
        return BrokerError(ErrorCode.INVALID_REQUEST, f"unknown controller command {op!r}"), v

    def write_snapshot(self, out: BinaryIO) -> None:
        body = json.dumps(
            {"view": self.view.to_json(), "security": self.security.to_json()}, separators=(",", ":")
        ).encode()
        out.write(_HEAD.pack(_SNAPSHOT_VERSION, crc32c.crc32c(body), self._last_applied) + body)

    def read_snapshot(self, inp: BinaryIO, last_applied: int) -> None:
        raw = inp.read()
        if len(raw) >= _HEAD.size and raw[0] == _SNAPSHOT_VERSION:
            _, crc, _ = _HEAD.unpack_from(raw, 0)
            body = raw[_HEAD.size :]
            if crc32c.crc32c(body) != crc:
                raise ControllerCorruptionError("controller snapshot failed its checksum")
            try:
                d = json.loads(body)
                view = ControllerView.from_json(d["view"])
                security = SecurityView.from_json(d["security"])
            except (ValueError, KeyError, TypeError, BrokerError) as exc:
                raise ControllerCorruptionError(f"controller snapshot is unreadable: {exc}") from exc
        else:
            view, _ = self._decode(raw)
            security = SecurityView()
        if security == self.security:
            security = self.security
        self._persist(view, last_applied, security)
        if self.on_change is not None:
            self.on_change(view)
