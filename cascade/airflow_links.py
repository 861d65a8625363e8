"""Extra links on every step task of the generated DAGs (buttons on the task's page).

Airflow 3 computes an operator's extra links on the worker when the task ends and stores each
as an XCom; the UI reads them back by name. Each link here reads the task's own result, where
the task wrapper put the step's :func:`cascade.step_links.step_links` under ``links``.
Imported only by :mod:`cascade.dag_factory`, inside DAG building (Airflow is imported here).
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperatorLink

from cascade.step_links import MLFLOW_RUN, MODEL_VERSION


def _from_result(ti_key: Any, name: str) -> str:
    try:
        result = ti_key.xcom_pull(task_ids=ti_key.task_id, key="return_value")
    except Exception:  # no result (a failed task): no link, never a failed finalizer
        return ""
    links = result.get("links") if isinstance(result, dict) else None
    return str(links.get(name, "")) if isinstance(links, dict) else ""


class MlflowRunLink(BaseOperatorLink):
    name = MLFLOW_RUN

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return _from_result(ti_key, MLFLOW_RUN)


class ModelVersionLink(BaseOperatorLink):
    name = MODEL_VERSION

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return _from_result(ti_key, MODEL_VERSION)


STEP_LINKS = (MlflowRunLink(), ModelVersionLink())
