"""The DVC stage graph and the Airflow DAGs run the same steps in the same order."""

from __future__ import annotations

import os

import pytest
import yaml

from cascade.config import REPO_ROOT
from cascade.steps import DVC_PREFIX, PIPELINES


def dvc_stages(pipeline: str) -> dict[str, dict]:
    """The pipeline's stages (in file order) under their step names."""
    prefix = DVC_PREFIX[pipeline]
    stages = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]
    return {
        name[len(prefix) :]: stage
        for name, stage in stages.items()
        if name.startswith(prefix)
        and (prefix or not any(name.startswith(p) for p in DVC_PREFIX.values() if p))
    }


@pytest.mark.parametrize("pipeline", list(PIPELINES))
def test_every_step_is_a_dvc_stage_running_the_same_entry_point(pipeline: str) -> None:
    stages = dvc_stages(pipeline)
    assert list(stages) == list(PIPELINES[pipeline])
    flag = "" if pipeline == "ctr_preranking" else f" --pipeline {pipeline}"
    for name, stage in stages.items():
        assert stage["cmd"] == f"cascade step {name}{flag} --ds ${{ds}}"


@pytest.mark.parametrize("pipeline", list(PIPELINES))
def test_dvc_stages_chain_in_step_order(pipeline: str) -> None:
    stages = dvc_stages(pipeline)
    names = list(stages)
    for upstream, downstream in zip(names, names[1:], strict=False):
        upstream_outs = {
            next(iter(o)) if isinstance(o, dict) else o for o in stages[upstream]["outs"]
        }
        assert upstream_outs & set(stages[downstream]["deps"]), (
            f"{downstream} does not depend on {upstream}"
        )


@pytest.mark.parametrize("pipeline", list(PIPELINES))
def test_dag_tasks_are_the_steps_in_the_same_order(tmp_path, pipeline: str) -> None:  # type: ignore[no-untyped-def]
    os.environ["AIRFLOW_HOME"] = str(tmp_path)
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(REPO_ROOT / "dags" / f"{pipeline}.py")).dags[pipeline]
    steps = list(PIPELINES[pipeline])
    order = [t.task_id for t in dag.topological_sort()]
    assert order == ["resolve_partition", *steps]
    for upstream, downstream in zip(steps, steps[1:], strict=False):
        assert downstream in dag.get_task(upstream).downstream_task_ids
