"""Commit groups: one write-once decision for a set of prepared transactions (``coordinator.group_commit``).

An external coordinator (Spark's driver) prepares one transaction per task,
then asks the group's coordinator to commit them all. The decision is one
record on the group's ``__transaction_state`` partition; then each member is
resolved on its own coordinator (here or over a signed internal call), so a
caller dying midway leaves every member committed or every member aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from clients.protocol import BrokerError, ErrorCode
from coordinator.commands import BindPrepared, DecideGroup, GroupMember, GroupMemberDone, ResolvePrepared
from coordinator.group_commit import GroupDecision, GroupDecisionResult, member_commits
from coordinator.metadata import TransactionMetadata
from coordinator.results import EndTxnResult

from ..deadline import background_task, current_deadline, loop_now
from .markers import MarkerDriver, backoff, driver_for_term
from .state_manager import TransactionStateManager

__all__ = ["CommitGroups"]

log = logging.getLogger(__name__)


class CommitGroups:
    """Decides commit groups and drives each decision to every member, once per Raft term."""

    def __init__(self, state: TransactionStateManager, driver: MarkerDriver, request_timeout_s: float) -> None:
        self._state = state
        self._driver = driver
        self._request_timeout_s = request_timeout_s
        self._drivers: dict[str, tuple[int, asyncio.Task[None]]] = {}
        self._partition_of: dict[str, int] = {}  # the __transaction_state partition of each driver's decision

    async def close(self) -> None:
        tasks = [t for _, t in self._drivers.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---- members --------------------------------------------------------------------------------

    async def bind_prepared(self, member: GroupMember, group_id: str) -> None:
        part = self._state.leading(member.transactional_id)
        await self._state.propose(
            part,
            BindPrepared,
            transactional_id=member.transactional_id,
            producer_id=member.producer_id,
            producer_epoch=member.producer_epoch,
            group_id=group_id,
        )

    async def resolve_prepared(self, member: GroupMember, group_id: str, commit: bool) -> EndTxnResult:
        part = self._state.leading(member.transactional_id)
        candidate = await self._state.candidate(None, always=True)
        result = await self._state.propose(
            part,
            ResolvePrepared,
            transactional_id=member.transactional_id,
            producer_id=member.producer_id,
            producer_epoch=member.producer_epoch,
            group_id=group_id,
            commit=commit,
            producer_id_candidate=candidate,
        )
        assert isinstance(result, EndTxnResult), result
        if result.markers is not None:
            await self._driver.bounded(self._driver.ensure_driver(part, result.markers))
        return result

    # ---- decisions -------------------------------------------------------------------------------

    async def group_commit(self, group_id: str, members: list[GroupMember], commit: bool) -> GroupDecision:
        """Decide a commit group: bind every member, record the decision once, carry it out.

        Answers when the decision is durable; the members are resolved before
        the answer when that is quick (within the request's deadline).
        """
        part = self._state.leading(group_id)
        existing = part.sm.group_decision(group_id)
        if existing is None and commit:
            # Readiness: every member is Prepared and bound to this group on its own partition.
            await asyncio.gather(*(self._on_member(m, "bind", group_id=group_id) for m in members))
        result = await self._state.propose(
            part,
            DecideGroup,
            group_id=group_id,
            commit=commit,
            members=tuple(sorted(members)),
        )
        assert isinstance(result, GroupDecisionResult), result
        decision = result.decision
        task = self._ensure_driver(part.partition, decision)
        deadline = current_deadline()  # the caller's: the decision is durable, the members resolve in the background
        wait = self._request_timeout_s if deadline is None else max(0.0, deadline.remaining(loop_now()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), wait)
        return decision

    def decision_ready(self, partition: int, decision: GroupDecision) -> None:
        part = self._state.local_partition(partition)
        if part is not None and part.group.is_leader() and not self._driver.closing:
            self._ensure_driver(partition, decision)

    def _ensure_driver(self, partition: int, decision: GroupDecision) -> asyncio.Task[None]:
        part = self._state.local_partition(partition)
        term = part.group.term() if part is not None else -1

        def start() -> asyncio.Task[None]:
            return background_task(self._drive(partition, decision, term))  # outlives the request

        key = decision.group_id
        self._partition_of[key] = partition
        return driver_for_term(self._drivers, key, term, start, on_end=lambda: self._partition_of.pop(key, None))

    def deposed(self, partition: int) -> None:
        """This node lost the leadership of ``partition``: stop its drivers now (the new leader resumes them)."""
        for group_id, p in list(self._partition_of.items()):
            held = self._drivers.get(group_id)
            if p == partition and held is not None and not held[1].done():
                held[1].cancel()

    async def _drive(self, partition: int, decision: GroupDecision, term: int) -> None:
        part = self._state.local_partition(partition)
        if part is None:
            return

        async def one(member: GroupMember) -> None:
            attempt = 0
            while self._driver.still_leading(part, term):
                try:
                    await self._on_member(member, "resolve", group_id=decision.group_id,
                                          commit=member_commits(decision, member))  # fmt: skip
                    break
                except BrokerError as exc:
                    if exc.error_code in (ErrorCode.INVALID_TXN_STATE, ErrorCode.PRODUCER_FENCED) or (
                        exc.error_code is ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
                    ):
                        # Already resolved by an earlier attempt (or gone): nothing left to do for it.
                        log.info("group %s member %s: %s", decision.group_id, member.transactional_id, exc)
                        break
                    await asyncio.sleep(backoff(attempt))
                    attempt += 1
            else:
                return
            with contextlib.suppress(BrokerError):
                await self._state.propose(
                    part,
                    GroupMemberDone,
                    group_id=decision.group_id,
                    transactional_id=member.transactional_id,
                )

        await asyncio.gather(*(one(m) for m in decision.pending))

    async def orphan_abort(self, meta: TransactionMetadata) -> None:
        """A group-bound prepared txn must end: propose ABORT for its group, then resolve it by the decision.

        The decision is write-once: if the group was decided before (possibly
        COMMIT, possibly without this member), that decision comes back and
        decides this member's fate (``member_commits``) -- a bound member that
        is not listed in a COMMIT decision is aborted, so it never pins the LSO.
        """
        group_id = meta.group_id
        assert group_id is not None
        commit, members = await self._on_group(group_id, commit=False)
        member = GroupMember(meta.transactional_id, meta.producer_id, meta.producer_epoch)
        try:
            await self._on_member(member, "resolve", group_id=group_id, commit=commit and member in members)
        except BrokerError as exc:
            if exc.error_code not in (ErrorCode.INVALID_TXN_STATE, ErrorCode.PRODUCER_FENCED):
                raise
            log.info("group %s member %s already resolved: %s", group_id, member.transactional_id, exc)

    # ---- calls that may cross nodes -------------------------------------------------------------

    async def _on_member(self, member: GroupMember, op: str, **kw: Any) -> None:
        """Run a member operation on the member's coordinator, local or remote."""
        if self._state.leading_local(member.transactional_id) is not None:
            if op == "bind":
                await self.bind_prepared(member, kw["group_id"])
            else:
                await self.resolve_prepared(member, kw["group_id"], kw["commit"])
            return
        body = {
            "transactional_id": member.transactional_id,
            "producer_id": member.producer_id,
            "producer_epoch": member.producer_epoch,
            **kw,
        }
        await self._state.remote(member.transactional_id, f"/v1/internal/txn/{op}", body)

    async def _on_group(self, group_id: str, commit: bool) -> tuple[bool, set[GroupMember]]:
        """Propose ``commit`` for the group (write-once) on its coordinator; the recorded decision."""
        if self._state.leading_local(group_id) is not None:
            decision = await self.group_commit(group_id, [], commit)
            return decision.commit, set(decision.members)
        body = await self._state.remote(group_id, "/v1/internal/txn/decide", {"group_id": group_id, "commit": commit})
        members = {GroupMember(m["transactional_id"], m["producer_id"], m["producer_epoch"]) for m in body["members"]}
        return bool(body["committed"]), members
