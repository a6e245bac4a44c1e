"""Requests to the transaction and group coordinators, found and retried as Kafka's client does.

A coordinator is the leader of one Raft group (``__transaction_state-p`` for
a transactional id); ``GET /v1/coordinators/{kind}/{key}`` names it. Any node
also proxies such a request to the coordinator, so while the lookup itself
fails the request goes to any node. Retriable answers (CONCURRENT_TRANSACTIONS
while the previous transaction's markers are written, NOT_COORDINATOR and
COORDINATOR_LOAD_IN_PROGRESS around a leader change, transport errors) are
retried with backoff until the caller's deadline; a lookup is repeated after
every answer that says the coordinator moved (at once: no backoff before
asking the new coordinator).

A request without an answer for ``stall_refresh_ms`` makes the client look
the coordinator up again (asking the silent node last) while the request
keeps waiting; if another node coordinates now, the stalled request is
abandoned and sent there (the transaction protocol makes the repeat
harmless), else it waits up to its own timeout.

The typed calls below (InitProducerId, AddOffsetsToTxn, TxnOffsetCommit,
EndTxn, Prepare, and the release of unused carried-marker tokens) build each
request body and parse its answer; the caller owns the transaction state.

Event-loop only; no state besides the coordinator cache.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import quote

from ..protocol import BrokerError, ErrorCode, decode_token, encode_token
from ..records import ConsumerGroupMetadata, OffsetAndMetadata, TopicPartition
from ..security import is_auth_failure
from ._idempotence import ProducerIdAndEpoch
from ._metadata import METADATA_NODE_TIMEOUT_S, MetadataCache
from ._session import HttpSession

__all__ = ["CoordinatorClient", "group_offsets_path", "offset_commit_entries", "transaction_path"]

log = logging.getLogger("clients.producer")

_MOVED = frozenset(
    {
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.REQUEST_TIMED_OUT,
    }
)
# The previous transaction's markers are still being written: they take milliseconds, so retry soon
# (Kafka retries AddPartitions after CONCURRENT_TRANSACTIONS at 20 ms instead of retry.backoff.ms).
_CONCURRENT_BACKOFF_S = 0.02
_MAX_BACKOFF_S = 1.0


class CoordinatorClient:
    def __init__(
        self,
        session: HttpSession,
        metadata: MetadataCache,
        *,
        request_timeout_s: float,
        retry_backoff_s: float,
        rewrite: Callable[[str], str] = lambda u: u,
        stall_refresh_s: float = 0.0,
    ) -> None:
        self._session = session
        self._stall_refresh_s = stall_refresh_s
        self.abandoned_requests = 0
        self._metadata = metadata
        self._request_timeout_s = request_timeout_s
        self._retry_backoff_s = retry_backoff_s
        self._rewrite = rewrite
        self._cache: dict[tuple[str, str], str] = {}
        self._rng = random.Random()
        self.retries = 0

    async def _lookup(
        self, kind: str, key: str, deadline: float, *, avoid: str | None = None, per_node_s: float | None = None
    ) -> str | None:
        """The coordinator's URL, or None when no node could name it now (the caller then asks any node).

        ``avoid`` (a node that does not answer): skip the cache, ask that node last, each at most ``per_node_s``.
        """
        cached = self._cache.get((kind, key))
        if cached is not None and avoid is None:
            return cached
        urls = list(dict.fromkeys(map(self._rewrite, self._metadata.urls())))
        if avoid is not None:
            urls.sort(key=lambda u: u == avoid)
        for url in urls:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                body = await self._session.request_json(
                    "GET", f"{url}/v1/coordinators/{kind}/{quote(key, safe='')}",
                    timeout=min(left, self._request_timeout_s, per_node_s or METADATA_NODE_TIMEOUT_S),
                )  # fmt: skip
            except BrokerError as exc:
                if is_auth_failure(exc):
                    raise
                log.debug("coordinator lookup for %s %r at %s: %s", kind, key, url, exc)
                continue
            found = body.get("url") if isinstance(body, dict) else None
            if isinstance(found, str) and found:
                coordinator = self._rewrite(found.rstrip("/"))
                self._cache[(kind, key)] = coordinator
                return coordinator
        return None

    def _any_node(self, attempt: int) -> str:
        urls = list(dict.fromkeys(map(self._rewrite, self._metadata.urls())))
        return urls[attempt % len(urls)]

    async def call(self, kind: str, key: str, path: str, body: Any, deadline: float, what: str) -> Any:
        """POST ``body`` to ``path`` on the coordinator of ``key``; retry retriable answers until ``deadline``.

        Raises the last ``BrokerError`` when it is not retriable, or
        ``REQUEST_TIMED_OUT`` (naming the last error) when the deadline
        passes -- the request's effect is then unknown.
        """
        attempt = 0
        last: BrokerError | None = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                cause = f": last error {last}" if last is not None else ""
                raise BrokerError(ErrorCode.REQUEST_TIMED_OUT, f"{what} did not finish in time{cause}")
            url = await self._lookup(kind, key, deadline) or self._any_node(attempt)
            try:
                return await self._watched(kind, key, url, path, body, min(max(left, 0.001), self._request_timeout_s))
            except BrokerError as exc:
                if not exc.retriable:
                    raise
                last = exc
                if exc.error_code in _MOVED and not exc.extra.get("abandoned"):
                    self._cache.pop((kind, key), None)  # (an abandoned request's lookup cached the new one)
                self.retries += 1
                log.debug("%s: %s (retrying)", what, exc)
                hint = exc.extra.get("coordinator_url") if exc.error_code is ErrorCode.NOT_COORDINATOR else None
                if isinstance(hint, str) and hint and self._rewrite(hint.rstrip("/")) != url:
                    self._cache[(kind, key)] = self._rewrite(hint.rstrip("/"))  # the answer names the coordinator
                    attempt += 1
                    continue  # ask it now
                if exc.extra.get("abandoned") or (exc.error_code is ErrorCode.NOT_COORDINATOR and attempt == 0):
                    attempt += 1
                    continue  # the coordinator moved: look it up and ask the new one now
            if last.error_code is ErrorCode.CONCURRENT_TRANSACTIONS:
                pause = _CONCURRENT_BACKOFF_S * (1 + min(attempt, 10))
            else:
                pause = min(_MAX_BACKOFF_S, self._retry_backoff_s * 2 ** min(attempt, 4))
            attempt += 1
            pause *= 0.8 + 0.4 * self._rng.random()
            await asyncio.sleep(max(0.0, min(pause, deadline - time.monotonic())))

    async def _watched(self, kind: str, key: str, url: str, path: str, body: Any, timeout: float) -> Any:
        """POST to the coordinator at ``url``; while there is no answer, look every ``stall_refresh_s`` where
        the coordinator is. If another node names a different one, the request is abandoned (a retriable
        error marked ``abandoned``) and the cache points at the new coordinator."""
        post = asyncio.ensure_future(self._session.request_json("POST", url + path, body, timeout=timeout))
        if self._stall_refresh_s <= 0:
            return await post
        until = time.monotonic() + timeout
        try:
            while True:
                done, _ = await asyncio.wait({post}, timeout=self._stall_refresh_s)
                if done:
                    return post.result()
                found = await self._lookup(kind, key, until, avoid=url, per_node_s=self._stall_refresh_s)
                if post.done():
                    return post.result()
                if found is not None and found != url:
                    post.cancel()
                    self.abandoned_requests += 1
                    log.info("%s %r: no answer from %s; the coordinator is now %s", kind, key, url, found)
                    raise BrokerError(
                        ErrorCode.NOT_COORDINATOR, f"no answer from {url}; the coordinator moved", abandoned=True
                    )
        except BaseException:
            post.cancel()
            raise

    # ---- the transactional requests (kafka_txn.md §4.3, TV2) ----------------------------------------

    async def init_producer_id(
        self, transactional_id: str, transaction_timeout_ms: int, deadline: float
    ) -> ProducerIdAndEpoch:
        """InitProducerId for ``transactional_id`` at its transaction coordinator: the fencing identity."""
        body = {"transactional_id": transactional_id, "transaction_timeout_ms": transaction_timeout_ms}
        res = await self.call(
            "transaction", transactional_id, "/v1/producers/init", body, deadline, "init_transactions"
        )
        return ProducerIdAndEpoch(int(res["producer_id"]), int(res["producer_epoch"]))

    async def add_offsets_to_txn(
        self, transactional_id: str, ident: ProducerIdAndEpoch, group_id: str, deadline: float
    ) -> None:
        """AddOffsetsToTxn: the transaction will carry offsets of ``group_id``."""
        body = {**_ident(ident), "group_id": group_id}
        path = transaction_path(transactional_id, "offsets")
        await self.call("transaction", transactional_id, path, body, deadline, "AddOffsetsToTxn")

    async def txn_offset_commit(
        self,
        transactional_id: str,
        ident: ProducerIdAndEpoch,
        group: ConsumerGroupMetadata,
        entries: list[dict[str, Any]],
        deadline: float,
    ) -> None:
        """TxnOffsetCommit at the group coordinator; ``entries`` from ``offset_commit_entries``."""
        body = {
            "offsets": entries,
            "transactional_id": transactional_id,
            **_ident(ident),
            "generation_id": group.generation_id,
            "member_id": group.member_id,
        }
        path = group_offsets_path(group.group_id)
        await self.call("group", group.group_id, path, body, deadline, "TxnOffsetCommit")

    async def end_txn(
        self,
        transactional_id: str,
        ident: ProducerIdAndEpoch,
        *,
        commit: bool,
        receipts: Mapping[tuple[str, int], bytes],
        deadline: float,
    ) -> tuple[ProducerIdAndEpoch, dict[tuple[str, int], bytes]]:
        """EndTxn; returns the next transaction's identity and the carried markers' tokens for it.

        ``receipts`` (carried markers, docs/carried-markers.md): what each partition leader answered to the
        transaction's first batch there; the coordinator turns them into tokens.
        """
        body: dict[str, Any] = {**_ident(ident), "commit": commit}
        body["txn_receipts"] = [{"topic": t, "partition": p, "receipt": encode_token(r)}
                                for (t, p), r in sorted(receipts.items())]  # fmt: skip
        what = "commit_transaction" if commit else "abort_transaction"
        path = transaction_path(transactional_id, "end")
        res = await self.call("transaction", transactional_id, path, body, deadline, what)
        tokens = {(str(t["topic"]), int(t["partition"])): decode_token(str(t["token"]), "txn_tokens")
                  for t in res.get("txn_tokens") or ()}  # fmt: skip
        return ProducerIdAndEpoch(int(res["producer_id"]), int(res["producer_epoch"])), tokens

    async def prepare_txn(
        self, transactional_id: str, ident: ProducerIdAndEpoch, group_id: str | None, deadline: float
    ) -> ProducerIdAndEpoch:
        """Prepare: the transaction becomes durable for an external coordinator (bound to ``group_id`` if given)."""
        body: dict[str, Any] = _ident(ident)
        if group_id is not None:
            body["group_id"] = group_id
        path = transaction_path(transactional_id, "prepare")
        res = await self.call("transaction", transactional_id, path, body, deadline, "prepare_transaction")
        return ProducerIdAndEpoch(int(res["producer_id"]), int(res["producer_epoch"]))

    async def release_tokens(
        self, transactional_id: str, ident: ProducerIdAndEpoch, partitions: Iterable[tuple[str, int]], deadline: float
    ) -> None:
        """Give back carried-marker tokens no batch used, so those partitions get their markers now."""
        body = {**_ident(ident), "partitions": [{"topic": t, "partition": p} for t, p in sorted(partitions)]}
        path = transaction_path(transactional_id, "release")
        await self.call("transaction", transactional_id, path, body, deadline, "release tokens")


def _ident(ident: ProducerIdAndEpoch) -> dict[str, Any]:
    return {"producer_id": ident.producer_id, "producer_epoch": ident.epoch}


def transaction_path(transactional_id: str, action: str) -> str:
    return f"/v1/transactions/{quote(transactional_id, safe='')}/{action}"


def group_offsets_path(group_id: str) -> str:
    return f"/v1/groups/{quote(group_id, safe='')}/offsets"


def offset_commit_entries(offsets: Mapping[TopicPartition, int | OffsetAndMetadata]) -> list[dict[str, Any]]:
    """``{(topic, partition): offset | OffsetAndMetadata}`` as TxnOffsetCommit entries (checked here, not by a 400)."""
    if not isinstance(offsets, Mapping) or not offsets:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "offsets must be a non-empty {(topic, partition): offset} mapping")
    out = []
    for tp, value in offsets.items():
        try:
            topic, partition = tp
        except (TypeError, ValueError):
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"not a (topic, partition) pair: {tp!r}") from None
        om = value if isinstance(value, OffsetAndMetadata) else OffsetAndMetadata(value)
        ok_tp = isinstance(topic, str) and isinstance(partition, int) and not isinstance(partition, bool)
        if not ok_tp or isinstance(om.offset, bool) or not isinstance(om.offset, int) or om.offset < 0:
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"bad offset entry {tp!r}: {value!r}")
        out.append({"topic": topic, "partition": partition, "offset": om.offset, "metadata": om.metadata})
    return out
