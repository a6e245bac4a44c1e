"""Socket helpers for tests that speak to a Raft port by hand (forged frames, slow or silent peers)."""

from __future__ import annotations

import socket


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "closed early"
        data += chunk
    return data


def read_until_closed(sock: socket.socket, timeout: float) -> bool:
    """True once the other end closed (or reset) the connection; False if it stayed open for ``timeout``."""
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
