"""The DVC stage graph and the Airflow DAG run the same steps in the same order."""

from __future__ import annotations

import os

import yaml

from cascade.config import REPO_ROOT
from cascade.steps import STEPS


def dvc_stages() -> dict[str, dict]:
    return yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]


def test_every_step_is_a_dvc_stage_running_the_same_entry_point() -> None:
    stages = dvc_stages()
    assert list(stages) == list(STEPS)
    for name, stage in stages.items():
        assert stage["cmd"] == f"cascade step {name} --ds ${{ds}}"


def test_dvc_stages_chain_in_step_order() -> None:
    stages = dvc_stages()
    names = list(stages)
    for upstream, downstream in zip(names, names[1:], strict=False):
        upstream_outs = {
            next(iter(o)) if isinstance(o, dict) else o for o in stages[upstream]["outs"]
        }
        assert upstream_outs & set(stages[downstream]["deps"]), (
            f"{downstream} does not depend on {upstream}"
        )


def test_dag_tasks_are_the_steps_in_the_same_order(tmp_path) -> None:  # type: ignore[no-untyped-def]
    os.environ["AIRFLOW_HOME"] = str(tmp_path)
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(REPO_ROOT / "dags" / "ctr_preranking.py")).dags["ctr_preranking"]
    order = [t.task_id for t in dag.topological_sort()]
    assert order == ["resolve_partition", *STEPS]
    for upstream, downstream in zip(list(STEPS), list(STEPS)[1:], strict=False):
        assert downstream in dag.get_task(upstream).downstream_task_ids
