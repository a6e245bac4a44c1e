"""The security part of the main job: a TLS cluster with users and ACLs, and a pipeline of a limited user.

Called by ``ops/demo.py``. It runs its own 3-node cluster from ``txbroker
cluster init --secure`` in a temporary directory (HTTPS, SCRAM users, ACLs,
the super user's ``admin.toml``), shows a user without ACLs being refused,
grants the ACLs with ``txbroker acl add --command-config admin.toml``, and
runs a transactional producer and read_committed consumer as that user. Every
process it starts is stopped and the directory removed, also on error.
"""

from __future__ import annotations

import secrets
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clients import Admin, Consumer, Producer
from clients.protocol import BrokerError
from clients.security import SecurityOptions
from cluster.client_config import load_client_config

Say = Callable[[str], None]

TOPIC = "secure-orders"
COMMITTED = 300
ABORTED = 100


def _free_port_range(n: int) -> int:
    """The first of ``n`` consecutive free loopback ports (``cluster init --base-port``)."""
    import random

    for _ in range(200):
        base = random.randrange(20_000, 60_000 - n)
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise SystemExit(f"no {n} consecutive free ports")


def _txbroker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cluster", *args], capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip


def _ready(url: str, context: ssl.SSLContext) -> bool:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=2, context=context) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _count(bootstrap: str, isolation: str, expect: int, security: SecurityOptions) -> int:
    c = Consumer(bootstrap=bootstrap, isolation_level=isolation, auto_offset_reset="earliest", **security)
    try:
        tps = [(TOPIC, p) for p in range(3)]
        c.assign(tps)
        n = 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            n += len(c.poll(timeout_ms=300))
            ends = c.end_offsets(tps)
            if n >= expect and all(c.position(tp) >= ends[tp] for tp in tps):
                break
        return n
    finally:
        c.close()


def stage_secure(say: Say) -> None:
    t0 = time.monotonic()
    directory = Path(tempfile.mkdtemp(prefix="txbroker-secure-"))
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Any] = []
    try:
        say("== security: TLS, SCRAM users and ACLs (txbroker cluster init --secure)")
        res = _txbroker("cluster", "init", "--secure", "--dir", str(directory), "--nodes", "3",
                        "--base-port", str(_free_port_range(6)))  # fmt: skip
        if res.returncode != 0:
            raise SystemExit(f"cluster init --secure failed: {res.stderr}")
        admin_toml = directory / "admin.toml"
        for i in (1, 2, 3):
            log = open(directory / f"node-{i}.log", "ab")  # noqa: SIM115 - closed below
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "cluster", "node", "start", "--config", str(directory / f"node-{i}.toml")],
                stdout=log, stderr=subprocess.STDOUT,
            ))  # fmt: skip
        admin_cfg = load_client_config(admin_toml)
        assert admin_cfg.bootstrap is not None
        bootstrap = admin_cfg.bootstrap
        cafile = admin_cfg.security.get("ssl_cafile")
        context = ssl.create_default_context(cafile=cafile)
        deadline = time.monotonic() + 60
        for url in bootstrap.split(","):
            while not _ready(url, context):
                if time.monotonic() > deadline:
                    raise SystemExit(f"secure node {url} not ready; see {directory}")
                time.sleep(0.2)
        say(f"   3 nodes serving HTTPS only: {bootstrap}")
        say(f"   the super user's client config (mode 0600): {admin_toml}")

        admin = Admin(bootstrap, **admin_cfg.security)
        admin.create_topic(TOPIC, partitions=3, replication_factor=3)
        admin.wait_for_leaders(TOPIC)
        password = secrets.token_urlsafe(12)
        admin.upsert_user("demo", password)
        demo = SecurityOptions(sasl_plain_username="demo", sasl_plain_password=password, ssl_cafile=cafile)
        say(f"   the admin created topic {TOPIC!r} and user 'demo' (the cluster keeps only its SCRAM credential)")

        try:
            Admin(bootstrap, **demo).describe_topic(TOPIC)
            raise SystemExit("user demo described the topic without an ACL")
        except BrokerError as exc:
            say(f"   demo describes {TOPIC!r} without ACLs: refused, {exc.error_code.name}")
        try:
            wrong = SecurityOptions(sasl_plain_username="demo", sasl_plain_password="wrong", ssl_cafile=cafile)
            Admin(bootstrap, **wrong).describe_topic(TOPIC)
            raise SystemExit("a wrong password was accepted")
        except BrokerError as exc:
            say(f"   the same with a wrong password: {exc.error_code.name} (not retried)")

        for flags in (
            ["--operation", "Read", "--operation", "Write", "--topic", TOPIC],
            ["--operation", "Write", "--transactional-id", "demo-", "--resource-pattern-type", "prefixed"],
        ):
            cmd = ["acl", "add", "--command-config", str(admin_toml), "--allow-principal", "User:demo", *flags]
            say("   $ txbroker " + shlex.join(cmd))
            res = _txbroker(*cmd)
            if res.returncode != 0:
                raise SystemExit(f"acl add failed: {res.stderr}")
            added = [line for line in res.stdout.splitlines() if line.startswith("added")]
            say("     " + (added[0] if added else res.stdout.strip()))
        partitions = len(Admin(bootstrap, **demo).describe_topic(TOPIC)["partitions"])
        say(f"   demo describes {TOPIC!r} again: allowed, {partitions} partitions")

        with Producer(bootstrap=bootstrap, transactional_id="demo-secure-1", **demo) as p:
            p.init_transactions()
            for t in range(3):
                p.begin_transaction()
                for i in range(COMMITTED // 3):
                    p.send(TOPIC, value=f"order-{t}-{i}".encode(), key=str(i).encode())
                p.commit_transaction()
            p.begin_transaction()
            for i in range(ABORTED):
                p.send(TOPIC, value=f"aborted-{i}".encode(), key=str(i).encode())
            p.flush()
            p.abort_transaction()
        committed = _count(bootstrap, "read_committed", COMMITTED, demo)
        uncommitted = _count(bootstrap, "read_uncommitted", COMMITTED + ABORTED, demo)
        if committed != COMMITTED:
            raise SystemExit(f"read_committed saw {committed} records, not {COMMITTED}")
        say(
            f"   as demo over HTTPS: 3 transactions of {COMMITTED // 3} committed, one of {ABORTED} aborted; "
            f"read_committed sees {committed}, read_uncommitted {uncommitted}"
        )
        say(f"   security stage done in {time.monotonic() - t0:.1f}s")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
        shutil.rmtree(directory, ignore_errors=True)
