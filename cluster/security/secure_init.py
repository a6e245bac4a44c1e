"""What ``txbroker cluster init --secure`` writes next to the node configs.

In the cluster directory ``D``:

- ``D/certs/``: ``ca.pem``/``ca.key`` and ``node-<id>.pem``/``.key`` per node (``certs``);
- each node config's ``[security]`` section: HTTPS with the node's certificate, HTTP Basic against
  SCRAM credentials, ACLs enforced, ``User:admin`` a super user, and the bootstrap users ``admin``
  and ``metrics`` (hashed; no password reaches a node config) with ``metrics`` allowed DESCRIBE on
  the cluster (what ``/metrics`` needs);
- ``D/admin.toml`` (0600): the client config of the super user (``bootstrap``, ``username``,
  ``password``, ``ssl_cafile``; paths relative to the file's folder);
- ``D/metrics.password`` (0600): the metrics user's password, for Prometheus's ``password_file``.

Secrets already there are kept: a directory initialised again (``--force``) keeps its CA, the node
certificates that still name their host, and both passwords.
"""

from __future__ import annotations

import secrets
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from ..config import BootstrapUser, ConfigError, NodeConfig, SecurityConfig
from .certs import certificate_covers, make_ca, make_node_certificate, write_private
from .scram import make_credential

__all__ = [
    "ADMIN_CONFIG",
    "ADMIN_USER",
    "CERTS_DIR",
    "METRICS_PASSWORD_FILE",
    "METRICS_USER",
    "SecureSetup",
    "render_client_config",
    "secure_cluster",
]

ADMIN_USER = "admin"
METRICS_USER = "metrics"
CERTS_DIR = "certs"
ADMIN_CONFIG = "admin.toml"
METRICS_PASSWORD_FILE = "metrics.password"
MECHANISM = "SCRAM-SHA-256"
CA_NAME = "txbroker CA"


@dataclass(frozen=True, slots=True)
class SecureSetup:
    """The node configs with their ``[security]`` sections, and the files written beside them."""

    configs: list[NodeConfig]
    admin_config: Path
    ca_file: Path
    metrics_user: str
    metrics_password_file: Path


def _write_private(path: Path, text: str) -> None:
    write_private(path, text.encode())


def _toml_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_client_config(bootstrap: str, username: str, password: str, ssl_cafile: str) -> str:
    """A client config (``--command-config``): relative paths in it resolve from its folder."""
    return "\n".join([
        f"# txbroker client config of {username!r} (written by `txbroker cluster init --secure`): keep it private",
        f"bootstrap = {_toml_string(bootstrap)}",
        f"username = {_toml_string(username)}",
        f"password = {_toml_string(password)}",
        f"ssl_cafile = {_toml_string(ssl_cafile)}",
        "",
    ])  # fmt: skip


def _existing_admin_password(path: Path) -> str | None:
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path} (remove it to make a new admin password): {exc}") from exc
    password = raw.get("password")
    return password if isinstance(password, str) and password else None


def _existing_password(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    return text or None


def _new_password() -> str:
    return secrets.token_urlsafe(24)


def _bootstrap_user(name: str, password: str) -> BootstrapUser:
    cred = make_credential(password, MECHANISM).to_json()
    return BootstrapUser(name, cred["mechanism"], cred["salt"], int(cred["iterations"]), cred["stored_key"],
                         cred["server_key"])  # fmt: skip


def _metrics_acl() -> dict[str, str]:
    return {
        "principal": f"User:{METRICS_USER}",
        "host": "*",
        "resource_type": "CLUSTER",
        "resource_name": "kafka-cluster",
        "pattern_type": "LITERAL",
        "operation": "DESCRIBE",
        "permission": "ALLOW",
    }


def secure_cluster(configs: list[NodeConfig], directory: Path) -> SecureSetup:
    """Certificates, passwords and client files in ``directory``; the configs gain their ``[security]`` section."""
    d = Path(directory)
    certs = d / CERTS_DIR
    ca_cert, ca_key = certs / "ca.pem", certs / "ca.key"
    if not (ca_cert.is_file() and ca_key.is_file()):
        make_ca(certs, CA_NAME)
    admin_path = d / ADMIN_CONFIG
    admin_password = _existing_admin_password(admin_path) or _new_password()
    metrics_path = d / METRICS_PASSWORD_FILE
    metrics_password = _existing_password(metrics_path) or _new_password()
    users = (_bootstrap_user(ADMIN_USER, admin_password), _bootstrap_user(METRICS_USER, metrics_password))
    out: list[NodeConfig] = []
    for c in configs:
        cert, key = certs / f"node-{c.node_id}.pem", certs / f"node-{c.node_id}.key"
        if not (key.is_file() and certificate_covers(cert, ca_cert, c.host)):
            make_node_certificate(ca_cert, ca_key, certs, c.node_id, c.host)
        sec = SecurityConfig(
            tls_cert_file=Path(CERTS_DIR, cert.name),
            tls_key_file=Path(CERTS_DIR, key.name),
            tls_ca_file=Path(CERTS_DIR, ca_cert.name),
            tls_client_auth="none",
            authentication=("basic",),
            authorizer=True,
            super_users=(f"User:{ADMIN_USER}",),
            allow_everyone_if_no_acl_found=False,
            metrics_public=False,
            bootstrap_users=users,
            bootstrap_acls=(_metrics_acl(),),
        )
        nodes = tuple(replace(n, scheme="https") for n in c.nodes)
        out.append(replace(c, nodes=nodes, security=sec))
    bootstrap = ",".join(n.url for n in out[0].nodes) if out else ""
    _write_private(admin_path, render_client_config(bootstrap, ADMIN_USER, admin_password, f"{CERTS_DIR}/ca.pem"))
    _write_private(metrics_path, metrics_password)
    return SecureSetup(out, admin_path, ca_cert, METRICS_USER, metrics_path)
