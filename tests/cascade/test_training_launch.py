"""Every training launch builds DeepSpeed's CPU extension with the same tools into one cache;
the command line of each node rank; a node that dies ends the others with an error naming it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from cascade.config import REPO_ROOT, Settings
from cascade.training.launch import (
    all_reduced,
    collective_device,
    extension_build_env,
    run_torchrun,
    torch_extensions_dir,
    torchrun_commands,
)


def _fake_ninja(folder: Path) -> Path:
    folder.mkdir(parents=True)
    ninja = folder / "ninja"
    ninja.write_text("#!/bin/sh\nexit 0\n")
    ninja.chmod(0o755)
    return folder


def test_each_ninja_gets_its_own_cache_folder(tmp_path: Path) -> None:
    first, second = _fake_ninja(tmp_path / "a"), _fake_ninja(tmp_path / "b")
    base = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    one = torch_extensions_dir({**base, "PATH": f"{first}{os.pathsep}{second}"})
    other = torch_extensions_dir({**base, "PATH": f"{second}{os.pathsep}{first}"})
    again = torch_extensions_dir({**base, "PATH": f"{first}{os.pathsep}{second}"})
    # Two ninjas record one build differently: sharing a folder rebuilt it at every switch.
    assert one != other and one == again
    assert one.startswith(str(tmp_path / "cache" / "cascade" / "torch_extensions"))


def test_a_launch_finds_this_interpreters_tools_first(tmp_path: Path) -> None:
    tools = str(Path(sys.executable).parent)
    env = {"PATH": f"/usr/bin{os.pathsep}/bin", "XDG_CACHE_HOME": str(tmp_path)}
    extension_build_env(env)
    assert env["PATH"].split(os.pathsep)[:2] == [tools, "/usr/bin"]
    assert env["TORCH_EXTENSIONS_DIR"] == torch_extensions_dir(env)
    # Whoever launches (pytest, an Airflow task with the venv on PATH), one folder.
    from_a_task = {"PATH": f"{tools}{os.pathsep}/usr/bin", "XDG_CACHE_HOME": str(tmp_path)}
    extension_build_env(from_a_task)
    assert from_a_task["TORCH_EXTENSIONS_DIR"] == env["TORCH_EXTENSIONS_DIR"]
    assert from_a_task["PATH"].count(tools) == 1


def test_one_node_runs_the_single_node_command_line() -> None:
    (command,) = torchrun_commands(
        "m.train", ["--out", "x"], nodes=1, processes=2, master_addr="127.0.0.1", master_port=123
    )
    assert command == [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1",
        "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1",
        "--master_port", "123",
        "-m", "m.train", "--out", "x",
    ]  # fmt: skip


def test_each_node_rank_gets_its_command_line_with_one_rendezvous() -> None:
    commands = torchrun_commands(
        "m.train", ["--out", "x"], nodes=2, processes=3, master_addr="10.0.0.1", master_port=555
    )
    assert len(commands) == 2
    for rank, command in enumerate(commands):
        flags = dict(zip(command[3:13:2], command[4:13:2], strict=True))
        assert flags == {
            "--nnodes": "2",
            "--node_rank": str(rank),
            "--nproc_per_node": "3",
            "--master_addr": "10.0.0.1",
            "--master_port": "555",
        }
        assert command[13:] == ["-m", "m.train", "--out", "x"]
    with pytest.raises(ValueError, match="must be >= 1"):
        torchrun_commands("m", [], nodes=0, processes=1, master_addr="h", master_port=1)


NODE_WORKER = """
import os, sys, time
from pathlib import Path

node, folder = int(os.environ["GROUP_RANK"]), Path(sys.argv[2])
print(f"rank={os.environ['RANK']} world={os.environ['WORLD_SIZE']} pid={os.getpid()}", flush=True)
(folder / f"node{node}").write_text(str(os.getpid()))
if node == int(sys.argv[1]):
    from cascade.training.crash_points import kill_node

    while len(list(folder.glob("node*"))) < 2:  # every node has started
        time.sleep(0.05)
    kill_node("worker")
time.sleep(600)  # the survivor: as if waiting forever in a collective with the dead node
"""


def running(pid: int) -> bool:
    """The process exists and is not a zombie waiting for its parent to reap it."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_dead_node_ends_the_other_nodes_with_an_error_naming_it(
    settings: Settings, tmp_path: Path
) -> None:
    """Node 0 (the rendezvous host) dies whole; node 1's worker would wait forever: the run
    ends it after the grace period and fails, naming node 0."""
    (tmp_path / "node_worker.py").write_text(NODE_WORKER)
    pids = tmp_path / "pids"
    pids.mkdir()
    path = os.pathsep.join(filter(None, (str(tmp_path), os.environ.get("PYTHONPATH"))))
    started = time.monotonic()
    code, tail = run_torchrun(
        "node_worker",
        ["0", str(pids)],
        processes=1,
        nodes=2,
        settings=settings,
        log_path=tmp_path / "train.log",
        extra_env={"PYTHONPATH": path},
        grace_s=0.5,
    )
    assert time.monotonic() - started < 60, tail
    assert code == -signal.SIGKILL, tail
    log = (tmp_path / "train.log").read_text()
    # One command line per node, the global rank and world size each worker got.
    assert "[launch node 0/2] " in log and "--node_rank 1" in log
    assert re.search(r"^\[node 0\] rank=0 world=2 pid=\d+$", log, re.M), log
    assert re.search(r"^\[node 1\] rank=1 world=2 pid=\d+$", log, re.M), log
    assert "[node 0] [worker] CASCADE_CRASH_NODE: killing node 0" in log
    assert tail.splitlines()[-1] == (
        "[launch] node 0 of 2 failed: its launcher was killed by SIGKILL; "
        "ended node(s) 1, still running 0.5 s later"
    )
    for node in (0, 1):  # no worker outlives the run (a killed one may be a zombie a moment)
        pid = int((pids / f"node{node}").read_text())
        deadline = time.monotonic() + 10
        while running(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not running(pid), f"node {node}'s worker {pid} outlived the run"


def test_killing_a_node_refuses_outside_a_launcher() -> None:
    """The fault hook kills its parent: run by anything but torchrun, it refuses instead."""
    code = "from cascade.training.crash_points import kill_node; kill_node('t')"
    done = subprocess.run(
        ["sh", "-c", f'"{sys.executable}" -c "{code}"; echo "exit=$?"'],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "needs a worker started by torch.distributed.run" in done.stderr
    assert done.stdout.strip() == "exit=1"


def test_collectives_outside_a_process_group_stay_on_the_cpu_untouched() -> None:
    values = torch.tensor([1.0, 2.0], dtype=torch.float64)
    assert collective_device() == torch.device("cpu")
    assert all_reduced(values) is values


def test_a_failed_launch_says_the_workers_reason_on_its_first_line(tmp_path: Path) -> None:
    from cascade.training.launch import accept_result

    tail = "\n".join(
        [
            "[rank1]: Traceback (most recent call last):",
            '[rank1]:   File "fscd_run.py", line 160, in finish',
            "[rank1]: RuntimeError: rank 0 left the group",
            "[rank0]: Traceback (most recent call last):",
            '[rank0]:   File "fscd_metrics.py", line 170, in choose_fscd',
            "[rank0]: models.preranking.fscd_metrics.OverBudget: no FSCD model that ranks is "
            "within the cost budget 0.5",
            "[rank1]: RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer",
            "E1129 13:00:00 torch/distributed/elastic/multiprocessing/api.py failed (exitcode: 1)",
        ]
    )
    with pytest.raises(RuntimeError) as failed:
        accept_result(1, tmp_path / "result.json", tail, what="training", keys=("run_id",))
    first = str(failed.value).splitlines()[0]
    assert first.startswith(
        "training failed (exit code 1): OverBudget: no FSCD model that ranks is within the "
        "cost budget 0.5 (no complete "
    )
    assert str(failed.value).endswith(tail)
    with pytest.raises(RuntimeError, match=r"^training failed \(exit code 9\) \(no complete"):
        accept_result(9, tmp_path / "result.json", "Killed", what="training", keys=("run_id",))


def test_a_build_lock_left_by_a_killed_build_is_removed_and_a_live_one_kept(
    tmp_path: Path,
) -> None:
    from cascade.training.launch import STALE_BUILD_LOCK_S, clear_stale_build_locks

    stale = tmp_path / "deepspeed_shm_comm" / "lock"
    live = tmp_path / "other_op" / "lock"
    for lock in (stale, live):
        lock.parent.mkdir()
        lock.touch()
    old = time.time() - STALE_BUILD_LOCK_S - 60
    os.utime(stale, (old, old))

    assert clear_stale_build_locks(tmp_path) == [stale]
    assert not stale.exists() and live.exists()
    assert clear_stale_build_locks(tmp_path / "missing") == []


def test_in_process_groups_and_launches_share_one_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import collections

    from cascade.training import launch

    tools = str(Path(sys.executable).parent)
    launched = {"PATH": f"/usr/bin{os.pathsep}/bin", "XDG_CACHE_HOME": str(tmp_path)}
    extension_build_env(launched)
    # A process's own environment (a mapping, not a dict), as init_distributed passes it.
    own = collections.UserDict(
        {"PATH": f"/usr/bin{os.pathsep}/bin", "XDG_CACHE_HOME": str(tmp_path)}
    )
    extension_build_env(own)
    assert own["TORCH_EXTENSIONS_DIR"] == launched["TORCH_EXTENSIONS_DIR"]
    assert own["PATH"].split(os.pathsep)[0] == tools

    # make venv's prebuild builds into that same folder, for the CPU accelerator.
    seen: list[dict[str, str]] = []
    monkeypatch.setenv("PATH", f"/usr/bin{os.pathsep}/bin")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setattr(launch.subprocess, "run", lambda cmd, env, **kw: seen.append(env))
    assert launch.prebuild_extensions(echo=lambda line: None) == launched["TORCH_EXTENSIONS_DIR"]
    assert seen[0]["TORCH_EXTENSIONS_DIR"] == launched["TORCH_EXTENSIONS_DIR"]
    assert seen[0]["DS_ACCELERATOR"] == "cpu"
