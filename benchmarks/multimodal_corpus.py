"""Benchmark of the image-text corpus job on generated pairs: throughput and where time goes.

    cascade bench multimodal-corpus --out bench-results/multimodal-corpus.json   # 10k, 100k
    cascade bench multimodal-corpus --out /tmp/mm.json --quick                   # 1k, a smoke run
    CASCADE_BENCH_MULTIMODAL_SIZES=10000 cascade bench multimodal-corpus --out FILE

Per size, in one Spark session (the job's own, ``local[2]`` unless ``CASCADE_SPARK_MASTER``
says otherwise): land that many generated pairs (:mod:`jobs.multimodal_sources`, seed 0,
planted near-duplicates included) under ``<lake>/bench/multimodal/<digest>/n=N_seed=0`` unless
a previous run completed it there (``_LANDED``); the folder is named by the digest of the
generator's code and parameters (:func:`landing_folder`), so changed generator code or
parameters land a new batch. That digest is each size's ``input_digest``; the result's is one
digest over every size's. Then it runs :func:`jobs.multimodal_corpus.build_corpus` ``repeats``
times, interleaved across sizes, and reports the median wall time, ``pairs_per_s`` and the
median share of each stage (``decode`` reads and decodes the files, ``hashing`` computes pHash
and MinHash signatures, ``dedup`` finds and resolves near-duplicates, ``write`` splits,
tokenizes and writes). Because the generator records what it planted, each size also reports
the recall of planted duplicates and how many originals were removed (false positives). The
top-level ``pairs_per_s``, ``quarantined``, ``duplicates_removed`` and ``time_share`` are those
of the first size; every size has its own entry in ``sizes``.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from benchmarks.provenance import digest_of, input_folder
from cascade.config import load_settings
from cascade.progress import track
from jobs.multimodal_corpus import CorpusConfig, build_corpus, spark_session
from jobs.multimodal_sources import GeneratorConfig, land_generated
from jobs.spark_sessions import active_or_new

FULL_SIZES = (10_000, 100_000)
QUICK_SIZES = (1_000,)
GENERATOR_MODULES = ("jobs.multimodal_sources",)
"""The code that makes the landed pairs; its source is part of the landing folder's digest."""
GENERATOR = GeneratorConfig(seed=0)


def landing_folder(root: Path, n: int) -> tuple[Path, str]:
    """``(folder, input digest)`` of a batch of ``n`` generated pairs: under ``root``, in a
    folder named by the digest of :data:`GENERATOR_MODULES`' code and the generator's
    parameters (:func:`benchmarks.provenance.input_folder`)."""
    folder, digest = input_folder(root, GENERATOR_MODULES, {"count": n, **asdict(GENERATOR)})
    return folder / f"n={n}_seed={GENERATOR.seed}", digest


def landed(spark: Any, root: Path, n: int) -> tuple[Path, float | None, str]:
    """``(landing, seconds spent landing or None, input digest)``: a batch of ``n`` generated
    pairs, reused when a previous run of the same generator code and parameters completed it."""
    landing, digest = landing_folder(root, n)
    done = landing / "_LANDED"
    if done.is_file():
        return landing, None, digest
    if landing.exists():
        import shutil

        shutil.rmtree(landing)
    started = time.perf_counter()
    land_generated(spark, landing, count=n, config=GENERATOR)
    done.write_text(str(n))
    return landing, time.perf_counter() - started, digest


def planted_outcome(landing: Path, corpus: Path) -> dict[str, Any]:
    """Recall of the planted duplicates and originals removed, against what was planted."""
    planted = pd.read_json(landing / "captions.jsonl", lines=True)[["pair_id", "planted"]]
    removed = pd.read_parquet(corpus / "duplicates")[["pair_id", "duplicate_kind"]]
    joined = planted.merge(removed, on="pair_id", how="left")
    outcome: dict[str, Any] = {}
    for kind in ("image", "caption"):
        rows = joined[joined["planted"] == kind]
        outcome[f"planted_{kind}"] = len(rows)
        outcome[f"recall_{kind}"] = (
            float(rows["duplicate_kind"].notna().mean()) if len(rows) else None
        )
    outcome["originals_removed"] = int(
        ((joined["planted"] == "original") & joined["duplicate_kind"].notna()).sum()
    )
    return outcome


def bench_multimodal_corpus(out: Path, quick: bool) -> dict[str, Any]:
    """``cascade bench multimodal-corpus``: see the module docstring."""
    settings = load_settings()
    sizes = settings.bench.multimodal_sizes or (QUICK_SIZES if quick else FULL_SIZES)
    # A session that was already running (a caller's, a test's) is reused and left running.
    with active_or_new(spark_session) as spark:
        return measure(spark, sizes, settings.spark_master, settings.lake_root, quick)


def measure(
    spark: Any, sizes: tuple[int, ...], master: str, lake_root: Path, quick: bool
) -> dict[str, Any]:
    config = CorpusConfig()
    root = lake_root / "bench" / "multimodal"
    batches = {n: landed(spark, root, n) for n in sizes}
    repeats = {n: 1 if quick or n > 20_000 else 3 for n in sizes}
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    outcome: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="multimodal-bench-") as scratch:
        rounds = range(max(repeats.values()))
        for round_ in track(rounds, desc="bench multimodal-corpus", unit="rounds"):
            for n in sizes:  # interleaved: round 1 of every size, then round 2...
                if round_ >= repeats[n]:
                    continue
                corpus = Path(scratch) / f"n={n}"
                started = time.perf_counter()
                summary = build_corpus(spark, batches[n][0], corpus, config)
                summary["wall_s"] = time.perf_counter() - started
                runs[n].append(summary)
                if n not in outcome:
                    outcome[n] = planted_outcome(batches[n][0], corpus)
                print(f"[bench multimodal-corpus] n={n} round {round_}: {summary['wall_s']:.1f} s")
    results = []
    for n in sizes:
        wall = statistics.median(r["wall_s"] for r in runs[n])
        last = runs[n][-1]
        results.append(
            {
                "pairs": n,
                "generated_s": batches[n][1],
                "input_digest": batches[n][2],
                "repeats": repeats[n],
                "wall_s": wall,
                "wall_s_runs": [r["wall_s"] for r in runs[n]],
                "pairs_per_s": n / wall,
                "pairs_per_s_runs": [n / r["wall_s"] for r in runs[n]],
                "stage_s": {
                    k: statistics.median(r["seconds"][k] for r in runs[n]) for k in last["seconds"]
                },
                "time_share": {
                    k: statistics.median(r["time_share"][k] for r in runs[n])
                    for k in last["time_share"]
                },
                "kept": last["kept"],
                "quarantined": last["quarantined"],
                "duplicates_removed": last["duplicates_removed"],
                **outcome[n],
            }
        )
    headline = results[0]
    result = {
        "benchmark": "multimodal-corpus",
        "spark_master": master,
        "pairs_per_s": headline["pairs_per_s"],
        "pairs_per_s_runs": headline["pairs_per_s_runs"],
        "repeats": max(repeats.values()),
        "input_digest": digest_of(r["input_digest"] for r in results),
        "pairs": headline["pairs"],
        "quarantined": headline["quarantined"],
        "duplicates_removed": headline["duplicates_removed"],
        "time_share": headline["time_share"],
        "sizes": results,
        "config": asdict(config),
        "quick": quick,
    }
    return result
