"""``Sender``: the producer's I/O task (Kafka's ``Sender``, network half).

One task loops: expire batches, bump the epoch once every unresolved
sequence has settled (``_idempotence``), drain the ``RecordAccumulator`` into
binary produce requests -- one per leader, at most
``max_in_flight_requests_per_connection`` unacknowledged batches per
partition -- and sleep until the next linger, backoff or expiry deadline or a
``wake()``. Each request runs as its own task; its answer is applied batch by
batch through ``RecordAccumulator.handle_response``. It also fetches the
producer id of an idempotent, non-transactional producer (InitProducerId, any
node answers) and refreshes metadata in the background when a partition has
no known leader.

A produce request without an answer for ``stall_refresh_ms`` makes the sender
refresh metadata (asking the silent node last) while the request keeps
waiting. If the leader of one of its partitions moved to another node, an
idempotent producer abandons the request and sends its batches to the new
leader (their sequence numbers make a duplicate harmless); otherwise the
request waits, up to its own timeout (``request_timeout_ms``).

The decisions (what to send, what a response means) are the accumulator's;
this class does the HTTP and the waking. A bug in any of its tasks fails
every pending batch with ``UNKNOWN_SERVER_ERROR`` (``internal_error``)
rather than leaving futures pending forever.

Event-loop only; not thread-safe.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from ..protocol import (
    PRODUCE_CONTENT_TYPE,
    BrokerError,
    ErrorCode,
    ProducePartition,
    ProduceRequest,
    decode_token,
    encode_produce_request,
)
from ..security import is_auth_failure
from ._accumulator import METADATA_ERRORS, Outcome, RecordAccumulator
from ._batch import ProducerBatch
from ._idempotence import IdempotenceManager, ProducerIdState
from ._metadata import MetadataCache
from ._session import HttpSession
from ._transactions import TransactionAbortedError, TransactionManager, TxnState

__all__ = ["Sender"]

log = logging.getLogger("clients.producer")


class Sender:
    """Runs the producer's requests: produce, InitProducerId (idempotent only), background metadata refreshes.

    ``rewrite`` maps a node URL from metadata to the URL to use (tests put a
    proxy in front of each node). ``requests_sent`` and ``errors`` (error
    name -> count of partition answers) are counters for ``metrics()``.
    """

    def __init__(
        self,
        acc: RecordAccumulator,
        idem: IdempotenceManager,
        txn: TransactionManager | None,
        session: HttpSession,
        metadata: MetadataCache,
        *,
        acks: int,
        request_timeout_ms: int,
        retry_backoff_s: float,
        rewrite: Callable[[str], str],
        stall_refresh_s: float = 0.0,
    ) -> None:
        self._acc = acc
        self._idem = idem
        self._txn = txn
        self._session = session
        self._metadata = metadata
        self._acks = acks
        self._request_timeout_ms = request_timeout_ms
        self._retry_backoff_s = retry_backoff_s
        self._rewrite = rewrite
        self._stall_refresh_s = stall_refresh_s
        self._stall_task: asyncio.Task[None] | None = None
        self.abandoned_requests = 0
        self._wake = asyncio.Event()
        self._init_done = asyncio.Event()  # an InitProducerId attempt sequence ended (id or fatal error)
        self._requests_idle = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._metadata_task: asyncio.Task[None] | None = None
        self._init_task: asyncio.Task[None] | None = None
        self.internal_error: BrokerError | None = None
        self.errors: dict[str, int] = {}
        self.requests_sent = 0

    # ---- control ------------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the loop task on ``loop`` (once)."""
        if self._task is None:
            self._loop = loop
            self._task = loop.create_task(self._run(), name="txbroker-producer-sender")
            self._task.add_done_callback(self._task_done)

    def wake(self) -> None:
        """Make the loop look at the accumulator again (something became sendable or changed state)."""
        self._wake.set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` as a task that ``stop`` cancels and whose crash counts as an internal error."""
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    async def wait_for_producer_id(self) -> None:
        """Until InitProducerId has given an id or failed for good (the caller bounds the wait)."""
        while self._idem.state is ProducerIdState.UNINITIALIZED:
            self._init_done.clear()
            await self._init_done.wait()

    async def wait_requests_idle(self, deadline: float) -> None:
        """Wait until no produce request is outstanding (expired batches' requests included)."""
        while self._acc.outstanding_requests:
            self._requests_idle.clear()
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await self._requests_idle.wait()
            except TimeoutError as exc:
                raise BrokerError(ErrorCode.REQUEST_TIMED_OUT, "produce requests still in flight") from exc

    async def join(self) -> None:
        """Wait for the loop to return: the accumulator is closing and has nothing pending."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def stop(self) -> None:
        """Cancel the loop and every task it started, and wait for them to end."""
        own = (self._task, self._metadata_task, self._init_task, self._stall_task, *self._tasks)
        tasks = [t for t in own if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        """A bug in the sender must not leave futures pending forever: fail everything, loudly."""
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        log.error("producer internal error", exc_info=exc)
        self.internal_error = BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"producer internal error: {exc!r}")
        self._acc.fail_all(self.internal_error)
        self._wake.set()

    # ---- the loop -----------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        acc, idem = self._acc, self._idem
        while True:
            self._wake.clear()
            now = loop.time()
            acc.expire(now)
            txn = self._txn
            if txn is not None and txn.state in (TxnState.ABORTABLE_ERROR, TxnState.ABORTING) and acc.has_undrained():
                acc.fail_undrained(TransactionAbortedError(f"{txn.transactional_id}: transaction is being aborted"))
            if idem.state is ProducerIdState.UNINITIALIZED and self._init_task is None and txn is None:
                self._init_task = loop.create_task(self._init_producer_id())
            elif acc.ready_to_bump():
                bumped = idem.bump_epoch()
                acc.reset_after_bump()
                what = f"epoch bumped to {idem.current.epoch}" if bumped else "epoch exhausted, new producer id next"
                log.warning("producer %d: %s after %s", idem.current.producer_id, what, idem.bump_reason)
                continue
            for url, batches in acc.drain(now, self._leader_of):
                self.spawn(self._send_request(url, batches))
            if acc.no_leader or self._metadata.stale():  # metadata_max_age_ms: new partitions show up
                self._refresh_metadata()
            if acc.closing and not acc.has_pending():
                return
            deadline = acc.next_deadline(now)
            if not self._wake.is_set():
                handle = loop.call_at(deadline, self._wake.set) if deadline is not None else None
                await self._wake.wait()
                if handle is not None:
                    handle.cancel()

    def _leader_of(self, topic: str, partition: int) -> str | None:
        info = self._metadata.cached(topic, partition)
        if info is None or info.leader_url is None:
            return None
        return self._rewrite(info.leader_url)

    def _refresh_metadata(self) -> None:
        """Refresh metadata in the background (one refresh at a time), then wake the loop."""
        if self._metadata_task is None or self._metadata_task.done():
            assert self._loop is not None
            self._metadata_task = self._loop.create_task(self._refresh_metadata_once())

    async def _refresh_metadata_once(self) -> None:
        try:
            await self._metadata.refresh()
        except BrokerError as exc:
            if is_auth_failure(exc):
                self._acc.fail_all(exc)  # not retriable: waiting for a leader would only repeat it
            log.debug("metadata refresh failed: %s", exc)
            await asyncio.sleep(self._retry_backoff_s)
        self._wake.set()

    async def _init_producer_id(self) -> None:
        """InitProducerId with retries; any node answers for a producer without a transactional id."""
        try:
            while True:
                last: BrokerError | None = None
                for url in dict.fromkeys(map(self._rewrite, self._metadata.urls())):
                    try:
                        body = await self._session.request_json(
                            "POST", url + "/v1/producers/init", {"transactional_id": None}
                        )
                        self._idem.set_producer_id(int(body["producer_id"]), int(body["producer_epoch"]))
                        log.debug("producer id %d epoch %d", self._idem.current.producer_id, self._idem.current.epoch)
                        return
                    except BrokerError as exc:
                        if not exc.retriable:
                            self._acc.fail_all(exc)
                            return
                        last = exc
                log.debug("producer id not available yet: %s", last)
                await asyncio.sleep(self._retry_backoff_s)
        finally:
            self._init_task = None
            self._init_done.set()
            self._wake.set()

    # ---- one produce request --------------------------------------------------------------------

    async def _send_request(self, url: str, batches: list[ProducerBatch]) -> None:
        acc = self._acc
        txn = self._txn
        if txn is not None:
            for b in batches:
                if not b.token_taken:
                    b.token_taken = True
                    b.txn_token = txn.take_token(b.topic, b.partition)
        req = ProduceRequest(
            tuple(ProducePartition(b.topic, b.partition, b.wire or b"", b.txn_token) for b in batches),
            acks=self._acks,
            timeout_ms=self._request_timeout_ms,
            transactional_id=txn.transactional_id if txn is not None else None,
        )
        answers: dict[tuple[str, int], Any] = {}
        whole: BrokerError | None = None
        self.requests_sent += 1
        moved: dict[tuple[str, int], str | None] = {}
        try:
            raw = await self._post_watched(url, encode_produce_request(req), batches, moved)
            parts = json.loads(raw)["partitions"]
        except BrokerError as exc:
            parts = exc.extra.get("partitions")
            if not isinstance(parts, list):
                whole = exc
        except (ValueError, KeyError, TypeError) as exc:
            whole = BrokerError(ErrorCode.NETWORK_EXCEPTION, f"malformed produce answer from {url}: {exc!r}")
        finally:
            acc.request_finished()
            if acc.outstanding_requests == 0:
                self._requests_idle.set()
        if whole is None:
            for p in parts:
                answers[(p.get("topic"), p.get("partition"))] = p
        now = asyncio.get_running_loop().time()
        refresh = False
        for b in batches:
            err = whole
            base = lat = -1
            if moved:
                # Abandoned while the leader moved: maybe written there; resent (same sequence) to the new leader.
                hint = moved.get((b.topic, b.partition))
                err = BrokerError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"no answer from {url}; the leader moved",
                                  **({"leader_url": hint} if hint else {}))  # fmt: skip
            elif err is None:
                p = answers.get((b.topic, b.partition))
                code = p.get("error_code", "NONE") if isinstance(p, dict) else None
                if p is None or code is None:
                    err = BrokerError(ErrorCode.NETWORK_EXCEPTION, f"no answer for {b.topic}-{b.partition}")
                elif code != "NONE":
                    extra = {k: v for k, v in p.items() if k == "leader_url"}
                    err = BrokerError(ErrorCode.from_name(str(code)), str(p.get("message") or ""), **extra)
                else:
                    base, lat = int(p.get("base_offset", -1)), int(p.get("log_append_time", -1))
                    receipt = p.get("txn_receipt")
                    if txn is not None and isinstance(receipt, str):
                        txn.receipts[(b.topic, b.partition)] = decode_token(receipt, "txn_receipt")
            if err is not None:
                if err.error_code is ErrorCode.TRANSACTION_RESERVATION_REVOKED:
                    b.txn_token = None  # resent without it: the partition leader verifies with the coordinator
                self.errors[err.error_code.name] = self.errors.get(err.error_code.name, 0) + 1
                if err.error_code is ErrorCode.NOT_LEADER_OR_FOLLOWER and not moved:
                    self._metadata.invalidate(b.topic, b.partition, err.extra.get("leader_url"))
                if err.error_code in METADATA_ERRORS and not moved:
                    refresh = True  # (an abandoned request's metadata is fresh already)
            outcome = acc.handle_response(b, base, lat, err, now)
            if outcome is Outcome.FATAL:
                log.error("producer %d fenced: %s", self._idem.current.producer_id, err)
        if refresh:
            self._refresh_metadata()
        self._wake.set()

    # ---- a stalled produce request ----------------------------------------------------------------

    async def _post_watched(
        self, url: str, data: bytes, batches: list[ProducerBatch], moved: dict[tuple[str, int], str | None]
    ) -> bytes:
        """POST the produce request; while it has no answer, look every ``stall_refresh_s`` where its leaders are.

        If a partition's leader moved to another node meanwhile (an idempotent producer only: a resent
        batch is deduplicated by its sequence), the request is abandoned: ``moved`` gets each partition's
        new leader URL (None where it stayed) and NOT_LEADER_OR_FOLLOWER is raised. Otherwise the request
        waits up to its own timeout.
        """
        post = asyncio.ensure_future(self._session.post_bytes(url + "/v1/produce", data, PRODUCE_CONTENT_TYPE))
        if self._stall_refresh_s <= 0 or not self._idem.enabled:
            return (await post)[1]
        sent_to = {(b.topic, b.partition): self._raw_leader(b.topic, b.partition) for b in batches}
        try:
            while True:
                done, _ = await asyncio.wait({post}, timeout=self._stall_refresh_s)
                if done:
                    return post.result()[1]
                silent = next((u for u in sent_to.values() if u is not None), None)
                await self._refresh_stalled(silent)
                if post.done():
                    return post.result()[1]
                now_at = {tp: self._raw_leader(*tp) for tp in sent_to}
                if any(new is not None and new != sent_to[tp] for tp, new in now_at.items()):
                    post.cancel()
                    moved.update({tp: new if new != sent_to[tp] else None for tp, new in now_at.items()})
                    self.abandoned_requests += 1
                    log.info("produce request to %s stalled and its leader moved; resending to %s", url, now_at)
                    raise BrokerError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"no answer from {url}; the leader moved")
        except BaseException:
            post.cancel()
            raise

    def _raw_leader(self, topic: str, partition: int) -> str | None:
        info = self._metadata.cached(topic, partition)
        return info.leader_url if info is not None else None

    async def _refresh_stalled(self, silent: str | None) -> None:
        """One metadata refresh for every stalled request at a time, asking the silent node last."""
        if self._stall_task is None or self._stall_task.done():
            assert self._loop is not None
            self._stall_task = self._loop.create_task(self._refresh_avoiding(silent))
        await asyncio.shield(self._stall_task)

    async def _refresh_avoiding(self, silent: str | None) -> None:
        try:
            await self._metadata.refresh_avoiding(silent, self._stall_refresh_s)
        except BrokerError as exc:
            log.debug("metadata refresh for a stalled request failed: %s", exc)
