"""Airflow tasks for a pipeline's steps: one task per entry of :data:`cascade.steps.PIPELINES`,
chained in order, each calling :func:`cascade.steps.run_step` (what DVC's stages run too).

Imported by DAG files at parse time, so nothing heavy here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cascade.steps import PIPELINES


def _runner(pipeline: str, name: str) -> Callable[[str], dict[str, Any]]:
    def run(ds: str) -> dict[str, Any]:
        from cascade.steps import run_step

        return run_step(name, ds, pipeline)

    run.__name__ = name
    run.__doc__ = f"Step {name!r} of {pipeline} (cascade step {name} --ds DS)."
    return run


def chain_steps(
    pipeline: str, ds: Any, options: Mapping[str, Mapping[str, Any]] | None = None
) -> list[Any]:
    """Add the pipeline's step tasks (task id = step name) on partition ``ds`` (the output of the
    partition task), each downstream of the previous; ``options[name]`` are ``@task`` keyword
    arguments (outlets, execution_timeout, doc_md, ...). Returns the tasks' outputs in order."""
    from airflow.sdk import task

    options = options or {}
    unknown = set(options) - set(PIPELINES[pipeline])
    if unknown:
        raise KeyError(f"options for steps {sorted(unknown)} that {pipeline} does not have")
    outputs = [
        task(task_id=name, **dict(options.get(name, {})))(_runner(pipeline, name))(ds)
        for name in PIPELINES[pipeline]
    ]
    for upstream, downstream in zip(outputs, outputs[1:], strict=False):
        upstream >> downstream
    return outputs
