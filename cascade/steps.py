"""The pipeline steps of ``ctr_preranking``, ``asr``, ``multimodal`` and ``ctr_cross``: one table
per pipeline, used by the Airflow DAG, DVC and the CLI.

    cascade step features --ds 2026-11-22
    cascade step train --pipeline asr --ds 2026-11-22
    cascade step corpus --pipeline multimodal --ds 2026-11-22
    cascade step stats --pipeline ctr_cross --ds 2026-11-22

Each step takes the partition date and returns a JSON-able summary. Imports are lazy so that
the DAG file stays cheap to parse.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from cascade.lake import check_ds, lake_from_settings


def write_step_result(lake: Any, kind: str, ds: str, result: dict[str, Any]) -> dict[str, Any]:
    """Write ``result`` atomically as ``Lake.reports(kind, ds) / "result.json"``; returns it."""
    from models.preranking.train import write_result

    out = lake.reports(kind, ds)
    out.mkdir(parents=True, exist_ok=True)
    write_result(out / "result.json", json.loads(json.dumps(result, default=str)))
    return result


def read_step_result(lake: Any, kind: str, ds: str, *, produced_by: str) -> dict[str, Any]:
    """The ``result.json`` a step wrote for ``ds``; FileNotFoundError names the step to run."""
    path = lake.reports(kind, ds) / "result.json"
    if not path.is_file():
        raise FileNotFoundError(f"no {kind} result {path}; run step {produced_by!r} for ds={ds}")
    return json.loads(path.read_text())


def partition_seed(ds: str) -> int:
    """A stable per-partition seed: every day's generated batch differs from the others."""
    import hashlib

    return int.from_bytes(hashlib.sha256(check_ds(ds).encode()).digest()[:4], "little")


def features(ds: str) -> dict[str, Any]:
    from jobs.ctr_cross_features import run

    return run(ds)


def validate(ds: str) -> dict[str, Any]:
    from jobs.ctr_cross_features_gate import validate as run_gate

    return run_gate(ds)


def feast_materialize(ds: str) -> dict[str, Any]:
    from cascade.feature_store import apply_and_materialize

    return apply_and_materialize(ds)


def training_set(ds: str) -> dict[str, Any]:
    from cascade.feature_store import build_training_set

    return {"ds": ds, "path": str(build_training_set(ds))}


def train(ds: str) -> dict[str, Any]:
    from cascade.config import load_settings

    settings = load_settings()
    if settings.preranking_model == "fscd":
        from models.preranking.cascade_train import launch_pipeline

        return launch_pipeline(ds, settings=settings)
    from models.preranking.train import launch

    return launch(ds, settings=settings)


def compile_gate(ds: str) -> dict[str, Any]:
    from compilers.deploy_gate import compile_and_gate

    return compile_and_gate(ds)


def register(ds: str) -> dict[str, Any]:
    from cascade.registry import register_and_promote

    return register_and_promote(ds)


def deploy(ds: str) -> dict[str, Any]:
    from serving.deploy import roll_out

    return roll_out(ds)


STEPS: dict[str, Callable[[str], dict[str, Any]]] = {
    "features": features,
    "validate": validate,
    "feast_materialize": feast_materialize,
    "training_set": training_set,
    "train": train,
    "compile": compile_gate,
    "register": register,
    "deploy": deploy,
}
"""Step name -> function, in pipeline order. DAG task ids and DVC stage names are these names."""


def _lazy_steps(module: str, names: tuple[str, ...]) -> dict[str, Callable[[str], dict[str, Any]]]:
    """Step name -> a function calling ``module.<name>(ds)``, imported only when it runs."""

    def step(name: str) -> Callable[[str], dict[str, Any]]:
        def run(ds: str) -> dict[str, Any]:
            import importlib

            return getattr(importlib.import_module(module), name)(ds)

        run.__name__ = name
        return run

    return {name: step(name) for name in names}


ASR_STEPS = _lazy_steps(
    "models.asr.pipeline", ("corpus", "validate", "train", "compile", "register", "deploy")
)
"""The ``asr`` DAG's steps (:mod:`models.asr.pipeline`); DVC stages are ``asr_`` + the name."""

MULTIMODAL_STEPS = _lazy_steps(
    "models.multimodal.pipeline", ("corpus", "validate", "train", "evaluate", "register")
)
"""The ``multimodal`` DAG's steps (:mod:`models.multimodal.pipeline`); DVC stages are ``mm_`` +
the name. No deploy step: the model ends in the registry."""

CROSS_STEPS = _lazy_steps("jobs.ctr_cross_pipeline", ("log", "stats", "validate", "feast"))
"""The ``ctr_cross`` DAG's steps (:mod:`jobs.ctr_cross_pipeline`): impression log -> cross
statistics -> GX gate -> Feast. DVC stages are ``cross_`` + the name."""

PIPELINES: dict[str, dict[str, Callable[[str], dict[str, Any]]]] = {
    "ctr_preranking": STEPS,
    "asr": ASR_STEPS,
    "multimodal": MULTIMODAL_STEPS,
    "ctr_cross": CROSS_STEPS,
}
DVC_PREFIX = {"ctr_preranking": "", "asr": "asr_", "multimodal": "mm_", "ctr_cross": "cross_"}
"""DVC stage name = prefix + step name (stage names share one ``dvc.yaml``)."""


def summary_path(name: str, ds: str, pipeline: str = "ctr_preranking") -> Path:
    """Where a step leaves its summary (a DVC output, and what the next stage depends on)."""
    return lake_from_settings().reports(f"step_{DVC_PREFIX[pipeline]}{name}", ds) / "summary.json"


def run_step(name: str, ds: str, pipeline: str = "ctr_preranking") -> dict[str, Any]:
    """Run one step of ``pipeline`` for partition ``ds`` and record its JSON summary."""
    if pipeline not in PIPELINES:
        raise KeyError(f"unknown pipeline {pipeline!r}; one of {', '.join(PIPELINES)}")
    steps = PIPELINES[pipeline]
    if name not in steps:
        raise KeyError(f"unknown {pipeline} step {name!r}; one of {', '.join(steps)}")
    result = steps[name](check_ds(ds))
    path = summary_path(name, ds, pipeline)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str))
    return result


def resolve_partition(
    event_extras: Iterable[Mapping[str, Any]],
    logical_date: dt.datetime | None,
    run_after: dt.datetime | None,
) -> str:
    """The partition a run works on.

    An asset-triggered run takes the newest partition named by its events; a scheduled run
    takes its logical date; a manual run without either takes the day it ran after.
    """
    partitions = sorted(
        str(extra["payload"]["partition"])
        for extra in event_extras
        if isinstance(extra, Mapping)
        and isinstance(extra.get("payload"), Mapping)
        and extra["payload"].get("partition")
    )
    if partitions:
        return check_ds(partitions[-1][:10])
    for moment in (logical_date, run_after):
        if moment is not None:
            return moment.date().isoformat()
    raise ValueError("cannot resolve a partition: no event partition, logical date or run_after")
