"""Node-to-node calls signed per request: who sent it, to whom, for whom, when, and that it is sent once.

Every call one node makes to another -- an internal endpoint (``/v1/internal/*``),
or a client request proxied to the node that can answer it -- carries one header::

    X-Txbroker-Node-Call: v1 n=<sender>,t=<ms>,c=<boot>.<counter>,p=<principal>,s=<signature>

- ``n``: the sending node's id (decimal);
- ``t``: when it was signed, Unix milliseconds (decimal);
- ``c``: the nonce: the signer's boot id (16 lowercase hex digits, random per signer) and a counter the
  signer increments per call to that receiver (decimal);
- ``p``: whom the call acts for, ``"<client address> <principal>"`` (the address host ACLs match, ``*``
  when unknown) in UTF-8, unpadded base64url; empty for the node itself (an internal call);
- ``s``: HMAC-SHA256, lowercase hex, of the canonical string (fields joined by ``\\n``)::

      txbroker-node-call / v1 / METHOD / path?query / SHA-256 hex of the body / p / n / receiver / t / c

  under a key derived from the cluster secret (HKDF-SHA256, fixed salt and label: the raw secret keys
  nothing). The path and query are the request target exactly as sent (the receiver checks its
  ``raw_path_qs``); ``receiver`` is the id of the node the call is sent to, which is not in the header:
  the receiver puts its own id there. So a call cannot be moved to another route, query, body,
  principal -- or node: replay memory is per receiver, and a call captured on its way to one node is
  refused by every other.

The verifier (``NodeCallVerifier``) accepts a call once:

- the signature matches (constant-time comparison);
- ``|now - t| <= max_skew_s`` (30 s by default): a captured call is worthless after that;
- ``t`` is not before the verifier started (less ``start_skew_s``, 0.25 s by default, for the clock
  differences of nodes): the replay memory starts empty when a node restarts, so calls signed before it
  would otherwise be replayable. A node listens only after its verifier exists, and a restart (process
  start, stores opened) takes longer than the skew, so no call signed to its previous run is accepted;
  a sender whose clock is behind by more than the skew sees its first calls refused until its clock
  passes the receiver's start;
- the nonce is new: per sender and boot, a sliding window (IPsec-style anti-replay: the highest counter
  seen and a bitmap of the ``window`` counters below it) remembers what was accepted. A counter above
  the window slides it; within it, each counter is accepted once (calls may arrive out of order); below
  it, it is refused. A boot's window is forgotten once its newest call is older than the freshness
  bound (no call of it can be fresh any more), and a sender has at most ``max_boots`` windows, so the
  memory is bounded whatever the call rate.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import itertools
import os
import re
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

__all__ = [
    "NODE_CALL_HEADER",
    "NodeCall",
    "NodeCallRejected",
    "NodeCallSigner",
    "NodeCallVerifier",
    "body_sha256",
    "body_sha256_async",
]

NODE_CALL_HEADER = "X-Txbroker-Node-Call"
VERSION = "v1"

_HKDF_SALT = b"txbroker cluster secret"
_HKDF_INFO = b"txbroker node-call v1"
_CANONICAL_TAG = "txbroker-node-call"
_MAX_HEADER = 1024
_MAX_PRINCIPAL_BYTES = 512
_MAX_COUNTER = 2**63 - 1
#: Bodies at least this large are hashed in a thread (hashlib releases the GIL), not on the event loop.
_HASH_IN_THREAD = 256 * 1024

_HEADER_RE = re.compile(
    r"v1 n=(0|[1-9][0-9]{0,9}),t=(0|[1-9][0-9]{0,15}),c=([0-9a-f]{16}\.(?:0|[1-9][0-9]{0,18})),"
    r"p=([A-Za-z0-9_-]{0,700}),s=([0-9a-f]{64})"
)
_METHOD_RE = re.compile(r"[A-Z]{1,16}")


@dataclass(frozen=True)
class NodeCall:
    """A verified node-to-node call: its sender, and the principal it acts for (None: the node itself)."""

    sender: int
    principal: str | None
    #: the address of the client a forwarded call acts for (its ACLs' host), as the forwarding node saw it
    host: str | None = None


class NodeCallRejected(Exception):
    """A node-call header that is malformed, wrongly signed, stale, or replayed."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def derive_key(secret: str) -> bytes:
    """HKDF-SHA256 (RFC 5869) of the cluster secret with a fixed salt and label: the node-call key."""
    if not secret:
        raise ValueError("the cluster secret must not be empty")
    prk = hmac.new(_HKDF_SALT, secret.encode("utf-8"), hashlib.sha256).digest()
    return hmac.new(prk, _HKDF_INFO + b"\x01", hashlib.sha256).digest()


def body_sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


async def body_sha256_async(body: bytes) -> str:
    """``body_sha256``, in a thread for a large body (so the event loop does not wait for it)."""
    if len(body) < _HASH_IN_THREAD:
        return body_sha256(body)
    return await asyncio.to_thread(body_sha256, body)


def _encode_principal(principal: str | None, host: str | None) -> str:
    """``"<client host> <principal>"`` (a host has no space; a principal may), unpadded base64url."""
    if principal is None:
        return ""
    if host is not None and (not host or not host.isprintable() or " " in host):
        raise ValueError("a node call's client host is printable, without spaces")
    raw = f"{host or '*'} {principal}".encode()
    if not principal or len(raw) > _MAX_PRINCIPAL_BYTES or not principal.isprintable():
        raise ValueError(f"a node call's principal is 1..{_MAX_PRINCIPAL_BYTES} printable bytes")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _decode_principal(p: str) -> tuple[str | None, str | None]:
    """(principal, client host) of a call's ``p`` field."""
    if not p:
        return None, None
    try:
        text = base64.urlsafe_b64decode(p + "=" * (-len(p) % 4)).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        raise NodeCallRejected("malformed principal") from None
    host, _, principal = text.partition(" ")
    if not host or not principal or len(text.encode("utf-8")) > _MAX_PRINCIPAL_BYTES or not text.isprintable():
        raise NodeCallRejected("malformed principal")
    return principal, host


def _canonical(
    method: str, path_qs: str, digest: str, p: str, sender: int, receiver: int, t_ms: int, nonce: str
) -> bytes:
    fields = (_CANONICAL_TAG, VERSION, method, path_qs, digest, p, str(sender), str(receiver), str(t_ms), nonce)
    return "\n".join(fields).encode("ascii")


def _check_target(method: str, path_qs: str) -> None:
    if not _METHOD_RE.fullmatch(method):
        raise ValueError(f"bad method {method[:20]!r}")
    if not path_qs.startswith("/") or not path_qs.isascii() or not path_qs.isprintable() or " " in path_qs:
        raise ValueError(f"a signed request target is printable ASCII without spaces: {path_qs[:80]!r}")
    if "#" in path_qs:
        raise ValueError(f"a request target has no fragment: {path_qs[:80]!r}")


class NodeCallSigner:
    """Signs this node's calls (one boot id per signer; per receiver, a counter per call)."""

    def __init__(self, secret: str, node_id: int, *, clock: Callable[[], float] = time.time) -> None:
        if not 0 <= node_id <= 2**31 - 1:
            raise ValueError(f"bad node id {node_id}")
        self._key = derive_key(secret)
        self.node_id = node_id
        self.boot = os.urandom(8).hex()
        self._counters: dict[int, itertools.count[int]] = {}
        self._clock = clock

    def sign(
        self,
        method: str,
        path_qs: str,
        body: bytes,
        principal: str | None,
        *,
        receiver: int,
        body_digest: str | None = None,
        host: str | None = None,
    ) -> str:
        """The ``X-Txbroker-Node-Call`` header value of one call to node ``receiver``.

        ``body_digest``: ``body_sha256(body)``, if the caller has it (then ``body`` is not read)."""
        _check_target(method, path_qs)
        p = _encode_principal(principal, host)
        digest = body_digest if body_digest is not None else body_sha256(body)
        t_ms = int(self._clock() * 1000)
        counter = self._counters.get(receiver)
        if counter is None:
            counter = self._counters[receiver] = itertools.count(1)
        nonce = f"{self.boot}.{next(counter)}"
        canonical = _canonical(method, path_qs, digest, p, self.node_id, receiver, t_ms, nonce)
        sig = hmac.new(self._key, canonical, hashlib.sha256)
        return f"{VERSION} n={self.node_id},t={t_ms},c={nonce},p={p},s={sig.hexdigest()}"


class _Window:
    """Anti-replay state of one (sender, boot): the highest counter accepted and a bitmap below it."""

    __slots__ = ("bits", "newest_t", "top")

    def __init__(self) -> None:
        self.top = -1
        self.bits = 0  # bit i: counter top - i was accepted
        self.newest_t = 0

    def accept(self, counter: int, size: int) -> str | None:
        """Mark ``counter`` seen; why not, if it was seen or is below the window."""
        if counter > self.top:
            shift = counter - self.top
            self.bits = 1 if shift >= size else ((self.bits << shift) | 1) & ((1 << size) - 1)
            self.top = counter
            return None
        behind = self.top - counter
        if behind >= size:
            return "nonce below the replay window"
        bit = 1 << behind
        if self.bits & bit:
            return "replayed"
        self.bits |= bit
        return None


class NodeCallVerifier:
    """Checks the node-call headers of calls to node ``node_id``: signature, freshness, not before this
    verifier started, never twice."""

    def __init__(
        self,
        secret: str,
        *,
        node_id: int,
        senders: Collection[int] | Callable[[int], bool] | None = None,
        max_skew_s: float = 30.0,
        start_skew_s: float = 0.25,
        window: int = 8192,
        max_boots: int = 64,
        max_senders: int = 4096,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_skew_s <= 0 or start_skew_s < 0 or window < 1 or max_boots < 1 or max_senders < 1:
            raise ValueError("bad node-call verifier bounds")
        self._key = derive_key(secret)
        self.node_id = node_id
        #: Whether a node id is a node of the cluster (None: any id the signature covers).
        self._is_sender: Callable[[int], bool] | None = (
            senders if callable(senders) or senders is None else frozenset(senders).__contains__
        )
        self._skew_ms = int(max_skew_s * 1000)
        self._window = window
        self._max_boots = max_boots
        self._max_senders = max_senders
        self._clock = clock
        self.started_ms = int(clock() * 1000)
        self._not_before_ms = self.started_ms - int(start_skew_s * 1000)
        self._windows: dict[int, dict[str, _Window]] = {}
        self._swept_ms = self.started_ms

    def windows(self) -> int:
        """How many (sender, boot) replay windows are held (bounded: ``max_senders * max_boots``)."""
        return sum(len(boots) for boots in self._windows.values())

    def verify(
        self, method: str, path_qs: str, body: bytes, header_value: str, *, body_digest: str | None = None
    ) -> NodeCall:
        """The call ``header_value`` signs for this request; ``NodeCallRejected`` if it is not one to accept."""
        if len(header_value) > _MAX_HEADER or not header_value.isascii():
            raise NodeCallRejected("malformed node-call header")
        m = _HEADER_RE.fullmatch(header_value)
        if m is None:
            raise NodeCallRejected("malformed node-call header")
        sender, t_ms, nonce, p, sig = int(m[1]), int(m[2]), m[3], m[4], m[5]
        if not _METHOD_RE.fullmatch(method) or not path_qs.isascii():
            raise NodeCallRejected("request target cannot be signed")
        digest = body_digest if body_digest is not None else body_sha256(body)
        canonical = _canonical(method, path_qs, digest, p, sender, self.node_id, t_ms, nonce)
        want = hmac.new(self._key, canonical, hashlib.sha256)
        if not hmac.compare_digest(want.hexdigest().encode("ascii"), sig.encode("ascii")):
            raise NodeCallRejected("bad signature (or signed for another node)")
        if self._is_sender is not None and not self._is_sender(sender):
            raise NodeCallRejected(f"node {sender} is not a node of this cluster")
        principal, host = _decode_principal(p)
        now_ms = int(self._clock() * 1000)
        if t_ms < now_ms - self._skew_ms:
            raise NodeCallRejected("stale")
        if t_ms > now_ms + self._skew_ms:
            raise NodeCallRejected("signed in the future")
        if t_ms < self._not_before_ms:
            raise NodeCallRejected("signed before this node started")
        boot, _, counter = nonce.partition(".")
        if int(counter) > _MAX_COUNTER:
            raise NodeCallRejected("malformed nonce")
        self._sweep(now_ms)
        win = self._window_of(sender, boot, now_ms)
        why = win.accept(int(counter), self._window)
        if why is not None:
            raise NodeCallRejected(why)
        win.newest_t = max(win.newest_t, t_ms)
        return NodeCall(sender, principal, host)

    def _window_of(self, sender: int, boot: str, now_ms: int) -> _Window:
        boots = self._windows.get(sender)
        if boots is None:
            if len(self._windows) >= self._max_senders:
                raise NodeCallRejected("too many senders")
            boots = self._windows[sender] = {}
        win = boots.get(boot)
        if win is None:
            self._expire(boots, now_ms)
            if len(boots) >= self._max_boots:
                raise NodeCallRejected(f"too many boots of node {sender} within the freshness window")
            win = boots[boot] = _Window()
        return win

    def _expire(self, boots: dict[str, _Window], now_ms: int) -> None:
        """Forget the windows none of whose calls can still be fresh (``|now - t| <= skew`` fails for all)."""
        for boot in [b for b, w in boots.items() if w.newest_t + self._skew_ms < now_ms]:
            del boots[boot]

    def _sweep(self, now_ms: int) -> None:
        if now_ms - self._swept_ms < self._skew_ms:
            return
        self._swept_ms = now_ms
        for sender in list(self._windows):
            boots = self._windows[sender]
            self._expire(boots, now_ms)
            if not boots:
                del self._windows[sender]
