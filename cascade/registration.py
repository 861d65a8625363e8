"""Registering a trained model: the one path every model's register step takes.

A model says what a new version of it holds through its packaging hook (:data:`Packaging`:
the run's files it registers, the tags the version carries); :func:`register_model` does the
rest, the same for every model:

1. opens the registry (:func:`cascade.registry.registry_client`: also the process-wide URIs and
   the tracking credentials the hook's MLflow calls use);
2. calls the hook, which may first add files to the run (:func:`pyfunc_folder`: what MLflow's
   standard loader needs) and names where the version's files come from;
3. copies those files into the run's write-once release (:func:`cascade.registry.freeze_release`)
   and records their digests as :data:`~cascade.artifacts.DIGESTS_TAG`;
4. refuses files the compile gate did not test, byte for byte, when there is a compile gate
   (:func:`cascade.signing.check_tested`);
5. registers the version and puts it through the promotion gate
   (:func:`cascade.promotion.register_and_promote`), signed with the platform's key.

So a model's registration module holds only what is its own: how the two versions are scored,
what the decision's report adds, and its packaging hook.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cascade.artifacts import DIGESTS_TAG, digests_tag
from cascade.config import Settings
from cascade.pipeline_spec import Promotion
from cascade.promotion import Baseline, Decision, NewVersion, Score, register_and_promote
from cascade.registry import add_pyfunc_files, freeze_release, registry_client, registry_client_of
from cascade.signing import check_tested, load_signing_key


@dataclass(frozen=True, kw_only=True)
class Package:
    """What a new version holds: its files and its tags."""

    parts: Mapping[str, str]
    """A folder of the release -> the registry location its files are copied from (``""``: the
    release's top), as :func:`cascade.registry.freeze_release` takes them."""
    tags: Mapping[str, str]
    """The version's tags (partition, training run, the figure it is known by); the digests tag
    is added by :func:`register_model`."""


Packaging = Callable[[Settings, str], Package]
"""A model's packaging hook: ``(settings, run_id) -> Package`` for the training run
``run_id``."""


def pyfunc_folder(
    settings: Settings, run_id: str, artifact_path: str, save: Callable[[Path], None]
) -> str:
    """The registry location of run ``run_id``'s folder ``artifact_path``, once it holds the
    files of an MLflow pyfunc beside the model's (``save``, see
    :func:`cascade.registry.add_pyfunc_files`), so a version registered from it loads the
    standard way too and its digests vouch for those files like the weights."""
    location = f"{registry_client_of(settings).get_run(run_id).info.artifact_uri}/{artifact_path}"
    add_pyfunc_files(settings, run_id, artifact_path, save)
    return location


def register_model(
    settings: Settings,
    *,
    name: str,
    model_description: str,
    run_id: str,
    description: str,
    package: Packaging,
    promotion: Promotion,
    score: Score,
    compile_gate: Mapping[str, Any] | None,
    report: Callable[[Decision], dict[str, Any]],
    baseline: Baseline | None = None,
) -> dict[str, Any]:
    """Register training run ``run_id`` as a new version of ``name`` (once; see the module's
    docstring) and return ``report`` of the promotion gate's decision.

    ``model_description`` describes the registered model when it is created, ``description``
    the version. ``score``, ``compile_gate``, ``report`` and ``baseline`` are the promotion
    gate's (:func:`cascade.promotion.register_and_promote`); a compile gate's ``tested`` files
    (``{path in the release: sha256}``) must be the release's."""
    client = registry_client(settings)
    packaged = package(settings, run_id)
    # What the registry holds now is what every later load must find (cascade.artifacts).
    # The registered version is a write-once copy: a re-run of a step rewrites the run's
    # working folders, never a registered release.
    source, files = freeze_release(settings, run_id, packaged.parts)
    if compile_gate is not None:
        check_tested(files, compile_gate.get("tested") or {}, f"{name} run {run_id}")
    return register_and_promote(
        client,
        NewVersion(
            name=name,
            model_description=model_description,
            run_id=run_id,
            source=source,
            tags={**packaged.tags, DIGESTS_TAG: digests_tag(files)},
            description=description,
        ),
        promotion=promotion,
        score=score,
        compile_gate=compile_gate,
        report=report,
        baseline=baseline,
        signing_key=load_signing_key(settings.home, create=True),
        settings=settings,
    )
