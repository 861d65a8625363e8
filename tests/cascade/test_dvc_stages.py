"""DVC knobs, metrics and plots come from the pipeline specs: a step's knobs are parameters of
``params.yaml`` that its stage passes to ``cascade step --param``, its metrics a ``metrics.json``
beside its summary, its plots the top-level ``plots:``. A toy pipeline in a git repository of
its own goes through ``dvc repro``, ``dvc exp run -S`` and ``dvc metrics diff`` (real DVC, no
remote)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from cascade.config import REPO_ROOT
from cascade.dvc_stages import dvc_yaml, params_yaml
from cascade.pipeline_registry import registered_pipelines
from cascade.pipeline_spec import Pipeline, Plot, Step
from cascade.step_runner import knob_environment, step_metrics

PIPELINES = registered_pipelines()


def _noop(ctx: object) -> dict:
    return {"ds": ctx.ds}  # type: ignore[attr-defined]


def _spec(**step: object) -> Pipeline:
    return Pipeline(
        name="knobbed",
        description="knobs",
        cron="0 1 * * *",
        dvc_prefix="k_",
        steps=(Step(name="fit", run=_noop, **step),),  # type: ignore[arg-type]
    )


def test_a_steps_knobs_metrics_and_plots_become_its_stage() -> None:
    spec = _spec(
        params={"days": "CASCADE_PRERANKING_TRAIN_DAYS", "epochs": "CASCADE_PRERANKING_EPOCHS"},
        metrics=("auc",),
        plots=(Plot(path="out/dt=${ds}/curves", x="step", y="loss"),),
    )
    document = yaml.safe_load(dvc_yaml([spec]))
    stage = document["stages"]["k_fit"]
    assert stage["cmd"] == (
        "cascade step fit --pipeline knobbed --ds ${ds} "
        "--param days=${knobbed.days} --param epochs=${knobbed.epochs}"
    )
    assert stage["params"] == ["ds", "knobbed.days", "knobbed.epochs"]
    assert stage["metrics"] == [".cascade/lake/reports/step_k_fit/dt=${ds}/metrics.json"]
    assert document["plots"] == [{"out/dt=${ds}/curves": {"x": "step", "y": "loss"}}]
    # params.yaml: the settings' defaults for new knobs (None -> ''), the values set kept.
    fresh = yaml.safe_load(params_yaml([spec]))
    assert fresh["knobbed"] == {"days": 7, "epochs": ""}
    kept = yaml.safe_load(params_yaml([spec], "ds: '2026-01-02'\nknobbed: {epochs: 7, gone: 1}\n"))
    assert kept == {"ds": "2026-01-02", "knobbed": {"days": 7, "epochs": 7}}


def test_a_knob_must_name_a_setting_and_one_knob_one_setting() -> None:
    with pytest.raises(ValueError, match="CASCADE_NO_SUCH_THING, which is no setting"):
        params_yaml([_spec(params={"x": "CASCADE_NO_SUCH_THING"})])
    with pytest.raises(ValueError, match="must name a CASCADE_"):
        _spec(params={"x": "HOME"})
    with pytest.raises(ValueError, match="one knob, one setting"):
        Pipeline(
            name="clash",
            description="",
            cron="0 1 * * *",
            steps=(
                Step(name="a", run=_noop, params={"c": "CASCADE_ASR_CONFIG"}),
                Step(name="b", run=_noop, params={"c": "CASCADE_MULTIMODAL_CONFIG"}),
            ),
        )


def test_knob_values_become_the_steps_settings_and_metrics_are_the_numbers() -> None:
    step = Step(
        name="fit",
        run=_noop,
        params={"config": "CASCADE_ASR_CONFIG", "twin": "CASCADE_MULTIMODAL_DENSE_TWIN"},
        metrics=("auc", "rows", "flag", "absent"),
    )
    assert knob_environment(step, {"config": " debug ", "twin": "true"}) == {
        "CASCADE_ASR_CONFIG": "debug",
        "CASCADE_MULTIMODAL_DENSE_TWIN": "1",
    }
    assert knob_environment(step, {"config": ""}) == {}  # empty: left to the settings
    with pytest.raises(ValueError, match=r"no knob lr \(knobs: config, twin\)"):
        knob_environment(step, {"lr": "1"})
    summary = {"auc": 0.7, "rows": 3, "flag": True, "run_id": "x"}
    assert step_metrics(step, summary) == {"auc": 0.7, "rows": 3}


def test_committed_params_yaml_holds_every_knob_of_the_specs() -> None:
    committed = (REPO_ROOT / "params.yaml").read_text()
    assert committed == params_yaml(PIPELINES.values(), committed), (
        "params.yaml lacks knobs of the pipeline specs; run `cascade pipelines --write`"
    )
    params = yaml.safe_load(committed)
    stages = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]
    for spec in PIPELINES.values():
        for step in spec.steps:
            for knob in step.params:
                assert knob in params[spec.name]
                assert f"{spec.name}.{knob}" in stages[spec.dvc_prefix + step.name]["params"]


TOY = '''
"""Toy: counts to three times its scale."""
import csv
from typing import ClassVar

from pydantic.dataclasses import dataclass

from cascade.settings_fields import SETTINGS_CONFIG
from cascade.pipeline_spec import Pipeline, Plot, Step

CURVE = ".cascade/lake/reports/toy_curve/dt=${ds}/curve.csv"


@dataclass(kw_only=True, frozen=True, config=SETTINGS_CONFIG)
class ToySettings:
    env_pattern: ClassVar[str] = "CASCADE_TOY_{}"
    title: ClassVar[str] = "Pipeline toy_knobs"

    scale: int = 2
    """How far to count."""


def count(ctx) -> dict:
    ds, scale = ctx.ds, ctx.settings.scale
    out = ctx.lake.reports("toy_curve", ds)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "curve.csv").open("w", newline="") as handle:
        rows = [[step, 1.0 / (step + scale)] for step in range(3)]
        csv.writer(handle).writerows([["step", "loss"], *rows])
    return {"ds": ds, "counted": 3 * scale, "note": "toy"}


PIPELINE = Pipeline(
    name="toy_knobs",
    description=__doc__,
    cron="0 6 * * *",
    settings=ToySettings,
    dvc_prefix="toy_",
    steps=(
        Step(
            name="count",
            run=count,
            dvc_deps=("toy_pipelines",),
            params={"scale": "CASCADE_TOY_SCALE"},
            metrics=("counted",),
            plots=(Plot(path=CURVE, x="step", y="loss"),),
        ),
    ),
)
'''

WRITE = """
from pathlib import Path
from cascade.dvc_stages import dvc_yaml, write_params_yaml
from cascade.pipeline_registry import get_pipeline

spec = get_pipeline("toy_knobs")
Path("dvc.yaml").write_text(dvc_yaml([spec]))
write_params_yaml(Path("params.yaml"), [spec])
"""


def test_dvc_exp_run_sets_a_knob_and_metrics_diff_shows_its_effect(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    package = repo / "toy_pipelines"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "toy.py").write_text(textwrap.dedent(TOY))
    dist = tmp_path / "site" / "toy_pipelines-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-pipelines\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[cascade.pipelines]\ntoy = toy_pipelines.toy\n")
    (repo / ".gitignore").write_text(".cascade/\n")
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
        "PYTHONPATH": os.pathsep.join([str(repo), str(tmp_path / "site"), str(REPO_ROOT)]),
        "CASCADE_HOME": str(repo / ".cascade"),
        "DVC_NO_ANALYTICS": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    env.pop("CASCADE_TOY_SCALE", None)
    dvc = shutil.which("dvc", path=bin_dir) or "dvc"

    def run(*cmd: str) -> str:
        done = subprocess.run(
            cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, f"{cmd}: {done.stdout}\n{done.stderr}"
        return done.stdout

    run(sys.executable, "-c", WRITE)
    stage = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]["toy_count"]
    assert stage["cmd"].endswith("--param scale=${toy_knobs.scale}")
    assert yaml.safe_load((repo / "params.yaml").read_text())["toy_knobs"] == {"scale": 2}
    run("git", "init", "-q")
    run(dvc, "init", "-q")
    run(dvc, "repro", "-q")
    run("git", "add", "-A")
    run("git", "commit", "-qm", "baseline")

    run(dvc, "exp", "run", "-q", "-S", "toy_knobs.scale=5")
    diff = json.loads(run(dvc, "metrics", "diff", "--json"))
    metrics = ".cascade/lake/reports/step_toy_count/dt=2026-11-22/metrics.json"
    assert diff[metrics]["counted"] == {"old": 6, "new": 15, "diff": 9}
    assert yaml.safe_load((repo / "params.yaml").read_text())["toy_knobs"]["scale"] == 5
    # The plot DVC draws (`dvc plots show`) is the curve the step wrote for the experiment.
    curve = repo / ".cascade/lake/reports/toy_curve/dt=2026-11-22/curve.csv"
    assert curve.read_text().splitlines()[1] == "0,0.2"


def test_stage_data_follows_the_lake_it_is_given_and_stays_in_the_repository(
    tmp_path: Path,
) -> None:
    """The stages' data paths come from the catalogs and the lake's layout: another state
    folder inside the repository moves every one of them; one outside it is refused."""
    from cascade.dvc_stages import dvc_lake

    moved = yaml.safe_load(dvc_yaml(PIPELINES.values(), Path("state/lake")))["stages"]
    paths = [
        next(iter(entry)) if isinstance(entry, dict) else entry
        for stage in moved.values()
        for entry in [*stage.get("deps", []), *stage["outs"]]
    ]
    data = [path for path in paths if "dt=${ds}" in path]
    assert data and all(path.startswith("state/lake/") for path in data)
    assert not any(path.startswith(".cascade") for path in paths)
    assert "state/lake/corpora/speech/dt=${ds}" in moved["asr_register"]["deps"]
    assert dvc_lake(tmp_path / "repo" / ".cascade" / "lake", tmp_path / "repo") == Path(
        ".cascade/lake"
    )
    with pytest.raises(ValueError, match="outside the repository"):
        dvc_lake(tmp_path / "elsewhere" / "lake", tmp_path / "repo")
