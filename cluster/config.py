"""Node configuration: one TOML file per node (stdlib ``tomllib``).

Example (what ``txbroker cluster init`` writes)::

    node_id = 1
    host = "127.0.0.1"
    http_port = 9091
    raft_port = 9094
    data_dir = "/var/lib/txbroker/node-1"
    cluster_id = "..."          # nodes refuse to join a cluster with another id
    cluster_secret = "..."      # authenticates Raft traffic (PySyncObj password)

    [[nodes]]                   # every node of the cluster, this one included
    id = 1
    host = "127.0.0.1"
    http_port = 9091
    raft_port = 9094

Optional keys and their defaults are the fields of ``NodeConfig`` below.
"""

from __future__ import annotations

import secrets
import socket
import tomllib
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any


class ConfigError(Exception):
    """The config file is missing, unreadable or inconsistent."""


@dataclass(frozen=True, slots=True)
class NodeAddress:
    id: int
    host: str
    http_port: int
    raft_port: int
    scheme: str = "http"  # "https" in a cluster whose nodes serve TLS (every node of a cluster does, or none)
    kafka_port: int | None = None  # the Kafka listener's port (None: the node has none)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.http_port}"

    @property
    def kafka_address(self) -> str | None:
        """``host:port`` of the node's Kafka listener (what Kafka clients bootstrap from), or None."""
        return None if self.kafka_port is None else f"{self.host}:{self.kafka_port}"

    @property
    def raft_address(self) -> str:
        return f"{self.host}:{self.raft_port}"


AUTHENTICATION_METHODS = ("basic", "mtls", "bearer")
TLS_CLIENT_AUTH = ("none", "required")


@dataclass(frozen=True, slots=True)
class BootstrapUser:
    """A SCRAM credential the controller records when the cluster has never recorded users (hashed; no password)."""

    name: str
    mechanism: str  # SCRAM-SHA-256 | SCRAM-SHA-512
    salt: str  # base64
    iterations: int
    stored_key: str  # base64
    server_key: str  # base64


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    """The node's ``[security]`` section (API.md "Security"); a node without one is open."""

    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_ca_file: Path | None = None
    tls_client_auth: str = "none"  # or "required": mTLS, principal "User:" + the certificate's subject CN
    authentication: tuple[str, ...] = ("basic",)
    authorizer: bool = True
    super_users: tuple[str, ...] = ()
    allow_everyone_if_no_acl_found: bool = False
    metrics_public: bool = False
    # bearer tokens (JWT): a fixed algorithm list; iss, aud and exp are required claims
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    jwt_algorithms: tuple[str, ...] = ("RS256", "ES256")
    jwt_jwks_file: Path | None = None
    jwt_jwks_url: str | None = None
    jwt_principal_claim: str = "sub"
    # recorded by the controller once, when the cluster has never recorded users or ACLs
    # (what `cluster init --secure` writes: the admin and metrics users, the metrics user's ACL)
    bootstrap_users: tuple[BootstrapUser, ...] = ()
    bootstrap_acls: tuple[dict[str, str], ...] = ()

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None


_SECURITY_PATHS = ("tls_cert_file", "tls_key_file", "tls_ca_file", "jwt_jwks_file")
_SECURITY_LISTS = ("authentication", "super_users", "jwt_algorithms")
_SECURITY_SWITCHES = ("authorizer", "allow_everyone_if_no_acl_found", "metrics_public")


def parse_security(raw: Any, base_dir: Path | None = None) -> SecurityConfig:
    """The ``[security]`` table, validated; relative file paths resolve from ``base_dir`` (the config's folder)."""
    if not isinstance(raw, dict):
        raise ConfigError("[security] must be a table")
    known = {f.name for f in fields(SecurityConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"unknown [security] keys: {', '.join(unknown)}")
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _SECURITY_PATHS:
            if not isinstance(value, str) or not value:
                raise ConfigError(f"security.{key} must be a file path")
            path = Path(value)
            kwargs[key] = (base_dir / path).resolve() if not path.is_absolute() and base_dir is not None else path
        elif key in _SECURITY_LISTS:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"security.{key} must be a list of strings")
            kwargs[key] = tuple(value)
        elif key in _SECURITY_SWITCHES:
            if not isinstance(value, bool):
                raise ConfigError(f"security.{key} must be true or false, not {value!r}")
            kwargs[key] = value
        elif key == "bootstrap_users":
            try:
                kwargs[key] = tuple(
                    BootstrapUser(str(u["name"]), str(u["mechanism"]), str(u["salt"]), int(u["iterations"]),
                                  str(u["stored_key"]), str(u["server_key"]))
                    for u in value
                )  # fmt: skip
            except (KeyError, TypeError, ValueError) as exc:
                raise ConfigError(f"bad security.bootstrap_users entry: {exc}") from exc
        elif key == "bootstrap_acls":
            if not isinstance(value, list) or not all(
                isinstance(a, dict) and all(isinstance(v, str) for v in a.values()) for a in value
            ):
                raise ConfigError("security.bootstrap_acls must be a list of tables of strings")
            kwargs[key] = tuple(dict(a) for a in value)
        else:
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"security.{key} must be a string")
            kwargs[key] = value
    sec = SecurityConfig(**kwargs)
    _check_security(sec)
    return sec


def _check_security(sec: SecurityConfig) -> None:
    if (sec.tls_cert_file is None) != (sec.tls_key_file is None):
        raise ConfigError("security.tls_cert_file and security.tls_key_file go together")
    if sec.tls_client_auth not in TLS_CLIENT_AUTH:
        raise ConfigError(f"security.tls_client_auth must be one of {', '.join(TLS_CLIENT_AUTH)}")
    if sec.tls_client_auth == "required" and (not sec.tls or sec.tls_ca_file is None):
        raise ConfigError("security.tls_client_auth = 'required' needs tls_cert_file, tls_key_file and tls_ca_file")
    bad = [m for m in sec.authentication if m not in AUTHENTICATION_METHODS]
    if bad or not sec.authentication:
        raise ConfigError(f"security.authentication lists any of {', '.join(AUTHENTICATION_METHODS)}")
    if "mtls" in sec.authentication and sec.tls_client_auth != "required":
        raise ConfigError("security.authentication 'mtls' needs tls_client_auth = 'required'")
    if "bearer" in sec.authentication:
        if not sec.jwt_issuer or not sec.jwt_audience:
            raise ConfigError("security.authentication 'bearer' needs jwt_issuer and jwt_audience")
        if (sec.jwt_jwks_file is None) == (sec.jwt_jwks_url is None):
            raise ConfigError("security.authentication 'bearer' needs one of jwt_jwks_file, jwt_jwks_url")
        if not sec.jwt_algorithms or any(a.lower() == "none" or a.startswith("HS") for a in sec.jwt_algorithms):
            raise ConfigError("security.jwt_algorithms lists asymmetric algorithms (RS*, PS*, ES*, EdDSA)")
    for p in sec.super_users:
        if ":" not in p:
            raise ConfigError(f"security.super_users entries are principals like 'User:admin', not {p!r}")
    for u in sec.bootstrap_users:
        if u.mechanism not in ("SCRAM-SHA-256", "SCRAM-SHA-512") or u.iterations < 4096:
            raise ConfigError(f"security.bootstrap_users {u.name!r}: SCRAM-SHA-256/512 with at least 4096 iterations")


def render_security(sec: SecurityConfig) -> list[str]:
    """The ``[security]`` section's TOML lines (paths as written: absolute, or relative to the config's folder)."""
    lines = ["[security]"]
    for f in fields(SecurityConfig):
        value = getattr(sec, f.name)
        if f.name in ("bootstrap_users", "bootstrap_acls") or value is None:
            continue
        if isinstance(value, tuple):
            lines.append(f"{f.name} = [{', '.join(_toml_value(v) for v in value)}]")
        else:
            lines.append(f"{f.name} = {_toml_value(value if not isinstance(value, Path) else str(value))}")
    lines.append("")
    for u in sec.bootstrap_users:
        lines.append("[[security.bootstrap_users]]")
        lines += [f"{f.name} = {_toml_value(getattr(u, f.name))}" for f in fields(BootstrapUser)]
        lines.append("")
    for acl in sec.bootstrap_acls:
        lines.append("[[security.bootstrap_acls]]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in acl.items()]
        lines.append("")
    return lines


@dataclass(frozen=True, slots=True)
class NodeConfig:
    node_id: int
    host: str
    http_port: int
    raft_port: int
    data_dir: Path
    cluster_id: str
    cluster_secret: str
    nodes: tuple[NodeAddress, ...]
    # the Kafka listener (None: this node serves no Kafka clients)
    kafka_port: int | None = None
    kafka_max_frame_bytes: int = 100 * 1024 * 1024  # socket.request.max.bytes: larger frames close the connection
    kafka_max_inflight_per_connection: int = 5  # requests of one connection handled at once (responses in order)
    kafka_connections_max_idle_ms: int = 600_000  # connections.max.idle.ms
    # auto.create.topics.enable: a topic a Kafka client's Metadata names is created with the defaults (off, as in
    # Redpanda: a typo then fails instead of making a topic)
    auto_create_topics_enable: bool = False
    # HTTP
    max_request_bytes: int = 16 * 1024 * 1024
    max_fetch_wait_ms: int = 30_000
    request_timeout_ms: int = 30_000
    # topic defaults (Kafka's)
    default_partitions: int = 1
    default_replication_factor: int = 3
    max_partitions_per_topic: int = 10_000
    # Raft
    raft_heartbeat_s: float = 0.2  # heartbeats only: commit latency does not depend on it (non-batch mode)
    raft_election_timeout_min_s: float = 0.8
    raft_election_timeout_max_s: float = 1.6
    # a leader that has not heard from a majority within this steps down and fails what it holds
    # (check quorum; between the heartbeat and the minimum election timeout)
    raft_check_quorum_s: float = 0.6
    raft_tick_threads: int = 1
    # Raft entries kept in memory (and in the journal) between compactions, per group: with
    # 64 KiB produce batches, about 64 MiB per busy partition.
    raft_log_compaction_min_entries: int = 1000
    # Pace (bytes/s) of a full snapshot for a follower -- a new replica of a move, a replaced node -- on the
    # leader: its build and its transfer (Kafka's replication throttle). 0: as fast as it goes.
    raft_snapshot_max_bytes_per_s: int = 0
    # Campaigns (pre-vote rounds and the elections they allow) a node runs at once (raft.campaigns): when a
    # node dies, the groups it led elect new leaders this many at a time per survivor, not all in one tick.
    raft_campaign_slots: int = 256
    # storage: RocksDB flushes and compactions bypass the page cache where the filesystem allows (storage.store)
    store_direct_io: bool = True
    # Carried markers (docs/carried-markers.md; on by default): a client that asks for them
    # gets tokens from EndTxn, and the answer to a transaction's first batch on a partition carries a receipt.
    # A reservation not settled by the next EndTxn within txn_reservation_ms is settled with revoking markers
    # (keep it above a pipeline's commit interval).
    txn_carried_markers: bool = True
    txn_reservation_ms: int = 1000
    # background work
    retention_check_interval_s: float = 30.0
    leader_balance_interval_s: float = 5.0
    # a preferred replica gets its leadership back once seen connected and caught up this long
    leader_balance_hold_s: float = 10.0
    peer_poll_interval_s: float = 1.0
    # transactions (Kafka's names and defaults where Kafka has them)
    transaction_state_partitions: int = 16
    transaction_max_timeout_ms: int = 900_000
    transaction_abort_scan_interval_ms: int = 10_000
    transactional_id_expiration_ms: int = 604_800_000
    transaction_max_prepared_ms: int = 86_400_000
    # consumer groups (Kafka's names; offsets.topic.num.partitions is 50 in Kafka, 8 here: each
    # partition is a Raft group on 3 nodes, and idle groups cost ticks. Never change it later.)
    offsets_topic_partitions: int = 8
    group_min_session_timeout_ms: int = 6_000
    group_max_session_timeout_ms: int = 300_000
    group_initial_rebalance_delay_ms: int = 0  # Kafka: 3000; 0 answers a lone first member at once
    # per-partition consumer-lag series (group, topic, partition) a coordinator exports at most; beyond it
    # only the per-group sums (docs/metrics.md "Consumer lag")
    metrics_max_lag_series: int = 1000
    # logging
    log_format: str = "text"
    log_level: str = "INFO"
    # None: an open node (local development; it logs a warning at start)
    security: SecurityConfig | None = None
    # The nodes of `cluster init` (default: every [[nodes]] entry). Internal partitions are placed over them
    # by default; `cluster add-node` writes them into a new node's file, whose [[nodes]] lists more.
    founders: tuple[int, ...] = ()
    # A partition move may not leave a partition with fewer replicas than this (or than it had, if fewer).
    min_insync_replicas: int = 2
    # A partition move's new replica counts as caught up within this many Raft entries of the leader.
    reassignment_catch_up_entries: int = 50
    reassignment_check_interval_s: float = 0.5
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def self_address(self) -> NodeAddress:
        for n in self.nodes:
            if n.id == self.node_id:
                return n
        raise ConfigError(f"node {self.node_id} is not in its own [[nodes]] list")

    @property
    def url(self) -> str:
        return self.self_address.url

    @property
    def founder_ids(self) -> tuple[int, ...]:
        return self.founders or tuple(n.id for n in self.nodes)

    def node(self, node_id: int) -> NodeAddress | None:
        for n in self.nodes:
            if n.id == node_id:
                return n
        return None

    def node_by_raft_address(self, address: str) -> NodeAddress | None:
        for n in self.nodes:
            if n.raft_address == address:
                return n
        return None


_REQUIRED = ("node_id", "host", "http_port", "raft_port", "data_dir", "cluster_id", "cluster_secret")


def load_config(path: Path | str) -> NodeConfig:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from exc
    return parse_config(raw, base_dir=path.parent)


def parse_config(raw: dict[str, Any], base_dir: Path | None = None) -> NodeConfig:
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise ConfigError(f"missing config keys: {', '.join(missing)}")
    nodes_raw = raw.get("nodes")
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise ConfigError("config needs a non-empty [[nodes]] list")
    try:
        nodes = tuple(
            sorted(
                (
                    NodeAddress(
                        int(n["id"]),
                        str(n["host"]),
                        int(n["http_port"]),
                        int(n["raft_port"]),
                        kafka_port=int(n["kafka_port"]) if n.get("kafka_port") is not None else None,
                    )
                    for n in nodes_raw
                ),
                key=lambda a: a.id,
            )
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"bad [[nodes]] entry: {exc}") from exc
    ids = [n.id for n in nodes]
    if len(set(ids)) != len(ids):
        raise ConfigError("duplicate node ids in [[nodes]]")
    known = {f.name for f in fields(NodeConfig)}
    switches = {f.name for f in fields(NodeConfig) if isinstance(f.default, bool)}
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    security = parse_security(raw["security"], base_dir) if "security" in raw else None
    scheme = "https" if security is not None and security.tls else "http"
    nodes = tuple(replace(n, scheme=scheme) for n in nodes)
    for key, value in raw.items():
        if key in ("nodes", "security"):
            continue
        if key == "founders":
            if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
                raise ConfigError("founders must be a list of node ids")
            value = tuple(value)
        if key in switches and not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, not {value!r}")
        if key in known:
            kwargs[key] = value
        else:
            extra[key] = value
    data_dir = Path(str(kwargs["data_dir"]))
    if not data_dir.is_absolute() and base_dir is not None:
        data_dir = (base_dir / data_dir).resolve()
    kwargs["data_dir"] = data_dir
    kwargs["nodes"] = nodes
    kwargs["extra"] = extra
    kwargs["security"] = security
    if not str(kwargs["cluster_secret"]):
        raise ConfigError("cluster_secret must not be empty (it authenticates Raft traffic)")
    try:
        cfg = NodeConfig(**kwargs)
    except TypeError as exc:
        raise ConfigError(str(exc)) from exc
    me = cfg.self_address
    if (me.host, me.http_port, me.raft_port) != (cfg.host, cfg.http_port, cfg.raft_port):
        raise ConfigError("node_id/host/ports disagree with this node's [[nodes]] entry")
    if me.kafka_port is not None and me.kafka_port != cfg.kafka_port:
        raise ConfigError("kafka_port disagrees with this node's [[nodes]] entry")
    if cfg.kafka_port is not None and not 0 < cfg.kafka_port < 65536:
        raise ConfigError("kafka_port must be a TCP port (1-65535)")
    if cfg.kafka_max_frame_bytes < 1024:
        raise ConfigError("kafka_max_frame_bytes must be at least 1024")
    if cfg.kafka_max_inflight_per_connection < 1:
        raise ConfigError("kafka_max_inflight_per_connection must be at least 1")
    if not 1 <= cfg.transaction_state_partitions <= 1024:
        raise ConfigError("transaction_state_partitions must be between 1 and 1024 (and never change later)")
    if not 1 <= cfg.offsets_topic_partitions <= 1024:
        raise ConfigError("offsets_topic_partitions must be between 1 and 1024 (and never change later)")
    if not 1 <= cfg.group_min_session_timeout_ms <= cfg.group_max_session_timeout_ms:
        raise ConfigError("need 1 <= group_min_session_timeout_ms <= group_max_session_timeout_ms")
    if cfg.metrics_max_lag_series < 0:
        raise ConfigError("metrics_max_lag_series must not be negative")
    if cfg.raft_campaign_slots < 1:
        raise ConfigError("raft_campaign_slots must be >= 1")
    if cfg.raft_snapshot_max_bytes_per_s < 0:
        raise ConfigError("raft_snapshot_max_bytes_per_s must not be negative (0: unlimited)")
    if cfg.log_format not in ("text", "json"):
        raise ConfigError("log_format must be 'text' or 'json'")
    if not 0 <= cfg.txn_reservation_ms <= 600_000:
        raise ConfigError("txn_reservation_ms must be between 0 and 600000")
    return cfg


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    s = str(v).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{s}"'


def render_config(cfg: NodeConfig) -> str:
    lines = [
        "# txbroker node configuration (written by `txbroker cluster init`)",
        f"node_id = {cfg.node_id}",
        f"host = {_toml_value(cfg.host)}",
        f"http_port = {cfg.http_port}",
        f"raft_port = {cfg.raft_port}",
        *([f"kafka_port = {cfg.kafka_port}"] if cfg.kafka_port is not None else []),
        f"data_dir = {_toml_value(str(cfg.data_dir))}",
        f"cluster_id = {_toml_value(cfg.cluster_id)}",
        "# authenticates Raft traffic between nodes: keep this file private",
        f"cluster_secret = {_toml_value(cfg.cluster_secret)}",
        f"log_format = {_toml_value(cfg.log_format)}",
    ]
    # Every other setting that is not its default (tuning a cluster made by `cluster init` or a bench).
    written = {"node_id", "host", "http_port", "raft_port", "kafka_port", "data_dir", "cluster_id", "cluster_secret",
               "log_format", "nodes", "extra", "security", "founders"}  # fmt: skip
    for f in fields(NodeConfig):
        value = getattr(cfg, f.name)
        if f.name not in written and f.default is not MISSING and value != f.default:
            lines.append(f"{f.name} = {_toml_value(value)}")
    if cfg.founders:
        lines.append(f"founders = [{', '.join(str(i) for i in cfg.founders)}]")
    lines.append("")
    for n in cfg.nodes:
        lines += [
            "[[nodes]]",
            f"id = {n.id}",
            f"host = {_toml_value(n.host)}",
            f"http_port = {n.http_port}",
            f"raft_port = {n.raft_port}",
            *([f"kafka_port = {n.kafka_port}"] if n.kafka_port is not None else []),
            "",
        ]
    if cfg.security is not None:
        lines += render_security(cfg.security)
    return "\n".join(lines)


def make_cluster_configs(
    n: int,
    directory: Path,
    *,
    host: str = "127.0.0.1",
    hosts: list[str] | None = None,
    http_ports: list[int] | None = None,
    raft_ports: list[int] | None = None,
    kafka_ports: list[int] | None = None,
    base_port: int = 9091,
    cluster_id: str | None = None,
    secret: str | None = None,
) -> list[NodeConfig]:
    """Configs for an ``n``-node cluster, on one host unless ``hosts`` names each node's address.

    ``hosts`` (one address per node, node ``i + 1`` at ``hosts[i]``) overrides ``host``; a
    harness that gives every node its own network namespace passes them. Ports default to
    ``base_port..base_port+n-1`` for HTTP, the next ``n`` for Raft and the ``n`` after those
    for the Kafka listener. Tests pass explicit free HTTP and Raft ports; the Kafka ports
    are then free ports chosen now unless ``kafka_ports`` names them.
    """
    if n < 1:
        raise ConfigError("a cluster needs at least one node")
    if hosts is not None and len(hosts) != n:
        raise ConfigError(f"hosts lists {len(hosts)} addresses for {n} nodes")
    hosts = hosts or [host] * n
    if kafka_ports is None:
        explicit = http_ports is not None or raft_ports is not None
        kafka_ports = (
            _free_ports_besides(n, "127.0.0.1", {*(http_ports or ()), *(raft_ports or ())})
            if explicit
            else [base_port + 2 * n + i for i in range(n)]
        )
    if len(kafka_ports) != n:
        raise ConfigError(f"kafka_ports lists {len(kafka_ports)} ports for {n} nodes")
    http_ports = http_ports or [base_port + i for i in range(n)]
    raft_ports = raft_ports or [base_port + n + i for i in range(n)]
    cluster_id = cluster_id or secrets.token_hex(8)
    secret = secret or secrets.token_urlsafe(24)
    nodes = tuple(
        NodeAddress(i + 1, hosts[i], http_ports[i], raft_ports[i], kafka_port=kafka_ports[i]) for i in range(n)
    )
    return [
        NodeConfig(
            node_id=a.id,
            host=a.host,
            http_port=a.http_port,
            raft_port=a.raft_port,
            kafka_port=a.kafka_port,
            data_dir=(directory / f"node-{a.id}").resolve(),
            cluster_id=cluster_id,
            cluster_secret=secret,
            nodes=nodes,
        )
        for a in nodes
    ]


def write_configs(configs: list[NodeConfig], directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for cfg in configs:
        p = directory / f"node-{cfg.node_id}.toml"
        p.write_text(render_config(cfg))
        p.chmod(0o600)
        paths.append(p)
    return paths


def _free_ports_besides(n: int, host: str, taken: set[int]) -> list[int]:
    for _ in range(100):
        ports = free_ports(n, host)
        if not taken & set(ports):
            return ports
    raise ConfigError(f"no {n} free ports on {host} beside {sorted(taken)}")


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports the OS reports free right now (for local clusters, tests and benches)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
