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
from pathlib import Path
from typing import Any

from cascade.allocator import keep_freed_memory
from cascade.config import scoped_environ

BENCHMARKS: dict[str, str] = {
    "events": "benchmarks.event_delivery:bench_events",
    "preranking": "benchmarks.preranking_models:run",
    "compilers": "benchmarks.compiled_inference:run",
    "ctr": "benchmarks.ctr_cross_stats:bench_ctr",
    "serving": "benchmarks.serving_load:run",
    "asr": "benchmarks.asr_path:run",
    "multimodal": "benchmarks.multimodal_moe:run",
    "multimodal-corpus": "benchmarks.multimodal_corpus:bench_multimodal_corpus",
    "security": "benchmarks.security:run",
}
"""Benchmark name -> ``module:function``; imported only when run."""


ALIASES: dict[str, str] = {"ctr-features": "ctr", "compile": "compilers"}
"""Names the issues use for the same benchmarks."""

OPTIONS: dict[str, dict[str, str]] = {
    "ctr": {"impressions": "CASCADE_BENCH_CTR_SIZES", "repeats": "CASCADE_BENCH_CTR_REPEATS"},
    "preranking": {
        "config": "CASCADE_BENCH_PRERANKING_CONFIG",
        "seeds": "CASCADE_BENCH_PRERANKING_SEEDS",
    },
    "compilers": {"model": "CASCADE_BENCH_COMPILE_MODEL"},
    "asr": {"model": "CASCADE_BENCH_ASR_MODEL", "sizes": "CASCADE_BENCH_ASR_SIZES"},
    "events": {"events": "CASCADE_BENCH_EVENTS"},
    "multimodal": {
        "config": "CASCADE_BENCH_MULTIMODAL_CONFIG",
        "corpus": "CASCADE_BENCH_MULTIMODAL_CORPUS",
    },
    "multimodal-corpus": {"pairs": "CASCADE_BENCH_MULTIMODAL_SIZES"},
    "serving": {
        "candidates": "CASCADE_BENCH_SERVING_CANDIDATES",
        "clients": "CASCADE_BENCH_SERVING_CLIENTS",
        "seconds": "CASCADE_BENCH_SERVING_SECONDS",
        "workers": "CASCADE_BENCH_SERVING_WORKERS",
    },
}
"""Per benchmark: command-line option -> the environment variable its function reads."""


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


def run_benchmark(
    name: str, out: Path, *, quick: bool = False, options: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run one benchmark and write its JSON; ``options`` are its command-line options."""
    name = ALIASES.get(name, name)
    if name not in BENCHMARKS:
        known = ", ".join(sorted([*BENCHMARKS, *ALIASES])) or "none yet"
        raise KeyError(f"unknown benchmark {name!r}; known: {known}")
    supported = OPTIONS.get(name, {})
    given = {k: v for k, v in (options or {}).items() if v is not None}
    unknown = sorted(set(given) - set(supported))
    if unknown:
        accepted = ", ".join(f"--{o}" for o in supported) or "none"
        raise ValueError(
            f"benchmark {name!r} takes no --{', --'.join(unknown)}; it takes {accepted}"
        )
    # Every variant a benchmark compares runs under the allocator the model servers use.
    allocator = keep_freed_memory()
    module_name, function_name = BENCHMARKS[name].split(":")
    function = getattr(importlib.import_module(module_name), function_name)
    with scoped_environ({supported[k]: str(v) for k, v in given.items()}):
        result = function(out, quick)
    result.setdefault("benchmark", name)
    result.setdefault("machine", machine_info())
    result.setdefault("allocator", allocator)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    return result
