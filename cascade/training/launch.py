"""Starting training workers and reading back what they wrote.

A trainer module is both the launcher and the worker: from Python, :func:`launch_for_result`
runs ``python -m MODULE ARGS`` under ``torch.distributed.run`` on this node (gloo on CPU, NCCL
on GPU) and returns the complete ``result.json`` rank 0 wrote; in the worker,
:func:`init_distributed` joins the process group (a single process without a launcher too).
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from cascade.config import REPO_ROOT, Settings
from cascade.ports import free_port
from cascade.tracking_auth import tracking_credentials_env


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
        deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")


def rank_world() -> tuple[int, int]:
    """``(rank, world size)``; ``(0, 1)`` outside a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


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


def extension_build_env(env: dict[str, str]) -> None:
    """Point ``env`` at this interpreter's tools first (its ``ninja`` among them) and at the
    matching extension cache, so every launch builds DeepSpeed's CPU extension with the same
    tools into the same folder, whoever started it."""
    tools = str(Path(sys.executable).parent)
    path = env.get("PATH", os.defpath)
    if path.split(os.pathsep)[0] != tools:
        env["PATH"] = f"{tools}{os.pathsep}{path}"
    env.setdefault("TORCH_EXTENSIONS_DIR", torch_extensions_dir(env))


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
        raise RuntimeError(
            f"{what} failed (exit code {returncode}) without a complete {result_path}; "
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
) -> tuple[int, str]:
    """Run ``python -m module args`` under ``torch.distributed.run`` on this node.

    The output goes to ``log_path`` line by line (and to stdout with ``echo``); returns the
    exit code and the last 60 lines.
    """
    env = dict(os.environ)
    # The child reads its settings from the environment: hand it these, not the ambient ones.
    env.update(
        CASCADE_HOME=str(settings.home),
        CASCADE_MLFLOW_URI=settings.tracking_uri,
        PYTHONUNBUFFERED="1",
        **tracking_credentials_env(settings),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        **(extra_env or {}),
    )
    if not torch.cuda.is_available():
        env.setdefault("DS_ACCELERATOR", "cpu")
    extension_build_env(env)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // processes)))
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1",
        "--nproc_per_node", str(processes),
        "--master_addr", env["MASTER_ADDR"],
        "--master_port", env["MASTER_PORT"],
        "-m", module, *args,
    ]  # fmt: skip
    if echo:
        print(f"[launch] {' '.join(cmd)}", flush=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tail: collections.deque[str] = collections.deque(maxlen=60)
    with (
        open(log_path, "a" if append else "w", buffering=1) as log,  # line by line: watchable
        subprocess.Popen(
            cmd,
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        ) as proc,
    ):
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
