"""``txbroker cluster add-node|decommission|nodes`` and ``txbroker partitions reassign|reassignments``.

``cluster add-node`` registers the next node with the controller and writes
its config beside the others: the cluster id and secret and every setting of
an existing node's config in the directory, the registered nodes, the
founders, and (for a secure cluster) a node certificate signed by the
directory's CA. ``prometheus.yml`` is rewritten to scrape the new node too.
The node joins when started (``txbroker node start --config D/node-<id>.toml``).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from clients.admin import Admin
from clients.protocol import BrokerError, ErrorCode

from .client_config import add_cluster_options, client_options
from .config import ConfigError, NodeAddress, NodeConfig, load_config, write_configs
from .prometheus_config import write_prometheus_files

__all__ = ["register"]

_PORT_SEARCH = 2000


def _template(d: Path) -> NodeConfig:
    paths = sorted(d.glob("node-*.toml"), key=lambda p: (len(p.name), p.name))
    if not paths:
        raise ConfigError(f"{d} holds no node config (node-<id>.toml) to copy the cluster's settings from")
    return load_config(paths[0])


def _bindable(host: str, port: int) -> bool:
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.bind((host, port))
        return True
    except OSError:
        return False


def _next_ports(host: str, used: set[int], local: bool) -> tuple[int, int, int]:
    """Three ports (HTTP, Raft, Kafka) above every port the cluster uses (free on this machine when ``host`` is
    one of its addresses)."""
    out: list[int] = []
    port = max(used, default=9090) + 1
    for _ in range(_PORT_SEARCH):
        if port > 65535:
            break
        if port not in used and (not local or _bindable(host, port)):
            out.append(port)
            if len(out) == 3:
                return out[0], out[1], out[2]
        port += 1
    raise ConfigError(f"no three free ports above {max(used, default=9090)} on {host}")


def _cluster_nodes(info: dict[str, Any]) -> list[NodeAddress]:
    out = []
    for n in info.get("nodes", []):
        if n.get("state") == "decommissioned" or n.get("url") is None or n.get("raft_port") is None:
            continue
        url = urlsplit(str(n["url"]))
        kafka = n.get("kafka")
        kafka_port = int(str(kafka).rsplit(":", 1)[1]) if isinstance(kafka, str) and ":" in kafka else None
        out.append(NodeAddress(int(n["id"]), str(n["host"]), int(url.port or 0), int(n["raft_port"]), url.scheme,
                               kafka_port=kafka_port))  # fmt: skip
    return out


def cmd_add_node(args: argparse.Namespace) -> int:
    d = Path(args.dir)
    template = _template(d)
    admin = Admin(args.bootstrap, **client_options(args))
    info = admin.describe_cluster()
    known = _cluster_nodes(info)
    host = args.host or template.host
    used = {p for n in known for p in (n.http_port, n.raft_port, n.kafka_port) if p is not None}
    for path in d.glob("node-*.toml"):
        c = load_config(path)
        used |= {p for p in (c.http_port, c.raft_port, c.kafka_port) if p is not None}
    if args.http_port:
        http_port, raft_port, kafka_port = args.http_port, args.raft_port, args.kafka_port
        if kafka_port is None:
            kafka_port = _next_ports(host, used | {http_port, raft_port}, args.local)[0]
    else:
        http_port, raft_port, kafka_port = _next_ports(host, used, args.local)
    rec = admin.register_node(host, http_port, raft_port, args.node_id, kafka_port=kafka_port)
    node_id = int(rec["id"])
    scheme = template.self_address.scheme
    me = NodeAddress(node_id, host, http_port, raft_port, scheme, kafka_port=kafka_port)
    nodes = tuple(sorted([*(replace(n, scheme=scheme) for n in known if n.id != node_id), me], key=lambda a: a.id))
    founders = tuple(int(i) for i in info.get("founders", [])) or template.founder_ids
    cfg = replace(
        template, node_id=node_id, host=host, http_port=http_port, raft_port=raft_port, kafka_port=kafka_port,
        data_dir=(d / f"node-{node_id}").resolve(), nodes=nodes, founders=founders,
    )  # fmt: skip
    if template.security is not None:
        cfg = replace(cfg, security=_node_security(d, template, node_id, host))
    (path,) = write_configs([cfg], d)
    _rewrite_prometheus(d, cfg, [n.url for n in nodes])
    print(f"node {node_id} registered: {me.url}  (raft {host}:{raft_port}, kafka {me.kafka_address}, config {path})")
    print(f"start it with: txbroker node start --config {path}")
    return 0


def _node_security(d: Path, template: NodeConfig, node_id: int, host: str) -> Any:
    from .security.certs import make_node_certificate
    from .security.secure_init import CERTS_DIR

    sec = template.security
    assert sec is not None
    if sec.tls_cert_file is None:
        return sec
    certs = d / CERTS_DIR
    ca_cert, ca_key = certs / "ca.pem", certs / "ca.key"
    if not (ca_cert.is_file() and ca_key.is_file()):
        raise ConfigError(f"{certs} has no ca.pem/ca.key to sign node {node_id}'s certificate with")
    cert, key = make_node_certificate(ca_cert, ca_key, certs, node_id, host)
    return replace(sec, tls_cert_file=Path(CERTS_DIR, cert.name), tls_key_file=Path(CERTS_DIR, key.name))


def _rewrite_prometheus(d: Path, cfg: NodeConfig, urls: list[str]) -> None:
    if not (d / "prometheus.yml").exists():
        return
    if cfg.security is None:
        write_prometheus_files(d, urls)
        return
    from .security.secure_init import CERTS_DIR, METRICS_PASSWORD_FILE, METRICS_USER

    write_prometheus_files(d, urls, basic_auth=(METRICS_USER, METRICS_PASSWORD_FILE), ca_file=f"{CERTS_DIR}/ca.pem")


def _wait(what: str, done: Any, timeout: float, interval: float = 1.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(interval)
    print(f"{what}: not done within {timeout:.0f} s", file=sys.stderr)
    return False


def cmd_decommission(args: argparse.Namespace) -> int:
    admin = Admin(args.bootstrap, **client_options(args))
    out = admin.decommission_node(args.node)
    print(f"node {args.node} is decommissioning: {len(out.get('moves', []))} replicas move to other nodes")
    if args.wait:
        if not _wait(
            f"decommission of node {args.node}",
            lambda: admin.describe_node(args.node).get("state") == "decommissioned",
            args.timeout,
        ):
            return 10
        print(f"node {args.node} is decommissioned: it can be stopped")
    return 0


def cmd_nodes(args: argparse.Namespace) -> int:
    nodes = Admin(args.bootstrap, **client_options(args)).list_nodes()
    if args.format == "json":
        print(json.dumps(nodes, indent=2))
        return 0
    print(f"{'ID':>4}  {'STATE':<16} {'ALIVE':<6} {'VOTER':<6} {'REPLICAS':>8}  URL")
    for n in nodes:
        print(f"{n['id']:>4}  {n['state']:<16} {str(n['alive']).lower():<6} {str(n['controller_voter']).lower():<6} "
              f"{n.get('replicas', 0):>8}  {n['url']}")  # fmt: skip
    return 0


def _replicas(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BrokerError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"--replicas takes ids like 2,3,4: {text!r}") from None


def cmd_reassign(args: argparse.Namespace) -> int:
    admin = Admin(args.bootstrap, **client_options(args))
    if args.cancel:
        out = admin.cancel_reassignment(args.topic, args.partition)
        print(f"{args.topic}-{args.partition}: the move is cancelled; back to replicas {out['target_replicas']}")
    else:
        if not args.replicas:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "--replicas is required (or --cancel)")
        out = admin.reassign_partition(args.topic, args.partition, _replicas(args.replicas))
        print(f"{args.topic}-{args.partition}: moving {out['replicas']} -> {out['target_replicas']}")
    if args.wait:
        gid = out["group_id"]
        if not _wait(
            f"move of {args.topic}-{args.partition}",
            lambda: all(m["group_id"] != gid for m in admin.list_reassignments()),
            args.timeout,
        ):
            return 10
        print(f"{args.topic}-{args.partition}: the move is complete")
    return 0


def cmd_reassignments(args: argparse.Namespace) -> int:
    moves = Admin(args.bootstrap, **client_options(args)).list_reassignments()
    if args.format == "json":
        print(json.dumps(moves, indent=2))
        return 0
    if not moves:
        print("no partition is moving")
    for m in moves:
        roles, entries, offsets = m.get("roles") or {}, m.get("entries_behind") or {}, m.get("offsets_behind") or {}
        lag = ", ".join(
            f"node {n} ({role}): {entries.get(n, '?')} entries"
            + (f", {offsets[n]} offsets" if offsets.get(n) is not None else "")
            for n, role in roles.items()
        )
        print(f"{m['topic']}-{m['partition']}\t{m['state']}\t{m['replicas']} -> {m['target_replicas']}"
              f"\tleader {m.get('leader', '?')}\tbehind: {lag or 'unknown'}")  # fmt: skip
    return 0


def register(sub: Any, cluster: Any, default_bootstrap: str) -> None:
    """Add the commands to ``txbroker`` (``sub``) and to ``txbroker cluster`` (``cluster``)."""
    p = cluster.add_parser("add-node", help="register the next node and write its config into --dir")
    p.add_argument("--dir", required=True, help="the cluster's config directory (holds node-<id>.toml)")
    p.add_argument("--host", help="the new node's address (default: the host of the directory's first node)")
    p.add_argument("--node-id", type=int, help="default: the next free id")
    p.add_argument("--http-port", type=int, help="default: the next free port above the cluster's ports")
    p.add_argument("--raft-port", type=int)
    p.add_argument("--kafka-port", type=int, help="the Kafka listener's port (default: the next free one)")
    p.add_argument("--no-local", dest="local", action="store_false",
                   help="the host is another machine: do not check the ports are free here")  # fmt: skip
    add_cluster_options(p, default_bootstrap)
    p.set_defaults(fn=cmd_add_node)
    p = cluster.add_parser("decommission", help="move every replica off a node, then mark it decommissioned")
    p.add_argument("--node", type=int, required=True)
    p.add_argument("--wait", action="store_true", help="wait until the node is decommissioned")
    p.add_argument("--timeout", type=float, default=600.0)
    add_cluster_options(p, default_bootstrap)
    p.set_defaults(fn=cmd_decommission)
    p = cluster.add_parser("nodes", help="registered nodes: state, alive, controller vote, replicas")
    p.add_argument("--format", choices=["text", "json"], default="text")
    add_cluster_options(p, default_bootstrap)
    p.set_defaults(fn=cmd_nodes)

    parts = sub.add_parser("partitions", help="move partitions between nodes").add_subparsers(dest="sub", required=True)
    p = parts.add_parser("reassign", help="move a partition to new replicas (by Raft membership changes)")
    p.add_argument("--topic", required=True)
    p.add_argument("--partition", type=int, required=True)
    p.add_argument("--replicas", help="the new replica set, preferred leader first: 2,3,4")
    p.add_argument("--cancel", action="store_true", help="turn an unfinished move back")
    p.add_argument("--wait", action="store_true", help="wait until the move is complete")
    p.add_argument("--timeout", type=float, default=600.0)
    add_cluster_options(p, default_bootstrap)
    p.set_defaults(fn=cmd_reassign)
    p = parts.add_parser("reassignments", help="the moves in progress and how far behind the new replicas are")
    p.add_argument("--format", choices=["text", "json"], default="text")
    add_cluster_options(p, default_bootstrap)
    p.set_defaults(fn=cmd_reassignments)
