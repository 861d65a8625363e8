"""A step is a function of its context: a toy pipeline whose steps only read their context runs
through the CLI runner, a generated DVC stage and the Airflow DAG factory with one knob changed
per run, and the process environment stays as it was."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import yaml
from pydantic.dataclasses import dataclass as settings_class

from cascade import pipeline_registry
from cascade.dvc_stages import dvc_yaml
from cascade.lake import Lake
from cascade.pipeline_spec import Data, Pipeline, Step
from cascade.settings_fields import SETTINGS_CONFIG
from cascade.step_context import StepContext, StepResultMissing

DS = "2026-11-22"
KNOB = "CASCADE_TOYCTX_SCALE"


@settings_class(kw_only=True, frozen=True, config=SETTINGS_CONFIG)
class ToyContextSettings:
    env_pattern: ClassVar[str] = "CASCADE_TOYCTX_{}"
    title: ClassVar[str] = "Pipeline toy_context"

    scale: int = 2
    """How far to count."""


def count(ctx: StepContext) -> dict[str, Any]:
    return {
        "ds": ctx.ds,
        "counted": 3 * ctx.settings.scale,
        "knob_in_environment": KNOB in os.environ,
        "dag_run": ctx.run.dag_run_id,
        "try": ctx.run.try_number,
        "reads": {name: str(handle.path) for name, handle in ctx.inputs.items()},
        "writes": {name: str(handle.path) for name, handle in ctx.outputs.items()},
    }


def report(ctx: StepContext) -> dict[str, Any]:
    counted = ctx.result_of("count")["counted"]
    return {"ds": ctx.ds, "doubled": 2 * counted, "scale": ctx.settings.scale}


TOY = Pipeline(
    name="toy_context",
    description="Toy: counts, then reports the count.",
    cron="0 6 * * *",
    settings=ToyContextSettings,
    dvc_prefix="toyctx_",
    catalog=(
        Data(name="numbers", kind="landing", key="toy_numbers", format="json"),
        Data(name="counts", kind="report", key="toy_counts", format="json"),
    ),
    steps=(
        Step(
            name="count",
            run=count,
            inputs=("numbers",),
            outputs=("counts",),
            params={"scale": KNOB},
            metrics=("counted",),
        ),
        Step(name="report", run=report, params={"scale": KNOB}),
    ),
)


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Lake:
    """The toy registered for this test only, with its lake under a fresh home."""
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    monkeypatch.delenv(KNOB, raising=False)
    pipelines = {**pipeline_registry.registered_pipelines(), TOY.name: TOY}
    monkeypatch.setattr(pipeline_registry, "_cache", pipelines)
    return Lake(tmp_path / "lake")


def test_the_cli_runner_gives_the_knob_as_a_setting_and_the_next_step_its_result(
    toy: Lake, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from cascade.cli import main

    before = dict(os.environ)
    assert main(["step", "count", "--pipeline", TOY.name, "--ds", DS, "--param", "scale=5"]) == 0
    assert dict(os.environ) == before
    counted = json.loads(capsys.readouterr().out)
    assert counted["counted"] == 15 and counted["knob_in_environment"] is False
    assert (counted["dag_run"], counted["try"]) == (None, 1)
    # The handles are the catalog's locations in this run's lake.
    assert counted["reads"] == {"numbers": str(toy.landing("toy_numbers", DS))}
    assert counted["writes"] == {"counts": str(toy.reports("toy_counts", DS))}
    # The next step reads what the runner recorded for the first, with the knob back at its
    # default for its own run.
    assert main(["step", "report", "--pipeline", TOY.name, "--ds", DS]) == 0
    assert json.loads(capsys.readouterr().out) == {"ds": DS, "doubled": 30, "scale": 2}
    assert dict(os.environ) == before
    # An unknown knob is still one clear error.
    assert main(["step", "count", "--pipeline", TOY.name, "--ds", DS, "--param", "x=1"]) == 2
    assert "has no knob x (knobs: scale)" in capsys.readouterr().err


def test_the_generated_dvc_stage_runs_with_its_knob_from_params(
    toy: Lake, capsys: pytest.CaptureFixture[str]
) -> None:
    """The stage's command, with ``${ds}`` and the knob as ``dvc exp run -S
    toy_context.scale=7`` would fill them in, run in process."""
    import json

    from cascade.cli import main

    stages = yaml.safe_load(dvc_yaml([TOY]))["stages"]
    stage = stages["toyctx_count"]
    assert stage["deps"] == [".cascade/lake/landing/toy_numbers/dt=${ds}"]
    assert stage["outs"][0] == ".cascade/lake/reports/toy_counts/dt=${ds}"
    assert stage["params"] == ["ds", "toy_context.scale"]
    assert stages["toyctx_report"]["deps"] == [
        ".cascade/lake/reports/step_toyctx_count/dt=${ds}/summary.json"
    ]
    command = stage["cmd"].replace("${ds}", DS).replace("${toy_context.scale}", "7")
    before = dict(os.environ)
    assert main(shlex.split(command)[1:]) == 0
    assert dict(os.environ) == before
    assert json.loads(capsys.readouterr().out)["counted"] == 21
    metrics = toy.step_summary("toyctx_count", DS).with_name("metrics.json")
    assert json.loads(metrics.read_text()) == {"counted": 21}


def test_the_dag_factory_passes_the_run_its_knob_and_its_run(
    toy: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DAG the factory builds, its tasks called as Airflow calls them: inside a task's
    context whose DAG run params set the knob."""
    from airflow.sdk.execution_time.context import set_current_context

    import cascade.run_report as run_report
    from cascade.dag_factory import build_dag

    def mlflow_down(*args: Any) -> dict[str, Any]:
        raise ConnectionError("no MLflow in this test")

    monkeypatch.setattr(run_report, "log_run_report", mlflow_down)
    dag = build_dag(TOY)
    assert "scale" in dag.params
    run = SimpleNamespace(run_id="manual__2026-11-22T06:00:00", dag_id=TOY.name)
    before = dict(os.environ)
    for scale, expected in ((4, 12), (None, 6)):
        context = {"params": {"ds": DS, "scale": scale}, "dag_run": run}
        context["ti"] = SimpleNamespace(try_number=2, log_url="")
        with set_current_context(context):  # type: ignore[arg-type]
            counted = dag.get_task("count").python_callable(DS)
            reported = dag.get_task("report").python_callable(DS)
        assert counted["counted"] == expected and counted["knob_in_environment"] is False
        assert (counted["dag_run"], counted["try"]) == (run.run_id, 2)
        assert reported["doubled"] == 2 * expected
    assert dict(os.environ) == before


def test_a_catalog_is_checked_and_a_step_reads_only_the_results_it_declares(
    toy: Lake,
) -> None:
    with pytest.raises(ValueError, match=r"inputs \['nope'\] are not in the catalog"):
        Pipeline(
            name="bad",
            description="",
            cron="0 1 * * *",
            steps=(Step(name="a", run=count, inputs=("nope",)),),
        )
    with pytest.raises(ValueError, match=r"reads the results of \['b'\], which are no earlier"):
        Pipeline(
            name="bad",
            description="",
            cron="0 1 * * *",
            steps=(Step(name="a", run=count, reads=("b",)), Step(name="b", run=count)),
        )
    with pytest.raises(ValueError, match="kind 'lakes' is not one of landing"):
        Data(name="x", kind="lakes", key="x")
    with pytest.raises(ValueError, match="are lake paths; declare the data"):
        Step(name="a", run=count, dvc_deps=(".cascade/lake/x/dt=${ds}",))
    ctx = StepContext.build(TOY, "report", DS)
    with pytest.raises(
        StepResultMissing, match="run step 'count' first: `cascade step count --pipeline toy"
    ):
        ctx.result_of("count")
    with pytest.raises(ValueError, match="reads the results of count, not 'report'"):
        ctx.result_of("report")
