"""Where a step's outputs can be looked at: MLflow's run page and model version page.

The Airflow task of a step returns them under ``links`` beside the step's summary, and each
task carries extra links of the same names (:mod:`cascade.airflow_links`), so the task's page in
the Airflow UI has one button per link.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

MLFLOW_RUN = "MLflow run"
MODEL_VERSION = "Model version"
LINK_NAMES = (MLFLOW_RUN, MODEL_VERSION)
"""The links of every step task."""
DATA_DOCS = "Data Docs"
"""A gate step's GX Data Docs (a ``file://`` link: no server serves the lake)."""
RUN_REPORT = "Run report"
"""The pipeline run's report in MLflow, on the task of the pipeline's last step."""


def _id(value: Any, *, max_len: int = 64) -> str | None:
    """``value`` if it looks like an id a URL may carry (letters, digits, ``-``/``_``)."""
    text = str(value) if isinstance(value, str | int) and not isinstance(value, bool) else ""
    if 0 < len(text) <= max_len and text.replace("-", "").replace("_", "").isalnum():
        return text
    return None


def step_links(
    result: Mapping[str, Any], tracking_uri: str, registered_model: str | None
) -> dict[str, str]:
    """The links a step's summary supports: the MLflow run it names (``run_id``) and the model
    version it registered (``version``, of ``registered_model``); none for a tracking store
    that is not a web server."""
    if urlparse(tracking_uri).scheme not in ("http", "https"):
        return {}
    base = tracking_uri.rstrip("/")
    links = {}
    run_id = _id(result.get("run_id"))
    if run_id:
        links[MLFLOW_RUN] = f"{base}/#/runs/{run_id}"
    version = _id(result.get("version"), max_len=12)
    if registered_model and version and version.isdigit():
        links[MODEL_VERSION] = f"{base}/#/models/{quote(registered_model)}/versions/{version}"
    return links


def file_link(path: Path) -> str:
    """``file://`` URL of ``path`` when the file is there, else no link."""
    return path.resolve().as_uri() if path.is_file() else ""
