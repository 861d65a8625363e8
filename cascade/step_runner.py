"""Runs one step of a registered pipeline: what the Airflow task, the DVC stage and
``cascade step NAME --pipeline P --ds DS`` all call.

    cascade step training_set --pipeline ctr_preranking --ds 2026-11-22

Each step takes its context (:class:`cascade.step_context.StepContext`) and returns a JSON-able
summary, recorded under the lake
(``reports/step_<dvc stage>/dt=DS/summary.json``) where the next DVC stage depends on it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from cascade.config import scoped_environ
from cascade.errors import NothingLanded
from cascade.lake import Lake, check_ds, lake_from_settings
from cascade.pipeline_registry import get_pipeline
from cascade.pipeline_spec import Step
from cascade.results import write_result
from cascade.step_context import RUN_VARIABLES, RunInfo, StepContext, knob_values


def summary_path(name: str, ds: str, pipeline: str, *, lake: Lake | None = None) -> Path:
    """Where a step leaves its summary (a DVC output, and what the next stage depends on)."""
    stage = get_pipeline(pipeline).dvc_prefix + name
    return (lake or lake_from_settings()).step_summary(stage, ds)


RUN_CONTEXT = RUN_VARIABLES
"""Variables a step's process (and the training processes it starts) sees while it runs: the
MLflow runs it opens are named and tagged with them (:mod:`cascade.training.resumable_run`)."""


@contextlib.contextmanager
def step_context(pipeline: str, name: str, ds: str) -> Iterator[None]:
    """Set :data:`RUN_CONTEXT` for the block and restore the previous values after it."""
    values = {"pipeline": pipeline, "step": name, "ds": ds}
    with scoped_environ({RUN_CONTEXT[key]: value for key, value in values.items()}):
        yield


TIMING_FILE = "timing.json"
"""Beside each step's summary: when it started, its wall seconds, ``ok``, ``failed`` or
``skipped`` (nothing landed for the partition) and the error's (or the skip's) first line (read
by ``cascade report``)."""


def _record_timing(
    path: Path, started: dt.datetime, seconds: float, error: str | None, *, skipped: bool = False
) -> None:
    record = {
        "started_at": started.isoformat(timespec="seconds"),
        "seconds": round(seconds, 3),
        "status": "skipped" if skipped else "failed" if error else "ok",
        "error": error,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_result(path, record)


METRICS_FILE = "metrics.json"
"""Beside the summary of a step with ``metrics``: those keys of its summary (a DVC metrics
file)."""


knob_environment = knob_values
"""The ``CASCADE_*`` values ``--param knob=VALUE`` values give a step (:func:`knob_values`)."""


def step_metrics(step: Step, summary: Mapping[str, Any]) -> dict[str, float]:
    """The step's metrics out of its summary: the declared keys that hold numbers."""
    return {
        key: summary[key]
        for key in step.metrics
        if isinstance(summary.get(key), int | float) and not isinstance(summary[key], bool)
    }


def run_step(
    name: str,
    ds: str,
    pipeline: str,
    params: Mapping[str, str] | None = None,
    *,
    run: RunInfo | None = None,
) -> dict[str, Any]:
    """Run step ``name`` of ``pipeline`` for partition ``ds`` on its context
    (:class:`~cascade.step_context.StepContext`: the settings with the knobs ``params``
    applied, ``run`` the Airflow run or none): :func:`execute`."""
    spec = get_pipeline(pipeline)
    return execute(StepContext.build(spec, name, check_ds(ds), params=params, run=run))


def execute(ctx: StepContext) -> dict[str, Any]:
    """Run the context's step and record its JSON summary (what the steps after it read,
    ``ctx.result_of``), its metrics (:data:`METRICS_FILE`, when it declares some) and its
    timing (:data:`TIMING_FILE`, also when it fails)."""
    step, ds = ctx.step, ctx.ds
    path = ctx.lake.step_summary(ctx.pipeline.dvc_prefix + step.name, ds)
    started, clock = dt.datetime.now(dt.UTC), time.monotonic()
    try:
        # The processes a step starts (trainings) learn which step they serve from these
        # variables; the knobs reach the step as settings values, not as variables.
        with step_context(ctx.pipeline.name, step.name, ds):
            result = dict(step.run(ctx))
    except BaseException as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        skipped = isinstance(exc, NothingLanded)  # the run ends as skipped, saying why
        _record_timing(
            path.with_name(TIMING_FILE), started, time.monotonic() - clock,
            first if skipped else f"{type(exc).__name__}: {first}", skipped=skipped,
        )  # fmt: skip
        raise
    path.parent.mkdir(parents=True, exist_ok=True)
    write_result(path, result)
    if step.metrics:
        write_result(path.with_name(METRICS_FILE), step_metrics(step, result))
    _record_timing(path.with_name(TIMING_FILE), started, time.monotonic() - clock, None)
    return result
