"""``dvc.yaml`` made from the pipeline specs: one stage per step, chained through the summaries.

    cascade pipelines --write          # regenerate dvc.yaml after adding or changing a pipeline
    dvc repro                          # then run the stages

Stage ``<dvc_prefix><step>`` runs ``cascade step <step> --pipeline <name> --ds ${ds}``, the same
function its Airflow task calls. It depends on the step's declared paths and on the previous
step's summary, and writes its declared outputs plus its own summary (uncached), so DVC's graph
is the DAG's order. A test keeps the committed file equal to what this module makes.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from cascade.pipeline_spec import Pipeline

HEADER = """\
# Generated from the pipeline specs (pipelines/*.py) by `cascade pipelines --write`; do not
# edit by hand. Stage <prefix><step> runs `cascade step <step> --pipeline <name> --ds ${ds}`,
# the function the Airflow task of the same name calls. Every step leaves a summary.json that
# the next stage depends on. Outputs live under the default state folder (.cascade/,
# git-ignored). Run: `dvc repro`.
"""
SUMMARY = ".cascade/lake/reports/step_{stage}/dt=${{ds}}/summary.json"


def summary_out(stage: str) -> str:
    return SUMMARY.format(stage=stage)


def stages(spec: Pipeline) -> dict[str, dict[str, Any]]:
    """The pipeline's DVC stages, in step order."""
    out: dict[str, dict[str, Any]] = {}
    previous: str | None = None
    for step in spec.steps:
        stage = spec.dvc_prefix + step.name
        deps = list(step.dvc_deps)
        if previous is not None:
            deps.append(summary_out(previous))
        outs: list[Any] = list(step.dvc_outs)
        outs += [{path: {"persist": True}} for path in step.dvc_persistent_outs]
        outs.append({summary_out(stage): {"cache": False}})
        body: dict[str, Any] = {
            "cmd": f"cascade step {step.name} --pipeline {spec.name} --ds ${{ds}}",
            "deps": deps,
            "params": ["ds"],
            "outs": outs,
        }
        if not deps:
            del body["deps"]
        out[stage] = body
        previous = stage
    return out


def dvc_yaml(specs: Iterable[Pipeline]) -> str:
    """The whole ``dvc.yaml`` text for ``specs``; stage names must not collide."""
    all_stages: dict[str, dict[str, Any]] = {}
    for spec in specs:
        for name, body in stages(spec).items():
            if name in all_stages:
                raise ValueError(
                    f"DVC stage {name!r} of pipeline {spec.name!r} collides with another "
                    "pipeline's; give it a distinct dvc_prefix"
                )
            all_stages[name] = body
    document = {"vars": ["params.yaml"], "stages": all_stages}
    return HEADER + yaml.safe_dump(document, sort_keys=False, width=100)


def write_dvc_yaml(path: Path, specs: Iterable[Pipeline]) -> bool:
    """Write ``path``; True when its content changed."""
    text = dvc_yaml(specs)
    if path.is_file() and path.read_text() == text:
        return False
    path.write_text(text)
    return True
