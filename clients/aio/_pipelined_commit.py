"""``PipelinedCommit``: the commit ``AsyncProducer.commit_and_begin`` runs while the next transaction is open.

Terms (docs/pipelined-commit.md): the **commit** is the open transaction's
flush, then EndTxn(commit); it runs as a background task. The **held
batches** are those created while it runs: they belong to the next
transaction and are never sequenced or sent until the commit ends. On
success they are released and go out under the identity EndTxn handed out,
after everything of the committed transaction. On any failure they fail
unsent with ``TransactionAbortedError`` and the transaction state is left
where ``commit_transaction`` would have left it
(``TransactionManager.pipelined_commit_unsettled``).

At most one commit is pending; every other transactional call, ``flush`` and
``close`` first ``settle`` it. Event-loop only; not thread-safe.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from ..protocol import BrokerError
from ._accumulator import RecordAccumulator
from ._transactions import TransactionAbortedError, TransactionManager

__all__ = ["PipelinedCommit", "copy_outcome"]


class _Settable(Protocol):
    """What an asyncio or a concurrent.futures future offers to be completed."""

    def done(self) -> bool: ...
    def cancel(self) -> bool: ...
    def set_result(self, result: None, /) -> None: ...
    def set_exception(self, exception: BaseException, /) -> None: ...


def copy_outcome(src: asyncio.Future[None], dst: _Settable) -> None:
    """Complete ``dst`` as ``src`` (done) completed: result, exception or cancellation."""
    if dst.done():
        return
    if src.cancelled():
        dst.cancel()
    elif (exc := src.exception()) is not None:
        dst.set_exception(exc)
    else:
        dst.set_result(None)


class PipelinedCommit:
    """Holds the next transaction's batches while one commit runs; releases or fails them when it ends.

    ``wake`` tells the sender that held batches changed state.
    """

    def __init__(self, acc: RecordAccumulator, wake: Callable[[], None]) -> None:
        self._acc = acc
        self._wake = wake
        self._task: asyncio.Task[None] | None = None

    def start(
        self, loop: asyncio.AbstractEventLoop, txn: TransactionManager, commit: Callable[[], Awaitable[None]]
    ) -> asyncio.Future[None]:
        """Hold batches created from now on and run ``commit()``; returns its outcome as a future.

        ``txn`` is already in PIPELINED_COMMIT. The outcome never logs "exception never retrieved":
        a failure also leaves the transaction in a state that raises it at the next call.
        """
        self._acc.hold_new_batches()
        self._wake()
        outcome: asyncio.Future[None] = loop.create_future()
        outcome.add_done_callback(lambda f: f.cancelled() or f.exception())
        task = loop.create_task(self._run(txn, commit))
        self._task = task

        def settled(t: asyncio.Task[None]) -> None:
            if self._task is t:
                self._task = None
            copy_outcome(t, outcome)

        task.add_done_callback(settled)
        return outcome

    async def _run(self, txn: TransactionManager, commit: Callable[[], Awaitable[None]]) -> None:
        try:
            await commit()
        except BaseException as exc:
            txn.pipelined_commit_unsettled()  # a timeout: commit_transaction finishes it (never an abort)
            code = exc.error_code.name if isinstance(exc, BrokerError) else type(exc).__name__
            self._acc.fail_held(
                TransactionAbortedError(f"{txn.transactional_id}: the transaction before it did not commit ({code})")
            )
            self._wake()
            raise
        self._acc.release_held()
        self._wake()

    async def settle(self, timeout: float | None = None) -> None:
        """Wait until a pending commit has ended, whatever its outcome (the transaction state tells).

        With ``timeout`` (``close``) it is cancelled when that passes first: its outcome stays unknown
        and its held records fail unsent.
        """
        task = self._task
        if task is None:
            return
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            task.cancel()
            await asyncio.wait({task})
