"""A benchmark stopped from outside unwinds: its ``finally`` blocks stop what it started.

Python turns Ctrl-C (SIGINT) into ``KeyboardInterrupt``, which unwinds the stack, but SIGTERM
(what ``timeout``, ``kill`` and a CI job's time limit send) and SIGHUP (a closed terminal) end
the process where it stands: a benchmark's private stack (PostgreSQL, Redis, Spark, the broker,
MLflow, Airflow, each started in its own session so that it outlives nothing by accident) kept
running. :func:`stop_on_signals` makes every one of these signals raise :class:`Stopped` in the
main thread, so the ``with private_stack(...)`` and ``try``/``finally`` blocks below it stop
the services by the pids they started. A second signal while they do is reported and ignored:
an impatient second Ctrl-C does not cut the clean-up short.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals a benchmark is stopped with from outside."""


class Stopped(KeyboardInterrupt):
    """Raised in the main thread when a stop signal arrives (a ``KeyboardInterrupt``, so code
    that stops on Ctrl-C stops the same way on SIGTERM)."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        super().__init__(f"stopped by {signal.Signals(signum).name}")

    @property
    def exit_code(self) -> int:
        """The shell's convention: 128 + the signal's number."""
        return 128 + self.signum


@contextmanager
def stop_on_signals(what: str = "benchmark") -> Iterator[None]:
    """Within the block, :data:`SIGNALS` raise :class:`Stopped` (the first one) and are then
    ignored until the block has unwound; the previous handlers come back on exit. Outside the
    main thread (where Python cannot set handlers) the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stopping = False

    def handle(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        name = signal.Signals(signum).name
        if stopping:
            print(f"[{what}] {name} again: still stopping what it started", file=sys.stderr)
            return
        stopping = True
        print(f"[{what}] {name}: stopping what it started", file=sys.stderr, flush=True)
        raise Stopped(signum)

    previous = {sig: signal.signal(sig, handle) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
