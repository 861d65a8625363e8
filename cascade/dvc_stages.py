"""``dvc.yaml`` made from the pipeline specs: one stage per step, chained through the summaries.

    cascade pipelines --write          # regenerate dvc.yaml after adding or changing a pipeline
    dvc repro                          # then run the stages

Stage ``<dvc_prefix><step>`` runs ``cascade step <step> --pipeline <name> --ds ${ds}``, the same
function its Airflow task calls. It depends on the step's code, its catalog inputs and the
summaries of the steps whose results it reads (the previous step's always), and writes its
catalog outputs plus its own summary (uncached), so DVC's graph is the DAG's order. The data
paths are the lake's layout (:meth:`cascade.lake.Lake.partition`) under the lake of
``CASCADE_HOME``, relative to the repository. A test keeps the committed file equal to what
this module makes.

Knobs: a step's :attr:`~cascade.pipeline_spec.Step.params` are the DVC parameters
``<pipeline>.<knob>`` of ``params.yaml`` (written here too: a new knob gets its setting's
default, the values already set are kept); the stage passes each to the step with
``--param knob=${<pipeline>.<knob>}``, so ``dvc exp run -S asr.config=debug`` runs the step with
its settings' ``config`` (``CASCADE_ASR_CONFIG``) set to ``debug``. A step with
:attr:`~cascade.pipeline_spec.Step.metrics` leaves ``metrics.json`` beside its summary, declared
as the stage's metrics (cached, so ``dvc metrics diff`` finds the baseline's values although the
state folder is git-ignored), and its
:attr:`~cascade.pipeline_spec.Step.plots` are the top-level ``plots:`` (``dvc plots show``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from cascade.lake import DS_PLACEHOLDER, Lake
from cascade.pipeline_spec import Pipeline, Plot

HEADER = """\
# Generated from the pipeline specs (pipelines/*.py) by `cascade pipelines --write`; do not
# edit by hand. Stage <prefix><step> runs `cascade step <step> --pipeline <name> --ds ${ds}`,
# the function the Airflow task of the same name calls, with its knobs from params.yaml
# (--param knob=${pipeline.knob}). Every step leaves a summary.json that the next stage depends
# on; steps with metrics leave a metrics.json beside it. Outputs live under the default state
# folder (.cascade/, git-ignored). Run: `dvc repro`; `dvc exp run -S asr.config=debug`;
# `dvc metrics diff`; `dvc plots show`.
"""
PARAMS_HEADER = """\
# Parameters of the reproducible stage graph (dvc.yaml): the partition `ds`, and per pipeline
# its steps' knobs (`<pipeline>.<knob>`, each a CASCADE_* setting; `cascade config` documents
# them). `cascade pipelines --write` adds a new knob with its setting's default and keeps the
# values set here. Change one for a run with `dvc exp run -S asr.config=debug`. An empty value
# leaves the setting to the environment, the settings file or its default.
"""
DEFAULT_DS = "2026-11-22"
DEFAULT_LAKE = Path(".cascade/lake")
"""The lake of the default state folder, relative to the repository (what DVC runs in)."""


def dvc_lake(lake_root: Path, repo: Path) -> Path:
    """The lake as the stages name it: relative to the repository, which must hold it (DVC
    tracks no outputs outside its repository)."""
    try:
        return lake_root.resolve().relative_to(repo.resolve())
    except ValueError:
        raise ValueError(
            f"the lake {lake_root} is outside the repository {repo}: DVC stages cannot write "
            "there; point CASCADE_HOME at a folder inside the repository (default .cascade)"
        ) from None


def summary_out(stage: str, lake: Path = DEFAULT_LAKE) -> str:
    return str(Lake(lake).step_summary(stage, DS_PLACEHOLDER))


def metrics_out(stage: str, lake: Path = DEFAULT_LAKE) -> str:
    """The stage's metrics file, beside its summary (:mod:`cascade.step_runner` writes it)."""
    return summary_out(stage, lake).removesuffix("summary.json") + "metrics.json"


def data_path(spec: Pipeline, name: str, lake: Path = DEFAULT_LAKE) -> str:
    """Where catalog dataset ``name`` of ``spec`` lies, for every partition."""
    return str(spec.data(name).location(Lake(lake), DS_PLACEHOLDER))


def plot_path(spec: Pipeline, plot: Plot, lake: Path = DEFAULT_LAKE) -> str:
    return plot.path or f"{data_path(spec, plot.output, lake)}/{plot.file}"


def command(spec: Pipeline, step_name: str) -> str:
    """The stage's ``cmd``: the step with the partition and its knobs from ``params.yaml``."""
    step = spec.step(step_name)
    knobs = "".join(f" --param {k}=${{{spec.name}.{k}}}" for k in step.params)
    return f"cascade step {step.name} --pipeline {spec.name} --ds ${{ds}}{knobs}"


def stages(spec: Pipeline, lake: Path = DEFAULT_LAKE) -> dict[str, dict[str, Any]]:
    """The pipeline's DVC stages, in step order: each depends on its code, its inputs and the
    summaries of the steps whose results it reads (the previous one's always), and writes its
    outputs and its summary."""
    out: dict[str, dict[str, Any]] = {}
    for step in spec.steps:
        stage = spec.dvc_prefix + step.name
        deps = list(step.dvc_deps)
        deps += [data_path(spec, name, lake) for name in step.inputs]
        deps += [summary_out(spec.dvc_prefix + name, lake) for name in spec.reads_of(step)]
        deps = list(dict.fromkeys(deps))
        outs: list[Any] = []
        for name in step.outputs:
            data, path = spec.data(name), data_path(spec, name, lake)
            flags = {"persist": True} if data.persist else {}
            flags |= {} if data.cache else {"cache": False}
            outs.append({path: flags} if flags else path)
        outs.append({summary_out(stage, lake): {"cache": False}})
        body: dict[str, Any] = {
            "cmd": command(spec, step.name),
            "deps": deps,
            "params": ["ds", *(f"{spec.name}.{knob}" for knob in step.params)],
            "outs": outs,
        }
        if not deps:
            del body["deps"]
        if step.metrics:
            body["metrics"] = [metrics_out(stage, lake)]
        out[stage] = body
    return out


def dvc_yaml(specs: Iterable[Pipeline], lake: Path = DEFAULT_LAKE) -> str:
    """The whole ``dvc.yaml`` text for ``specs`` with their data in ``lake`` (relative to the
    repository); stage names must not collide."""
    specs = list(specs)
    all_stages: dict[str, dict[str, Any]] = {}
    for spec in specs:
        for name, body in stages(spec, lake).items():
            if name in all_stages:
                raise ValueError(
                    f"DVC stage {name!r} of pipeline {spec.name!r} collides with another "
                    "pipeline's; give it a distinct dvc_prefix"
                )
            all_stages[name] = body
    document: dict[str, Any] = {"vars": ["params.yaml"], "stages": all_stages}
    plots = [
        {
            plot_path(spec, plot, lake): {
                "x": plot.x,
                "y": plot.y,
                **({"title": plot.title} if plot.title else {}),
            }
        }
        for spec in specs
        for step in spec.steps
        for plot in step.plots
    ]
    if plots:
        document["plots"] = plots
    return HEADER + yaml.safe_dump(document, sort_keys=False, width=100)


def write_dvc_yaml(path: Path, specs: Iterable[Pipeline], lake: Path = DEFAULT_LAKE) -> bool:
    """Write ``path``; True when its content changed."""
    text = dvc_yaml(specs, lake)
    if path.is_file() and path.read_text() == text:
        return False
    path.write_text(text)
    return True


def _param_value(value: Any) -> Any:
    """A setting's default as ``params.yaml`` writes it (what ``--param`` reads back)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float | str):
        return value
    if isinstance(value, tuple | list):
        return ",".join(str(part) for part in value)
    return str(value)


def knob_defaults(spec: Pipeline) -> dict[str, Any]:
    """The pipeline's knobs with their settings' defaults; a knob naming no setting is an
    error."""
    from cascade.config import all_setting_fields

    fields = {field.env: field for field in all_setting_fields()}
    defaults: dict[str, Any] = {}
    for knob, variable in spec.knobs.items():
        if variable not in fields:
            raise ValueError(
                f"pipeline {spec.name!r}: knob {knob!r} names {variable}, which is no setting "
                "(`cascade config` lists them)"
            )
        defaults[knob] = _param_value(fields[variable].default)
    return defaults


def params_yaml(specs: Iterable[Pipeline], current: str = "") -> str:
    """``params.yaml`` for ``specs``: ``ds`` and every knob, keeping the values ``current`` (the
    file's text) sets for them; knobs no spec has any more are dropped."""
    old = yaml.safe_load(current) if current.strip() else {}
    if not isinstance(old, dict):
        raise ValueError("params.yaml must be a mapping")
    document: dict[str, Any] = {"ds": str(old.get("ds", DEFAULT_DS))}
    for spec in specs:
        knobs = knob_defaults(spec)
        if not knobs:
            continue
        kept = old.get(spec.name) if isinstance(old.get(spec.name), dict) else {}
        document[spec.name] = {knob: kept.get(knob, value) for knob, value in knobs.items()}
    return PARAMS_HEADER + yaml.safe_dump(document, sort_keys=False, width=100)


def write_params_yaml(path: Path, specs: Iterable[Pipeline]) -> bool:
    """Write ``path`` (keeping the values already set); True when its content changed."""
    current = path.read_text() if path.is_file() else ""
    text = params_yaml(specs, current)
    if text == current:
        return False
    path.write_text(text)
    return True
