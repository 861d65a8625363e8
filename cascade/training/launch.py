"""Starting training workers and reading back what they wrote.

A trainer module is both the launcher and the worker: from Python, :func:`launch_for_result`
runs ``python -m MODULE ARGS`` under ``torch.distributed.run`` (gloo on CPU, NCCL on GPU) and
returns the complete ``result.json`` rank 0 wrote; in the worker, :func:`init_distributed`
joins the process group (a single process without a launcher too).

``CASCADE_TRAIN_NODES`` (``Settings.train_nodes``; 2 in the ``cluster`` profile) node ranks
each run ``CASCADE_TRAIN_PROCESSES`` workers: :func:`run_torchrun` starts one launcher per node
rank on this machine, all with one static rendezvous on loopback, and writes each node's
command line (:func:`torchrun_commands`) at the top of the log, the line a host of a real
cluster runs with node 0's address as ``--master_addr``. Ranks are global (``RANK`` /
``WORLD_SIZE``; ``LOCAL_RANK`` only picks the GPU); rank 0 writes the results, and every rank
reads the checkpoints of the shared run folder on resume. A node that dies fails the run: the
other nodes are ended and the log's last line names the dead one.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import MutableMapping, Sequence
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist

from cascade.config import REPO_ROOT, Settings
from cascade.ports import free_port
from cascade.tracking_auth import WRITER, role_env


def ensure_distributed_env() -> None:
    """Let a trainer module run as a single process without a launcher."""
    if "RANK" in os.environ:
        return
    os.environ.update(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    )


def init_distributed() -> None:
    """Join the process group (NCCL on GPU, gloo on CPU) unless already in one."""
    ensure_distributed_env()
    cuda = torch.cuda.is_available()
    # Must be set before deepspeed is imported: it picks its accelerator at import time.
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if cuda else "cpu")
    import deepspeed

    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        # DeepSpeed builds its CPU communication extension on first use: with the launches'
        # tools into their cache (one build serves both), never a lock a killed build left.
        extension_build_env(os.environ)
        deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")


def rank_world() -> tuple[int, int]:
    """``(rank, world size)``; ``(0, 1)`` outside a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def collective_device() -> torch.device:
    """Where a collective's tensors must live: this process's GPU when the process group runs
    NCCL (which has no CPU transport: a CPU tensor there raises), else the CPU (gloo)."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduced(values: torch.Tensor) -> torch.Tensor:
    """``values`` summed over every rank, on the CPU (``values`` itself outside a process group
    of several). The reduction runs on :func:`collective_device`, so CPU-side figures (losses,
    counts) reduce under NCCL too."""
    _, world = rank_world()
    if world == 1:
        return values
    reduced = values.to(collective_device())
    dist.all_reduce(reduced)
    return reduced.cpu()


def torch_extensions_dir(env: dict[str, str]) -> str:
    """A stable cache outside CASCADE_HOME, one per virtual environment and ninja.

    Stable: the DeepSpeed extension compiles once, not once per home. Per venv: the build
    records its include paths, so two checkouts sharing one folder (seen: a CI clone beside
    the working tree) rebuild it on every launch, ~3 minutes each on a loaded 2-core machine.
    Per ninja: the venv's ``ninja`` and the system's record the same build differently, so a
    folder shared by launches whose ``PATH`` finds one or the other was rebuilt each time the
    other one ran (~50 s on a quiet 2-core machine, 2 minutes loaded).
    """
    ninja = shutil.which("ninja", path=env.get("PATH", os.defpath)) or ""
    key = f"{sys.prefix}\0{os.path.realpath(ninja) if ninja else ''}"
    venv = hashlib.sha1(key.encode()).hexdigest()[:10]
    cache = Path(env.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return str(cache / "cascade" / "torch_extensions" / venv)


def extension_build_env(env: MutableMapping[str, str]) -> None:
    """Point ``env`` at this interpreter's tools first (its ``ninja`` among them) and at the
    matching extension cache, so every launch builds DeepSpeed's CPU extension with the same
    tools into the same folder, whoever started it."""
    tools = str(Path(sys.executable).parent)
    path = env.get("PATH", os.defpath)
    if path.split(os.pathsep)[0] != tools:
        env["PATH"] = f"{tools}{os.pathsep}{path}"
    use_extension_cache(env)


def use_extension_cache(env: MutableMapping[str, str]) -> None:
    """Point ``env`` at the extension cache its tools give (unless it names one) and clear a
    build lock a killed build left there."""
    env.setdefault("TORCH_EXTENSIONS_DIR", torch_extensions_dir(dict(env)))
    clear_stale_build_locks(Path(env["TORCH_EXTENSIONS_DIR"]))


def prebuild_extensions(echo: Any = print) -> str:
    """Build DeepSpeed's CPU communication extension into the cache that launched ranks and
    in-process process groups share (:func:`extension_build_env`). ``make venv`` calls it, so
    the build runs once at set-up, on a quiet machine, instead of inside the first test or
    training step that needs it, where others would wait on its lock. Returns the folder."""
    env = dict(os.environ)
    extension_build_env(env)
    env["DS_ACCELERATOR"] = "cpu"
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-c", "from deepspeed.comm.torch import build_shm_op; build_shm_op()"],
        env=env, check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    folder = env["TORCH_EXTENSIONS_DIR"]
    echo(f"install: DeepSpeed CPU extension in {folder} ({time.monotonic() - started:.0f} s)")
    return folder


STALE_BUILD_LOCK_S = 900.0
"""A build lock this old is a leftover: the extension builds in about a minute (3 loaded)."""


def clear_stale_build_locks(
    folder: Path, *, older_than_s: float = STALE_BUILD_LOCK_S
) -> list[Path]:
    """Remove the ``lock`` files of extension builds under ``folder`` older than
    ``older_than_s``. PyTorch's JIT build takes the lock before it compiles and releases it
    after; a build killed in between (SIGKILL, a time limit) leaves it behind, and every later
    process then waits on it forever. Returns the locks removed."""
    removed = []
    now = time.time()
    for lock in folder.glob("*/lock") if folder.is_dir() else ():
        with contextlib.suppress(FileNotFoundError):
            age = now - lock.stat().st_mtime
            if age > older_than_s:
                lock.unlink()
                removed.append(lock)
                print(
                    f"[launch] removed a stale build lock {lock} ({age / 60:.0f} min old: a "
                    "build was killed before it finished); the extension builds again",
                    flush=True,
                )
    return removed


def read_complete_result(path: Path, ds: str | None, keys: Sequence[str]) -> dict[str, Any] | None:
    """The result at ``path`` if it exists, parses, has every one of ``keys`` and is for ``ds``
    (any partition when ``ds`` is None)."""
    try:
        result = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if not isinstance(result, dict) or any(result.get(k) in (None, "") for k in keys):
        return None
    return result if ds is None or result["ds"] == ds else None


RAISED_LINE = re.compile(
    r"^(?:\[(?:default)?rank\d+\]:\s*)?"
    r"((?:[a-z_]\w*\.)+[A-Z]\w*|[A-Z]\w*(?:Error|Exception|Exit)): (\S.*)$"
)
"""The last line of a Python traceback, ``[rankN]:``-prefixed as torchrun relays it:
``models.preranking.fscd_metrics.OverBudget: ...`` or ``ValueError: ...``."""


def raised_reason(log_tail: str) -> str | None:
    """The exception a worker ended with, from the launch's log tail, as ``Name: message``
    with the module path dropped; None when the tail holds none. The last one the project
    raised (its name has a module path) wins over builtin ones: when one rank fails, the
    others end on a lost connection, often later in the log."""
    raised = [m for m in map(RAISED_LINE.match, map(str.strip, log_tail.splitlines())) if m]
    if not raised:
        return None
    found = next((m for m in reversed(raised) if "." in m.group(1)), raised[-1])
    return f"{found.group(1).rsplit('.', 1)[-1]}: {found.group(2).strip()}"


def accept_result(
    returncode: int,
    result_path: Path,
    log_tail: str,
    *,
    what: str,
    keys: Sequence[str],
    ds: str | None = None,
) -> dict[str, Any]:
    """The launch's complete result, even if a rank crashed at exit; else raise with the log's
    tail."""
    result = read_complete_result(result_path, ds, keys)
    if result is None:
        # The workers' own reason goes first: the first line is what a step's timing.json and
        # the CLI keep, and the tail interleaves every rank's traceback.
        reason = raised_reason(log_tail)
        said = f": {reason}" if reason else ""
        raise RuntimeError(
            f"{what} failed (exit code {returncode}){said} (no complete {result_path}); "
            f"last log lines:\n{log_tail}"
        )
    if returncode != 0:
        # Seen with DeepSpeed on CPU: a rank SIGABRTs at exit after everything was written.
        warnings.warn(
            f"{what} exited with code {returncode} after writing a complete {result_path}; "
            f"accepting run {result['run_id']}",
            RuntimeWarning,
            stacklevel=3,
        )
    return result


NODE_GRACE_S = 10.0
"""After one node's launcher failed: how long the other nodes' launchers may take to fail on
their own (a peer's lost connection ends their collectives) before they are ended."""
END_GRACE_S = 5.0
"""How long an ended launcher and its workers get after SIGTERM before SIGKILL."""


def torchrun_commands(
    module: str,
    args: Sequence[str],
    *,
    nodes: int,
    processes: int,
    master_addr: str,
    master_port: int | str,
    python: str = sys.executable,
) -> list[list[str]]:
    """The ``torch.distributed.run`` command line of each node rank, in rank order.

    One node: ``--nnodes 1`` with the rendezvous at ``master_addr:master_port``. Several: each
    node rank ``R`` runs ``--nnodes N --node_rank R`` with the same static rendezvous, hosted by
    node rank 0's launcher at ``master_addr:master_port``, so node ``R`` holds the global ranks
    ``R*P .. R*P+P-1``. On a real cluster each host runs its own line (``master_addr`` being
    node 0's address); :func:`run_torchrun` runs them all on this machine (loopback) and
    writes them at the top of the log.
    """
    if nodes < 1 or processes < 1:
        raise ValueError(f"nodes ({nodes}) and processes per node ({processes}) must be >= 1")
    head = [python, "-m", "torch.distributed.run"]
    tail = ["--master_addr", master_addr, "--master_port", str(master_port), "-m", module, *args]
    size = ["--nproc_per_node", str(processes)]
    if nodes == 1:
        return [[*head, "--nnodes", "1", *size, *tail]]
    return [
        [*head, "--nnodes", str(nodes), "--node_rank", str(rank), *size, *tail]
        for rank in range(nodes)
    ]


def run_torchrun(
    module: str,
    args: list[str],
    *,
    processes: int,
    settings: Settings,
    log_path: Path,
    echo: bool = False,
    append: bool = False,
    extra_env: dict[str, str] | None = None,
    nodes: int | None = None,
    grace_s: float = NODE_GRACE_S,
) -> tuple[int, str]:
    """Run ``python -m module args`` under ``torch.distributed.run``: ``processes`` per node on
    ``nodes`` node ranks (default ``settings.train_nodes``), all on this machine.

    The output goes to ``log_path`` line by line (and to stdout with ``echo``); returns the
    exit code and the last 60 lines. With several nodes each line starts with ``[node R]``, the
    log starts with each node's command line (:func:`torchrun_commands`), and a node whose
    launcher fails ends the run: the others get ``grace_s`` to fail on their own, then they are
    ended; the returned code is the failed node's and the last line names it.
    """
    nodes = settings.train_nodes if nodes is None else nodes
    env = dict(os.environ)
    # The child reads its settings from the environment: hand it these, not the ambient ones.
    env.update(
        CASCADE_HOME=str(settings.home),
        CASCADE_MLFLOW_URI=settings.tracking_uri,
        PYTHONUNBUFFERED="1",
        # Training writes runs, nothing in the registry: the writer's credential only.
        **role_env(settings, WRITER),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        **(extra_env or {}),
    )
    if not torch.cuda.is_available():
        env.setdefault("DS_ACCELERATOR", "cpu")
    extension_build_env(env)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // (processes * nodes))))
    commands = torchrun_commands(
        module,
        args,
        nodes=nodes,
        processes=processes,
        master_addr=env["MASTER_ADDR"],
        master_port=env["MASTER_PORT"],
    )
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tail: collections.deque[str] = collections.deque(maxlen=60)
    with open(log_path, "a" if append else "w", buffering=1) as log:  # line by line: watchable
        if nodes > 1:
            returncode = _run_nodes(commands, env, log, tail, echo=echo, grace_s=grace_s)
        else:
            (cmd,) = commands
            if echo:
                print(f"[launch] {' '.join(cmd)}", flush=True)
            with start_launcher(cmd, env) as proc:
                assert proc.stdout is not None
                for line in proc.stdout:
                    if echo:
                        sys.stdout.write(line)
                    log.write(line)
                    tail.append(line)
                returncode = proc.wait()
    if echo:
        sys.stdout.flush()
    return returncode, "".join(tail)


def start_launcher(
    cmd: list[str], env: dict[str, str], *, new_session: bool = False
) -> subprocess.Popen[str]:
    """Start a launcher in the repository with its output (stderr too) on a line-buffered
    pipe; ``new_session``: in its own process group (a node of several)."""
    return subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        start_new_session=new_session,
    )


def exit_description(code: int) -> str:
    """``exited with code 1`` or ``was killed by SIGKILL``."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def node_processes(pid: int) -> list[psutil.Process]:
    """The launcher ``pid`` and every process under it (its workers); [] once it is gone."""
    try:
        launcher = psutil.Process(pid)
        return [launcher, *launcher.children(recursive=True)]
    except psutil.Error:
        return []


def end_processes(procs: Sequence[psutil.Process], grace_s: float = END_GRACE_S) -> None:
    """SIGTERM ``procs`` (a launcher forwards it to its workers), SIGKILL what is left after
    ``grace_s``."""
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace_s)


def _run_nodes(
    commands: list[list[str]],
    env: dict[str, str],
    log: Any,
    tail: collections.deque[str],
    *,
    echo: bool,
    grace_s: float,
) -> int:
    """Start one launcher per node rank, stream their lines (``[node R]`` first), wait for all;
    a failed launcher ends the others ``grace_s`` later. Returns 0 or the failed node's code."""
    lock = threading.Lock()

    def write(line: str) -> None:
        with lock:
            if echo:
                sys.stdout.write(line)
            log.write(line)
            tail.append(line)

    def pump(rank: int, stream: Any) -> None:
        for line in stream:
            write(f"[node {rank}] {line}")

    for rank, cmd in enumerate(commands):
        write(f"[launch node {rank}/{len(commands)}] {shlex.join(cmd)}\n")
    launchers: list[subprocess.Popen[str]] = []
    # A launcher's workers, seen while it ran: they outlive a launcher killed alone.
    workers: dict[int, dict[int, psutil.Process]] = {}
    readers: list[threading.Thread] = []
    failed: tuple[int, int] | None = None
    ended: list[int] = []
    try:
        for rank, cmd in enumerate(commands):
            proc = start_launcher(cmd, env, new_session=True)
            launchers.append(proc)
            reader = threading.Thread(target=pump, args=(rank, proc.stdout), daemon=True)
            reader.start()
            readers.append(reader)
        deadline = math.inf
        looked = 0.0
        while True:
            codes = [proc.poll() for proc in launchers]
            if time.monotonic() - looked >= 1.0:
                looked = time.monotonic()
                for rank, proc in enumerate(launchers):
                    if codes[rank] is None:
                        seen = workers.setdefault(rank, {})
                        seen.update({p.pid: p for p in node_processes(proc.pid)[1:]})
            if failed is None:
                for rank, code in enumerate(codes):
                    if code not in (None, 0):
                        assert code is not None
                        failed = (rank, code)
                        deadline = time.monotonic() + grace_s
                        break
            if all(code is not None for code in codes):
                break
            if time.monotonic() >= deadline:
                ended = [rank for rank, code in enumerate(codes) if code is None]
                end_processes([p for r in ended for p in node_processes(launchers[r].pid)])
                deadline = math.inf
            time.sleep(0.1)
    finally:
        # Interrupted, or a launcher that died alone: no worker of this run outlives it.
        leftovers = [p for seen in workers.values() for p in seen.values() if p.is_running()]
        for proc in launchers:
            if proc.poll() is None:
                leftovers.extend(node_processes(proc.pid))
        if leftovers:
            end_processes(leftovers)
        for proc in launchers:
            proc.wait()
        for reader in readers:
            reader.join(timeout=END_GRACE_S)
        for proc in launchers:
            if proc.stdout is not None:
                proc.stdout.close()
    if failed is None:
        return 0
    rank, code = failed
    others = (
        f"ended node(s) {', '.join(map(str, ended))}, still running {grace_s:g} s later"
        if ended
        else "the other nodes stopped on their own"
    )
    write(
        f"[launch] node {rank} of {len(commands)} failed: its launcher {exit_description(code)}; "
        f"{others}\n"
    )
    return code


def launch_for_result(
    module: str,
    args: list[str],
    *,
    what: str,
    out_dir: Path,
    keys: Sequence[str],
    processes: int,
    settings: Settings,
    echo: bool,
    ds: str | None = None,
    append: bool = True,
) -> dict[str, Any]:
    """Run ``module`` under :func:`run_torchrun` (log in ``OUT/train.log``) and return its
    complete ``OUT/result.json`` (every one of ``keys`` set, for ``ds`` when given); raise with
    the log's tail when there is none. A stale result is removed first, so it never passes for
    this launch's."""
    result_path = out_dir / "result.json"
    result_path.unlink(missing_ok=True)
    returncode, tail = run_torchrun(
        module,
        args,
        processes=processes,
        settings=settings,
        log_path=out_dir / "train.log",
        echo=echo,
        append=append,
    )
    return accept_result(returncode, result_path, tail, what=what, keys=keys, ds=ds)
