"""The ``ctr_cross`` pipeline: impression log -> cross statistics -> GX gate -> Feast.

Steps (each takes the partition date, returns a JSON-able summary; the Airflow DAG
``ctr_cross``, DVC's ``cross_*`` stages and ``cascade step NAME --pipeline ctr_cross --ds DS``
all run these functions):

* ``log``: the partition's impression log. A log that landed in
  ``<lake>/landing/impressions/dt=<ds>/`` (any writer, with a ``_SUCCESS`` marker) is kept and
  read as the source its ``_SOURCE`` file names (else ``CASCADE_CROSS_SOURCE``); sources are
  registered by name with a mapping onto the engine's schema (:mod:`jobs.ctr_log_sources`:
  built in, entry points, or ``CASCADE_CROSS_SOURCES_FILE``). With nothing landed the run ends
  as skipped ("nothing landed for DS"); generated impressions are a named source landed on
  purpose (``cascade land impressions --source generated --ds DS``: :mod:`jobs.impression_log`,
  ``CASCADE_CROSS_IMPRESSIONS`` rows ending at ``ds``). The ``ml100k`` source
  (``CASCADE_CROSS_SOURCE=ml100k``) reads the installed MovieLens package.
  Every output, quarantine and report path carries the source's name.
* ``stats``: :func:`jobs.ctr_cross_stats.run` (the user's and the item's own statistics and
  the crosses x 1/7/30-day windows, fitted priors, quarantine partition with reasons; the
  item catalogue of the window: each item's category at its newest impression). With
  ``CASCADE_CROSS_HISTORY_DAYS=N`` it first builds each partition of the N days before ``ds``
  that was never built (from that day's landed log, else from ``ds``'s rows before that day),
  so a fresh lake gets the daily partitions a point-in-time training set joins.
* ``validate``: :func:`jobs.ctr_cross_stats_gate.validate`; a failed batch raises, so the run
  stops before Feast. History partitions are judged first, each on its own (a failed one stays
  unpublished).
* ``feast``: applies the pair views and ``ctr_cross_v2`` and materializes the ``ds`` partition of
  every pair into the online store. It refuses to run unless the gate's report for ``ds`` says
  the batch passed. The job deletes that report when it rebuilds the partition, so a
  ``cascade step`` or ``dvc repro`` that skips the gate, or reruns the job after it, cannot
  publish unchecked features.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field
from pydantic.dataclasses import dataclass

from cascade.assets import (
    ASSET_CTR_CROSS_FEATURES,
    ASSET_IMPRESSIONS_DATA_LANDED,
    CROSS_EVENT_SELECTORS,
)
from cascade.config import Settings
from cascade.errors import NothingLanded, NotReady
from cascade.lake import Lake, check_ds
from cascade.partitions import days_before
from cascade.pipeline_spec import Data, Dataset, Pipeline, Step, Trigger, deferred
from cascade.settings_fields import SETTINGS_CONFIG
from cascade.step_context import StepContext, with_settings

DEFAULT_SOURCE = "generated"
BUILT_IN_PAIRS = ("user", "item", "seg_cat", "user_cat", "seg_item", "ctx_item", "item_pos")
"""Names of the engine's built-in pairs (``jobs.ctr_cross_stats.GENERATED_PAIRS``, kept equal
by a test; named here so that parsing the DAG never imports Spark)."""
CROSS_DATA = tuple(f"cross_{pair}" for pair in BUILT_IN_PAIRS)
"""The catalog names of the built-in pairs' statistics of the default source."""
DEFAULT_IMPRESSIONS = 200_000
"""Generated rows per partition when nothing landed; raise it for a load test."""
DEFAULT_GENERATED_DAYS = 35
"""Days a generated log spans unless set: the generator's own default
(``jobs.impression_log.GeneratorConfig.days``, not imported here: parsing the DAG imports no
Spark), the 30-day windows and a few more."""


@dataclass(kw_only=True, frozen=True, config=SETTINGS_CONFIG)
class CrossSettings:
    """The ``ctr_cross`` pipeline's variables."""

    env_pattern: ClassVar[str] = "CASCADE_CROSS_{}"
    title: ClassVar[str] = "Pipeline ctr_cross"

    source: str = Field(default="generated", pattern=r"^[a-z][a-z0-9_]{0,47}$")
    """The registered log source read when a landed log names none: ``generated`` (the engine's
    own columns, as ``cascade land impressions`` writes them), ``ml100k`` (the installed
    MovieLens-100k package), or one from the sources file or the ``cascade.log_sources`` entry
    points."""
    sources_file: Path | None = None
    """TOML file of ``[sources.NAME]`` tables registering log sources (see
    :mod:`jobs.ctr_log_sources`); default ``$CASCADE_HOME/log_sources.toml`` when it exists."""
    impressions: int = Field(default=DEFAULT_IMPRESSIONS, ge=1)
    """Generated rows per partition when nothing landed; raise it for a load test."""
    generated_days: int = Field(default=DEFAULT_GENERATED_DAYS, ge=1, le=365)
    """Days a generated log spans (its timestamps uniform over the days before ``ds``): with
    fewer, each day holds more of ``CASCADE_CROSS_IMPRESSIONS`` (a training day's rows are
    impressions / days)."""
    history_days: int = Field(default=7, ge=0, le=90)
    """Before partition ``ds``, also build each of the partitions of the N days before it that
    was never built: from that day's own landed log, else from ``ds``'s log (its rows before
    that day; :func:`jobs.ctr_cross_stats.before_cutoff`). A first run on a fresh lake so gets
    the daily partitions a point-in-time training set joins (an impression of day D reads
    partition D; ``ctr_preranking`` trains on ``CASCADE_PRERANKING_TRAIN_DAYS``, default 7);
    the gate checks each, and only ``ds`` goes to the online store. Later runs find them
    built and build only what is missing."""


def sources_file(settings: Settings, knobs: CrossSettings) -> Path:
    """The file registering log sources (it need not exist)."""
    if knobs.sources_file is not None:
        return knobs.sources_file
    return settings.home / "log_sources.toml"


def source_name(settings: Settings, knobs: CrossSettings) -> str:
    """The configured log source (``CASCADE_CROSS_SOURCE``), checked against the registry."""
    from jobs import ctr_log_sources

    ctr_log_sources.resolve(knobs.source, sources_file(settings, knobs))
    return knobs.source


def partition_source(ds: str, settings: Settings, knobs: CrossSettings) -> str:
    """The source of partition ``ds``: the one its landed log names in ``_SOURCE``, else the
    configured one. Every step of a run resolves the same name, so outputs, quarantine and
    reports of a landed log go under its own source."""
    from jobs import ctr_log_sources

    declared = ctr_log_sources.declared_source(landing_dir(Lake(settings.lake_root), ds))
    if declared is None:
        return source_name(settings, knobs)
    ctr_log_sources.resolve(declared, sources_file(settings, knobs))
    return declared


def landing_dir(lake: Lake, ds: str) -> Path:
    """Where the partition's impression log lands (read by the ``generated`` source)."""
    return lake.landing("impressions", ds)


def missing_log(ds: str, settings: Settings, knobs: CrossSettings) -> str | None:
    """Why ``log`` cannot give partition ``ds`` a log (its source reads a landed log and none
    landed), or None when it can: the trigger's check, so an event naming such a partition is
    dead-lettered instead of failing a run."""
    from jobs import ctr_log_sources

    source = partition_source(ds, settings, knobs)
    registered = ctr_log_sources.resolve(source, sources_file(settings, knobs))
    landing = landing_dir(Lake(settings.lake_root), ds)
    if not registered.reads_landing or (landing / "_SUCCESS").is_file():
        return None
    return nothing_landed_reason(ds, landing)


def nothing_landed_reason(ds: str, landing: Path) -> str:
    return (
        f"nothing landed for {ds}: no click log at {landing}; land one with `cascade land "
        f"impressions PATH --ds {ds}` (or `--source generated` for generated impressions)"
    )


def generate(dest: Path, *, ds: str, settings: Settings, knobs: CrossSettings) -> dict[str, int]:
    """The ``generated`` source of dataset ``impressions``: ``CASCADE_CROSS_IMPRESSIONS``
    generated impressions over the ``CASCADE_CROSS_GENERATED_DAYS`` days before ``ds``
    (:mod:`jobs.impression_log`) written into ``dest``."""
    from jobs import ctr_cross_stats as job
    from jobs import impression_log
    from jobs.spark_sessions import active_or_new

    rows = knobs.impressions
    started = time.perf_counter()
    with active_or_new(lambda: job.build_session(settings, app="cascade.ctr_cross.log")) as spark:
        config = impression_log.GeneratorConfig(
            impressions=rows, end_ds=ds, days=knobs.generated_days
        )
        impression_log.write(spark, config, dest)
    seconds = round(time.perf_counter() - started, 1)
    print(f"[cross] generated {rows:,} impressions ending at {ds} -> {dest} in {seconds} s")
    return {"rows": rows}


@with_settings(CrossSettings)
def _land_generated(
    dest: Path, *, ds: str, platform: Settings, settings: CrossSettings
) -> dict[str, int]:
    counts = generate(dest, ds=ds, settings=platform, knobs=settings)
    (dest / "_SOURCE").write_text(DEFAULT_SOURCE + "\n")
    return counts


@with_settings(CrossSettings)
def _source_importer(
    name: str, *, platform: Settings, settings: CrossSettings
) -> Callable[..., Any]:
    from jobs.click_log_landing import source_importer

    return source_importer(name, sources_file(platform, settings))


@with_settings(CrossSettings)
def _unbuildable(ds: str, *, platform: Settings, settings: CrossSettings) -> str | None:
    return missing_log(ds, platform, settings)


IMPRESSIONS = Dataset(
    name="impressions",
    description="click logs: csv (header row), parquet or jsonl with the engine's column names, "
    "or any registered log source's shape with --source NAME; string keys are hashed to ids",
    formats={
        "csv": deferred("jobs.click_log_landing:land_csv"),
        "jsonl": deferred("jobs.click_log_landing:land_jsonl"),
        "parquet": deferred("jobs.click_log_landing:land_parquet"),
    },
    sources={"generated": _land_generated},
    source_importer=_source_importer,
)
"""The click log ``log`` reads from ``landing/impressions/dt=DS`` (``cascade land``)."""


def log(ctx: StepContext) -> dict[str, Any]:
    """The partition's log: the landed one (or a source that finds its data itself); with
    nothing landed the run ends as skipped (:class:`~cascade.errors.NothingLanded`)."""
    from cascade.landing import landed_from, landing_record
    from jobs import ctr_log_sources

    ds, settings, knobs = ctx.ds, ctx.platform, ctx.settings
    missing = missing_log(ds, settings, knobs)
    if missing is not None:
        raise NothingLanded(missing)
    source = partition_source(ds, settings, knobs)
    registered = ctr_log_sources.resolve(source, sources_file(settings, knobs))
    if not registered.reads_landing:
        return {"ds": ds, "source": source, "path": None, "landed_from": None, "rows": None}
    landing = landing_dir(Lake(settings.lake_root), ds)
    print(f"[cross] log for ds={ds} ({source}) landed at {landing}", flush=True)
    record = landing_record(landing) or {}
    return {
        "ds": ds,
        "source": source,
        "path": str(landing),
        "landed_from": landed_from(record),
        "rows": (record.get("counts") or {}).get("rows"),
    }


@dataclasses.dataclass(frozen=True)
class SourceRun:
    """What a Spark step of partition ``ds`` works with: its source, its log and a session."""

    ds: str
    source: str
    log_path: Path | None
    """The partition's landed log (None: the source finds its data itself)."""
    settings: Settings
    spark: Any
    sources_file: Path
    history_days: int
    """Days before ``ds`` whose missing partitions the step builds or judges first."""

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the engine's and the gate's entry points."""
        return {
            "source": self.source,
            "log_path": self.log_path,
            "settings": self.settings,
            "spark": self.spark,
            "sources_file": self.sources_file,
        }


def _on_spark(
    step: Callable[[SourceRun], dict[str, Any]], ctx: StepContext, app: str
) -> dict[str, Any]:
    """``step(SourceRun)`` on the partition's source (:func:`partition_source`)."""
    from jobs import ctr_cross_stats as job
    from jobs import ctr_log_sources
    from jobs.spark_sessions import active_or_new

    ds, settings, knobs = ctx.ds, ctx.platform, ctx.settings
    source = partition_source(ds, settings, knobs)
    registry_file = sources_file(settings, knobs)
    landed = ctr_log_sources.resolve(source, registry_file).reads_landing
    log_path = landing_dir(Lake(settings.lake_root), ds) if landed else None
    if log_path is not None and not log_path.is_dir():
        # Before a Spark session starts: the answer is the same and comes at once.
        raise FileNotFoundError(
            f"no impression log for ds={ds} at {log_path}; run the pipeline's `log` step "
            f"(`cascade step log --pipeline ctr_cross --ds {ds}`) or land one there"
        )
    with active_or_new(lambda: job.build_session(settings, app=app)) as spark:
        run = SourceRun(ds, source, log_path, settings, spark, registry_file, knobs.history_days)
        return step(run)


def history_window(ds: str, days: int) -> list[str]:
    """The ``days`` days before ``ds``, oldest first."""
    return days_before(ds, days)


def _stats(run: SourceRun, history_days: int | None = None) -> dict[str, Any]:
    from jobs import ctr_cross_stats as job

    lake = Lake(run.settings.lake_root)
    where = job.CrossLake(lake, run.source)
    built: dict[str, dict[str, Any]] = {}
    for day in history_window(run.ds, run.history_days if history_days is None else history_days):
        if where.summary(day).is_file():
            continue
        own = landing_dir(lake, day)
        from_own = run.log_path is not None and (own / "_SUCCESS").is_file()
        try:
            summary = job.run(
                day,
                **{**run.kwargs(), "log_path": own if from_own else run.log_path},
                history=not from_own,
            )
        except job.EmptyBatch as empty:
            print(f"[cross] history ds={day}: nothing to build ({empty})", flush=True)
            built[day] = {"built": False, "reason": str(empty)}
            continue
        built[day] = {
            "built": True,
            "log": "its own" if from_own else f"ds={run.ds}'s",
            "rows": summary["rows"],
            "seconds": summary["seconds"],
        }
    summary = job.run(run.ds, **run.kwargs())
    if built:
        summary["history_partitions"] = built
    return summary


def stats(ctx: StepContext, *, history_days: int | None = None) -> dict[str, Any]:
    """The cross statistics of the partition (see :func:`jobs.ctr_cross_stats.run`), after
    the missing partitions of the ``history_days`` before it (``history_partitions``;
    ``history_days`` given here replaces the setting)."""
    step = functools.partial(_stats, history_days=history_days)
    return _on_spark(step, ctx, "cascade.ctr_cross.stats")


def _validate(run: SourceRun) -> dict[str, Any]:
    from jobs import ctr_cross_stats as job
    from jobs import ctr_cross_stats_gate as gate

    lake = Lake(run.settings.lake_root)
    where = job.CrossLake(lake, run.source)
    checked: dict[str, dict[str, Any]] = {}
    for day in history_window(run.ds, run.history_days):
        summary_path = where.summary(day)
        if not summary_path.is_file() or where.gate_report(day).is_file():
            continue  # never built, or already judged
        built_from = json.loads(summary_path.read_text()).get("log_path")
        try:
            gate.validate(
                day,
                **{**run.kwargs(), "log_path": None if built_from is None else Path(built_from)},
                docs=lake.data_docs("ctr_cross", "validate", day),
            )
            checked[day] = {"success": True}
        except gate.GateFailed as failed:
            # The day is not published (training sets read gate-passed partitions only);
            # partition ds is judged on its own.
            print(f"[cross] history ds={day}: {failed}", flush=True)
            checked[day] = {"success": False, "failed": failed.failed}
    verdict = gate.validate(
        run.ds, **run.kwargs(), docs=lake.data_docs("ctr_cross", "validate", run.ds)
    )
    if checked:
        verdict["history_partitions"] = checked
    return verdict


def validate(ctx: StepContext) -> dict[str, Any]:
    """The batch gate; raises :class:`jobs.ctr_cross_stats_gate.GateFailed` when partition
    ``ds`` fails. History partitions the job built are judged first, each on its own
    (``history_partitions``: a failed one is left unpublished, not fatal)."""
    return _on_spark(_validate, ctx, "cascade.ctr_cross.validate")


class GateNotPassed(NotReady):
    """Feast was asked to publish a partition whose gate did not pass (or did not run)."""


def feast(ctx: StepContext) -> dict[str, Any]:
    """Apply the cross views and load partition ``ds`` of every pair into the online store
    (the profile's engine: from Spark executors in the ``cluster`` profile)."""
    from jobs.ctr_cross_stats import CrossLake

    ds, settings = ctx.ds, ctx.platform
    source = partition_source(ds, settings, ctx.settings)
    report = CrossLake(Lake(settings.lake_root), source).gate_report(check_ds(ds))
    if not report.is_file():
        raise GateNotPassed(
            f"no gate report {report}: run step 'validate' for ds={ds} before publishing to Feast"
        )
    verdict = json.loads(report.read_text())
    if not verdict.get("success"):
        raise GateNotPassed(
            f"the gate failed for ds={ds} ({', '.join(verdict.get('failed', []))}); "
            f"see {report}. Feast keeps the previous partition."
        )
    from jobs.ctr_cross_features import default_materialize_engine, materialize_cross

    summary = CrossLake(Lake(settings.lake_root), source).summary(check_ds(ds))
    pairs = json.loads(summary.read_text()).get("pairs") if summary.is_file() else None
    engine = default_materialize_engine(settings)
    if engine != "spark":
        return materialize_cross(ds, settings=settings, source=source, pairs=pairs, engine=engine)
    # The cluster profile: the executors of the job's own Spark master write Redis.
    from jobs import ctr_cross_stats as job
    from jobs.online_materialize import SparkViewLoader
    from jobs.spark_sessions import active_or_new

    with active_or_new(lambda: job.build_session(settings, app="cascade.ctr_cross.feast")) as spark:
        return materialize_cross(
            ds,
            settings=settings,
            source=source,
            pairs=pairs,
            engine=engine,
            loader=SparkViewLoader(spark, settings),
        )


PIPELINE = Pipeline(
    name="ctr_cross",
    description="""CTR cross statistics: impression log -> Spark pairs x windows -> GX -> Feast.

Runs daily at 02:00 UTC (before ``ctr_preranking`` at 03:00) and whenever a
``cascade.data.landed`` (dataset ``impressions``) or ``cascade.retrain.requested`` (model
``ctr_cross``) event arrives on Kafka, through the same shared watcher stream, claim ledger and
coalescing as the other pipelines. Rows that break a row rule go to the quarantine partition
with their reason; a failed gate stops the run before Feast.
""",
    cron="0 2 * * *",
    trigger=Trigger(
        asset=ASSET_IMPRESSIONS_DATA_LANDED,
        watcher="impressions_data_landed_watcher",
        selectors=CROSS_EVENT_SELECTORS,
        unbuildable=_unbuildable,
    ),
    tags=("ctr", "features"),
    settings=CrossSettings,
    datasets=(IMPRESSIONS,),
    catalog=(
        Data(
            name="impressions_landing",
            kind="landing",
            key="impressions",
            format="parquet",
            description="the partition's click log as landed (`cascade land impressions`)",
            # A log that landed from elsewhere is kept, never deleted before the stage runs.
            persist=True,
        ),
        *(
            Data(
                name=f"cross_{pair}",
                kind="features",
                key=f"ctr_cross/{DEFAULT_SOURCE}/{pair}",
                format="parquet",
                contract="jobs/ctr_cross_stats_gate.py",
                description=f"cross statistics of pair {pair} over 1/7/30-day windows",
            )
            for pair in BUILT_IN_PAIRS
        ),
        Data(
            name="ctr_catalogue",
            kind="features",
            key=f"ctr_catalogue/{DEFAULT_SOURCE}",
            format="parquet",
            description="the engine's item catalogue of the partition",
        ),
        Data(
            name="quarantined_log",
            kind="quarantine",
            key=f"{DEFAULT_SOURCE}_log",
            format="parquet",
            description="rows that broke a row rule, with their reason",
        ),
    ),
    dvc_prefix="cross_",
    steps=(
        Step(
            name="log",
            run=log,
            spark=True,
            doc="the partition's impression log, as landed in the lake (`cascade land "
            "impressions`; with nothing landed the run is skipped); CASCADE_CROSS_SOURCE=ml100k "
            "reads MovieLens-100k",
            timeout_minutes=30,
            outputs=("impressions_landing",),
            dvc_deps=("pipelines/ctr_cross.py", "jobs/impression_log.py"),
        ),
        Step(
            name="stats",
            run=stats,
            spark=True,
            doc="cross statistics on Spark: impressions, clicks, smoothed and position-debiased "
            "CTRs over 1/7/30-day windows, recency, decayed CTR; bad rows quarantined",
            timeout_minutes=60,
            dvc_deps=(
                "jobs/ctr_cross_stats.py",
                "jobs/ctr_cross_config.py",
                "jobs/ctr_cross_transforms.py",
                "jobs/ctr_cross_passes.py",
                "jobs/ctr_cross_lake.py",
                "jobs/ctr_log_sources.py",
            ),
            inputs=("impressions_landing",),
            outputs=(*CROSS_DATA, "ctr_catalogue", "quarantined_log"),
        ),
        Step(
            name="validate",
            run=validate,
            data_docs=True,
            spark=True,
            doc="the GX gate on the input and every pair's output; a failed batch fails the task",
            timeout_minutes=30,
            inputs=("impressions_landing", *CROSS_DATA),
            dvc_deps=("jobs/ctr_cross_stats_gate.py", "jobs/gx_suites.py"),
        ),
        Step(
            name="feast",
            run=feast,
            doc="apply the pair views and ctr_cross_v2, materialize the partition online",
            timeout_minutes=60,
            outlets=(ASSET_CTR_CROSS_FEATURES,),
            inputs=CROSS_DATA,
            dvc_deps=(
                "features/ctr/cross_views.py",
                "domains/ctr/feature_store.py",
                "jobs/ctr_cross_features.py",
            ),
        ),
    ),
)
