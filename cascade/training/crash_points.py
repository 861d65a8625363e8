"""Fault injection for resume tests: ``CASCADE_CRASH_AT=PHASE:STEP`` makes rank 0 SIGKILL
itself right after that optimizer step of that phase (and its checkpoint, if one falls due);
with ``CASCADE_CRASH_NODE=N`` the whole node rank N dies there instead (its launcher and all
of its workers at once, as a host that is lost)."""

from __future__ import annotations

import os
import signal

from cascade.config import load_settings

CRASH_ENV = "CASCADE_CRASH_AT"
"""``PHASE:STEP``, e.g. ``train:25`` or ``teacher:40``; unset: no crash."""
CRASH_NODE_ENV = "CASCADE_CRASH_NODE"
"""Node rank whose launcher and workers die at the crash point; unset: rank 0 alone."""
LAUNCHER_MODULE = "torch.distributed.run"


def crash_point(env: dict[str, str] | None = None) -> tuple[str, int] | None:
    """``(phase, step)`` from ``CASCADE_CRASH_AT=phase:step``, or None when unset."""
    value = load_settings(env).hooks.crash_at
    if not value:
        return None
    phase, _, step = value.rpartition(":")
    return phase, int(step)


def kill_node(who: str) -> None:
    """SIGKILL this worker's launcher, every worker under it and this process: all of this node
    at once. Refuses (RuntimeError) when the parent is not a ``torch.distributed.run``
    launcher, so a worker started some other way never kills its caller."""
    import psutil

    launcher = psutil.Process(os.getppid())
    if LAUNCHER_MODULE not in " ".join(launcher.cmdline()):
        raise RuntimeError(
            f"{CRASH_NODE_ENV} needs a worker started by {LAUNCHER_MODULE}; "
            f"this one's parent is {launcher.cmdline()}"
        )
    node = os.environ.get("GROUP_RANK", "0")
    print(f"[{who}] {CRASH_NODE_ENV}: killing node {node} (launcher {launcher.pid})", flush=True)
    workers = launcher.children(recursive=True)
    for proc in (launcher, *workers):  # the launcher first: it must not see its workers die
        if proc.pid != os.getpid():
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
    os.kill(os.getpid(), signal.SIGKILL)


def crash_if_due(
    crash: tuple[str, int] | None, phase: str, step: int, *, rank: int, who: str
) -> None:
    """At the crash point ``(phase, step)``: SIGKILL this process when it is rank 0, or, with
    ``CASCADE_CRASH_NODE=N``, kill node N from its first worker (:func:`kill_node`)."""
    if crash != (phase, step):
        return
    node = load_settings().hooks.crash_node
    if node is None:
        if rank == 0:
            print(f"[{who}] {CRASH_ENV}: killing rank 0 after {phase} step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    elif int(os.environ.get("GROUP_RANK", "0")) == node and os.environ.get("LOCAL_RANK") == "0":
        print(f"[{who}] {CRASH_ENV}: node {node} dies after {phase} step {step}", flush=True)
        kill_node(who)
