"""What every benchmark JSON records beside its figures, so a reader can check and rerun it.

:func:`run_benchmark <benchmarks.registry.run_benchmark>` adds, without replacing a key the
benchmark wrote itself:

* ``machine``: CPU model, cores (all and usable), memory, GPU (if any), Python and torch;
* ``git_commit`` and ``git_dirty``: the commit the code ran from, and whether the tree had
  changes on top of it;
* ``input_digest`` and ``inputs``: a SHA-256 of the source of the modules that generate the
  benchmark's inputs and of its parameters (options, ``--quick``); a benchmark that reads
  files it was given (a corpus folder) puts their :func:`files_digest` under
  ``input_files_digest``, and ``input_digest`` then covers their bytes too;
* ``model_digest`` and ``model_provenance``: set by benchmarks that involve a model (the
  digest of its files or weights; the registry name and version, or the training config);
  None where no model is involved;
* ``machine_load``: the machine's load average over the run (:class:`LoadSampler`: mean, max,
  start, end, against the usable cores), since other work on a shared machine shows in every
  timed figure;
* ``repeats``: timed runs behind each figure (a benchmark's own value is kept);
* ``spread``: for every list of timed runs in the result (a key ending ``_runs``, at any
  depth; list items by their index), ``{"min", "median", "max", "n"}`` under the figure's
  name: ``sizes.0.job_s`` for the ``job_s_runs`` of the first entry of ``sizes``.

Variants are timed interleaved, the order rotating each round (:func:`rotated`), so neither
always runs first. :func:`private_tracking` gives benchmarks that train a private MLflow store,
so none needs the local stack.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

REPO_ROOT = Path(__file__).resolve().parents[1]
RUNS_SUFFIX = "_runs"
T = TypeVar("T")


def bench_repeats(default: int, *, quick: bool = False, quick_default: int | None = None) -> int:
    """Timed repeats behind each figure: ``--repeats`` (``CASCADE_BENCH_REPEATS``) when given,
    else ``quick_default`` under ``--quick`` (when given), else ``default``."""
    from cascade.config import load_settings

    given = load_settings().bench.repeats
    if given is not None:
        return given
    return quick_default if quick and quick_default is not None else default


# --- machine and code ------------------------------------------------------------------------


def cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` knows."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


def usable_cpus() -> int:
    """Cores this process may run on (its affinity where the OS has one, else every core)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    import torch

    cuda = torch.cuda.is_available()
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_device": torch.cuda.get_device_name(0) if cuda else None,
        "gpus": torch.cuda.device_count() if cuda else 0,
    }
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/meminfo") as meminfo:
            info["memory_kib"] = int(meminfo.readline().split()[1])
    return info


def git_state(root: Path = REPO_ROOT) -> dict[str, Any]:
    """``git_commit`` (None outside a checkout) and ``git_dirty`` (uncommitted changes)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args], cwd=root, capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain") if commit else None
    return {"git_commit": commit, "git_dirty": bool(status) if commit else None}


# --- digests ---------------------------------------------------------------------------------


def module_source(name: str) -> bytes:
    """The source file of module ``name``, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        spec = None
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        raise ValueError(f"module {name!r} has no Python source to digest")
    return Path(spec.origin).read_bytes()


def code_digest(modules: Iterable[str], parameters: Mapping[str, Any]) -> str:
    """SHA-256 of the modules' sources (in the order given) and of ``parameters`` (as sorted
    JSON): inputs generated by the same code with the same parameters have the same digest."""
    digest = hashlib.sha256()
    for name in modules:
        digest.update(name.encode() + b"\0" + module_source(name) + b"\0")
    digest.update(json.dumps(dict(parameters), sort_keys=True, default=str).encode())
    return "sha256:" + digest.hexdigest()


def input_folder(
    root: Path, generators: Iterable[str], parameters: Mapping[str, Any]
) -> tuple[Path, str]:
    """``(root / <digest>, digest)``: where inputs that ``generators`` make with ``parameters``
    are kept, the folder named by their :func:`code_digest` (its first 16 hex digits). Changed
    generator code or parameters give a new folder, so a benchmark regenerates instead of
    reusing inputs made by other code; the same ones find the folder a previous run filled."""
    digest = code_digest(generators, parameters)
    return Path(root) / digest.removeprefix("sha256:")[:16], digest


def digest_of(digests: Iterable[str]) -> str:
    """One SHA-256 over several digests (in the order given): a result's ``input_digest``
    when each of its sizes has inputs of its own."""
    return "sha256:" + hashlib.sha256("\n".join(digests).encode()).hexdigest()


def frame_digest(frame: Any) -> str:
    """SHA-256 of a pandas frame's column names, dtypes and values (row order counts, the
    index does not): the rows a model was trained on."""
    import pandas as pd

    digest = hashlib.sha256()
    digest.update(json.dumps([[str(c), str(t)] for c, t in frame.dtypes.items()]).encode())
    digest.update(pd.util.hash_pandas_object(frame, index=False).to_numpy().tobytes())
    return "sha256:" + digest.hexdigest()


def files_digest(paths: Iterable[Path]) -> str:
    """SHA-256 of files, folders taken whole (each file's path relative to the folder, then
    its bytes, in name order)."""
    digest = hashlib.sha256()
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"cannot digest {path}: it does not exist")
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            name = file.relative_to(path) if path.is_dir() else Path(file.name)
            digest.update(str(name).encode() + b"\0")
            with file.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return "sha256:" + digest.hexdigest()


def weights_digest(model: Any) -> str:
    """SHA-256 of a torch module's state (names, dtypes, shapes and values, in order)."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        value = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{value.dtype}:{tuple(value.shape)}".encode())
        digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes())
    return "sha256:" + digest.hexdigest()


# --- repeats ---------------------------------------------------------------------------------


def rotated(items: Sequence[T], round_: int) -> list[T]:
    """``items`` starting at position ``round_`` (mod its length): round 0 runs A, B, C, round
    1 B, C, A, ..., so each variant runs first as often as the others."""
    if not items:
        return []
    start = round_ % len(items)
    return [*items[start:], *items[:start]]


def spread(values: Sequence[float]) -> dict[str, float | int]:
    """``min``, ``median``, ``max`` and ``n`` of timed runs."""
    if not values:
        raise ValueError("no runs to summarize")
    numbers = [float(v) for v in values]
    return {
        "min": min(numbers),
        "median": statistics.median(numbers),
        "max": max(numbers),
        "n": len(numbers),
    }


def _numbers(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    )


def spreads(result: Mapping[str, Any]) -> dict[str, dict[str, float | int]]:
    """Every ``*_runs`` list of numbers in ``result`` (nested dicts included) as
    ``{dotted figure name: spread}``; the figure's name drops the ``_runs`` suffix."""
    found: dict[str, dict[str, float | int]] = {}

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        for key, value in node.items():
            if key == "spread":
                continue
            name = f"{prefix}{key}"
            if isinstance(value, Mapping):
                walk(value, f"{name}.")
            elif str(key).endswith(RUNS_SUFFIX) and _numbers(value):
                found[name[: -len(RUNS_SUFFIX)]] = spread(value)
            elif isinstance(value, list):
                for index, item in enumerate(value):
                    if isinstance(item, Mapping):
                        walk(item, f"{name}.{index}.")

    walk(result, "")
    return found


def non_finite(result: Any, prefix: str = "") -> list[str]:
    """Dotted names of every NaN or infinite number in ``result`` (what a smoke test forbids)."""
    bad: list[str] = []
    if isinstance(result, Mapping):
        for key, value in result.items():
            bad += non_finite(value, f"{prefix}{key}.")
    elif isinstance(result, list | tuple):
        for index, value in enumerate(result):
            bad += non_finite(value, f"{prefix}{index}.")
    elif isinstance(result, float) and not math.isfinite(result):
        bad.append(prefix.rstrip("."))
    return bad


class LoadSampler:
    """The machine's 1-minute load average sampled every ``every_s`` seconds while a benchmark
    runs (a thread; ``with LoadSampler() as load: ...`` then ``load.summary()``): other work on
    a shared machine shows in every timed figure, so each result says how busy it was."""

    def __init__(self, every_s: float = 10.0) -> None:
        self.every_s = every_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict[str, Any]:
        """``load_average_mean``, ``_max``, ``_start`` and ``_end`` over the run, the samples'
        count and the machine's usable cores to read them against."""
        taken = self.samples or [os.getloadavg()[0]]
        return {
            "load_average_mean": round(statistics.fmean(taken), 2),
            "load_average_max": round(max(taken), 2),
            "load_average_start": round(taken[0], 2),
            "load_average_end": round(taken[-1], 2),
            "samples": len(taken),
            "usable_cpus": usable_cpus(),
        }


# --- the stamp -------------------------------------------------------------------------------


def provenance(
    result: Mapping[str, Any],
    *,
    generators: Sequence[str],
    parameters: Mapping[str, Any],
) -> dict[str, Any]:
    """The keys :func:`benchmarks.registry.run_benchmark` adds to ``result`` (see the module
    docstring); ``generators`` are the modules whose code makes the inputs."""
    runs = spreads(result)
    repeats = max((int(s["n"]) for s in runs.values()), default=1)
    input_digest = code_digest(generators, parameters)
    if result.get("input_files_digest"):
        # Inputs the benchmark read rather than generated (a corpus folder): their bytes count.
        input_digest = digest_of([input_digest, str(result["input_files_digest"])])
    return {
        "machine": machine_info(),
        **git_state(),
        "input_digest": input_digest,
        "inputs": {"generators": list(generators), "parameters": dict(parameters)},
        "model_digest": None,
        "model_provenance": None,
        "repeats": repeats,
        "spread": runs,
    }


# --- a private MLflow store ------------------------------------------------------------------


@contextlib.contextmanager
def private_tracking(folder: Path, experiments: Sequence[str] = ()) -> Iterator[str]:
    """Log to a SQLite MLflow store in ``folder`` for the block (training processes started
    inside inherit it through ``CASCADE_MLFLOW_URI``), whatever stack is or is not running.
    ``experiments`` are created there first with their artifacts under ``folder`` too, so
    nothing the benchmark logs lands in the user's state folder. Yields the store's URI."""
    import mlflow

    from cascade.config import scoped_environ

    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    with scoped_environ({"CASCADE_MLFLOW_URI": uri}):
        client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
        for name in experiments:
            if client.get_experiment_by_name(name) is None:
                client.create_experiment(name, artifact_location=(folder / name).as_uri())
        yield uri
