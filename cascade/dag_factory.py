"""Airflow DAGs made from pipeline specs: one DAG per registered pipeline, no DAG file per pipeline.

``dags/pipeline_dags.py`` calls :func:`build_dags`. Each DAG is ``resolve_partition`` (claims the
events of the run's one partition, so a redelivered or coalesced event never does the work twice,
and returns the partition) followed by one task per step, chained in order, each calling
:func:`cascade.step_runner.run_step` (what the DVC stage and ``cascade step`` call too). A
pipeline with a trigger runs on its cron or its Kafka-watched asset, whichever comes first; one
chained by data (``after``) on the other pipelines' assets too. Both have ``next_partitions``
beside the steps: each partition their events or upstream assets name gets its own run.

Imported by the DAG processor at parse time, so nothing heavy here.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from cascade.assets import TOPIC_RUN_FAILED
from cascade.pipeline_registry import registered_pipelines
from cascade.pipeline_spec import HEAVY_POOL, MAX_RETRY_DELAY_S, Pipeline, Step


def watched_asset(
    uri: str, *, watcher: str, selectors: tuple[str, ...], dead_letter: bool = False
) -> Any:
    """An asset fed by the shared Kafka watcher stream: events matching ``selectors`` become
    its asset events. Only one watcher sets ``dead_letter``, so a bad message is dead-lettered
    once."""
    from airflow.sdk import Asset, AssetWatcher

    from cascade.assets import KAFKA_CONN_ID, WATCHED_TOPICS
    from cascade.event_trigger import CascadeEventTrigger

    trigger = CascadeEventTrigger(
        topics=WATCHED_TOPICS,
        kafka_config_id=KAFKA_CONN_ID,
        poll_timeout=1,
        selectors=selectors,
        dead_letter=dead_letter,
        name=watcher,
    )
    return Asset(uri, watchers=[AssetWatcher(name=watcher, trigger=trigger)])


PARTITION_PARAM = "ds"
"""The DAG parameter a manual run names its partition by (empty: the run's own date)."""


PARTITION_PATTERN = r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$"
"""What the trigger form accepts for ``ds``: a ``YYYY-MM-DD`` date with a real month and day
(Airflow answers 400 otherwise, before any run exists); ``resolve_partition`` still checks the
calendar (``2026-02-30``)."""


def partition_param() -> Any:
    """The ``ds`` Param of every pipeline DAG: validated by the trigger form."""
    from airflow.sdk import Param

    return Param(
        None,
        type=["null", "string"],
        pattern=PARTITION_PATTERN,
        title="Partition (YYYY-MM-DD)",
        description="The partition this run works on, e.g. a backfill of 2026-11-22. Leave "
        "empty for the run's own date (scheduled runs) or the events' partition.",
    )


def knob_params(spec: Pipeline) -> dict[str, Any]:
    """A Param per knob of the pipeline's steps: the trigger form sets them for one run, as
    ``--param`` does for ``cascade step`` and ``dvc exp run -S`` for a DVC stage."""
    from airflow.sdk import Param

    return {
        knob: Param(
            None,
            type=["null", "string", "number", "integer", "boolean"],
            title=f"Knob {knob}",
            description=f"{variable} for this run only; empty: the setting's value.",
        )
        for knob, variable in spec.knobs.items()
    }


def airflow_knobs(step: Step) -> dict[str, str]:
    """The running task's knob values set in its DAG run's params (none outside a task)."""
    from airflow.sdk import get_current_context

    try:
        params = get_current_context().get("params") or {}
    except Exception:  # called outside a running task (a test calling the task's function)
        return {}
    return {
        knob: str(value).lower() if isinstance(value, bool) else str(value)
        for knob in step.params
        if (value := params.get(knob)) not in (None, "")
    }


RUN_QUEUE_URI = "cascade://pipelines/{pipeline}/next-run"
"""The asset of a pipeline chained only by data (``after``, no Kafka trigger) that its
``next_partitions`` task updates to queue its next run (a triggered pipeline updates its
watched asset instead)."""


def run_queue_asset(spec: Pipeline) -> Any | None:
    """The asset whose update queues ``spec``'s next run (:func:`next_partitions_task`), the
    claim step's inlet: the Kafka-watched asset of a triggered pipeline, a plain asset of its
    own for one chained only by data, None for a cron-only pipeline (its runs claim nothing)."""
    from airflow.sdk import Asset

    if spec.trigger is not None:
        return watched_asset(
            spec.trigger.asset,
            watcher=spec.trigger.watcher,
            selectors=spec.trigger.selectors,
            dead_letter=spec.trigger.dead_letter,
        )
    if spec.after:
        return Asset(RUN_QUEUE_URI.format(pipeline=spec.name))
    return None


SCHEDULED_RUN_TYPES = ("scheduled", "DagRunType.SCHEDULED")
"""``DagRun.run_type`` of a cron run (as text): it works on its own date, never an event's."""


def _resolve_task(spec: Pipeline, asset: Any | None) -> Any:
    """The ``resolve_partition`` task: with a watched asset it claims the run's events first."""
    from airflow.sdk import task

    lag = spec.partition_lag_days
    after = tuple(spec.after)
    watched = spec.trigger is not None
    unbuildable = spec.trigger.unbuildable if spec.trigger is not None else None

    @task(
        task_id="resolve_partition",
        inlets=[asset] if asset is not None else [],
        doc_md="Claims the events of one partition, Kafka's and the partitions upstream "
        "pipelines published (a redelivered or coalesced event, or an upstream partition this "
        "DAG built already, skips the run; an event whose partition cannot be built is "
        "dead-lettered) and returns the partition date the steps work on: the form's `ds`, a "
        "scheduled run's own date, or else the oldest partition waiting.",
    )
    def resolve_partition(**context: Any) -> str:
        from cascade.event_claims import claim_for_run, run_partition
        from cascade.lake import check_ds

        dag_run = context["dag_run"]
        requested = (context.get("params") or {}).get(PARTITION_PARAM)
        # A run triggered from the form (or `airflow dags trigger -c '{"ds": ...}'`) is a
        # backfill of that partition; a cron run works on its own date. Each claims only that
        # partition's events; any other run, the oldest partition waiting.
        fixed = check_ds(str(requested)) if requested else None
        if fixed is None and str(getattr(dag_run, "run_type", "")) in SCHEDULED_RUN_TYPES:
            fixed = run_partition(dag_run, lag_days=lag)
        if asset is not None:
            claim = claim_for_run(
                context,
                asset,
                partition=fixed,
                lag_days=lag,
                unbuildable=unbuildable,
                after=after,
                coalesce=watched,
            )
            # The claimed events' one partition (the run's own date when they name none).
            fixed = fixed or claim.partition
        return check_ds(fixed) if fixed else run_partition(dag_run, lag_days=lag)

    return resolve_partition()


NEXT_PARTITIONS_TASK = "next_partitions"
"""The task that queues the run of the next partition waiting (:func:`next_partitions_task`)."""


def next_partitions_task(asset: Any, *, claim_task: str = "resolve_partition") -> Any:
    """The task that starts the next partition's run: each partition is built by its own run.

    Why a run per partition, queued from here: the Kafka watcher makes one asset event per
    message and Airflow folds every event queued while a run is active into the next run, so
    neither the watcher nor the scheduler can split a burst by partition (Airflow's partitioned
    assets need a partition key on the asset event, which a watcher's events never carry). The
    claim step therefore claims one partition's events, and when others are still waiting this
    task updates the DAG's own watched asset: Airflow queues one more asset-triggered run,
    which starts after this one (``max_active_runs=1``) and claims the next partition. A
    partition's run keeps every downstream key as it was (one ``ds`` per run: links, reports,
    the run-failed event, the data assets it publishes), which mapping the steps over the
    partitions in one run would not; and a failure fails only its own partition's run. The
    partitions that upstream pipelines publish (``after``) arrive the same way, folded into one
    run, and are dealt out the same way: the ledger keeps those a run does not take, and a
    pipeline with no watched asset updates its own queue asset (:func:`run_queue_asset`).
    Skipped when nothing else is waiting, so the asset is updated only then."""
    from airflow.sdk import task
    from airflow.sdk.exceptions import AirflowSkipException

    @task(
        task_id=NEXT_PARTITIONS_TASK,
        outlets=[asset],
        doc_md="Queues the next run when the events name more partitions than this run's one "
        "(skipped otherwise): every partition is built by its own run.",
    )
    def next_partitions(**context: Any) -> list[str]:
        from cascade.event_claims import PENDING_XCOM_KEY

        pending = context["ti"].xcom_pull(task_ids=claim_task, key=PENDING_XCOM_KEY) or []
        if not pending:
            raise AirflowSkipException("no other partition is waiting for a run")
        context["outlet_events"][asset].extra = {"pending_partitions": list(pending)}
        print(f"[events] partitions waiting for their own runs: {pending}", flush=True)
        return list(pending)

    return next_partitions()


def notify_failure(context: Mapping[str, Any]) -> None:
    """Task ``on_failure_callback`` (a task failed for good, its retries spent): an error line
    in the task log and a ``cascade.run.failed`` event on the broker, for whoever watches
    (alerting, a chat bridge). Best effort: a broker that is down costs a warning, never the
    callback."""
    import logging

    ti, dag_run = context.get("ti"), context.get("dag_run")
    error = context.get("exception")
    detail = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    fields = {
        "pipeline": str(getattr(ti, "dag_id", "?")),
        "run_id": str(getattr(dag_run, "run_id", "?"))[:2000],
        "task": str(getattr(ti, "task_id", "?")),
        "try_number": int(getattr(ti, "try_number", 1) or 1),
        "error": detail[:2000],
    }
    log = logging.getLogger(__name__)
    where = f"{fields['pipeline']}.{fields['task']} run {fields['run_id']}"
    log.error("FAILED %s (try %s): %s", where, fields["try_number"], detail)
    try:
        import socket

        from cascade.broker import publish
        from cascade.config import load_settings
        from cascade.events import make_event

        settings = load_settings()
        # A broker that is down would hold the callback for the producer's timeouts (~30 s).
        socket.create_connection((settings.host, settings.ports.broker), timeout=1.0).close()

        partition = (context.get("params") or {}).get(PARTITION_PARAM)
        payload = {**fields, **({"partition": partition} if partition else {})}
        publish(make_event(TOPIC_RUN_FAILED, payload, source="airflow"), timeout_s=5.0)
    except Exception as exc:  # the notice must not fail the callback
        log.warning("could not publish %s: %s", TOPIC_RUN_FAILED, exc)


def run_report_links(pipeline: str, ds: str) -> dict[str, str]:
    """Log the run's report to MLflow (:func:`cascade.run_report.log_run_report`) and return
    its link. Best effort: the pipeline's work is done, a report that cannot be written or
    logged costs a warning in the task log, never the task."""
    import logging

    from cascade.config import load_settings
    from cascade.run_report import log_run_report
    from cascade.step_links import RUN_REPORT

    try:
        logged = log_run_report(load_settings(), pipeline, ds)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        logging.getLogger(__name__).warning(
            "no run report for %s ds=%s: %s: %s", pipeline, ds, type(exc).__name__, exc
        )
        return {}
    print(f"[report] {pipeline} ds={ds}: {logged['url']}", flush=True)
    return {RUN_REPORT: logged["url"]}


def outlet_events() -> Any:
    """The running task's outlet events (Airflow's context), read without a ``**context``
    parameter: Airflow passes the whole context to such a task, ``ds`` included, which clashes
    with the partition argument of a run that has a logical date."""
    from airflow.sdk import get_current_context

    return get_current_context()["outlet_events"]


def airflow_run_info() -> Any:
    """The running task's DAG run, try and UI link, for its step's context."""
    from airflow.sdk import get_current_context

    from cascade.step_context import RunInfo

    try:
        context = get_current_context()
    except Exception:  # called outside a running task (a test calling the task's function)
        return RunInfo()
    ti, dag_run = context.get("ti"), context.get("dag_run")
    url = str(getattr(ti, "log_url", "") or "")
    return RunInfo(
        dag_run_id=str(getattr(dag_run, "run_id", "") or "") or None,
        try_number=int(getattr(ti, "try_number", 1) or 1),
        links={"airflow": url} if url else {},
    )


def claimed_events() -> list[dict[str, Any]]:
    """The events the running task's DAG run claimed (the ledger keeps their bodies): a run
    queued for a waiting partition was started by its own DAG's asset, not by those events."""
    from airflow.sdk import get_current_context

    from cascade.event_ledger import ClaimLedger

    dag_run = get_current_context()["dag_run"]
    return ClaimLedger.for_settings().run_events(dag_run.dag_id, dag_run.run_id)


def _step_task(spec: Pipeline, step: Step) -> Any:
    from airflow.sdk import Asset, task

    pipeline, name = spec.name, step.name
    last, data_docs = step.name == spec.steps[-1].name, step.data_docs
    first, datasets = step.name == spec.steps[0].name, tuple(d.name for d in spec.datasets)

    registered = spec.model.name if spec.model is not None else None
    outlets = spec.step_outlets(step)

    def run(partition: str) -> dict[str, Any]:
        from cascade.config import load_settings
        from cascade.errors import NothingLanded
        from cascade.lake import Lake
        from cascade.step_links import DATA_DOCS, file_link, step_links
        from cascade.step_runner import run_step

        # Not "ds" as the argument: Airflow refuses a task argument named like a context key,
        # and every run with a logical date (cron ticks, the form's runs) has "ds" in its context.
        ds = partition

        if first and datasets:
            # A data-landed event may name a batch elsewhere (its ``path``): land it through
            # the dataset's importer before the step reads the landing folder.
            from cascade.landing import land_event_paths

            land_event_paths(Lake(load_settings().lake_root), claimed_events(), ds, datasets)
        try:
            result = run_step(name, ds, pipeline, airflow_knobs(step), run=airflow_run_info())
        except NothingLanded as exc:
            # Nothing to build: the run ends as skipped (so do the steps after this one) and
            # trains, registers and promotes nothing; the reason shows in the task's log.
            from airflow.sdk.exceptions import AirflowSkipException

            raise AirflowSkipException(str(exc)) from None
        # The data this step published carries its partition: a pipeline started by it
        # (``Pipeline.after``) works on the same one.
        if outlets:
            events = outlet_events()
            for uri in outlets:
                events[Asset(uri)].extra = {"ds": ds, "pipeline": pipeline, "step": name}
        settings = load_settings()
        links = step_links(result, settings.tracking_uri, registered)
        if data_docs:
            docs = file_link(Lake(settings.lake_root).data_docs(pipeline, name, ds) / "index.html")
            if docs:
                links[DATA_DOCS] = docs
        if last:
            links.update(run_report_links(pipeline, ds))
        # The task's result carries the links its extra-link buttons show.
        return {**result, "links": links} if links else result

    run.__name__ = name
    options: dict[str, Any] = {
        "task_id": name,
        "doc_md": f"{step.doc}\n\nSame as `cascade step {name} --pipeline {pipeline} --ds DS` "
        f"and DVC stage `{spec.dvc_prefix}{name}`.",
    }
    if spec.step_outlets(step):
        options["outlets"] = [Asset(uri) for uri in spec.step_outlets(step)]
    if step.in_heavy_pool:
        # At most the pool's slots of these run at once, across all pipelines.
        options["pool"] = HEAVY_POOL
    # The Celery queue decides which worker runs it, and so which credentials it has: the
    # promotion steps' queue is consumed only by the worker that holds the promoter's.
    options["queue"] = step.queue
    if step.timeout_minutes is not None:
        options["execution_timeout"] = dt.timedelta(minutes=step.timeout_minutes)
    return task(**options)(run)


def _schedule(spec: Pipeline, asset: Any | None, *, cron_on: bool = True) -> Any:
    """Cron or any of the watched assets: the run queue's (:func:`run_queue_asset`) and the
    upstream ``after`` ones (cron off in test stacks: ``CASCADE_AIRFLOW_SCHEDULES=0``)."""
    from airflow.sdk import Asset, AssetAny, AssetOrTimeSchedule, CronTriggerTimetable

    watched = [*([asset] if asset is not None else []), *(Asset(uri) for uri in spec.after)]
    assets = None if not watched else watched[0] if len(watched) == 1 else AssetAny(*watched)
    if spec.cron is None or not cron_on:
        # One asset as the list Airflow takes; several already make one condition.
        return None if assets is None else assets if len(watched) > 1 else [assets]
    cron = CronTriggerTimetable(spec.cron, timezone="UTC")
    if assets is None:
        return cron
    return AssetOrTimeSchedule(timetable=cron, assets=assets)


def _stack_overrides(spec: Pipeline) -> tuple[Pipeline, bool]:
    """``spec`` with the stack's ``CASCADE_RETRY_DELAY_S`` as its first retry delay, if set,
    and whether cron schedules are on (``CASCADE_AIRFLOW_SCHEDULES``)."""
    from cascade.config import load_settings

    settings = load_settings()
    delay = settings.runtime.retry_delay_s
    if delay is not None:
        spec = dataclasses.replace(spec, retry_delay_s=delay)
    return spec, settings.airflow_schedules


def build_dag(spec: Pipeline) -> Any:
    """The Airflow DAG of one pipeline spec."""
    from airflow.sdk import dag

    from cascade.airflow_links import step_links_of
    from cascade.event_claims import release_failed_run

    spec, cron_on = _stack_overrides(spec)
    asset = run_queue_asset(spec)

    @dag(
        dag_id=spec.name,
        schedule=_schedule(spec, asset, cron_on=cron_on),
        # No start_date: the first scheduled run waits for the next cron tick instead of
        # running the latest past interval the moment the DAG appears.
        catchup=False,
        max_active_runs=1,
        on_failure_callback=release_failed_run if asset is not None else None,
        tags=["cascade", *spec.tags],
        default_args={
            "owner": spec.owner,
            "retries": spec.retries,
            "retry_delay": dt.timedelta(seconds=spec.retry_delay_s),
            "retry_exponential_backoff": 2.0,
            "max_retry_delay": dt.timedelta(seconds=MAX_RETRY_DELAY_S),
            # A task failed for good: its run's events go back before the run queued after
            # it claims (the DAG's own callback comes later, and covers a timed-out run).
            "on_failure_callback": [notify_failure, release_failed_run]
            if asset is not None
            else notify_failure,
        },
        dagrun_timeout=dt.timedelta(minutes=spec.run_timeout_minutes),
        params={PARTITION_PARAM: partition_param(), **knob_params(spec)},
        doc_md=spec.description,
    )
    def pipeline_dag() -> None:
        ds = _resolve_task(spec, asset)
        if asset is not None:
            ds >> next_partitions_task(asset)
        upstream = ds
        for step in spec.steps:
            output = _step_task(spec, step)(ds)
            output.operator.operator_extra_links = step_links_of(
                data_docs=step.data_docs, last=step is spec.steps[-1]
            )
            upstream >> output
            upstream = output

    return pipeline_dag()


def build_dags() -> dict[str, Any]:
    """DAG id -> DAG for every registered pipeline (``dags/pipeline_dags.py`` puts them in its
    globals, where the DAG processor finds them)."""
    return {name: build_dag(spec) for name, spec in registered_pipelines().items()}
