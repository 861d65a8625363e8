"""Free local TCP ports for services, rendezvous and test servers (no third-party imports).

Ports are drawn at random from below the system's ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``), never from it: the system hands ephemeral
ports to every outgoing connection and every ``bind(0)``, so a port drawn from that range and
bound a minute later (a stack starts its services one after another) can meanwhile be the
local end of some HTTP client's connection, and the service then fails to bind. Below the
range only another explicit bind can take it. Where the system leaves no such room, the
system's own choice is used.
"""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

LOWEST = 10000
"""The lowest port drawn (well-known and registered services sit below)."""

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_ATTEMPTS = 200


def ephemeral_low() -> int:
    """The first port of the system's ephemeral range (32768 where it cannot be read)."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bind(sock: socket.socket, port: int) -> bool:
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports of 127.0.0.1 that were free a moment ago, from below the
    ephemeral range: each socket stays bound until all are drawn, so none is drawn twice. The
    caller binds them right after."""
    low, high = LOWEST, ephemeral_low() - 1
    draw = random.SystemRandom()
    with contextlib.ExitStack() as sockets:
        ports: list[int] = []
        for _ in range(count):
            sock = sockets.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            port = None
            if high - low >= 1000:
                for _ in range(_ATTEMPTS):
                    candidate = draw.randint(low, high)
                    if candidate not in ports and _bind(sock, candidate):
                        port = candidate
                        break
            if port is None:  # no room below the ephemeral range: the system's choice
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
            ports.append(port)
        return ports


def free_port() -> int:
    """One port of 127.0.0.1 that was free a moment ago (see :func:`free_ports`)."""
    (port,) = free_ports(1)
    return port
