"""The server side of a SCRAM exchange (RFC 5802, RFC 7677) and of SASL PLAIN, as Kafka's SASL uses them.

SCRAM takes two client messages. ``ScramExchange.first(message)`` parses
``n,,n=NAME,r=CNONCE`` and answers ``r=CNONCE+SNONCE,s=SALT,i=ITERATIONS``;
``final(message)`` checks ``c=biws,r=NONCE,p=PROOF`` against the user's
stored key and answers ``v=SERVER_SIGNATURE``. The proof is checked by
recomputing ``H(ClientKey)`` and comparing it with StoredKey in constant time,
and the nonce by a constant-time comparison too. An unknown user (or one
without a credential of the mechanism) gets a server-first message of the same
shape, with a salt derived from a per-process key and its name, and fails at
the final message like a wrong password, so the exchange does not tell
whether a user exists. Channel binding is not offered (``n`` or ``y`` only).

``parse_plain`` splits a PLAIN message (``authzid NUL authcid NUL password``);
the password itself is checked by ``CredentialChecker``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
from collections.abc import Callable

from clients.protocol import BrokerError, ErrorCode

from .scram import DEFAULT_ITERATIONS, MECHANISMS, ScramCredential

__all__ = ["ScramExchange", "parse_plain"]

_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
_MAX_MESSAGE = 4096
_FAKE_SALT_KEY = os.urandom(32)


def _fail(message: str) -> BrokerError:
    return BrokerError(ErrorCode.SASL_AUTHENTICATION_FAILED, message)


def _attributes(text: str) -> list[tuple[str, str]]:
    out = []
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            raise _fail("malformed SCRAM message")
        out.append((key, value))
    return out


def _sasl_name(value: str) -> str:
    """RFC 5802's saslname: ``=2C`` is ``,`` and ``=3D`` is ``=``; any other ``=`` is malformed."""
    out, i = [], 0
    while i < len(value):
        c = value[i]
        if c == "=":
            code = value[i + 1 : i + 3]
            if code == "2C":
                out.append(",")
            elif code == "3D":
                out.append("=")
            else:
                raise _fail("malformed SCRAM user name")
            i += 3
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _decode(message: bytes) -> str:
    if len(message) > _MAX_MESSAGE:
        raise _fail("SCRAM message too long")
    try:
        return message.decode("utf-8")
    except UnicodeDecodeError:
        raise _fail("SCRAM message is not UTF-8") from None


class ScramExchange:
    """One connection's SCRAM exchange: ``first`` then ``final``; ``username`` once ``final`` succeeded."""

    def __init__(self, mechanism: str, lookup: Callable[[str, str], ScramCredential | None]) -> None:
        """``lookup(username, mechanism)``: the user's credential of that mechanism, or None."""
        if mechanism not in MECHANISMS:
            raise BrokerError(ErrorCode.UNSUPPORTED_SASL_MECHANISM, f"{mechanism!r} is not a SCRAM mechanism")
        self.mechanism = mechanism
        self._hash = _HASHES[mechanism]
        self._lookup = lookup
        self._credential: ScramCredential | None = None
        self._user: str | None = None
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self.username: str | None = None

    @property
    def started(self) -> bool:
        return bool(self._server_first)

    def first(self, message: bytes) -> bytes:
        """The server-first message for the client-first ``message``."""
        if self.started:
            raise BrokerError(ErrorCode.ILLEGAL_SASL_STATE, "the SCRAM exchange already started")
        text = _decode(message)
        gs2, sep, rest = text.partition(",")
        authzid, sep2, bare = rest.partition(",")
        if not sep or not sep2 or gs2 not in ("n", "y"):
            raise _fail("SCRAM: channel binding is not supported; the message must start 'n,,'")
        if authzid:
            raise _fail("SCRAM: an authorization id is not supported")
        attrs = _attributes(bare)
        if len(attrs) < 2 or attrs[0][0] != "n" or attrs[1][0] != "r" or not attrs[1][1]:
            raise _fail("SCRAM: the client-first message must be n=NAME,r=NONCE")
        for key, _value in attrs[2:]:
            if key == "m":
                raise _fail("SCRAM: mandatory extensions are not supported")
        extensions = dict(attrs[2:])
        if extensions.get("tokenauth") is not None:
            raise _fail("SCRAM: delegation tokens are not supported")
        user = _sasl_name(attrs[0][1])
        client_nonce = attrs[1][1]
        if not user or not client_nonce.isprintable() or "," in client_nonce:
            raise _fail("SCRAM: bad user name or nonce")
        self._user = user
        self._credential = self._lookup(user, self.mechanism)
        if self._credential is not None:
            salt, iterations = self._credential.salt, self._credential.iterations
        else:
            salt = hmac.digest(_FAKE_SALT_KEY, f"{self.mechanism}\x00{user}".encode(), "sha256")
            iterations = DEFAULT_ITERATIONS
        self._nonce = client_nonce + secrets.token_urlsafe(24)
        self._client_first_bare = bare
        self._server_first = f"r={self._nonce},s={base64.b64encode(salt).decode()},i={iterations}"
        return self._server_first.encode()

    def final(self, message: bytes) -> bytes:
        """The server-final message (``v=...``) for a client-final ``message`` whose proof holds."""
        if not self.started or self.username is not None:
            raise BrokerError(ErrorCode.ILLEGAL_SASL_STATE, "no SCRAM exchange waits for a final message")
        text = _decode(message)
        without_proof, sep, proof_attr = text.rpartition(",p=")
        if not sep:
            raise _fail("SCRAM: the client-final message has no proof")
        attrs = dict(_attributes(without_proof))
        if attrs.get("c") not in ("biws", "eSws"):  # base64 of "n,," / "y,,"
            raise _fail("SCRAM: channel binding is not supported")
        if not hmac.compare_digest(attrs.get("r", "").encode(), self._nonce.encode()):
            raise _fail("SCRAM: nonce mismatch")
        try:
            proof = base64.b64decode(proof_attr, validate=True)
        except (binascii.Error, ValueError):
            raise _fail("SCRAM: malformed proof") from None
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        cred = self._credential
        size = hashlib.new(self._hash).digest_size
        stored_key = cred.stored_key if cred is not None else bytes(size)
        signature = hmac.digest(stored_key, auth_message, self._hash)
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=False)) if len(proof) == size else b""
        computed = hashlib.new(self._hash, client_key).digest()
        if cred is None or len(proof) != size or not hmac.compare_digest(computed, cred.stored_key):
            raise _fail("wrong user name or password")
        self.username = self._user
        server_signature = hmac.digest(cred.server_key, auth_message, self._hash)
        return b"v=" + base64.b64encode(server_signature)


def parse_plain(message: bytes) -> tuple[str, str]:
    """(user name, password) of a SASL PLAIN message; SASL_AUTHENTICATION_FAILED when malformed."""
    if len(message) > _MAX_MESSAGE:
        raise _fail("PLAIN message too long")
    parts = message.split(b"\x00")
    if len(parts) != 3:
        raise _fail("malformed PLAIN message")
    try:
        authzid, user, password = (p.decode("utf-8") for p in parts)
    except UnicodeDecodeError:
        raise _fail("PLAIN message is not UTF-8") from None
    if not user or not password:
        raise _fail("PLAIN needs a user name and a password")
    if authzid and authzid != user:
        raise _fail("PLAIN: an authorization id other than the user is not supported")
    return user, password
