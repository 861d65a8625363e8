"""Where the pre-ranking server's models and features come from (:class:`Backends`: the
MLflow registry and the Feast online store by default, fakes in tests), and how it tells a
busy online store from a broken one (:func:`is_lock_timeout`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pandas as pd
import torch
from kserve.errors import ModelNotReady

from cascade.config import Settings
from serving.item_table import lake_item_catalogue
from serving.online_fields import CrossReader


class ChampionModel(Protocol):
    """What the server needs of ``models.preranking.inference.LoadedModel`` (read-only)."""

    @property
    def model(self) -> torch.nn.Module: ...
    @property
    def version(self) -> str: ...
    @property
    def run_id(self) -> str: ...


LOCK_MESSAGES = ("database is locked", "database table is locked", "database is busy")
"""SQLite's answers to a read that waited out its busy timeout behind a writer."""


class FeatureStoreBusy(ModelNotReady):
    """The online store was locked or timed out: 503, counted apart from the model's errors
    (a rollback would not bring the store back)."""

    def __init__(self, model_name: str) -> None:
        super().__init__(model_name)
        self.error_msg = (
            f"the feature store did not answer in time for {model_name} (locked or timed "
            "out); retry shortly"
        )


def is_lock_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) says the online store was busy,
    not broken: SQLite's "database is locked" (a materialization held the write lock past the
    reader's busy timeout), or any client's timeout (a builtin TimeoutError, or a class named
    ``TimeoutError`` such as Redis')."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, TimeoutError) or type(current).__name__ == "TimeoutError":
            return True
        if isinstance(current, sqlite3.OperationalError):
            message = str(current).lower()
            if any(text in message for text in LOCK_MESSAGES):
                return True
        current = current.__cause__ or current.__context__
    return False


class VersionNotServable(ValueError):
    """A registered version the server cannot serve: not one trained on the cross-statistics
    engine's training set. The message names the version and what to do."""


@dataclass(kw_only=True)
class Backends:
    """Where models and features come from: MLflow and Feast by default, fakes in tests."""

    champion_version: Callable[[Settings, str], str | None]
    """``(settings, alias) -> version`` of the alias in the registry, None if unset."""
    load_champion: Callable[[Settings, str], ChampionModel | None]
    """``(settings, alias) -> LoadedModel`` of the alias, None if unset."""
    version_source: Callable[[Settings, str], str | None]
    """``(settings, run_id) -> source`` of the cross-statistics engine whose training set the
    version's run trained on (its run param ``cross_source``); None: the run names none, and
    the version is not served."""
    open_cross_reader: Callable[[Settings], CrossReader | None] = lambda settings: None
    """``settings -> reader`` of the online store's cross views (a version's fields it serves
    are read per request, :mod:`serving.online_fields`); None: every field beyond the ids
    comes with the request."""
    item_catalogue: Callable[[Settings, str], pd.DataFrame | None] = lake_item_catalogue
    """``(settings, source) -> frame`` of ``item_id``, ``item_category``: the engine's newest
    published item catalogue of the source, None when there is none; a version's item
    table."""
    version_record: Callable[[Settings, str], str | None] = lambda settings, version: None
    """``(settings, version) -> digest`` of the version's registry record (its tags: the
    signed release, the file digests): a version refused with one record is not fetched
    again until the record changes (a new signature) or the alias moves. None: the version
    number alone keys the refusal."""


def default_backends() -> Backends:
    """MLflow registry + Feast online store; imported lazily so tests never need them."""
    from domains.ctr.feature_store import feature_store
    from domains.ctr.online_cross import OnlineCrossReader
    from models.preranking.inference import run_cross_source

    return registry_backends(
        version_source=run_cross_source,
        open_cross_reader=lambda settings: OnlineCrossReader(feature_store(settings)),
        item_catalogue=lake_item_catalogue,
    )


def registry_backends(**rest: Any) -> Backends:
    """The MLflow registry's aliases and its signature-checking loader
    (:func:`models.preranking.inference.load_registered`, with the compiled package), the other
    backends as given."""
    from models.preranking.inference import alias_version, load_registered, version_record

    return Backends(
        champion_version=lambda settings, alias: alias_version(settings, alias=alias),
        load_champion=lambda settings, alias: load_registered(
            settings, alias=alias, with_package=True
        ),
        **{"version_record": version_record, **rest},
    )
