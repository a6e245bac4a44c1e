"""SCRAM-SHA-256/512 credentials (RFC 5802 / RFC 7677 keys): what a node keeps instead of a password.

SaltedPassword = PBKDF2-HMAC(password, salt, iterations); ClientKey =
HMAC(SaltedPassword, "Client Key"); StoredKey = H(ClientKey); ServerKey =
HMAC(SaltedPassword, "Server Key"). A password is checked by recomputing
StoredKey and comparing in constant time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from ..config import BootstrapUser

__all__ = ["DEFAULT_ITERATIONS", "MECHANISMS", "MIN_ITERATIONS", "ScramCredential", "check_password",
           "make_credential"]  # fmt: skip

MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
MIN_ITERATIONS = 4096
DEFAULT_ITERATIONS = 8192
_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
_SALT_BYTES = 16


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@dataclass(frozen=True, slots=True)
class ScramCredential:
    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "mechanism": self.mechanism,
            "salt": _b64(self.salt),
            "iterations": self.iterations,
            "stored_key": _b64(self.stored_key),
            "server_key": _b64(self.server_key),
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ScramCredential:
        mechanism = str(obj["mechanism"])
        if mechanism not in MECHANISMS:
            raise ValueError(f"unknown SCRAM mechanism {mechanism!r}")
        return cls(
            mechanism,
            base64.b64decode(str(obj["salt"]), validate=True),
            int(obj["iterations"]),
            base64.b64decode(str(obj["stored_key"]), validate=True),
            base64.b64decode(str(obj["server_key"]), validate=True),
        )

    @classmethod
    def from_bootstrap(cls, user: BootstrapUser) -> ScramCredential:
        return cls.from_json({"mechanism": user.mechanism, "salt": user.salt, "iterations": user.iterations,
                              "stored_key": user.stored_key, "server_key": user.server_key})  # fmt: skip


def _keys(password: str, mechanism: str, salt: bytes, iterations: int) -> tuple[bytes, bytes]:
    name = _HASHES[mechanism]
    salted = hashlib.pbkdf2_hmac(name, password.encode("utf-8"), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", name).digest()
    stored_key = hashlib.new(name, client_key).digest()
    server_key = hmac.new(salted, b"Server Key", name).digest()
    return stored_key, server_key


def make_credential(
    password: str, mechanism: str, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None
) -> ScramCredential:
    if mechanism not in MECHANISMS:
        raise ValueError(f"mechanism must be one of {', '.join(MECHANISMS)}")
    if iterations < MIN_ITERATIONS:
        raise ValueError(f"SCRAM needs at least {MIN_ITERATIONS} iterations")
    salt = salt if salt is not None else secrets.token_bytes(_SALT_BYTES)
    stored_key, server_key = _keys(password, mechanism, salt, iterations)
    return ScramCredential(mechanism, salt, iterations, stored_key, server_key)


def check_password(cred: ScramCredential, password: str) -> bool:
    stored_key, _ = _keys(password, cred.mechanism, cred.salt, cred.iterations)
    return hmac.compare_digest(stored_key, cred.stored_key)
