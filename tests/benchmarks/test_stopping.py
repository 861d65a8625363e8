"""A benchmark stopped from outside stops what it started (a stand-in child, no real stack)."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from psutil import pid_exists

from benchmarks import registry
from benchmarks.commands import register
from benchmarks.provenance import REPO_ROOT
from benchmarks.stopping import Stopped, stop_on_signals


@contextmanager
def fake_stack() -> Iterator[int]:
    """A stand-in for a private stack: one service in its own session (as the real ones are,
    so a signal to the benchmark's process group does not reach it), stopped by pid on exit."""
    service = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        yield service.pid
    finally:
        service.terminate()
        service.wait(timeout=10)


STARTED: list[int] = []


def self_terminating_benchmark(out: Path, quick: bool) -> dict[str, Any]:
    with fake_stack() as pid:
        STARTED.append(pid)
        os.kill(os.getpid(), signal.SIGTERM)  # what `timeout` sends
        time.sleep(5)  # the signal arrives here
    return {"finished": True}


def test_sigterm_to_bench_stops_the_stack_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(registry.BENCHMARKS, "events", f"{__name__}:self_terminating_benchmark")
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    out = tmp_path / "events.json"
    before = signal.getsignal(signal.SIGTERM)
    args = parser.parse_args(["bench", "events", "--out", str(out), "--quick"])
    started = time.monotonic()
    assert args.func(args) == 128 + signal.SIGTERM
    assert time.monotonic() - started < 5  # stopped at once, not after the benchmark's sleep
    assert STARTED and not pid_exists(STARTED[-1])  # the service was stopped (and reaped)
    assert not out.exists()
    assert signal.getsignal(signal.SIGTERM) == before  # handlers restored


CHILD = """
import subprocess, sys, time
from benchmarks.stopping import stop_on_signals
service = subprocess.Popen(["sleep", "300"], start_new_session=True)
with stop_on_signals("test"):
    try:
        print(service.pid, flush=True)
        time.sleep(60)
    finally:
        time.sleep(0.5)  # a second signal arrives while stopping: ignored
        service.terminate()
        service.wait()
        print("stopped", flush=True)
"""


def test_a_signalled_process_stops_its_service_even_when_signalled_twice() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    service = int(child.stdout.readline())
    assert pid_exists(service)
    child.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    child.send_signal(signal.SIGINT)  # an impatient second Ctrl-C during the clean-up
    out, err = child.communicate(timeout=30)
    assert "stopped" in out, err
    assert child.returncode != 0
    assert "SIGINT again" in err
    deadline = time.monotonic() + 5
    while pid_exists(service) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_exists(service)


def test_stopped_carries_the_shell_exit_code() -> None:
    with pytest.raises(Stopped) as raised, stop_on_signals("test"):
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(5)
    assert raised.value.exit_code == 129
    assert isinstance(raised.value, KeyboardInterrupt)
