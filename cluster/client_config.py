"""``--command-config FILE``: how every command that talks to a cluster learns its URL, trust and credentials.

The file is TOML, the client config ``cluster init --secure`` writes as
``admin.toml``::

    bootstrap = "https://127.0.0.1:9091"   # or a list of URLs; replaces --bootstrap
    username = "admin"                      # Basic credentials (SCRAM user)
    password = "..."
    ssl_cafile = "certs/ca.pem"             # relative paths resolve from the file's folder
    ssl_certfile = "certs/me.pem"           # a client certificate (mTLS), with ssl_keyfile
    ssl_keyfile = "certs/me.key"
    security_protocol = "SASL_SSL"          # optional, checked against the rest
    sasl_mechanism = "SCRAM-SHA-256"        # optional

A missing, unreadable or malformed file, an unknown key or contradicting
settings raise ``ConfigError`` (the CLI prints one line and exits 2). Other
keys are refused so that a misspelt one does not silently send no password.
"""

from __future__ import annotations

import argparse
import contextlib
import tomllib
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clients.aio import parse_bootstrap
from clients.protocol import BrokerError
from clients.security import ClientSecurity, SecurityOptions

from .config import ConfigError

__all__ = [
    "ClientConfig",
    "add_cluster_options",
    "apply_command_config",
    "client_options",
    "load_client_config",
    "urllib_security",
]

#: TOML key -> the clients' keyword argument.
_OPTIONS = {
    "username": "sasl_plain_username",
    "password": "sasl_plain_password",
    "ssl_cafile": "ssl_cafile",
    "ssl_certfile": "ssl_certfile",
    "ssl_keyfile": "ssl_keyfile",
    "security_protocol": "security_protocol",
    "sasl_mechanism": "sasl_mechanism",
}
_PATHS = ("ssl_cafile", "ssl_certfile", "ssl_keyfile")


@dataclass(frozen=True)
class ClientConfig:
    bootstrap: str | None
    security: SecurityOptions = field(default_factory=lambda: SecurityOptions(), repr=False)


def load_client_config(path: str | Path) -> ClientConfig:
    """Read a client config file; relative TLS file paths are made absolute from the file's folder."""
    p = Path(path)
    what = f"--command-config {p}"
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{what}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{what}: cannot read it: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what}: not valid TOML: {exc}") from None
    unknown = sorted(set(raw) - set(_OPTIONS) - {"bootstrap"})
    if unknown:
        raise ConfigError(f"{what}: unknown keys {', '.join(unknown)} (known: bootstrap, {', '.join(_OPTIONS)})")
    bootstrap = raw.get("bootstrap")
    if isinstance(bootstrap, list) and all(isinstance(u, str) for u in bootstrap):
        bootstrap = ",".join(bootstrap)
    if bootstrap is not None and (not isinstance(bootstrap, str) or not bootstrap.strip()):
        raise ConfigError(f"{what}: bootstrap must be a URL or a list of URLs")
    options: dict[str, str] = {}
    for key, option in _OPTIONS.items():
        value = raw.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise ConfigError(f"{what}: {key} must be a string, not {type(value).__name__}")
        if key in _PATHS:
            value = str((p.parent / Path(value).expanduser()).resolve())
        options[option] = value
    return ClientConfig(bootstrap, SecurityOptions(**options))  # type: ignore[typeddict-item]


def add_cluster_options(p: argparse.ArgumentParser, default_bootstrap: str) -> None:
    """``--bootstrap`` and ``--command-config`` on a command that talks to a cluster."""
    p.add_argument("--bootstrap", default=default_bootstrap, help="any node's URL (http:// or https://)")
    p.add_argument(
        "--command-config",
        metavar="FILE",
        help="client config (TOML: bootstrap, username, password, ssl_cafile, ...); its bootstrap replaces --bootstrap",
    )


def apply_command_config(args: argparse.Namespace) -> None:
    """Load ``args.command_config`` (if the command has one): its bootstrap into ``args.bootstrap``, its
    security options into ``client_options(args)``; contradicting settings raise ``ConfigError``."""
    path = getattr(args, "command_config", None)
    if path is None:
        return
    cfg = load_client_config(path)
    if cfg.bootstrap is not None:
        args.bootstrap = cfg.bootstrap
    try:
        ClientSecurity.from_options(parse_bootstrap(args.bootstrap), **cfg.security)
    except (ValueError, BrokerError) as exc:
        raise ConfigError(f"--command-config {path}: {exc}") from None
    args.client_security = cfg.security


def client_options(args: argparse.Namespace) -> SecurityOptions:
    """The security keyword arguments for the clients a command makes (none without --command-config)."""
    options: SecurityOptions = getattr(args, "client_security", SecurityOptions())
    return options


class _Credentials(urllib.request.BaseHandler):
    def __init__(self, headers: dict[str, str]) -> None:
        self._headers = headers

    def _add(self, req: urllib.request.Request) -> urllib.request.Request:
        for name, value in self._headers.items():
            if not req.has_header(name):
                req.add_unredirected_header(name, value)
        return req

    http_request = _add
    https_request = _add


@contextlib.contextmanager
def urllib_security(args: argparse.Namespace) -> Iterator[None]:
    """Within the block, plain ``urllib.request.urlopen`` calls (the health and status reports) trust the
    command config's CA and carry its credentials; outside it nothing changes."""
    options = client_options(args)
    if not options:
        yield
        return
    sec = ClientSecurity.from_options(parse_bootstrap(args.bootstrap), **options)
    handlers: list[Any] = [_Credentials(sec.headers())]
    if sec.ssl_context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=sec.ssl_context))
    urllib.request.install_opener(urllib.request.build_opener(*handlers))
    try:
        yield
    finally:
        urllib.request.install_opener(None)
