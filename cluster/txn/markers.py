"""The marker driver: a decided transaction's COMMIT/ABORT markers, then CompleteTxn.

A PrepareCommit/PrepareAbort state carries a ``MarkerPlan``. The coordinator's
leader writes a marker to every partition of the transaction, retrying until
each partition applied it, then proposes CompleteTxn. A new leader resumes
every plan it finds. Each plan has one ``PlanRun``: its driver (per Raft
term), one future per partition done once that partition's marker is
written, and the carried-marker bookkeeping (docs/carried-markers.md).

Drivers are per Raft term: a driver of an earlier term may still be waiting
on a call (a marker to a paused node) when this node leads again; it then
ends without completing anything, and the new term gets a driver of its own.
A node that loses the leadership of a ``__transaction_state`` partition
stops that partition's drivers at once (``deposed``): every request waiting
on them answers ``NOT_COORDINATOR`` and the client finds the new coordinator.

Each marker attempt runs under a deadline of the request timeout and is
abandoned as soon as this node learns that the target partition's leader
moved (``MarkerLeaders``, ``cluster.deadline.abandon_if_moved``); the next
attempt goes to the new leader after a short backoff, so a leader change of a
target partition costs about an election, not a request timeout.

Runs on the asyncio loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from clients.protocol import BrokerError, ControlType, ErrorCode
from coordinator.commands import Command, CompleteTxn
from coordinator.metadata import MarkerPlan, TopicPartition, TransactionMetadata
from coordinator.results import CompleteTxnResult
from coordinator.transitions import waits_for_previous

from ..deadline import Deadline, abandon_if_moved, background_task, loop_now
from ..seams import Clock, MarkerWriter
from .completions import CompletionCounter, PlanKey, plan_key
from .state_manager import TxnPartition

__all__ = [
    "CoordinatorLog",
    "MarkerDriver",
    "MarkerLeaders",
    "MarkerMetrics",
    "PlanRun",
    "driver_for_term",
    "marker_until_applied",
]

log = logging.getLogger(__name__)

#: Backoff between marker attempts that failed retriably (a leader change, an election): short, so the
#: marker reaches a new leader soon after it is elected.
MARKER_BACKOFF_S = (0.02, 0.05, 0.1, 0.2, 0.25)
#: Backoff after an unexpected (non-retriable) error, logged each time.
ERROR_BACKOFF_S = 1.0
#: Longest one marker attempt waits for its answer before it is sent again (markers are idempotent): a
#: connection into a silent network, or one a heal left in TCP's retransmission backoff, would otherwise
#: hold the marker -- and every later transaction of its producer -- for the whole request timeout.
MARKER_ATTEMPT_S = 3.0

_K = TypeVar("_K")
_T = TypeVar("_T")


class MarkerMetrics(Protocol):
    def txn_marker_written(self, topic: str, commit: bool) -> None: ...


class MarkerLeaders(Protocol):
    def marker_leader(self, topic: str, partition: int) -> int | None:
        """The node leading the partition a marker goes to, as this node knows now (None: unknown)."""
        ...


class CoordinatorLog(Protocol):
    """What the driver needs of ``TransactionStateManager``: this node's partitions, and proposing to one."""

    def local_partition(self, partition: int) -> TxnPartition | None: ...

    def not_coordinator(self, partition: int) -> BrokerError:
        """The error for a request this node cannot serve on ``partition`` (any longer)."""
        ...

    async def propose(self, part: TxnPartition, command: type[Command], **fields: Any) -> Any: ...


def backoff(attempt: int) -> float:
    return MARKER_BACKOFF_S[min(attempt, len(MARKER_BACKOFF_S) - 1)]


def driver_for_term(
    drivers: dict[_K, tuple[int, asyncio.Task[None]]],
    key: _K,
    term: int,
    start: Callable[[], asyncio.Task[None]],
    on_end: Callable[[], object] | None = None,
) -> asyncio.Task[None]:
    """The running driver of ``key`` for ``term``, started with ``start()`` if there is none.

    A driver of an earlier term that is still waiting on a call (a marker to
    a paused node) is left to end on its own -- it completes nothing once
    the term changed -- so the new term gets its own. When a driver ends
    while still the registered one, its entry goes and ``on_end`` runs.
    """
    held = drivers.get(key)
    if held is not None and held[0] == term and not held[1].done():
        return held[1]
    task = start()
    drivers[key] = (term, task)

    def ended(t: asyncio.Task[None]) -> None:
        current = drivers.get(key)
        if current is not None and current[1] is t:
            del drivers[key]
            if on_end is not None:
                on_end()

    task.add_done_callback(ended)
    return task


async def marker_until_applied(
    send: Callable[[], Awaitable[bool]],
    superseded: bool,
    plan: MarkerPlan,
    tp: TopicPartition,
    still_leading: Callable[[], bool],
    what: str,
    unknown_topic_grace_s: float = 0.0,
) -> bool | None:
    """``send()`` a marker until it is applied, with backoff, while ``still_leading()``; its answer.

    ``superseded`` is the answer when the partition is gone or saw a newer epoch of the producer;
    None when a newer coordinator fenced this one or the leadership was lost. An unknown topic counts
    as gone only once it has stayed unknown for ``unknown_topic_grace_s``: a node that just took over,
    or a topic just created, may not know the topic yet.
    """
    attempt = 0
    unknown_since: float | None = None
    while still_leading():
        try:
            return await send()
        except BrokerError as exc:
            code = exc.error_code
            if code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                unknown_since = unknown_since if unknown_since is not None else time.monotonic()
                if time.monotonic() - unknown_since < unknown_topic_grace_s:
                    code = ErrorCode.LEADER_NOT_AVAILABLE  # retried below, like a partition without a leader
            if code in (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.INVALID_PRODUCER_EPOCH):
                log.warning("%s for %s of %s superseded: %s", what, tp, plan.transactional_id, exc)
                return superseded
            if code is ErrorCode.TRANSACTION_COORDINATOR_FENCED:
                log.info("%s for %s fenced by a newer coordinator; leaving it to it", what, tp)
                return None
            if not code.retriable:
                log.error("%s for %s of %s failed: %s (retrying)", what, tp, plan.transactional_id, exc)
                await asyncio.sleep(ERROR_BACKOFF_S)
                continue
        await asyncio.sleep(backoff(attempt))
        attempt += 1
    return None


@dataclass
class PlanRun:
    """What the coordinator keeps for one planned run of markers (one ``MarkerPlan``), beside its driver.

    The driver itself is in ``MarkerDriver._drivers`` (one per plan, with its Raft term).
    """

    #: One future per partition, done once that partition's marker is written (or its carried marker settled).
    written: dict[TopicPartition, asyncio.Future[None]] = field(default_factory=dict)
    #: Carried partitions settled so far (True: the next transaction already wrote there).
    settled: dict[TopicPartition, bool] = field(default_factory=dict)
    #: Makes settling the plan's partitions serial.
    settle_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: Wakes the driver early: the fold completed the plan, or a caller needs it done.
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class MarkerDriver:
    """Writes each decided transaction's markers and completes it, once per plan and term."""

    def __init__(
        self,
        state: CoordinatorLog,
        markers: MarkerWriter,
        metrics: MarkerMetrics,
        completions: CompletionCounter,
        clock: Clock,
        request_timeout_s: float,
        reservation_s: float,
        leaders: MarkerLeaders | None = None,
    ) -> None:
        self._state = state
        self._markers = markers
        self._leaders = leaders
        self._metrics = metrics
        self._completions = completions
        self._clock = clock
        self._request_timeout_s = request_timeout_s
        self._reservation_s = reservation_s
        self._runs: dict[PlanKey, PlanRun] = {}
        self._drivers: dict[PlanKey, tuple[int, asyncio.Task[None]]] = {}
        self._partition_of: dict[PlanKey, int] = {}  # the __transaction_state partition of each driver's plan
        self.closing = False

    def _run(self, plan: MarkerPlan) -> PlanRun:
        key = plan_key(plan)
        run = self._runs.get(key)
        if run is None:
            run = self._runs[key] = PlanRun()
        return run

    def _forget_if_done(self, part: TxnPartition, plan: MarkerPlan) -> None:
        """Drop ``plan``'s run once it has no driver and the plan is no longer pending."""
        key = plan_key(plan)
        run = self._runs.get(key)
        if run is None or key in self._drivers:
            return
        meta = part.sm.get(plan.transactional_id)
        if meta is None or meta.marker_plan() != plan:
            del self._runs[key]

    async def close(self) -> None:
        self.closing = True
        tasks = [t for _, t in self._drivers.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def deposed(self, partition: int) -> None:
        """This node lost the leadership of ``partition``: stop its drivers now.

        Their waiters (``await_markers``, ``await_previous``, a commit waiting for completion) wake at
        once and answer NOT_COORDINATOR; the new leader resumes every plan.
        """
        for key, p in list(self._partition_of.items()):
            held = self._drivers.get(key)
            if p == partition and held is not None and not held[1].done():
                held[1].cancel()

    async def attempt(self, tp: TopicPartition, send: Callable[[], Awaitable[_T]], what: str) -> _T:
        """One marker call: under a deadline of ``MARKER_ATTEMPT_S`` (at most the request timeout), abandoned
        if ``tp``'s leader moves."""
        deadline = Deadline.after(loop_now(), min(MARKER_ATTEMPT_S, self._request_timeout_s))
        leaders = self._leaders
        if leaders is None:
            return await abandon_if_moved(send(), lambda: None, deadline, what=what)
        return await abandon_if_moved(
            send(), lambda: leaders.marker_leader(tp.topic, tp.partition), deadline, what=f"{what} for {tp}"
        )

    def still_leading(self, part: TxnPartition, term: int) -> bool:
        return part.group.is_leader() and part.group.term() == term and not self.closing

    # ---- drivers ------------------------------------------------------------------------------

    def plan_ready(self, partition: int, plan: MarkerPlan) -> None:
        part = self._state.local_partition(partition)
        if part is not None and part.group.is_leader() and not self.closing:
            self.ensure_driver(part, plan)

    def ensure_driver(self, part: TxnPartition, plan: MarkerPlan) -> asyncio.Task[None]:
        """The running driver of ``plan`` for this node's current term (``driver_for_term``)."""
        key = plan_key(plan)
        term = part.group.term()
        run = self._run(plan)

        def ended() -> None:
            run.written = {}
            self._partition_of.pop(key, None)
            self._forget_if_done(part, plan)

        self._partition_of[key] = part.partition
        # The driver outlives the request that may have started it: it runs outside that request's deadline.
        return driver_for_term(
            self._drivers, key, term, lambda: background_task(self._drive(part, plan, term)), on_end=ended
        )

    def marker_written(self, plan: MarkerPlan, tp: TopicPartition) -> asyncio.Future[None]:
        """The future a running driver of ``plan`` completes once the marker on ``tp`` is written."""
        futures = self._run(plan).written
        fut = futures.get(tp)
        if fut is None:
            fut = futures[tp] = asyncio.get_running_loop().create_future()
        return fut

    def _mark_written(self, plan: MarkerPlan, tp: TopicPartition) -> None:
        fut = self.marker_written(plan, tp)
        if not fut.done():
            fut.set_result(None)

    def wake(self, plan: MarkerPlan) -> None:
        """Wake ``plan``'s driver: it settles its carried markers now instead of after the reservation."""
        self._run(plan).wake.set()

    async def bounded(self, task: asyncio.Task[None], timeout: float | None = None) -> bool:
        """Wait for a driver task for at most ``timeout`` (default: the request timeout); True if it ended.

        The task itself is never cancelled by the wait (it is the background
        work every waiter shares) and its failure is not the waiter's: the
        state machine, re-read afterwards, tells what happened.
        """
        if timeout is None:
            timeout = self._request_timeout_s
        done, _ = await asyncio.wait({task}, timeout=max(0.0, timeout))
        return bool(done)

    # ---- waiting for a previous transaction -------------------------------------------------------

    async def await_markers(self, part: TxnPartition, plan: MarkerPlan, tps: Iterable[TopicPartition]) -> None:
        """Return once ``plan``'s markers on ``tps`` are written (or the plan completed), else raise.

        Bounded by the request timeout; if the driver ends without writing
        them (this node lost the leadership), or the wait runs out, the answer
        is CONCURRENT_TRANSACTIONS (retriable: the client resends, and the
        verification runs again wherever the coordinator is then), or
        NOT_COORDINATOR once this node no longer leads the partition.
        """
        tps = list(tps)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._request_timeout_s
        carried = [tp for tp in tps if tp in plan.carried]
        if carried and part.group.is_leader():
            # A carried marker a caller waits for (a verification, an add of the next transaction): settle it
            # now with a revoking marker instead of waiting for the next EndTxn or the reservation timer.
            await self.settle(part, plan, carried)
        gave_up = False  # the driver ended with markers still owed (deposed, or fenced by a newer coordinator)
        while True:
            meta = part.sm.get(plan.transactional_id)
            if meta is None or meta.marker_plan() != plan:
                return  # CompleteTxn applied: every marker is written
            if gave_up or not part.group.is_leader() or self.closing:
                break
            task = self.ensure_driver(part, plan)
            pending = {fut for fut in (self.marker_written(plan, tp) for tp in tps) if not fut.done()}
            if not pending:
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            await asyncio.wait({*pending, task}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            gave_up = task.done() and any(not fut.done() for fut in pending)
        if not part.group.is_leader():
            raise self._state.not_coordinator(part.partition)  # deposed: the client asks the new coordinator
        raise BrokerError(
            ErrorCode.CONCURRENT_TRANSACTIONS,
            f"the previous transaction of {plan.transactional_id!r} is still writing its markers",
        )

    async def await_previous(
        self,
        part: TxnPartition,
        transactional_id: str,
        identity: tuple[int, int] | None = None,
        *,
        retry: bool = False,
    ) -> None:
        """While the id's previous transaction writes its markers, wait for its driver (bounded).

        Kafka answers CONCURRENT_TRANSACTIONS to a call that would begin the
        next transaction during PrepareCommit/PrepareAbort, and the client
        retries after a backoff; waiting here lets it begin as soon as
        CompleteTxn is applied, in the same request. Who waits is
        ``coordinator.transitions.waits_for_previous``. When the request
        timeout passes, or the driver ends without completing (this node lost
        the leadership), the caller goes on and the state machine answers
        (CONCURRENT_TRANSACTIONS, NOT_COORDINATOR).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._request_timeout_s
        awaited: MarkerPlan | None = None
        while True:
            meta = part.sm.get(transactional_id)
            plan = meta.marker_plan() if meta is not None else None
            if meta is None or plan is None or plan == awaited:
                return
            if not waits_for_previous(meta, identity, retry=retry):
                return
            if not part.group.is_leader() or self.closing:
                return
            awaited = plan
            task = self.ensure_driver(part, plan)
            if plan.carried:
                self.wake(plan)  # settle the carried markers now: this caller needs the transaction complete
            if not await self.bounded(task, deadline - loop.time()):
                return

    # ---- one plan's run ----------------------------------------------------------------------------

    async def _drive(self, part: TxnPartition, plan: MarkerPlan, term: int) -> None:
        """Write every marker of ``plan``, then CompleteTxn -- for as long as this node leads ``term``."""
        control = ControlType.COMMIT if plan.commit else ControlType.ABORT
        started = time.monotonic()
        meta = part.sm.get(plan.transactional_id)
        start_ms = meta.txn_start_time_ms if meta is not None else -1

        def still_leading() -> bool:
            return self.still_leading(part, term)

        async def one(tp: TopicPartition) -> bool:
            async def send() -> bool:
                await self.attempt(tp, lambda: self._markers.write_txn_marker(
                    tp.topic, tp.partition, plan.producer_id, plan.producer_epoch, term, control, plan.classic
                ), "marker")  # fmt: skip
                self._metrics.txn_marker_written(tp.topic, plan.commit)
                return True

            # A partition gone, or one that saw a newer epoch of the producer (the transaction ended there
            # before; a later one has begun): nothing left to write there. "Gone" only once the topic has stayed
            # unknown for the request timeout: a coordinator that just took over may not know it yet, and
            # skipping the marker then would leave the transaction open on that partition for good.
            grace = self._request_timeout_s
            written = bool(await marker_until_applied(send, True, plan, tp, still_leading, "marker", grace))
            if written:
                self._mark_written(plan, tp)
            return written

        results = await asyncio.gather(*(one(tp) for tp in sorted(plan.explicit, key=str)))
        if not all(results):
            return
        used: frozenset[TopicPartition] = frozenset()
        if plan.carried:
            settled = await self._await_carried(part, plan, term)
            if settled is None:
                return  # completed by the next EndTxn (the fold), or this node no longer leads
            used = settled
        attempt = 0
        while still_leading():
            try:
                result = await self._state.propose(
                    part,
                    CompleteTxn,
                    transactional_id=plan.transactional_id,
                    producer_id=plan.producer_id,
                    producer_epoch=plan.producer_epoch,
                    commit=plan.commit,
                    settled_partitions=tuple(sorted(used)),
                )
            except BrokerError as exc:
                if exc.retriable:
                    await asyncio.sleep(backoff(attempt))
                    attempt += 1
                    continue
                meta = part.sm.get(plan.transactional_id)
                if meta is not None and meta.marker_plan() == plan:
                    log.error("CompleteTxn of %s failed: %s", plan.transactional_id, exc)
                return  # else completed meanwhile by the next EndTxn (carried markers' fold)
            if isinstance(result, CompleteTxnResult) and not result.already_complete:
                elapsed = (self._clock.now_ms() - start_ms) / 1000 if start_ms >= 0 else time.monotonic() - started
                self._completions.completed(plan, elapsed)
            return

    def completed_by_fold(self, plan: MarkerPlan, before: TransactionMetadata | None) -> None:
        """The next EndTxn completed ``plan`` in its own write (carried markers' fold): count it."""
        start_ms = before.txn_start_time_ms if before is not None else -1
        self._completions.completed(plan, max(0.0, (self._clock.now_ms() - start_ms) / 1000) if start_ms >= 0 else 0.0)

    # ---- carried markers: settling (docs/carried-markers.md) ----------------------------------------

    async def _await_carried(self, part: TxnPartition, plan: MarkerPlan, term: int) -> frozenset[TopicPartition] | None:
        """Wait for the next EndTxn to settle ``plan``'s carried markers, at most ``txn_reservation_ms``; then settle.

        A plan this leader inherited (another term wrote it) is settled at once: its tokens may be in use,
        and only revoking markers tell. Returns the partitions the next transaction wrote to, or None when
        there is nothing left to complete here.
        """
        run = self._run(plan)
        if plan.coordinator_epoch == term:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.wake.wait(), self._reservation_s)
        try:
            return await self.settle(part, plan, plan.carried)
        finally:
            run.wake = asyncio.Event()
            run.settle_lock = asyncio.Lock()
            meta = part.sm.get(plan.transactional_id)
            if meta is None or meta.marker_plan() != plan:
                run.settled = {}

    async def settle(
        self,
        part: TxnPartition,
        plan: MarkerPlan,
        tps: Iterable[TopicPartition],
        receipted: frozenset[TopicPartition] = frozenset(),
    ) -> frozenset[TopicPartition] | None:
        """Settle ``plan``'s carried markers on ``tps``: by a receipt, else by a revoking marker.

        Returns the partitions of ``tps`` the next transaction wrote to (settled earlier or now), or None if
        ``plan`` is no longer pending or this node stopped leading before all were settled. Each partition
        settled resolves its marker future (waiting verifications go on).
        """
        tps = list(tps)
        term = part.group.term()
        run = self._run(plan)
        async with run.settle_lock:
            meta = part.sm.get(plan.transactional_id)
            if meta is None or meta.marker_plan() != plan:
                return None
            done = run.settled
            for tp in tps:
                if tp not in done and tp in receipted:
                    done[tp] = True
            todo = [tp for tp in tps if tp not in done]
            results = await asyncio.gather(*(self._revoke(part, plan, tp, term) for tp in todo))
            for tp, used in zip(todo, results, strict=True):
                if used is not None:
                    done[tp] = used
            for tp in tps:
                if tp in done:
                    self._mark_written(plan, tp)
            if any(tp not in done for tp in tps):
                return None
            return frozenset(tp for tp in tps if done[tp])

    async def _revoke(self, part: TxnPartition, plan: MarkerPlan, tp: TopicPartition, term: int) -> bool | None:
        """A revoking marker on ``tp`` until it is applied: True if the reservation was used; None if deposed."""
        control = ControlType.COMMIT if plan.commit else ControlType.ABORT

        async def send() -> bool:
            res = await self.attempt(tp, lambda: self._markers.revoke_txn_marker(
                tp.topic, tp.partition, plan.producer_id, plan.producer_epoch, term, control
            ), "revoking marker")  # fmt: skip
            if not res.used:
                self._metrics.txn_marker_written(tp.topic, plan.commit)
            return res.used

        # A node that just took over, or a topic just created, may not know the topic yet: a revocation must not
        # take that for "the partition is gone" (it would settle a partition whose marker was never written).
        return await marker_until_applied(
            send, False, plan, tp, lambda: self.still_leading(part, term), "revoking marker", self._request_timeout_s
        )
