"""How a client reaches a secured cluster: TLS trust, client certificate, credentials.

Every client (``Producer``, ``Consumer``, ``Admin`` and their asyncio twins)
takes kafka-python's security arguments (``SecurityOptions``):

* ``sasl_plain_username`` / ``sasl_plain_password``: sent as
  ``Authorization: Basic`` on every request (built once); the broker checks
  them against the user's SCRAM credential. Over HTTP every
  ``sasl_mechanism`` ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") is sent the
  same way, so the mechanism only has to be one of those.
* ``ssl_cafile``: the CA that signed the nodes' certificates (default: the
  system's trusted CAs); ``ssl_certfile`` / ``ssl_keyfile``: a client
  certificate (mTLS).
* ``security_protocol``: "PLAINTEXT", "SSL", "SASL_PLAINTEXT" or "SASL_SSL".
  The bootstrap URLs' scheme decides TLS; a protocol that contradicts them or
  the credentials (``SSL`` with ``http://``, ``SASL_SSL`` without a username,
  a username with ``PLAINTEXT``) is a ``ValueError``.

A 401 answer is ``SASL_AUTHENTICATION_FAILED`` and a 403 one of the
``*_AUTHORIZATION_FAILED`` codes; neither is retriable, and ``is_auth_failure``
lets the loops that try node after node stop at once on them.
"""

from __future__ import annotations

import base64
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from .protocol import BrokerError, ErrorCode

__all__ = [
    "ACL_FIELDS",
    "AUTH_FAILURES",
    "SASL_MECHANISMS",
    "SECURITY_PROTOCOLS",
    "AclBinding",
    "ClientSecurity",
    "SecurityOptions",
    "basic_authorization",
    "is_auth_failure",
]

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

#: Answers about who the caller is or what it may do: asking another node, or again, cannot change them.
AUTH_FAILURES = frozenset(
    {
        ErrorCode.SASL_AUTHENTICATION_FAILED,
        ErrorCode.TOPIC_AUTHORIZATION_FAILED,
        ErrorCode.GROUP_AUTHORIZATION_FAILED,
        ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)


def is_auth_failure(exc: BrokerError) -> bool:
    return exc.error_code in AUTH_FAILURES


class SecurityOptions(TypedDict, total=False):
    """The security keyword arguments every client accepts (kafka-python's names)."""

    sasl_plain_username: str | None
    sasl_plain_password: str | None
    ssl_cafile: str | None
    ssl_certfile: str | None
    ssl_keyfile: str | None
    security_protocol: str | None
    sasl_mechanism: str | None


def basic_authorization(username: str, password: str) -> str:
    """The ``Authorization`` header value of HTTP Basic (RFC 7617, UTF-8)."""
    if ":" in username:
        raise ValueError("sasl_plain_username must not contain ':' (HTTP Basic separates it from the password)")
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode("ascii")


def _schemes(urls: Sequence[str]) -> set[str]:
    return {u.split("://", 1)[0].lower() for u in urls if "://" in u}


@dataclass(frozen=True)
class ClientSecurity:
    """The validated security settings of one client; ``authorization`` and ``ssl_context`` are built once.

    The password is kept out of ``repr`` (and so out of logs and tracebacks).
    """

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    tls: bool = False
    authorization: str | None = field(default=None, repr=False)
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_options(
        cls,
        urls: Sequence[str],
        *,
        sasl_plain_username: str | None = None,
        sasl_plain_password: str | None = None,
        ssl_cafile: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        security_protocol: str | None = None,
        sasl_mechanism: str | None = None,
    ) -> ClientSecurity:
        """Check the options against each other and the bootstrap URLs; raises ``ValueError`` on contradictions."""
        schemes = _schemes(urls)
        if len(schemes) > 1:
            raise ValueError("bootstrap URLs mix http:// and https://; a cluster serves one scheme")
        tls = schemes == {"https"}
        username = sasl_plain_username or None
        if (username is None) != (sasl_plain_password is None):
            raise ValueError("give sasl_plain_username and sasl_plain_password together")
        if security_protocol is not None:
            proto = str(security_protocol).upper()
            if proto not in SECURITY_PROTOCOLS:
                raise ValueError(f"security_protocol must be one of {', '.join(SECURITY_PROTOCOLS)}, not {proto!r}")
            if proto.endswith("SSL") and not tls:
                raise ValueError(f"security_protocol {proto} needs https:// bootstrap URLs")
            if not proto.endswith("SSL") and tls:
                raise ValueError(
                    f"security_protocol {proto} contradicts the https:// bootstrap URLs (use SSL or SASL_SSL)"
                )
            if proto.startswith("SASL_") and username is None:
                raise ValueError(f"security_protocol {proto} needs sasl_plain_username and sasl_plain_password")
            if not proto.startswith("SASL_") and username is not None:
                raise ValueError(f"security_protocol {proto} sends no credentials: use SASL_{proto} with a username")
        if sasl_mechanism is not None and str(sasl_mechanism).upper() not in SASL_MECHANISMS:
            raise ValueError(f"sasl_mechanism must be one of {', '.join(SASL_MECHANISMS)}, not {sasl_mechanism!r}")
        if ssl_keyfile and not ssl_certfile:
            raise ValueError("ssl_keyfile needs ssl_certfile (the client certificate it belongs to)")
        if not tls and (ssl_cafile or ssl_certfile):
            raise ValueError("ssl_cafile/ssl_certfile need https:// bootstrap URLs")
        auth = basic_authorization(username, sasl_plain_password or "") if username is not None else None
        ctx = client_ssl_context(ssl_cafile, ssl_certfile, ssl_keyfile) if tls else None
        return cls(username, sasl_plain_password, ssl_cafile or None, ssl_certfile or None, ssl_keyfile or None,
                   tls, auth, ctx)  # fmt: skip

    def headers(self) -> dict[str, str]:
        """Headers every request carries (the credentials)."""
        return {"Authorization": self.authorization} if self.authorization is not None else {}

    def head_lines(self) -> bytes:
        """``headers()`` as raw HTTP/1.1 header lines, each ending in CRLF."""
        return b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in self.headers().items())


def client_ssl_context(
    cafile: str | None = None, certfile: str | None = None, keyfile: str | None = None
) -> ssl.SSLContext:
    """The TLS context of every client connection: verify the node against ``cafile`` (or the system CAs).

    A missing or unreadable file is a ``ValueError`` naming it.
    """
    try:
        ctx = ssl.create_default_context(cafile=cafile or None)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"ssl_cafile {cafile!r}: {exc}") from exc
    if certfile:
        try:
            ctx.load_cert_chain(certfile, keyfile or None)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"ssl_certfile {certfile!r} / ssl_keyfile {keyfile!r}: {exc}") from exc
    return ctx


# ---- ACLs as values (Admin.create_acls / describe_acls / delete_acls) ---------------------------------

ACL_FIELDS = ("principal", "host", "resource_type", "resource_name", "pattern_type", "operation", "permission")


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL (Kafka's model): ``principal`` may ``operation`` on a resource, or is denied it.

    ``resource_type``: TOPIC, GROUP, CLUSTER (named ``kafka-cluster``) or
    TRANSACTIONAL_ID; ``pattern_type``: LITERAL (``*`` matches every name) or
    PREFIXED; ``operation``: ALL, READ, WRITE, CREATE, DELETE, ALTER,
    DESCRIBE, IDEMPOTENT_WRITE; ``permission``: ALLOW or DENY. The broker
    checks every field; ``Admin.create_acls`` takes these or the same JSON
    objects as dicts.
    """

    principal: str
    resource_type: str
    resource_name: str
    operation: str
    permission: str = "ALLOW"
    host: str = "*"
    pattern_type: str = "LITERAL"

    def to_json(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in ACL_FIELDS}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> AclBinding:
        """An ACL object of the broker's answers (``describe_acls``) as a binding."""
        missing = [n for n in ("principal", "resource_type", "resource_name", "operation") if n not in obj]
        if missing:
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"ACL object without {', '.join(missing)}: {obj!r}")
        return cls(**{n: str(obj[n]) for n in ACL_FIELDS if n in obj})
