"""Finding a daemon: by the pid its supervisor recorded, or among the processes that carry its
command line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from infra.supervise import lose_node, process_from_pid_file, topmost_process, write_pid_file

# A parent that forks two children: all three carry the same command line, as a Celery worker
# and its pool processes do.
FORKING = (
    "import os, time\nfor _ in range(2):\n    if os.fork() == 0:\n        break\ntime.sleep(60)\n"
)


@pytest.fixture()
def forking_daemon():
    marker = f"cascade-test-{uuid.uuid4().hex}"
    proc = subprocess.Popen([sys.executable, "-c", FORKING, marker])
    try:
        deadline = time.monotonic() + 20
        while len(psutil.Process(proc.pid).children()) < 2:
            assert time.monotonic() < deadline, "the daemon did not fork"
            time.sleep(0.05)
        yield proc, marker
    finally:
        if proc.poll() is None:
            lose_node(psutil.Process(proc.pid))


@pytest.mark.parametrize("order", ["ascending", "children first"])
def test_the_topmost_process_is_found_whatever_the_order_of_process_ids(
    forking_daemon, order, monkeypatch
) -> None:
    proc, marker = forking_daemon
    if order == "children first":
        # As after process ids wrap around: the children come before their parent.
        listed = list(psutil.process_iter(["cmdline", "ppid"]))
        monkeypatch.setattr(
            psutil,
            "process_iter",
            lambda attrs=None: iter(sorted(listed, key=lambda p: p.pid != proc.pid, reverse=True)),
        )
    found = topmost_process(lambda cmdline: marker in cmdline)
    assert found is not None and found.pid == proc.pid
    assert topmost_process(lambda cmdline: "no-such-marker" in cmdline) is None


def test_losing_the_topmost_process_loses_its_children(forking_daemon) -> None:
    proc, marker = forking_daemon
    family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children()]
    lose_node(topmost_process(lambda cmdline: marker in cmdline))
    assert len(family) == 3
    assert not any(alive(member) for member in family)
    assert topmost_process(lambda cmdline: marker in cmdline) is None


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_pid_file_names_its_process_until_it_exits(forking_daemon, tmp_path) -> None:
    proc, _ = forking_daemon
    pid_file = tmp_path / "daemon.pid"
    assert process_from_pid_file(pid_file) is None  # not written yet
    write_pid_file(pid_file, proc.pid)
    found = process_from_pid_file(pid_file)
    assert found is not None and found.pid == proc.pid
    lose_node(found)
    proc.wait(timeout=20)
    assert process_from_pid_file(pid_file) is None


def test_a_pid_reused_after_the_file_was_written_is_not_the_process_named(tmp_path) -> None:
    pid_file = tmp_path / "old.pid"
    write_pid_file(pid_file, 1)  # init: started long before the file, so it is named
    assert process_from_pid_file(pid_file).pid == 1
    # A process started after the file was written only reuses the id.
    later = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        write_pid_file(pid_file, later.pid)
        old = pid_file.stat().st_mtime - 60
        os.utime(pid_file, (old, old))
        assert process_from_pid_file(pid_file) is None
    finally:
        later.kill()
        later.wait()
    pid_file.write_text("not a pid\n")
    assert process_from_pid_file(pid_file) is None
