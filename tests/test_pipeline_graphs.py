"""The pipeline specs are the one source of the Airflow DAGs, the DVC stages and the CLI: the
committed ``dvc.yaml`` is what the specs make, every DAG's tasks are its spec's steps, and a
toy pipeline in a package of its own (registered only through its entry point) becomes a DAG,
DVC stages and ``cascade step`` choices with no edit anywhere else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from cascade.config import REPO_ROOT
from cascade.dvc_stages import dvc_yaml
from cascade.pipeline_registry import registered_pipelines

PIPELINES = registered_pipelines()


def test_the_project_registers_its_pipelines() -> None:
    assert {"ctr_preranking", "ctr_cross", "asr", "multimodal", "ctr_monitor"} <= set(PIPELINES)


def test_committed_dvc_yaml_is_the_one_the_specs_make() -> None:
    committed = (REPO_ROOT / "dvc.yaml").read_text()
    assert committed == dvc_yaml(PIPELINES.values()), (
        "dvc.yaml differs from the pipeline specs; run `cascade pipelines --write`"
    )


def test_the_pipelines_reference_is_the_one_the_specs_make() -> None:
    from cascade.pipeline_docs import documented_table, render_markdown, render_reference

    page = documented_table((REPO_ROOT / "docs" / "reference" / "pipelines.md").read_text())
    assert page == render_reference(PIPELINES.values()), "run `cascade pipelines --write`"
    assert page.startswith(render_markdown(PIPELINES.values()))
    for name, spec in PIPELINES.items():
        assert f"| `{name}` |" in page and f"### `{name}`" in page
        assert all(f"| `{step}` |" in page for step in spec.step_names)


@pytest.mark.parametrize("pipeline", list(PIPELINES))
def test_every_step_is_a_dvc_stage_chained_in_step_order(pipeline: str) -> None:
    spec = PIPELINES[pipeline]
    stages = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]
    names = [spec.dvc_prefix + step for step in spec.step_names]
    for step, stage in zip(spec.step_names, names, strict=True):
        knobs = "".join(f" --param {k}=${{{pipeline}.{k}}}" for k in spec.step(step).params)
        assert stages[stage]["cmd"] == (
            f"cascade step {step} --pipeline {pipeline} --ds ${{ds}}{knobs}"
        )
    for upstream, downstream in zip(names, names[1:], strict=False):
        outs = {next(iter(o)) if isinstance(o, dict) else o for o in stages[upstream]["outs"]}
        assert outs & set(stages[downstream]["deps"]), f"{downstream} does not follow {upstream}"


@pytest.fixture(scope="module")
def dagbag(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    home = tmp_path_factory.mktemp("airflow")
    os.environ["AIRFLOW_HOME"] = str(home)
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO_ROOT / "dags" / "pipeline_dags.py"))


@pytest.mark.parametrize("pipeline", list(PIPELINES))
def test_dag_tasks_are_the_steps_in_the_same_order(dagbag, pipeline: str) -> None:  # type: ignore[no-untyped-def]
    assert dagbag.import_errors == {}
    dag = dagbag.dags[pipeline]
    spec = PIPELINES[pipeline]
    steps = list(spec.step_names)
    tasks = [t.task_id for t in dag.topological_sort()]
    # A triggered or chained pipeline queues the next partition's run beside its steps.
    queued = ["next_partitions"] if spec.trigger is not None or spec.after else []
    assert sorted(tasks) == sorted(["resolve_partition", *queued, *steps])
    assert [t for t in tasks if t != "next_partitions"] == ["resolve_partition", *steps]
    if queued:
        assert dag.get_task("next_partitions").upstream_task_ids == {"resolve_partition"}
    for upstream, downstream in zip(steps, steps[1:], strict=False):
        assert dag.get_task(upstream).downstream_task_ids == {downstream}
    for step in spec.steps:
        task = dag.get_task(step.name)
        assert [o.uri for o in task.outlets] == list(spec.step_outlets(step))
        if step.timeout_minutes is not None:
            assert task.execution_timeout.total_seconds() == step.timeout_minutes * 60


TOY_MODULE = '''
"""Toy: counts to three."""
from cascade.pipeline_spec import Pipeline, Step, Trigger


def count(ctx) -> dict:
    return {"ds": ctx.ds, "counted": 3}


def report(ctx) -> dict:
    return {"ds": ctx.ds, "reported": True}


PIPELINE = Pipeline(
    name="toy_counter",
    description=__doc__,
    cron="0 6 * * *",
    trigger=Trigger(
        asset="kafka://cascade/cascade.data.landed/toy",
        watcher="toy_watcher",
        selectors=("cascade.data.landed:dataset=toy",),
    ),
    tags=("toy",),
    dvc_prefix="toy_",
    steps=(
        Step(name="count", run=count, doc="count", dvc_deps=("toy_pipelines/toy.py",)),
        Step(name="report", run=report, doc="report", timeout_minutes=5),
    ),
)
'''

PROBE = """
import json, os, sys
from cascade.dvc_stages import dvc_yaml
from cascade.pipeline_registry import registered_pipelines
from airflow.dag_processing.dagbag import DagBag

bag = DagBag(dag_folder=sys.argv[1])
dag = bag.dags["toy_counter"]
import yaml
stages = yaml.safe_load(dvc_yaml(registered_pipelines().values()))["stages"]
print(json.dumps({
    "errors": {str(k): str(v) for k, v in bag.import_errors.items()},
    "dags": sorted(bag.dag_ids),
    "tasks": [t.task_id for t in dag.topological_sort()],
    "selectors": dag.timetable.asset_condition.watchers[0].trigger.serialize()[1]["selectors"],
    "cron": dag.timetable.timetable.expression,
    "stages": {k: v["cmd"] for k, v in stages.items() if k.startswith("toy_")},
}))
"""


def test_a_toy_pipeline_in_its_own_package_becomes_a_dag_dvc_stages_and_cli_steps(
    tmp_path: Path,
) -> None:
    # A separately installed package: its module and its distribution's entry point, nothing
    # else. The project's files are not touched.
    package = tmp_path / "toy_pipelines"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "toy.py").write_text(textwrap.dedent(TOY_MODULE))
    dist = tmp_path / "toy_pipelines-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-pipelines\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[cascade.pipelines]\ntoy = toy_pipelines.toy\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO_ROOT)]),
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "CASCADE_HOME": str(tmp_path / "state"),
    }

    probe = subprocess.run(
        [sys.executable, "-c", PROBE, str(REPO_ROOT / "dags" / "pipeline_dags.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    assert seen["errors"] == {}
    # The toy is one more DAG beside the project's own.
    assert {"toy_counter", "ctr_preranking", "asr"} <= set(seen["dags"])
    assert sorted(seen["tasks"]) == ["count", "next_partitions", "report", "resolve_partition"]
    assert seen["selectors"] == ["cascade.data.landed:dataset=toy"]
    assert seen["cron"] == "0 6 * * *"
    assert seen["stages"] == {
        "toy_count": "cascade step count --pipeline toy_counter --ds ${ds}",
        "toy_report": "cascade step report --pipeline toy_counter --ds ${ds}",
    }

    # The CLI lists it and runs its steps, recording their summaries.
    cli = [sys.executable, "-m", "cascade.cli"]
    listing = subprocess.run(
        [*cli, "pipelines", "--json"], env=env, capture_output=True, text=True, check=True
    )
    toy = next(p for p in json.loads(listing.stdout) if p["name"] == "toy_counter")
    assert [s["name"] for s in toy["steps"]] == ["count", "report"]
    assert toy["assets"]["trigger"]["watcher"] == "toy_watcher"
    ran = subprocess.run(
        [*cli, "step", "count", "--pipeline", "toy_counter", "--ds", "2026-11-22"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(ran.stdout) == {"ds": "2026-11-22", "counted": 3}
    summary = tmp_path / "state/lake/reports/step_toy_count/dt=2026-11-22/summary.json"
    assert json.loads(summary.read_text())["counted"] == 3
    helptext = subprocess.run(
        [*cli, "step", "--help"], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert "toy_counter: count, report" in " ".join(helptext.split())


@pytest.mark.parametrize("pipeline", [n for n, s in PIPELINES.items() if s.model is not None])
def test_the_promotion_overrides_are_knobs_of_the_step_that_registers(pipeline: str) -> None:
    """`dvc exp run -S <pipeline>.<field>=...` (or `--param`) changes the rule for one run."""
    spec = PIPELINES[pipeline]
    registers = [s for s in spec.steps if spec.model and s.name == "register"]
    assert len(registers) == 1
    variables = spec.promotion_variables()
    assert variables and set(variables.values()) <= set(registers[0].params.values())
    stage = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"][
        spec.dvc_prefix + "register"
    ]
    knobs = {k for k, v in registers[0].params.items() if v in variables.values()}
    assert {f"{pipeline}.{k}" for k in knobs} <= set(stage["params"])
