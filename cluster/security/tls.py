"""The SSL contexts of the HTTP listener and of node-to-node calls, and the principal of a client certificate.

A node with ``tls_cert_file``/``tls_key_file`` serves HTTPS (TLS 1.2 or newer,
no compression, the ciphers of ``ssl.create_default_context``). With
``tls_client_auth = "required"`` the handshake also demands a client
certificate signed by ``tls_ca_file`` (mTLS); its subject CN names the caller
(``User:<CN>``). Its outgoing calls to other nodes trust ``tls_ca_file`` (the
system CAs without one) and present the node's own certificate.

Files that cannot be read, or a key that does not belong to its certificate,
raise ``ConfigError`` naming the file: a node refuses to start with a clear
message instead of a traceback.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..config import ConfigError, SecurityConfig
from .principals import is_valid_principal, user_principal

__all__ = ["client_context", "node_client_context", "peer_principal", "server_context"]

MIN_VERSION = ssl.TLSVersion.TLSv1_2


def _harden(ctx: ssl.SSLContext) -> ssl.SSLContext:
    ctx.minimum_version = MIN_VERSION
    ctx.options |= ssl.OP_NO_COMPRESSION
    return ctx


def _readable(path: Path, what: str) -> None:
    try:
        with path.open("rb") as f:
            f.read(1)
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc


def _load_chain(ctx: ssl.SSLContext, cert: Path, key: Path) -> None:
    _readable(cert, "TLS certificate file")
    _readable(key, "TLS key file")
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except ssl.SSLError as exc:
        raise ConfigError(
            f"TLS certificate {cert} and key {key} do not load together "
            f"(not PEM, encrypted, or the key does not belong to the certificate): {exc.reason or exc}"
        ) from exc


def _load_ca(ctx: ssl.SSLContext, ca: Path) -> None:
    _readable(ca, "TLS CA file")
    try:
        ctx.load_verify_locations(cafile=str(ca))
    except ssl.SSLError as exc:
        raise ConfigError(f"TLS CA file {ca} holds no usable PEM certificate: {exc.reason or exc}") from exc


def server_context(sec: SecurityConfig) -> ssl.SSLContext:
    """The HTTP listener's context: the node certificate; client certificates required with mTLS."""
    if sec.tls_cert_file is None or sec.tls_key_file is None:
        raise ConfigError("TLS needs security.tls_cert_file and security.tls_key_file")
    ctx = _harden(ssl.create_default_context(ssl.Purpose.CLIENT_AUTH))
    _load_chain(ctx, sec.tls_cert_file, sec.tls_key_file)
    if sec.tls_client_auth == "required":
        if sec.tls_ca_file is None:
            raise ConfigError("security.tls_client_auth = 'required' needs security.tls_ca_file")
        _load_ca(ctx, sec.tls_ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def node_client_context(sec: SecurityConfig | None) -> ssl.SSLContext | None:
    """For this node's calls to other nodes: trusts the cluster CA, presents the node certificate. None without TLS."""
    if sec is None or not sec.tls or sec.tls_cert_file is None or sec.tls_key_file is None:
        return None
    ctx = client_context(sec.tls_ca_file)
    _load_chain(ctx, sec.tls_cert_file, sec.tls_key_file)
    return ctx


def client_context(
    cafile: Path | str | None = None, certfile: Path | str | None = None, keyfile: Path | str | None = None
) -> ssl.SSLContext:
    """A verifying client context (hostname checked) trusting ``cafile`` (system CAs without it), with an
    optional client certificate. Raises ``ConfigError`` naming the file that does not load."""
    ctx = _harden(ssl.create_default_context(ssl.Purpose.SERVER_AUTH))
    if cafile is not None:
        _load_ca(ctx, Path(cafile))
    if certfile is not None:
        _load_chain(ctx, Path(certfile), Path(keyfile if keyfile is not None else certfile))
    return ctx


def _common_name(peercert: Mapping[str, Any]) -> str | None:
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and isinstance(value, str) and value:
                return value
    return None


def peer_principal(source: ssl.SSLObject | ssl.SSLSocket | Mapping[str, Any] | None) -> str | None:
    """``"User:" + subject CN`` of the verified client certificate; None without one.

    ``source`` is what ``request.transport.get_extra_info("ssl_object")`` gives (or its ``getpeercert()``).
    ``getpeercert()`` is empty unless the handshake verified the certificate against the CA, so an
    unverified certificate names no principal.
    """
    if source is None:
        return None
    peercert = source if isinstance(source, Mapping) else source.getpeercert()
    if not peercert:
        return None
    cn = _common_name(peercert)
    if cn is None or not is_valid_principal(user_principal(cn)):
        return None
    return user_principal(cn)
