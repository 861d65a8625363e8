"""Benchmarks: each writes one JSON result file.

    cascade bench NAME --out FILE [--quick]
    make bench                       # every benchmark into bench-results/

A benchmark is a function ``(out: Path, quick: bool) -> dict`` named in :data:`BENCHMARKS`;
it measures side by side in one run, reports medians and their spread, and every result
carries its provenance (:mod:`benchmarks.provenance`: machine, git commit, input and model
digests, repeats). ``--quick`` shrinks sizes so a smoke test finishes in seconds.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any

from benchmarks.provenance import LoadSampler, provenance
from cascade.config import scoped_environ
from serving.allocator import keep_freed_memory

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
    "cluster": "benchmarks.cluster:run",
}
"""Benchmark name -> ``module:function``; imported only when run."""


ALIASES: dict[str, str] = {"ctr-features": "ctr", "compile": "compilers"}
"""Names the issues use for the same benchmarks."""

OPTIONS: dict[str, dict[str, str]] = {
    "ctr": {"impressions": "CASCADE_BENCH_CTR_SIZES", "repeats": "CASCADE_BENCH_CTR_REPEATS"},
    "preranking": {
        "config": "CASCADE_BENCH_PRERANKING_CONFIG",
        "seeds": "CASCADE_BENCH_PRERANKING_SEEDS",
        "keep": "CASCADE_BENCH_KEEP",
    },
    "compilers": {
        "model": "CASCADE_BENCH_COMPILE_MODEL",
        "model-dir": "CASCADE_BENCH_ASR_MODEL",
    },
    "asr": {"model": "CASCADE_BENCH_ASR_MODEL", "sizes": "CASCADE_BENCH_ASR_SIZES"},
    "events": {"events": "CASCADE_BENCH_EVENTS", "partitions": "CASCADE_BENCH_EVENT_PARTITIONS"},
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
        "config": "CASCADE_BENCH_SERVING_CONFIG",
        "rate": "CASCADE_BENCH_SERVING_RATE",
        "cross-features": "CASCADE_BENCH_SERVING_CROSS_FEATURES",
    },
}
"""Per benchmark: command-line option -> the environment variable its function reads."""

COMMON_OPTIONS: dict[str, str] = {"repeats": "CASCADE_BENCH_REPEATS"}
"""Options every benchmark takes (read with :func:`benchmarks.provenance.bench_repeats`); a
benchmark's own entry in :data:`OPTIONS` wins."""


def benchmark_options(name: str) -> dict[str, str]:
    """Command-line option -> environment variable, for benchmark ``name``."""
    return COMMON_OPTIONS | OPTIONS.get(name, {})


BENCH_ENV_PREFIX = "CASCADE_BENCH_"

GENERATORS: dict[str, tuple[str, ...]] = {
    "events": ("benchmarks.event_delivery",),
    "preranking": ("benchmarks.preranking_models", "models.preranking.synthetic_data"),
    "compilers": (
        "benchmarks.compiled_inference",
        "benchmarks.compiled_fscd",
        "models.preranking.synthetic_data",
        "benchmarks.asr_path",
        "benchmarks.asr_model",
        "jobs.audio_corpus",
        "jobs.speech_synth",
    ),
    "ctr": ("benchmarks.ctr_cross_stats", "jobs.impression_log"),
    "serving": (
        "benchmarks.serving_load",
        "benchmarks.serving_cross_features",
        "benchmarks.ctr_cross_duckdb",
        "benchmarks.load_generator",
        "models.preranking.synthetic_data",
    ),
    "asr": (
        "benchmarks.asr_path",
        "benchmarks.asr_model",
        "benchmarks.asr_people",
        "jobs.audio_corpus",
        "jobs.speech_synth",
        "jobs.speech_packages",
        "domains.speech.speaker_splits",
    ),
    "multimodal": (
        "benchmarks.multimodal_moe",
        "models.multimodal.pairs",
        "benchmarks.multimodal_corpus",
        "jobs.multimodal_sources",
    ),
    "multimodal-corpus": ("benchmarks.multimodal_corpus", "jobs.multimodal_sources"),
    "security": (
        "benchmarks.security",
        "benchmarks.security_events",
        "benchmarks.security_releases",
    ),
    "cluster": ("benchmarks.cluster", "jobs.movielens"),
}
"""Per benchmark: the modules whose code makes its inputs; their sources and the run's
parameters make its ``input_digest``."""


def run_benchmark(
    name: str, out: Path, *, quick: bool = False, options: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run one benchmark and write its JSON; ``options`` are its command-line options."""
    name = ALIASES.get(name, name)
    if name not in BENCHMARKS:
        known = ", ".join(sorted([*BENCHMARKS, *ALIASES])) or "none yet"
        raise KeyError(f"unknown benchmark {name!r}; known: {known}")
    supported = benchmark_options(name)
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
        # The parameters: --quick and every benchmark setting in force (options included).
        parameters = {"quick": quick} | {
            k: v for k, v in sorted(os.environ.items()) if k.startswith(BENCH_ENV_PREFIX)
        }
        with LoadSampler() as load:
            result = function(out, quick)
    result.setdefault("benchmark", name)
    result.setdefault("machine_load", load.summary())
    generators = GENERATORS.get(name, (module_name,))
    stamp = provenance(result, generators=generators, parameters=parameters)
    for key, value in stamp.items():
        result.setdefault(key, value)
    result.setdefault("allocator", allocator)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    return result
