"""SCRAM-SHA-256 / SCRAM-SHA-512 credentials (RFC 5802, RFC 7677): what a node keeps instead of a password.

``SaltedPassword = PBKDF2-HMAC-H(password, salt, iterations)``,
``ClientKey = HMAC(SaltedPassword, "Client Key")``, ``StoredKey = H(ClientKey)``,
``ServerKey = HMAC(SaltedPassword, "Server Key")``. The credential is the
mechanism, salt, iteration count, StoredKey and ServerKey; the password is
never stored. A password is checked by recomputing StoredKey from it and
comparing in constant time. The password's bytes are its UTF-8 encoding
(Kafka's ``ScramFormatter``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clients.protocol import BrokerError, ErrorCode

from ..config import BootstrapUser

__all__ = [
    "DEFAULT_ITERATIONS",
    "MAX_ITERATIONS",
    "MECHANISMS",
    "MIN_ITERATIONS",
    "SALT_BYTES",
    "ScramCredential",
    "check_password",
    "make_credential",
    "salted_keys",
]

MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
MIN_ITERATIONS = 4096
DEFAULT_ITERATIONS = 8192
MAX_ITERATIONS = 1_000_000
SALT_BYTES = 32
_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


def _hash_name(mechanism: str) -> str:
    try:
        return _HASHES[mechanism]
    except KeyError:
        raise BrokerError(
            ErrorCode.INVALID_REQUEST, f"mechanism must be one of {', '.join(MECHANISMS)}, not {mechanism!r}"
        ) from None


def salted_keys(password: str, mechanism: str, salt: bytes, iterations: int) -> tuple[bytes, bytes, bytes]:
    """(ClientKey, StoredKey, ServerKey) of ``password`` (RFC 5802 section 3)."""
    h = _hash_name(mechanism)
    salted = hashlib.pbkdf2_hmac(h, password.encode("utf-8"), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", h)
    server_key = hmac.digest(salted, b"Server Key", h)
    return client_key, hashlib.new(h, client_key).digest(), server_key


@dataclass(frozen=True, slots=True)
class ScramCredential:
    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def to_json(self) -> dict[str, Any]:
        """The config's ``BootstrapUser`` fields (without the name): binary fields base64."""
        return {
            "mechanism": self.mechanism,
            "salt": base64.b64encode(self.salt).decode(),
            "iterations": self.iterations,
            "stored_key": base64.b64encode(self.stored_key).decode(),
            "server_key": base64.b64encode(self.server_key).decode(),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ScramCredential:
        """The inverse of ``to_json``; INVALID_REQUEST on a bad field."""
        try:
            mechanism = str(obj["mechanism"])
            iterations = obj["iterations"]
            cred = cls(
                mechanism,
                base64.b64decode(str(obj["salt"]), validate=True),
                iterations if isinstance(iterations, int) and not isinstance(iterations, bool) else -1,
                base64.b64decode(str(obj["stored_key"]), validate=True),
                base64.b64decode(str(obj["server_key"]), validate=True),
            )
        except (KeyError, TypeError, binascii.Error) as exc:
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"bad SCRAM credential: {exc!r}") from exc
        cred.validate()
        return cred

    @classmethod
    def from_bootstrap(cls, user: BootstrapUser) -> ScramCredential:
        return cls.from_json(
            {
                "mechanism": user.mechanism,
                "salt": user.salt,
                "iterations": user.iterations,
                "stored_key": user.stored_key,
                "server_key": user.server_key,
            }
        )

    def validate(self) -> None:
        """INVALID_REQUEST unless the fields fit the mechanism (key sizes, iterations, a salt)."""
        size = hashlib.new(_hash_name(self.mechanism)).digest_size
        if not MIN_ITERATIONS <= self.iterations <= MAX_ITERATIONS:
            raise BrokerError(
                ErrorCode.INVALID_REQUEST, f"iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}"
            )
        if not self.salt:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "a SCRAM credential needs a salt")
        if len(self.stored_key) != size or len(self.server_key) != size:
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"{self.mechanism} keys are {size} bytes")


def make_credential(
    password: str, mechanism: str, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None
) -> ScramCredential:
    """The credential of ``password`` (CPU-heavy: PBKDF2; run it off the event loop)."""
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    _, stored_key, server_key = salted_keys(password, mechanism, salt, iterations)
    return ScramCredential(mechanism, salt, iterations, stored_key, server_key)


def check_password(cred: ScramCredential, password: str) -> bool:
    """Whether ``password`` is the credential's (constant-time comparison of StoredKey; PBKDF2 runs)."""
    _, stored_key, _ = salted_keys(password, cred.mechanism, cred.salt, cred.iterations)
    return hmac.compare_digest(stored_key, cred.stored_key)
