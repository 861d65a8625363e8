"""Fault injection for resume tests: ``CASCADE_CRASH_AT=PHASE:STEP`` makes rank 0 SIGKILL
itself right after that optimizer step of that phase (and its checkpoint, if one falls due)."""

from __future__ import annotations

import os
import signal

from cascade.config import load_settings

CRASH_ENV = "CASCADE_CRASH_AT"
"""``PHASE:STEP``, e.g. ``train:25`` or ``teacher:40``; unset: no crash."""


def crash_point(env: dict[str, str] | None = None) -> tuple[str, int] | None:
    """``(phase, step)`` from ``CASCADE_CRASH_AT=phase:step``, or None when unset."""
    value = load_settings(env).hooks.crash_at
    if not value:
        return None
    phase, _, step = value.rpartition(":")
    return phase, int(step)


def crash_if_due(
    crash: tuple[str, int] | None, phase: str, step: int, *, rank: int, who: str
) -> None:
    """SIGKILL this process when it is rank 0 and ``(phase, step)`` is the crash point."""
    if crash == (phase, step) and rank == 0:
        print(f"[{who}] {CRASH_ENV}: killing rank 0 after {phase} step {step}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
