"""Airflow pieces the DAG files share: the Kafka-watched asset that starts a pipeline, the task
that claims the run's events and resolves its partition, and one task per entry of
:data:`cascade.steps.PIPELINES`, chained in order, each calling :func:`cascade.steps.run_step`
(what DVC's stages run too).

Imported by DAG files at parse time, so nothing heavy here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cascade.steps import PIPELINES


def watched_asset(
    uri: str, *, watcher: str, selectors: tuple[str, ...], dead_letter: bool = False
) -> Any:
    """An asset fed by the shared Kafka watcher stream: events matching ``selectors`` become
    its asset events. Only one watcher (``ctr_preranking``'s) sets ``dead_letter``, so a bad
    message is dead-lettered once."""
    from airflow.sdk import Asset, AssetWatcher

    from cascade.assets import KAFKA_CONN_ID, WATCHED_TOPICS
    from cascade.events import CascadeEventTrigger

    trigger = CascadeEventTrigger(
        topics=WATCHED_TOPICS,
        kafka_config_id=KAFKA_CONN_ID,
        poll_timeout=1,
        selectors=selectors,
        dead_letter=dead_letter,
        name=watcher,
    )
    return Asset(uri, watchers=[AssetWatcher(name=watcher, trigger=trigger)])


def resolve_partition(asset: Any) -> Any:
    """The ``resolve_partition`` task (inside a DAG): claims the run's event ids, so a
    redelivered or coalesced event skips the run's work, and returns the partition to work on."""
    from airflow.sdk import task

    @task(inlets=[asset])
    def resolve_partition(**context: Any) -> str:
        from cascade.events import claim_and_resolve

        return claim_and_resolve(context, asset)

    return resolve_partition()


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
