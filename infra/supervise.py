"""Supervisors of the stack services made of several daemons (:mod:`infra.airflow_local`,
:mod:`infra.spark_standalone`): stop on SIGTERM/SIGINT, stop every child within a grace
period."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

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


def write_pid_file(path: Path, pid: int) -> None:
    """Record the pid of a child just started (atomically: a reader sees no half-written
    file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    part.write_text(f"{pid}\n")
    os.replace(part, path)


def process_from_pid_file(path: Path) -> psutil.Process | None:
    """The running process ``path`` names (:func:`write_pid_file`); None when the file is
    missing or unreadable, or the process has exited. Process ids wrap around on a busy machine:
    a process started after the file was written only reuses the id, and is not the one named."""
    try:
        written = path.stat().st_mtime
        proc = psutil.Process(int(path.read_text().strip()))
        if proc.create_time() > written + 1.0 or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except (OSError, ValueError, psutil.Error):
        return None


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
