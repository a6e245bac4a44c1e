"""Checking HTTP Basic credentials against SCRAM credentials, with a small cache of verified ones.

A check runs PBKDF2 (thousands of HMACs: milliseconds of CPU), far more than
serving a request, so a verified (user, password) pair is remembered: the
cache key is an HMAC of the user name and password under a random per-process
key (the cache never holds a password, and its keys are useless outside the
process). ``cached`` answers from the cache alone, so the HTTP layer answers a
hit on the event loop and runs ``check`` in a thread only on a miss.
``replace_users`` installs the users of a new replicated state and drops the
cache entries of every user whose credentials changed or went away, so a
changed password stops working at once.

A password is good when it verifies against any of the user's credentials
(one per SCRAM mechanism; a password change replaces them all). An unknown
user costs the same PBKDF2 as a known one, so timing does not tell whether a
user exists.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping

from .scram import MIN_ITERATIONS, ScramCredential, check_password, make_credential

__all__ = ["DEFAULT_CACHE_SIZE", "CredentialChecker", "UserCredentials"]

#: name -> mechanism -> credential
UserCredentials = Mapping[str, Mapping[str, ScramCredential]]

DEFAULT_CACHE_SIZE = 1024
_DUMMY = make_credential("", "SCRAM-SHA-256", MIN_ITERATIONS, b"\x00" * 16)


class CredentialChecker:
    """``check(username, password)`` against the users' SCRAM credentials (see the module docstring).

    Thread-safe: ``check`` runs in worker threads while the loop calls ``cached`` and ``replace_users``.
    """

    def __init__(self, users: UserCredentials | None = None, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        self._users: dict[str, dict[str, ScramCredential]] = {
            name: dict(creds) for name, creds in (users or {}).items()
        }
        self._cache_size = cache_size
        self._key = os.urandom(32)
        self._lock = threading.Lock()
        #: cache key -> (user name, the credentials it verified against)
        self._cache: OrderedDict[bytes, tuple[str, Mapping[str, ScramCredential]]] = OrderedDict()

    def _cache_key(self, username: str, password: str) -> bytes:
        msg = username.encode("utf-8", "surrogatepass") + b"\x00" + password.encode("utf-8", "surrogatepass")
        return hmac.digest(self._key, msg, hashlib.sha256)

    def users(self) -> dict[str, dict[str, ScramCredential]]:
        with self._lock:
            return {name: dict(creds) for name, creds in self._users.items()}

    def credential(self, username: str, mechanism: str) -> ScramCredential | None:
        """``username``'s credential of ``mechanism`` (a SCRAM exchange checks the proof against it), or None."""
        with self._lock:
            creds = self._users.get(username)
            return creds.get(mechanism) if creds is not None else None

    def cached(self, username: str, password: str) -> bool | None:
        """True when this pair was verified against the user's current credentials; None: not known here."""
        key = self._cache_key(username, password)
        with self._lock:
            hit = self._cache.get(key)
            if hit is None:
                return None
            name, creds = hit
            if name != username or self._users.get(username) is not creds:
                del self._cache[key]
                return None
            self._cache.move_to_end(key)
            return True

    def check(self, username: str, password: str) -> bool:
        """Whether ``password`` is ``username``'s (PBKDF2 on a cache miss: call it off the event loop)."""
        if self.cached(username, password):
            return True
        with self._lock:
            creds = self._users.get(username)
        if not creds:
            check_password(_DUMMY, password)  # the same cost as a known user
            return False
        ok = False
        for cred in creds.values():
            ok |= check_password(cred, password)
        if ok:
            key = self._cache_key(username, password)
            with self._lock:
                if self._users.get(username) is creds:  # not replaced while we computed
                    self._cache[key] = (username, creds)
                    self._cache.move_to_end(key)
                    while len(self._cache) > self._cache_size:
                        self._cache.popitem(last=False)
        return ok

    def replace_users(self, users: UserCredentials) -> None:
        """Install ``users``; drop the cache entries of users whose credentials changed or were removed."""
        with self._lock:
            old = self._users
            new: dict[str, dict[str, ScramCredential]] = {}
            for name, creds in users.items():
                before = old.get(name)
                new[name] = before if before is not None and before == dict(creds) else dict(creds)
            self._users = new
            stale = [k for k, (name, creds) in self._cache.items() if new.get(name) is not creds]
            for k in stale:
                del self._cache[k]

    def cache_size(self) -> int:
        with self._lock:
            return len(self._cache)
