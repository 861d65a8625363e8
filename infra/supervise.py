"""Supervisors of the stack services made of several daemons (:mod:`infra.airflow_local`,
:mod:`infra.spark_standalone`): stop on SIGTERM/SIGINT, stop every child within a grace
period."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterable

import psutil


def stop_requested() -> Callable[[], bool]:
    """Install SIGTERM and SIGINT handlers; the returned function says whether one arrived."""
    stopping = False

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return lambda: stopping


def stop_children(children: Iterable[subprocess.Popen[bytes]], grace_s: float = 20.0) -> None:
    """SIGTERM each running child (in the given order), then SIGKILL what is left after
    ``grace_s`` seconds."""
    children = list(children)
    for child in children:
        if child.poll() is None:
            child.terminate()
    deadline = time.monotonic() + grace_s
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()


def topmost_process(match: Callable[[list[str]], bool]) -> psutil.Process | None:
    """The process whose command line ``match`` accepts and whose parent's does not; None if
    none. A forking daemon's children (a Celery worker's pool) carry its command line, and once
    process ids wrap around a child may come before its parent in the process table: the parent
    is told apart by its ancestry, not by a lower id."""
    found = {}
    for proc in psutil.process_iter(["cmdline", "ppid"]):
        try:
            if match(proc.info["cmdline"] or []):
                found[proc.pid] = proc
        except psutil.Error:
            continue
    roots = [proc for pid, proc in found.items() if proc.info["ppid"] not in found]
    return min(roots, key=lambda proc: proc.pid) if roots else None


def lose_node(proc: psutil.Process, wait_s: float = 20.0) -> None:
    """Kill ``proc`` and every process under it at once (SIGKILL), as a host that is lost, and
    wait up to ``wait_s`` for them to be gone. Used by the fault tests and benchmarks."""
    family = [*proc.children(recursive=True), proc]
    for member in family:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=wait_s)
