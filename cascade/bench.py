"""Benchmarks: each writes one JSON result file.

    cascade bench NAME --out FILE [--quick]
    make bench                       # every benchmark into bench-results/

A benchmark is a function ``(out: Path, quick: bool) -> dict`` named in :data:`BENCHMARKS`;
it measures side by side in one run, reports medians and names the machine
(:func:`machine_info`). ``--quick`` shrinks sizes so a smoke test finishes in seconds.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCHMARKS: dict[str, str] = {
    "events": "cascade.event_bench:bench_events",
    "preranking": "models.preranking.bench:run",
    "compilers": "compilers.bench:run",
    "ctr": "jobs.ctr_cross_stats_bench:bench_ctr",
}
"""Benchmark name -> ``module:function``; imported only when run."""


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    import torch

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    try:
        with open("/proc/meminfo") as meminfo:
            info["memory_kib"] = int(meminfo.readline().split()[1])
    except OSError:
        pass
    return info


def median_seconds(fn: Callable[[], object], *, repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``fn`` over ``repeats`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def run_benchmark(name: str, out: Path, *, quick: bool = False) -> dict[str, Any]:
    if name not in BENCHMARKS:
        known = ", ".join(sorted(BENCHMARKS)) or "none yet"
        raise KeyError(f"unknown benchmark {name!r}; known: {known}")
    module_name, function_name = BENCHMARKS[name].split(":")
    function = getattr(importlib.import_module(module_name), function_name)
    result = function(out, quick)
    result.setdefault("benchmark", name)
    result.setdefault("machine", machine_info())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    return result
