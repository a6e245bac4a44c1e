"""The consumer's side of a consumer group (Kafka's ``ConsumerCoordinator``): membership, heartbeats, offsets.

Terms: the *group coordinator* is the node leading the group's
``__consumer_offsets`` partition (found with ``GET /v1/coordinators/group/G``;
any node also proxies). A *generation* is one completed rebalance: its id,
this member's id and the partitions the coordinator assigned to this member
(txbroker computes the assignment on the coordinator, so JoinGroup and
SyncGroup are one long-polling ``join``).

Member states (``MemberState``, transitions checked by ``VALID_PREVIOUS``):

* ``UNJOINED``: no generation (never joined, left, or the join failed);
* ``REBALANCING``: a join request is outstanding; it answers when the
  coordinator completes the rebalance, so it may last up to the rebalance
  timeout (``max_poll_interval_ms``, as in Kafka);
* ``STABLE``: member of a generation; a heartbeat task runs every
  ``heartbeat_interval_ms``.

The heartbeat task only *flags* what it learns -- ``REBALANCE_IN_PROGRESS``
(rejoin, keep the partitions until then), ``ILLEGAL_GENERATION`` /
``UNKNOWN_MEMBER_ID`` (the generation is gone: the partitions are *lost*) --
and the consumer's ``poll`` acts on the flag: it runs the rebalance listener,
drops the assignment and starts the next join (the eager protocol: every
partition is revoked before a rejoin). Heartbeats go on while the flag waits
for ``poll``, so a member that is busy between polls keeps its session; one
that does not poll for ``max_poll_interval_ms`` leaves the group, as Kafka's
heartbeat thread does.

Offsets: ``commit`` sends the generation and member id when the consumer is a
member (the coordinator rejects a stale one with ``ILLEGAL_GENERATION`` /
``UNKNOWN_MEMBER_ID``, KIP-447); ``fetch_committed`` may ask for stable
offsets only (``UNSTABLE_OFFSET_COMMIT``, retriable, while a transactional
commit of the group is undecided).

All state is owned by the consumer's event loop; nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

from ..protocol import BrokerError, ErrorCode
from ..records import ConsumerGroupMetadata, OffsetAndMetadata, TopicPartition
from ._metadata import MetadataCache
from ._session import HttpSession

__all__ = [
    "VALID_PREVIOUS",
    "ConsumerCoordinator",
    "ConsumerRebalanceListener",
    "Generation",
    "GroupConfig",
    "HeartbeatAction",
    "MemberState",
    "heartbeat_action",
    "parse_join_answer",
    "parse_offsets",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

NO_GENERATION = -1
PROTOCOLS = ("range", "roundrobin")
JOIN_GRACE_S = 5.0  # Kafka's JOIN_GROUP_TIMEOUT_LAPSE: the join may answer just after the rebalance timeout


class MemberState(enum.Enum):
    UNJOINED = "Unjoined"
    REBALANCING = "Rebalancing"
    STABLE = "Stable"


#: Allowed previous states of each state.
VALID_PREVIOUS: Mapping[MemberState, frozenset[MemberState]] = {
    MemberState.UNJOINED: frozenset({MemberState.REBALANCING, MemberState.STABLE}),  # join failed / left / lost
    MemberState.REBALANCING: frozenset({MemberState.UNJOINED, MemberState.STABLE}),
    MemberState.STABLE: frozenset({MemberState.REBALANCING}),
}

# Errors that mean "ask again where the coordinator is".
_COORDINATOR_MOVED = frozenset(
    {
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.REQUEST_TIMED_OUT,
    }
)


@dataclass(frozen=True, slots=True)
class Generation:
    """What a completed join tells a member (Kafka's JoinGroup + SyncGroup answers)."""

    generation_id: int
    member_id: str
    leader_id: str | None
    protocol: str | None
    assignment: tuple[TopicPartition, ...]
    members: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class GroupConfig:
    group_id: str
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 3_000
    max_poll_interval_ms: int = 300_000
    protocol: str = "range"
    request_timeout_ms: int = 30_000
    retry_backoff_ms: int = 100

    def validate(self) -> None:
        if not self.group_id:
            raise BrokerError(ErrorCode.INVALID_CONFIG, "group_id must be a non-empty string")
        if self.protocol not in PROTOCOLS:
            raise BrokerError(
                ErrorCode.INVALID_CONFIG,
                f"partition_assignment_strategy must be one of {PROTOCOLS}, not {self.protocol!r}",
            )
        if min(self.session_timeout_ms, self.heartbeat_interval_ms, self.max_poll_interval_ms) < 1:
            raise BrokerError(ErrorCode.INVALID_CONFIG, "group timeouts must be positive")
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            # Kafka's rule: a member must get several heartbeats in per session.
            raise BrokerError(ErrorCode.INVALID_CONFIG, "heartbeat_interval_ms must be below session_timeout_ms")


class HeartbeatAction(enum.Enum):
    """What a heartbeat answer asks the member to do."""

    CONTINUE = "continue"  # accepted
    REJOIN = "rejoin"  # a rebalance started: rejoin, the generation is still valid until then
    LOST = "lost"  # the generation is gone (ILLEGAL_GENERATION): partitions are lost, rejoin
    RESET = "reset"  # the member is gone (UNKNOWN_MEMBER_ID): lost, and rejoin as a new member
    RETRY = "retry"  # the coordinator moved or did not answer: find it and try again


def heartbeat_action(code: ErrorCode) -> HeartbeatAction:
    if code is ErrorCode.NONE:
        return HeartbeatAction.CONTINUE
    if code is ErrorCode.REBALANCE_IN_PROGRESS:
        return HeartbeatAction.REJOIN
    if code is ErrorCode.ILLEGAL_GENERATION:
        return HeartbeatAction.LOST
    if code is ErrorCode.UNKNOWN_MEMBER_ID:
        return HeartbeatAction.RESET
    return HeartbeatAction.RETRY


def _tp(item: Any, where: str) -> TopicPartition:
    if not isinstance(item, dict):
        raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"{where}: expected a topic-partition object")
    topic, partition = item.get("topic"), item.get("partition")
    if not isinstance(topic, str) or isinstance(partition, bool) or not isinstance(partition, int):
        raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"{where}: bad topic-partition {item!r}")
    return (topic, partition)


def parse_join_answer(body: Any) -> Generation:
    """The coordinator's join answer -> ``Generation`` (a malformed one is ``UNKNOWN_SERVER_ERROR``)."""
    if not isinstance(body, dict):
        raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, "join answer is not a JSON object")
    gen, member = body.get("generation_id"), body.get("member_id")
    if isinstance(gen, bool) or not isinstance(gen, int) or not isinstance(member, str) or not member:
        raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"join answer lacks generation_id/member_id: {body!r}")
    assignment = tuple(_tp(a, "join answer assignment") for a in body.get("assignment") or [])
    leader, protocol = body.get("leader_id"), body.get("protocol")
    return Generation(
        generation_id=gen,
        member_id=member,
        leader_id=leader if isinstance(leader, str) else None,
        protocol=protocol if isinstance(protocol, str) else None,
        assignment=tuple(sorted(set(assignment))),
        members=tuple(str(m) for m in body.get("members") or []),
    )


def parse_offsets(body: Any, wanted: Iterable[TopicPartition]) -> dict[TopicPartition, OffsetAndMetadata | None]:
    """An OffsetFetch answer -> the committed offset of every wanted partition (None: nothing committed)."""
    out: dict[TopicPartition, OffsetAndMetadata | None] = dict.fromkeys(wanted)
    items = body.get("offsets") if isinstance(body, dict) else None
    if not isinstance(items, list):
        raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, "offset fetch answer lacks an offsets list")
    for item in items:
        tp = _tp(item, "offset fetch answer")
        offset = item.get("offset")
        if tp not in out or isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            continue
        metadata = item.get("metadata")
        out[tp] = OffsetAndMetadata(offset, metadata if isinstance(metadata, str) else "")
    return out


class ConsumerCoordinator:
    """One consumer's membership in ``config.group_id`` and its offset commits (module docstring).

    ``wake`` is called when the heartbeat task learns that ``poll`` has
    rebalance work to do, so a ``poll`` waiting for records returns to it.
    """

    def __init__(
        self, session: HttpSession, metadata: MetadataCache, config: GroupConfig, wake: Callable[[], None]
    ) -> None:
        config.validate()
        self.config = config
        self.group_id = config.group_id
        self._session = session
        self._metadata = metadata
        self._wake = wake
        self._path = f"/v1/groups/{quote(config.group_id, safe='')}"
        self.state = MemberState.UNJOINED
        self.member_id = ""
        self.generation: Generation | None = None
        self.subscription: tuple[str, ...] = ()
        self.rejoin_needed = False
        self.partitions_lost = False  # the generation ended without a clean revoke (see HeartbeatAction.LOST)
        self.rejoin_reason = ""
        self._coordinator_url: str | None = None
        self._join_task: asyncio.Task[Generation] | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._last_poll = 0.0
        self.rebalances = 0

    # ---- state --------------------------------------------------------------------------------

    def _transition(self, new: MemberState) -> None:
        if self.state not in VALID_PREVIOUS[new]:
            raise RuntimeError(f"group {self.group_id!r}: illegal member transition {self.state.value} -> {new.value}")
        self.state = new

    @property
    def generation_id(self) -> int:
        return self.generation.generation_id if self.generation is not None else NO_GENERATION

    def group_metadata(self) -> ConsumerGroupMetadata:
        """The identity a transactional offset commit carries (KIP-447); -1/"" when not a member."""
        if self.state is not MemberState.STABLE or self.generation is None:
            return ConsumerGroupMetadata(self.group_id)
        return ConsumerGroupMetadata(self.group_id, self.generation.generation_id, self.generation.member_id)

    def request_rejoin(self, reason: str, *, lost: bool = False, reset_member: bool = False) -> None:
        """Ask the next ``poll`` to rebalance (``lost``: the generation is already invalid)."""
        if not self.rejoin_needed or lost:
            log.info("group %s member %s: rejoin needed (%s)", self.group_id, self.member_id or "-", reason)
        self.rejoin_needed = True
        self.rejoin_reason = reason
        self.partitions_lost = self.partitions_lost or lost
        if reset_member:
            self.member_id = ""
        self._wake()

    def note_poll(self, now: float) -> None:
        self._last_poll = now

    # ---- coordinator lookup and calls ----------------------------------------------------------

    async def _coordinator(self) -> str:
        if self._coordinator_url is not None:
            return self._coordinator_url
        last: BrokerError | None = None
        for url in self._metadata.urls():
            try:
                body = await self._session.request_json(
                    "GET", f"{url}/v1/coordinators/group/{quote(self.group_id, safe='')}"
                )
            except BrokerError as exc:
                last = exc
                if exc.retriable:
                    continue
                raise
            found = body.get("url") if isinstance(body, dict) else None
            if isinstance(found, str) and found:
                self._coordinator_url = found.rstrip("/")
                return self._coordinator_url
        raise BrokerError(
            ErrorCode.COORDINATOR_NOT_AVAILABLE,
            f"no coordinator for group {self.group_id!r} yet" + (f" ({last.message})" if last else ""),
        )

    def coordinator_lost(self) -> None:
        self._coordinator_url = None

    async def _call(self, method: str, path: str, body: Any = None, *, timeout: float | None = None) -> Any:
        """One request to the coordinator; a coordinator error forgets the coordinator before raising."""
        url = await self._coordinator()
        try:
            return await self._session.request_json(method, url + self._path + path, body, timeout=timeout)
        except BrokerError as exc:
            if exc.error_code in _COORDINATOR_MOVED:
                self.coordinator_lost()
            raise

    async def _retrying(self, fn: Callable[[], Awaitable[T]], timeout_s: float | None, what: str) -> T:
        """Retry ``fn`` on retriable errors with backoff; after ``timeout_s`` the last error is raised."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        backoff = self.config.retry_backoff_ms / 1000
        while True:
            try:
                return await fn()
            except BrokerError as exc:
                if not exc.retriable:
                    raise
                if deadline is not None and loop.time() + backoff > deadline:
                    raise BrokerError(exc.error_code, f"{what}: {exc.message}", **exc.extra) from exc
            await asyncio.sleep(backoff)

    # ---- joining ----------------------------------------------------------------------------------

    def start_join(self) -> None:
        """Send the join (in the background); ``wait_join`` collects its answer."""
        if not self.subscription:
            raise RuntimeError("start_join without a subscription")
        self._stop_heartbeat()
        self._transition(MemberState.REBALANCING)
        self.generation = None
        self.rejoin_needed = False
        self.partitions_lost = False
        self._join_task = asyncio.get_running_loop().create_task(self._join())

    async def _join(self) -> Generation:
        cfg = self.config
        timeout = max(cfg.request_timeout_ms, cfg.max_poll_interval_ms) / 1000 + JOIN_GRACE_S
        backoff = cfg.retry_backoff_ms / 1000
        while True:
            body = {
                "member_id": self.member_id,
                "session_timeout_ms": cfg.session_timeout_ms,
                "rebalance_timeout_ms": cfg.max_poll_interval_ms,
                "topics": list(self.subscription),
                "protocol": cfg.protocol,
            }
            try:
                return parse_join_answer(await self._call("POST", "/join", body, timeout=timeout))
            except BrokerError as exc:
                code = exc.error_code
                if code is ErrorCode.UNKNOWN_MEMBER_ID:
                    self.member_id = ""  # removed meanwhile (session expired): join as a new member
                elif code is ErrorCode.REBALANCE_IN_PROGRESS:
                    pass  # superseded or not completed in time: join again at once
                elif exc.retriable:
                    await asyncio.sleep(backoff)
                else:
                    raise

    async def wait_join(self, timeout_s: float) -> Generation | None:
        """The generation once the outstanding join completes; None if it is still running after ``timeout_s``.

        A failed join (a non-retriable error such as ``INVALID_SESSION_TIMEOUT``
        or ``INCONSISTENT_GROUP_PROTOCOL``) leaves the member ``UNJOINED`` and raises.
        """
        task = self._join_task
        if task is None:
            raise RuntimeError("wait_join without a join in flight")
        done, _ = await asyncio.wait({task}, timeout=max(0.0, timeout_s))
        if not done:
            return None
        self._join_task = None
        try:
            gen = task.result()
        except BaseException:
            self._transition(MemberState.UNJOINED)
            raise
        self.generation = gen
        self.member_id = gen.member_id
        self._transition(MemberState.STABLE)
        self.rebalances += 1
        log.info("group %s: joined generation %d as %s with %d partition(s): %s", self.group_id,
                 gen.generation_id, gen.member_id, len(gen.assignment), gen.assignment)  # fmt: skip
        self._heartbeat_task = asyncio.get_running_loop().create_task(self._heartbeat_loop(gen))
        return gen

    # ---- heartbeats ---------------------------------------------------------------------------------

    def _stop_heartbeat(self) -> None:
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
            self._heartbeat_task = None

    async def _heartbeat_loop(self, gen: Generation) -> None:
        cfg = self.config
        loop = asyncio.get_running_loop()
        interval = cfg.heartbeat_interval_ms / 1000
        backoff = cfg.retry_backoff_ms / 1000
        self._last_poll = max(self._last_poll, loop.time())
        wait = interval
        while self.state is MemberState.STABLE and self.generation is gen:
            await asyncio.sleep(wait)
            wait = interval
            if loop.time() - self._last_poll > cfg.max_poll_interval_ms / 1000:
                log.warning("group %s member %s: no poll() for max_poll_interval_ms=%d: leaving the group",
                            self.group_id, gen.member_id, cfg.max_poll_interval_ms)  # fmt: skip
                await self._send_leave(gen.member_id)
                self.request_rejoin("max_poll_interval_ms passed", lost=True, reset_member=True)
                return
            body = {"member_id": gen.member_id, "generation_id": gen.generation_id}
            try:
                await self._call("POST", "/heartbeat", body, timeout=cfg.session_timeout_ms / 1000)
                code = ErrorCode.NONE
            except BrokerError as exc:
                code = exc.error_code
            action = heartbeat_action(code)
            if action is HeartbeatAction.REJOIN:
                self.request_rejoin("the group is rebalancing")
            elif action is HeartbeatAction.LOST:
                self.request_rejoin(f"generation {gen.generation_id} is no longer current", lost=True)
                return
            elif action is HeartbeatAction.RESET:
                self.request_rejoin(f"member {gen.member_id} is unknown to the group", lost=True, reset_member=True)
                return
            elif action is HeartbeatAction.RETRY:
                wait = backoff

    # ---- leaving --------------------------------------------------------------------------------------

    async def _send_leave(self, member_id: str) -> None:
        if not member_id:
            return
        try:
            await self._call("POST", "/leave", {"member_id": member_id}, timeout=self.config.request_timeout_ms / 1000)
        except BrokerError as exc:
            log.info("group %s: leave of %s not confirmed: %s", self.group_id, member_id, exc)

    async def leave(self) -> None:
        """Leave the group now (unsubscribe / close): the others rebalance without waiting for a session timeout."""
        self._stop_heartbeat()
        task, self._join_task = self._join_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        member = self.member_id
        if self.state is not MemberState.UNJOINED:
            self._transition(MemberState.UNJOINED)
        self.generation = None
        self.member_id = ""
        self.rejoin_needed = False
        self.partitions_lost = False
        await self._send_leave(member)

    # ---- offsets ---------------------------------------------------------------------------------------

    def _identity(self) -> dict[str, Any]:
        """Generation and member id for a commit: none for a consumer that uses the group only for offsets."""
        if not self.subscription:
            return {}
        if self.state is not MemberState.STABLE or self.generation is None:
            raise BrokerError(
                ErrorCode.REBALANCE_IN_PROGRESS,
                f"group {self.group_id!r} is rebalancing: commit after the next poll() completes the rebalance",
            )
        return {"generation_id": self.generation.generation_id, "member_id": self.generation.member_id}

    async def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata], timeout_s: float | None) -> None:
        """OffsetCommit, retried while the coordinator moves; a stale generation raises and asks for a rejoin."""
        if not offsets:
            return
        body: dict[str, Any] = {
            "offsets": [
                {"topic": t, "partition": p, "offset": om.offset, "metadata": om.metadata}
                for (t, p), om in sorted(offsets.items())
            ],
            **self._identity(),
        }
        try:
            await self._retrying(lambda: self._call("POST", "/offsets", body), timeout_s, "offset commit")
        except BrokerError as exc:
            if exc.error_code is ErrorCode.ILLEGAL_GENERATION:
                self.request_rejoin("offset commit: stale generation", lost=True)
            elif exc.error_code is ErrorCode.UNKNOWN_MEMBER_ID:
                self.request_rejoin("offset commit: unknown member", lost=True, reset_member=True)
            elif exc.error_code is ErrorCode.REBALANCE_IN_PROGRESS:
                self.request_rejoin("offset commit: the group is rebalancing")
            raise

    async def fetch_committed(
        self, partitions: Iterable[TopicPartition], *, require_stable: bool, timeout_s: float | None
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """OffsetFetch; with ``require_stable``, ``UNSTABLE_OFFSET_COMMIT`` is retried until ``timeout_s``."""
        tps = sorted(set(partitions))
        if not tps:
            return {}
        query = {"topics": ",".join(sorted({t for t, _ in tps}))}
        if require_stable:
            query["require_stable"] = "true"
        path = "/offsets?" + urlencode(query)
        body = await self._retrying(lambda: self._call("GET", path), timeout_s, "offset fetch")
        return parse_offsets(body, tps)

    async def close(self) -> None:
        self._stop_heartbeat()
        if self._join_task is not None:
            self._join_task.cancel()
            with contextlib.suppress(BaseException):
                await self._join_task
            self._join_task = None


class ConsumerRebalanceListener:
    """Callbacks around a rebalance (kafka-python's ``ConsumerRebalanceListener``); subclass and override.

    ``on_partitions_revoked`` runs in ``poll`` before the member rejoins (the
    eager protocol revokes every partition), while the generation is still
    valid: the last chance to commit for these partitions.
    ``on_partitions_lost`` runs instead when the generation already ended
    (the member was expelled): a commit would fail; by default it calls
    ``on_partitions_revoked``, as Kafka's does. ``on_partitions_assigned``
    runs once the new generation's partitions are assigned, before their
    positions are read from the committed offsets (a ``seek`` here wins).

    With ``AsyncConsumer`` the methods may be coroutine functions; with the
    sync ``Consumer`` they run in the thread that called ``poll``.
    """

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> Any:
        return None

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> Any:
        return None

    def on_partitions_lost(self, lost: set[TopicPartition]) -> Any:
        return self.on_partitions_revoked(lost)
