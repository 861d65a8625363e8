"""Free local TCP ports for services, rendezvous and test servers (no third-party imports)."""

from __future__ import annotations

import contextlib
import socket


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports of 127.0.0.1 that were free a moment ago: each socket stays bound
    until all are drawn, so the system cannot hand the same port out twice (drawn one at a
    time, it sometimes did). The caller binds them right after."""
    with contextlib.ExitStack() as sockets:
        ports = []
        for _ in range(count):
            sock = sockets.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def free_port() -> int:
    """One port of 127.0.0.1 that was free a moment ago (see :func:`free_ports`)."""
    (port,) = free_ports(1)
    return port
