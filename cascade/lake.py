"""Where data lives in the lake. Every writer keys its output on a partition date (``ds``)."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

TRAINING_PROVENANCE = "training.json"
"""Written beside an engine-built training set's ``data.parquet``: the feature source it was
built from, its days and row counts (the trainer records the source with its run)."""


LAYOUT = {
    "landing": "landing",
    "corpus": "corpora",
    "features": "features",
    "training_set": "training",
    "report": "reports",
    "quarantine": "quarantine",
}
"""The lake's layout: a catalog dataset's kind (:class:`cascade.pipeline_spec.Data`) -> the
folder under the lake root that holds its kind; a dataset is ``<folder>/<key>/dt=<ds>/``."""
DS_PLACEHOLDER = "${ds}"
"""What a partition date is spelled as in paths that stand for every partition (DVC stages)."""


DS_PATTERN = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
"""The one spelling of a partition date: ``YYYY-MM-DD`` (matched whole, ASCII digits only)."""


def check_ds(ds: str) -> str:
    """Validate a partition date, canonical ``YYYY-MM-DD`` only, and return it unchanged.

    ``date.fromisoformat`` alone also takes ``20261122`` and ``2026-W47-1``, which would name
    the same day with another folder (``dt=20261122``); those are refused here."""
    if not isinstance(ds, str) or not DS_PATTERN.fullmatch(ds):
        raise ValueError(f"partition date {ds!r} is not YYYY-MM-DD")
    try:
        dt.date.fromisoformat(ds)
    except ValueError as exc:
        raise ValueError(f"partition date {ds!r} is not a calendar day (YYYY-MM-DD)") from exc
    return ds


@dataclass(frozen=True)
class Lake:
    """Paths under the lake root; nothing here touches the disk."""

    root: Path

    def partition(self, kind: str, key: str, ds: str) -> Path:
        """Partition ``ds`` of the dataset ``key`` of ``kind`` (:data:`LAYOUT`); ``ds`` may be
        :data:`DS_PLACEHOLDER` for a path that stands for every partition."""
        if kind not in LAYOUT:
            raise ValueError(f"no {kind!r} in the lake; one of {', '.join(LAYOUT)}")
        day = ds if ds == DS_PLACEHOLDER else check_ds(ds)
        return self.root / LAYOUT[kind] / key / f"dt={day}"

    def step_summary(self, stage: str, ds: str) -> Path:
        """The summary a step's run leaves (stage = the pipeline's DVC prefix + step name)."""
        return self.partition("report", f"step_{stage}", ds) / "summary.json"

    def ctr_catalogue_root(self, source: str) -> Path:
        """Every partition of the cross-statistics engine's item catalogue of ``source``."""
        return self.root / "features" / "ctr_catalogue" / source

    def ctr_catalogue(self, source: str, ds: str) -> Path:
        """The item catalogue of the engine's partition ``ds`` of ``source`` (outside the pair
        folders, which the feature views read whole)."""
        return self.ctr_catalogue_root(source) / f"dt={check_ds(ds)}"

    def ctr_cross_gate_report(self, source: str, ds: str) -> Path:
        """The verdict of the engine's gate (``jobs.ctr_cross_stats_gate``) on partition ``ds``
        of ``source``: ``{"success": bool, ...}``."""
        return self.reports(f"gx_ctr_cross_{source}", ds) / "report.json"

    def landing(self, dataset: str, ds: str) -> Path:
        """Where a producer lands partition ``ds`` of ``dataset`` for the pipelines to read."""
        return self.partition("landing", dataset, ds)

    def impressions(self, ds: str) -> Path:
        """Labelled impressions (user_id, item_id, genre, event_timestamp, click) for training."""
        return self.root / "impressions" / "ml100k" / f"dt={check_ds(ds)}"

    def quarantine(self, dataset: str, ds: str) -> Path:
        return self.partition("quarantine", dataset, ds)

    def training_set(self, model: str, ds: str) -> Path:
        return self.partition("training_set", model, ds)

    def corpus(self, name: str, ds: str) -> Path:
        return self.partition("corpus", name, ds)

    def reports(self, kind: str, ds: str) -> Path:
        return self.partition("report", kind, ds)

    def data_docs(self, pipeline: str, step: str, ds: str) -> Path:
        """The GX Data Docs site a gate step builds for ``ds`` (``index.html`` inside); the
        task's "Data Docs" link points there."""
        return self.reports("data_docs", ds) / pipeline / step


def dated_partitions(root: Path) -> list[str]:
    """The ``ds`` of every ``dt=YYYY-MM-DD`` folder under ``root`` that holds parquet files,
    oldest first (none when ``root`` does not exist)."""
    if not root.is_dir():
        return []
    days = []
    for folder in root.glob("dt=*"):
        ds = folder.name.removeprefix("dt=")
        if DS_PATTERN.fullmatch(ds) and folder.is_dir() and any(folder.glob("*.parquet")):
            days.append(ds)
    return sorted(days)


def nothing_landed(dataset: str, *markers: str) -> Callable[[str], str | None]:
    """A trigger's check (:attr:`cascade.pipeline_spec.Trigger.unbuildable`): partition ``ds``
    of ``dataset`` cannot be built while its landing folder holds none of ``markers`` (files or
    folders, as the pipeline's first step looks for them)."""
    if not markers:
        raise ValueError(f"nothing_landed({dataset!r}) needs the files a landed batch has")

    def check(ds: str) -> str | None:
        landing = lake_from_settings().landing(dataset, ds)
        if any((landing / marker).exists() for marker in markers):
            return None
        return (
            f"nothing landed for {dataset} ds={ds}: {landing} has no {' or '.join(markers)}; "
            "land the batch there, then publish the event"
        )

    return check


def lake_from_settings() -> Lake:
    from cascade.config import load_settings

    return Lake(load_settings().lake_root)
