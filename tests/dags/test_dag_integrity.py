"""Every DAG imports cleanly, cheaply and without touching the database or connections."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cascade.config import REPO_ROOT

DAGS_DIR = REPO_ROOT / "dags"
HEAVY_MODULES = (
    "torch",
    "pyspark",
    "feast",
    "mlflow",
    "great_expectations",
    "deepspeed",
    "kserve",
    "pandas",
)


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("airflow")
    os.environ["AIRFLOW_HOME"] = str(home)
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{home / 'airflow.db'}"
    return home


@pytest.fixture(scope="module")
def dagbag(airflow_home: Path):  # type: ignore[no-untyped-def]
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS_DIR))


def test_dags_import_without_errors(dagbag) -> None:  # type: ignore[no-untyped-def]
    assert dagbag.import_errors == {}
    assert "ctr_preranking" in dagbag.dag_ids


def test_dags_have_tags_retries_and_explicit_schedule(dagbag) -> None:  # type: ignore[no-untyped-def]
    for dag_id, dag in dagbag.dags.items():
        assert dag.tags, f"{dag_id} has no tags"
        assert dag.schedule is not None, f"{dag_id} has no explicit schedule"
        for task in dag.tasks:
            assert task.retries >= 2, f"{dag_id}.{task.task_id} retries={task.retries}"


def watcher_of(dag: Any, cron: str, selectors: tuple[str, ...]) -> tuple[Any, dict[str, Any]]:
    """(watcher, trigger kwargs) of a DAG scheduled on ``cron`` or its one Kafka-watched asset,
    after checking the trigger is the shared-stream one (commits after the asset event is
    stored) on the topics every watcher shares, filtering with ``selectors``."""
    from airflow.sdk import AssetOrTimeSchedule

    from cascade.assets import EVENT_TRIGGER, WATCHED_TOPICS

    timetable = dag.timetable
    assert isinstance(timetable, AssetOrTimeSchedule)
    assert timetable.timetable.expression == cron
    (watcher,) = timetable.asset_condition.watchers
    classpath, kwargs = watcher.trigger.serialize()
    assert classpath == EVENT_TRIGGER
    assert kwargs["topics"] == sorted(WATCHED_TOPICS)
    assert kwargs["selectors"] == list(selectors)
    return watcher, kwargs


def test_ctr_preranking_runs_on_published_cross_statistics_and_retrain_requests(dagbag) -> None:  # type: ignore[no-untyped-def]
    """No clock: the asset ctr_cross's feast step updates, or a retrain request on Kafka."""
    from airflow.sdk.definitions.timetables.assets import AssetTriggeredTimetable

    from cascade.assets import (
        ASSET_CTR_CROSS_FEATURES,
        ASSET_CTR_DATA_LANDED,
        CTR_EVENT_SELECTORS,
        EVENT_TRIGGER,
        WATCHED_TOPICS,
    )

    dag = dagbag.dags["ctr_preranking"]
    assert isinstance(dag.timetable, AssetTriggeredTimetable)
    assets = {a.uri: a for a in dag.timetable.asset_condition.objects}
    assert set(assets) == {ASSET_CTR_DATA_LANDED, ASSET_CTR_CROSS_FEATURES}
    assert assets[ASSET_CTR_CROSS_FEATURES].watchers == []
    (watcher,) = assets[ASSET_CTR_DATA_LANDED].watchers
    classpath, kwargs = watcher.trigger.serialize()
    assert (classpath, watcher.name) == (EVENT_TRIGGER, "ctr_data_landed_watcher")
    assert kwargs["topics"] == sorted(WATCHED_TOPICS)
    assert kwargs["selectors"] == list(CTR_EVENT_SELECTORS)
    # This watcher dead-letters bad messages.
    assert kwargs["dead_letter"] is True
    published = dagbag.dags["ctr_cross"].get_task("feast").outlets
    assert [a.uri for a in published] == [ASSET_CTR_CROSS_FEATURES]


def _parse_probe(dag_file: Path) -> dict[str, object]:
    """Import a DAG file in a fresh interpreter with DB and connection access booby-trapped."""
    probe = f"""
import json, sys, importlib.util
from unittest import mock
from sqlalchemy import event
from sqlalchemy.engine import Engine
queries = []
event.listen(Engine, "before_cursor_execute", lambda *a, **k: queries.append(a[2]))
from airflow.sdk.bases.hook import BaseHook
def refuse(*a, **k):
    raise AssertionError("connection looked up at parse time")
with mock.patch.object(BaseHook, "get_connection", refuse):
    spec = importlib.util.spec_from_file_location("probe_dag", {str(dag_file)!r})
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
heavy = [m for m in {HEAVY_MODULES!r} if m in sys.modules]
print(json.dumps({{"queries": queries, "heavy": heavy}}))
"""
    env = dict(os.environ)
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("dag_file", sorted(DAGS_DIR.glob("*.py")), ids=lambda p: p.name)
def test_parse_does_no_db_query_no_connection_and_no_heavy_import(
    dag_file: Path, airflow_home: Path
) -> None:
    result = _parse_probe(dag_file)
    assert result["queries"] == []
    assert result["heavy"] == []


def test_multimodal_is_scheduled_daily_and_on_the_images_asset_without_deploy(dagbag) -> None:  # type: ignore[no-untyped-def]
    from cascade.assets import MULTIMODAL_EVENT_SELECTORS

    dag = dagbag.dags["multimodal"]
    watcher_of(dag, "0 5 * * *", MULTIMODAL_EVENT_SELECTORS)
    assert "deploy" not in dag.task_ids
    for task_id in ("corpus", "validate", "train", "evaluate", "register"):
        assert dag.get_task(task_id).execution_timeout is not None, task_id


def test_ctr_cross_runs_before_preranking_on_impressions_and_ends_in_feast(dagbag) -> None:  # type: ignore[no-untyped-def]
    from cascade.assets import ASSET_CTR_CROSS_FEATURES, CROSS_EVENT_SELECTORS

    dag = dagbag.dags["ctr_cross"]
    _, kwargs = watcher_of(dag, "0 2 * * *", CROSS_EVENT_SELECTORS)
    # Only the ctr_preranking watcher dead-letters, so a bad message is recorded once.
    assert not kwargs.get("dead_letter")
    # The gate sits between the Spark job and Feast: its failure leaves feast unrun.
    assert dag.get_task("validate").downstream_task_ids == {"feast"}
    assert dag.get_task("stats").downstream_task_ids == {"validate"}
    assert [o.uri for o in dag.get_task("feast").outlets] == [ASSET_CTR_CROSS_FEATURES]
    for task_id in ("log", "stats", "validate", "feast"):
        assert dag.get_task(task_id).execution_timeout is not None, task_id


def test_every_dag_has_an_owner_a_run_timeout_backoff_and_a_partition_param(dagbag) -> None:  # type: ignore[no-untyped-def]
    import re

    from cascade.dag_factory import PARTITION_PATTERN
    from cascade.pipeline_registry import registered_pipelines

    for good in ("2026-11-22", "2024-02-29", "2026-12-31"):
        assert re.match(PARTITION_PATTERN, good), good
    for bad in ("2026-13-01", "2026-11-32", "2026-00-10", "20261122", "2026-1-22", "2026-11-22x"):
        assert not re.match(PARTITION_PATTERN, bad), bad
    for dag_id, spec in registered_pipelines().items():
        dag = dagbag.dags[dag_id]
        assert dag.dagrun_timeout.total_seconds() == pytest.approx(spec.run_timeout_minutes * 60)
        # Every step may use its whole timeout on each try, with the waits in between.
        longest = sum(t.execution_timeout.total_seconds() for t in dag.tasks if t.execution_timeout)
        assert dag.dagrun_timeout.total_seconds() > longest * (spec.retries + 1)
        param = dag.params.get_param("ds")
        assert param.value is None and param.schema["pattern"] == PARTITION_PATTERN
        for task in dag.tasks:
            assert task.owner == "cascade" and task.retry_exponential_backoff == 2.0
            assert task.doc_md, f"{dag_id}.{task.task_id} has no doc_md"


def monitor_run(run_type: str, logical_date: Any = None) -> Any:
    """A ``ctr_monitor`` DAG run as its tasks see it."""
    import datetime as dt
    from types import SimpleNamespace

    return SimpleNamespace(
        dag_id="ctr_monitor",
        run_id=f"{run_type}__1",
        run_type=run_type,
        logical_date=logical_date,
        run_after=logical_date or dt.datetime.now(dt.UTC),
    )


def test_a_manual_run_works_on_the_partition_it_names(dagbag, settings) -> None:  # type: ignore[no-untyped-def]
    import datetime as dt

    resolve = dagbag.dags["ctr_monitor"].get_task("resolve_partition").python_callable
    run = monitor_run("scheduled", dt.datetime(2026, 11, 25, 1, tzinfo=dt.UTC))
    assert resolve(params={"ds": None}, dag_run=run) == "2026-11-24"  # the day that just ended
    assert resolve(params={"ds": "2026-10-02"}, dag_run=run) == "2026-10-02"  # a backfill
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        resolve(params={"ds": "2026-02-30"}, dag_run=run)


def test_a_stack_wide_retry_delay_replaces_each_pipelines_own(
    airflow_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datetime as dt

    from cascade.dag_factory import build_dag
    from cascade.pipeline_registry import registered_pipelines

    spec = registered_pipelines()["ctr_preranking"]
    assert spec.retry_delay_s != 2.0
    default = build_dag(spec)
    monkeypatch.setenv("CASCADE_RETRY_DELAY_S", "2")
    short = build_dag(spec)
    for dag, delay in ((default, spec.retry_delay_s), (short, 2.0)):
        for task in dag.tasks:
            assert task.retry_delay == dt.timedelta(seconds=delay), task.task_id
            assert task.retry_exponential_backoff == 2.0
    # The run's bound follows the shorter waits.
    assert short.dagrun_timeout < default.dagrun_timeout


def test_with_schedules_off_only_events_and_people_start_runs(
    airflow_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cascade.dag_factory import build_dag
    from cascade.pipeline_registry import registered_pipelines

    pipelines = registered_pipelines()
    on = {name: build_dag(pipelines[name]) for name in ("ctr_preranking", "ctr_monitor")}
    monkeypatch.setenv("CASCADE_AIRFLOW_SCHEDULES", "0")
    off = {name: build_dag(pipelines[name]) for name in ("ctr_preranking", "ctr_monitor")}
    # On: the event (or upstream data) or the cron; off: the event or the data alone.
    # ctr_preranking has no cron (published statistics start it), so it is the same either way.
    assert type(on["ctr_preranking"].timetable).__name__ == "AssetTriggeredTimetable"
    assert type(off["ctr_preranking"].timetable).__name__ == "AssetTriggeredTimetable"
    assert type(on["ctr_monitor"].timetable).__name__ == "AssetOrTimeSchedule"
    assert type(off["ctr_monitor"].timetable).__name__ == "AssetTriggeredTimetable"


def test_every_step_task_has_the_mlflow_links_and_its_result_carries_them(dagbag) -> None:  # type: ignore[no-untyped-def]
    from airflow.serialization.serialized_objects import DagSerialization

    from cascade.pipeline_registry import registered_pipelines
    from cascade.step_links import DATA_DOCS, LINK_NAMES, RUN_REPORT, step_links

    gates = set()
    for dag_id, spec in registered_pipelines().items():
        dag = dagbag.dags[dag_id]
        serialized = DagSerialization.to_dict(dag)["dag"]["tasks"]
        for task in serialized:
            data = task["__var"]
            if data["task_id"] in ("resolve_partition", "next_partitions"):
                continue
            step = spec.step(data["task_id"])
            # What the UI shows: one button per link, read back from the task's XCom; a gate's
            # Data Docs, and the run's report on the last step.
            expected = {
                *LINK_NAMES,
                *([DATA_DOCS] if step.data_docs else []),
                *([RUN_REPORT] if step is spec.steps[-1] else []),
            }
            assert set(data["_operator_extra_links"]) == expected, (dag_id, data["task_id"])
            gates |= {(dag_id, step.name)} if step.data_docs else set()
    assert {("ctr_cross", "validate"), ("asr", "validate"), ("multimodal", "validate")} <= gates
    links = step_links({"run_id": "abc123", "version": "7"}, "http://127.0.0.1:25000/", "asr")
    assert links == {
        "MLflow run": "http://127.0.0.1:25000/#/runs/abc123",
        "Model version": "http://127.0.0.1:25000/#/models/asr/versions/7",
    }
    # Only what looks like an id makes a URL; a local store has no pages.
    assert step_links({"run_id": "../x?y", "version": "1; drop"}, "http://h:1", "asr") == {}
    assert step_links({"run_id": "abc"}, "sqlite:///m.db", "asr") == {}


def test_exactly_the_heavy_steps_run_in_the_heavy_pool(dagbag) -> None:  # type: ignore[no-untyped-def]
    from cascade.pipeline_registry import registered_pipelines
    from cascade.pipeline_spec import HEAVY_POOL

    pooled = set()
    for dag_id, spec in registered_pipelines().items():
        for task in dagbag.dags[dag_id].tasks:
            heavy = (
                task.task_id not in ("resolve_partition", "next_partitions")
                and spec.step(task.task_id).in_heavy_pool
            )
            assert task.pool == (HEAVY_POOL if heavy else "default_pool"), (dag_id, task.task_id)
            pooled |= {(dag_id, task.task_id)} if heavy else set()
    # Spark jobs, DeepSpeed trainings and compiles; gates on pandas, registry and serving calls
    # stay out, so they run beside a heavy task.
    assert {
        ("ctr_cross", "stats"),
        ("ctr_preranking", "training_set"),
        ("ctr_preranking", "train"),
        ("ctr_preranking", "compile"),
        ("asr", "corpus"),
        ("asr", "train"),
        ("asr", "compile"),
        ("multimodal", "corpus"),
        ("multimodal", "train"),
    } <= pooled
    assert not pooled & {
        ("ctr_preranking", "register"),
        ("ctr_preranking", "deploy"),
        ("asr", "validate"),
        ("multimodal", "validate"),
        ("ctr_monitor", "drift"),
    }


def test_exactly_the_promotion_steps_wait_in_the_promotion_queue(dagbag) -> None:  # type: ignore[no-untyped-def]
    """The steps that act as the MLflow promoter (their code calls the promotion gate) are
    queued where only the promotion worker takes them; every other task in the default queue,
    where the workers without the promoter's credential take them."""
    import inspect

    from cascade.pipeline_registry import registered_pipelines
    from cascade.pipeline_spec import DEFAULT_QUEUE, PROMOTION_QUEUE

    queued = set()
    for dag_id, spec in registered_pipelines().items():
        for task in dagbag.dags[dag_id].tasks:
            if task.task_id in ("resolve_partition", "next_partitions"):
                assert task.queue == DEFAULT_QUEUE, (dag_id, task.task_id)
                continue
            promotes = "register_and_promote(" in inspect.getsource(spec.step(task.task_id).run)
            assert task.queue == (PROMOTION_QUEUE if promotes else DEFAULT_QUEUE), (
                dag_id,
                task.task_id,
            )
            queued |= {(dag_id, task.task_id)} if task.queue == PROMOTION_QUEUE else set()
    assert queued == {
        ("ctr_preranking", "register"),
        ("asr", "register"),
        ("multimodal", "register"),
    }
    from cascade.pipeline_spec import Step

    with pytest.raises(ValueError, match="queue 'Promotion queue' must be lower-case"):
        Step(name="register", run=lambda ctx: {}, queue="Promotion queue")


def test_a_gates_data_docs_link_works_when_the_gate_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from cascade.airflow_links import DataDocsLink
    from cascade.lake import Lake

    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    partitions = {"resolve_partition": "2026-11-22"}

    def xcom_pull(task_ids: str, key: str) -> object:
        if task_ids not in partitions:
            raise KeyError(task_ids)  # the gate failed: no result of its own
        return partitions[task_ids]

    ti = SimpleNamespace(dag_id="asr", task_id="validate", xcom_pull=xcom_pull)
    link = DataDocsLink()
    assert link.get_link(None, ti_key=ti) == ""  # no pages rendered: no link
    index = Lake(tmp_path / "lake").data_docs("asr", "validate", "2026-11-22") / "index.html"
    index.parent.mkdir(parents=True)
    index.write_text("<html>GX</html>")
    assert link.get_link(None, ti_key=ti) == index.resolve().as_uri()
    partitions.clear()  # the run failed before it had a partition
    assert link.get_link(None, ti_key=ti) == ""


def test_the_last_step_logs_the_run_report_and_a_gate_links_its_data_docs(  # type: ignore[no-untyped-def]
    dagbag, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cascade.run_report as run_report
    from cascade.lake import Lake
    from tests.cascade.test_step_runner import with_step

    ds = "2026-11-22"
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    with_step(monkeypatch, "ctr_monitor", "drift", lambda ctx: {"psi": 0.01})
    logged = []

    def log(settings: Any, pipeline: str, ds: str) -> dict[str, Any]:
        logged.append((pipeline, ds))
        return {"url": "http://127.0.0.1:5000/#/experiments/1/runs/r/artifactPath/report"}

    monkeypatch.setattr(run_report, "log_run_report", log)
    drift = dagbag.dags["ctr_monitor"].get_task("drift").python_callable
    report = {"Run report": "http://127.0.0.1:5000/#/experiments/1/runs/r/artifactPath/report"}
    assert drift(ds) == {"psi": 0.01, "links": report} and logged == [("ctr_monitor", ds)]

    def down(*args: Any) -> dict[str, Any]:
        raise ConnectionError("MLflow does not answer")

    monkeypatch.setattr(run_report, "log_run_report", down)
    assert drift(ds) == {"psi": 0.01}  # the work is done: no report costs a warning only

    index = Lake(tmp_path / "lake").data_docs("asr", "validate", ds) / "index.html"
    with_step(monkeypatch, "asr", "validate", lambda ctx: {"success": True})
    gate = dagbag.dags["asr"].get_task("validate").python_callable
    assert gate(ds) == {"success": True}  # no pages rendered
    index.parent.mkdir(parents=True)
    index.write_text("<html>GX</html>")
    assert gate(ds) == {"success": True, "links": {"Data Docs": index.resolve().as_uri()}}


def test_the_monitor_starts_on_a_new_champion_for_the_partition_it_was_deployed_for(
    dagbag, settings, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """Chaining by data: a step's outlet event carries its partition, and a pipeline started by
    it (``Pipeline.after``) resolves that partition, the oldest first when several wait (each
    its own run: tests/events/test_partition_runs.py); a form run's own ds still wins."""
    import datetime as dt
    from types import SimpleNamespace

    from cascade.assets import ASSET_CTR_CROSS_FEATURES, ASSET_PRERANKING_CHAMPION
    from cascade.pipeline_spec import Pipeline, Step

    monitor = dagbag.dags["ctr_monitor"]
    assert ASSET_PRERANKING_CHAMPION in str(monitor.timetable.asset_condition)

    def event(uri: str, ds: str, minute: int) -> SimpleNamespace:
        when = dt.datetime(2026, 11, 23, 3, minute, tzinfo=dt.UTC)
        return SimpleNamespace(asset=SimpleNamespace(uri=uri), extra={"ds": ds}, timestamp=when)

    resolve = monitor.get_task("resolve_partition").python_callable
    run = monitor_run("asset_triggered", dt.datetime(2026, 11, 25, 1, tzinfo=dt.UTC))
    champion = {
        "champion": [
            event(ASSET_PRERANKING_CHAMPION, "2026-11-21", 1),
            event(ASSET_PRERANKING_CHAMPION, "2026-11-22", 2),
        ],
        "other": [event("file://elsewhere", "2026-11-01", 3)],
    }
    started = {"params": {"ds": None}, "dag_run": run, "triggering_asset_events": champion}
    assert resolve(**started) == "2026-11-21"  # the older champion's partition; 11-22 waits
    form = {"params": {"ds": "2026-10-02"}, "dag_run": monitor_run("manual")}
    assert resolve(**form) == "2026-10-02"
    cron = monitor_run("scheduled", dt.datetime(2026, 11, 25, 1, tzinfo=dt.UTC))
    assert resolve(params={"ds": None}, dag_run=cron) == "2026-11-24"  # cron: the day before

    # The producing side: the step task sets its outlet event's extra to its partition.
    import cascade.dag_factory
    import cascade.step_runner

    class Outlets(dict):
        def __missing__(self, key):  # type: ignore[no-untyped-def]
            self[key] = SimpleNamespace(extra={})
            return self[key]

    outlets = Outlets()
    monkeypatch.setattr(
        cascade.step_runner, "run_step", lambda name, ds, pipeline, *a, **k: {"ok": 1}
    )
    monkeypatch.setattr(cascade.dag_factory, "outlet_events", lambda: outlets)
    feast = dagbag.dags["ctr_cross"].get_task("feast").python_callable
    # Called the way Airflow calls it: the partition as its one argument (a `**context` in its
    # signature would clash with Airflow's own "ds" and fail every step task).
    # Airflow's own check of a task's arguments against a run's context: a run with a logical
    # date (cron, the trigger form) has "ds" there, so a step argument named "ds" failed every
    # step task of such runs.
    from airflow.sdk.bases.decorator import KeywordParameters

    context = {"ds": "2026-11-25", "params": {"ds": None}, "outlet_events": outlets}
    for dag in dagbag.dags.values():
        for task in dag.tasks:
            if task.task_id not in ("resolve_partition", "next_partitions"):
                KeywordParameters.determine(task.python_callable, ["2026-11-22"], context)
    feast("2026-11-22")
    (published,) = outlets.items()
    assert published[0].uri == ASSET_CTR_CROSS_FEATURES
    assert published[1].extra["ds"] == "2026-11-22"

    def step() -> Step:
        return Step(name="s", run=lambda ctx: {}, doc="d", outlets=("file://x/out",))

    with pytest.raises(ValueError, match="its own outlets"):
        Pipeline(name="p", description="d", steps=(step(),), after=("file://x/out",))
    assert Pipeline(name="p", description="d", steps=(step(),), after=("file://y",)).after
