"""MLflow model registry: the client, the aliases and tags every registered model uses.

A new version gets the ``challenger`` alias; :mod:`cascade.promotion` decides whether
``champion`` moves to it, and stores the decision on the version (:data:`DECISION_TAG`) so a
repeated registration returns the same answer. Before ``champion`` moves, the version is
tagged with the champion it replaces (:data:`PREVIOUS_CHAMPION_TAG`), which the rollback of
:mod:`cascade.deployments` follows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cascade.config import Settings, load_settings
from cascade.lake import Lake

CHAMPION = "champion"
CHALLENGER = "challenger"
DECISION_TAG = "cascade.promotion"
"""Model-version tag holding the decision as JSON, so a repeated call returns the same answer."""
PREVIOUS_CHAMPION_TAG = "cascade.previous_champion"
"""Written before the champion alias moves, so a retry after a crash still knows it."""


def version_by_alias(client: Any, name: str, alias: str) -> Any | None:
    """The ``ModelVersion`` behind ``name@alias``, or None if the model or alias does not exist."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        # Both "no such registered model" and "no such alias" mean: nothing there yet.
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None
        raise


def registry_client(settings: Settings) -> Any:
    """A client on the settings' tracking + registry store (also made the global URIs: the
    registry store resolves a models:/m-<id> source through the global tracking URI)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from cascade.tracking_auth import use_tracking_credentials

    use_tracking_credentials(settings)
    uri = settings.tracking_uri
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def ensure_registered_model(client: Any, name: str, description: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name, description=description)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise


def version_of_run(client: Any, name: str, run_id: str) -> tuple[Any | None, dict | None]:
    """The version already registered from ``run_id`` (newest) and its stored decision, so a
    repeated registration returns the first answer instead of registering twice."""
    existing = client.search_model_versions(f"name='{name}' and run_id='{run_id}'")
    if not existing:
        return None, None
    version = max(existing, key=lambda v: int(v.version))
    stored = version.tags.get(DECISION_TAG)
    return version, None if stored is None else json.loads(stored)


def registry_report_path(ds: str, settings: Settings | None = None) -> Path:
    """Where the pre-ranker's register step writes its decision for ``ds``."""
    settings = settings or load_settings()
    return Lake(settings.lake_root).reports("register", ds) / "result.json"
