"""raft/transport.py Listener out of descriptors: it waits for room instead of spinning on accept()."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import textwrap
import time

from cluster.config import free_ports
from raft.connection import encode_preamble
from raft.frame_crypto import NONCE_BYTES

_CHILD = textwrap.dedent(
    """
    import os, resource, socket, sys, time
    from raft.transport import Listener

    port = int(sys.argv[1])
    listener = Listener("127.0.0.1", port, lambda g, n, s: False, lambda why: None)
    listener.start()
    # Leave no room for one more descriptor: every accept() fails with EMFILE.
    spare = []
    while True:
        try:
            spare.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            break
    print("ready", flush=True)
    sys.stdin.readline()  # the test has measured: make room again
    for fd in spare:
        os.close(fd)
    print("room", flush=True)
    sys.stdin.readline()
    listener.stop()
    """
)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_listener_out_of_descriptors_stays_idle_then_accepts_when_room_returns() -> None:
    (port,) = free_ports(1)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    script = "import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))\n" + _CHILD
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # one warning per failed accept
        text=True,
        env=env,
    )
    assert child.stdin is not None and child.stdout is not None
    conns: list[socket.socket] = []
    try:
        assert child.stdout.readline().strip() == "ready"
        conns.append(socket.create_connection(("127.0.0.1", port), timeout=5))  # waits in the backlog
        before, t0 = _cpu_seconds(child.pid), time.monotonic()
        deadline = t0 + 2.0
        while time.monotonic() < deadline:  # watch the child for two seconds
            assert child.poll() is None
            time.sleep(0.1)
        used = _cpu_seconds(child.pid) - before
        assert used < 0.5, f"the listener spun on accept(): {used:.2f} s of CPU in 2 s"
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "room"
        # With room again, the waiting connection is accepted and, naming no group, closed.
        conns[0].sendall(encode_preamble("no-such-group", b"\x00" * NONCE_BYTES))
        conns[0].settimeout(5)
        with contextlib.suppress(ConnectionResetError):  # closed with our bytes unread: closed all the same
            assert conns[0].recv(1) == b""
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(10) == 0
    finally:
        for c in conns:
            c.close()
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdin.close()
        child.stdout.close()
