"""Free ports: distinct within one draw, and bindable right after."""

from __future__ import annotations

import socket

from cascade.ports import free_port, free_ports


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(8)
    assert len(set(ports)) == 8
    for port in [*ports, free_port()]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
