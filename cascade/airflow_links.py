"""Extra links on every step task of the generated DAGs (buttons on the task's page).

Airflow 3 computes an operator's extra links on the worker when the task ends and stores each
as an XCom; the UI reads them back by name. Each link here reads the task's own result, where
the task wrapper put the step's :func:`cascade.step_links.step_links` under ``links``.
Imported only by :mod:`cascade.dag_factory`, inside DAG building (Airflow is imported here).
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperatorLink

from cascade.step_links import DATA_DOCS, MLFLOW_RUN, MODEL_VERSION, RUN_REPORT, file_link


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


class RunReportLink(BaseOperatorLink):
    name = RUN_REPORT

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return _from_result(ti_key, RUN_REPORT)


class DataDocsLink(BaseOperatorLink):
    """A gate's Data Docs. A gate that refuses its batch fails its task, so there is no result
    to read: the link is found from the run's partition (``resolve_partition``'s result) and
    the place every gate step renders its pages (:meth:`cascade.lake.Lake.data_docs`)."""

    name = DATA_DOCS

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        try:
            ds = ti_key.xcom_pull(task_ids="resolve_partition", key="return_value")
            from cascade.config import load_settings
            from cascade.lake import Lake

            folder = Lake(load_settings().lake_root).data_docs(ti_key.dag_id, ti_key.task_id, ds)
        except Exception:  # no partition (the run failed before): no link
            return ""
        return file_link(folder / "index.html")


STEP_LINKS = (MlflowRunLink(), ModelVersionLink())


def step_links_of(*, data_docs: bool, last: bool) -> tuple[BaseOperatorLink, ...]:
    """The extra links of a step's task: every step's, a gate's Data Docs, and the run report
    on the pipeline's last step."""
    return (
        *STEP_LINKS,
        *((DataDocsLink(),) if data_docs else ()),
        *((RunReportLink(),) if last else ()),
    )
