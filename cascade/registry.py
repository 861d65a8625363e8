"""MLflow model registry: the client, the aliases and tags every registered model uses.

A new version gets the ``challenger`` alias; :mod:`cascade.promotion` decides whether
``champion`` moves to it, and stores the decision on the version (:data:`DECISION_TAG`) so a
repeated registration returns the same answer. Before ``champion`` moves, the version is
tagged with the champion it replaces (:data:`PREVIOUS_CHAMPION_TAG`), which the rollback of
:mod:`cascade.deployments` follows.

A version's files are data checked against what its registration recorded
(:mod:`cascade.artifacts`): :func:`source_digests` is what a registration step records as
:data:`~cascade.artifacts.DIGESTS_TAG`, :func:`download_verified` is how a loader gets the files
of a version, refused (:class:`~cascade.artifacts.TamperedArtifact`) before any is read when
one changed, went missing or was added.

A version never points at a run's working folders, which a re-run of a step writes again:
registration copies the files it vouches for into the run's content-addressed, write-once
``releases/<digest>/`` (:func:`freeze_release`) and registers that folder.

A version registered from a run's raw artifact folder also gets what MLflow's standard loader
needs (:func:`add_pyfunc_files`: ``MLmodel``, the model's code file, its signature and input
example, a "model from code" that reads the weights as data) before its digests are taken, so
those files are vouched for like the weights.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cascade.artifacts import folder_digests, recorded_digests, verify
from cascade.config import Settings, load_settings
from cascade.lake import Lake

CHAMPION = "champion"
CHALLENGER = "challenger"
DECISION_TAG = "cascade.promotion"
"""Model-version tag holding the decision as JSON, so a repeated call returns the same answer."""
PREVIOUS_CHAMPION_TAG = "cascade.previous_champion"
"""Written before the champion alias moves, so a retry after a crash still knows it."""
REGISTRY_META = "registered_model_meta"
"""A file MLflow adds to a ``models:/`` download (name and version); not part of the model."""


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


def download_source(settings: Settings, source: str, dst: Path) -> Path:
    """The files at registry location ``source`` downloaded under ``dst`` (without the
    :data:`REGISTRY_META` file MLflow adds); returns their folder."""
    import mlflow.artifacts

    local = Path(
        mlflow.artifacts.download_artifacts(
            artifact_uri=source, dst_path=str(dst), tracking_uri=settings.tracking_uri
        )
    )
    (local / REGISTRY_META).unlink(missing_ok=True)
    return local


def source_digests(settings: Settings, source: str) -> dict[str, str]:
    """What a registration records for the version it creates from ``source``: the sha256 of
    every file of the registry's own copy (a path relative to ``source`` -> hex digest)."""
    with tempfile.TemporaryDirectory(prefix="cascade-register-") as tmp:
        return folder_digests(download_source(settings, source, Path(tmp)))


MLMODEL = "MLmodel"


def add_pyfunc_files(
    settings: Settings, run_id: str, artifact_path: str, save: Callable[[Path], None]
) -> bool:
    """Log the files of an MLflow pyfunc beside the model files of run ``run_id`` at
    ``artifact_path`` unless an :data:`MLMODEL` is there already (so a repeated registration
    leaves the registered files as they were); True when it added them.

    ``save(folder)`` writes the pyfunc into the new folder ``folder`` (``mlflow.pyfunc.save_model``
    with a code file); a file of the same name as one of the model's is refused, not replaced."""
    client = registry_client_of(settings)
    present = {Path(a.path).name for a in client.list_artifacts(run_id, artifact_path)}
    if MLMODEL in present:
        return False
    with tempfile.TemporaryDirectory(prefix="cascade-pyfunc-") as tmp:
        folder = Path(tmp) / "pyfunc"
        save(folder)
        written = {p.name for p in folder.iterdir()}
        if clash := sorted(written & present):
            raise ValueError(
                f"the pyfunc files {clash} would replace model files of run {run_id} "
                f"({artifact_path}); not added"
            )
        if MLMODEL not in written:
            raise ValueError(f"saving the pyfunc of run {run_id} wrote no {MLMODEL}")
        client.log_artifacts(run_id, str(folder), artifact_path)
    return True


def recorded_version_digests(settings: Settings, name: str, version: str) -> dict[str, str]:
    """The digests version ``version`` of ``name`` recorded at registration; raises
    :class:`~cascade.artifacts.TamperedArtifact` when it records none."""
    client = registry_client_of(settings)
    return recorded_digests(client.get_model_version(name, version).tags, f"{name} v{version}")


def registry_client_of(settings: Settings) -> Any:
    """A client on the settings' store that leaves MLflow's process-wide URIs alone."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=settings.tracking_uri, registry_uri=settings.tracking_uri)


def download_verified(
    settings: Settings,
    name: str,
    version: str,
    dst: Path,
    *,
    expected: Mapping[str, str] | None = None,
) -> Path:
    """The files of version ``version`` of ``name``, downloaded under ``dst`` from where the
    settings' registry keeps them (a ``models:/`` URI would resolve in MLflow's process-wide
    registry, which may be another store) and checked against the digests recorded at
    registration (``expected``, else the version's tag) before anything reads them.

    Raises :class:`~cascade.artifacts.TamperedArtifact` (the files stay under ``dst`` for
    the caller to delete) when the version records no digests or a file differs."""
    what = f"{name} v{version}"
    client = registry_client_of(settings)
    if expected is None:
        expected = recorded_digests(client.get_model_version(name, version).tags, what)
    location = client.get_model_version_download_uri(name, version)
    local = download_source(settings, location, dst)
    verify(local, expected, what)
    return local


RELEASES_DIR = "releases"
"""Run artifact folder of the content-addressed copies registered versions point at."""


def release_id(digests: Mapping[str, str]) -> str:
    """The content address of a set of files: sha256 of their sorted ``path: sha256`` list."""
    listing = json.dumps(dict(sorted(digests.items())), separators=(",", ":"))
    return hashlib.sha256(listing.encode()).hexdigest()[:32]


def freeze_release(
    settings: Settings, run_id: str, parts: Mapping[str, str]
) -> tuple[str, dict[str, str]]:
    """Copy the files at the registry locations ``parts`` (a folder of the release -> the
    location its files come from; ``""``: the release's top) into run ``run_id``'s
    ``releases/<digest>/``, once; returns that folder's location and its files' digests.

    The digests are of the copies downloaded here, which are what is uploaded: a step that
    writes the run's working folders again (a re-run of compile) changes no registered
    release, and a release folder that exists already (the same content) is not written."""
    client = registry_client_of(settings)
    with tempfile.TemporaryDirectory(prefix="cascade-release-") as tmp:
        release = Path(tmp) / "release"
        for index, (folder, location) in enumerate(sorted(parts.items())):
            local = download_source(settings, location, Path(tmp) / f"part{index}")
            target = release / folder if folder else release
            if local.is_file():
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(local, target / local.name)
            else:
                shutil.copytree(local, target, dirs_exist_ok=True)
        digests = folder_digests(release)
        path = f"{RELEASES_DIR}/{release_id(digests)}"
        if not client.list_artifacts(run_id, path):
            client.log_artifacts(run_id, str(release), path)
    return f"{client.get_run(run_id).info.artifact_uri}/{path}", digests
