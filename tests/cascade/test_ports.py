"""Free ports: distinct within one draw, and bindable right after."""

from __future__ import annotations

import socket

import pytest

from cascade import ports
from cascade.ports import LOWEST, ephemeral_low, free_port, free_ports


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(8)
    assert len(set(ports)) == 8
    for port in [*ports, free_port()]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_ports_come_from_below_the_ephemeral_range_and_skip_taken_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    low = ephemeral_low()
    assert all(LOWEST <= port < low for port in free_ports(16))
    # A taken port is never handed out: with every draw landing on it first, the next is used.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        taken.listen()
        draws = iter([busy, busy, LOWEST + 7])
        monkeypatch.setattr(ports.random.SystemRandom, "randint", lambda self, a, b: next(draws))
        assert free_ports(1) == [LOWEST + 7]


def test_no_room_below_the_ephemeral_range_falls_back_to_the_system(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ports, "ephemeral_low", lambda: 1024)
    (port,) = free_ports(1)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
