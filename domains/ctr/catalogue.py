"""The cross-statistics engine's item catalogue in the lake, and which partition a reader takes.

Every partition ``ds`` of the engine (``jobs.ctr_cross_stats``) of a log source writes the
items of its clean rows (``item_id``, ``item_category`` at the item's newest impression,
``impressions``, ``last_seen``) under :meth:`cascade.lake.Lake.ctr_catalogue`; its gate writes
a verdict under :meth:`cascade.lake.Lake.ctr_cross_gate_report`. A partition is published when
that verdict says ``"success": true``. Here only paths, the verdict and a pandas read: no
Spark, so the server and the jobs share one definition.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd

from cascade.lake import Lake, dated_partitions

log = logging.getLogger(__name__)

CATALOGUE_COLUMNS = ("item_id", "item_category")
"""The columns a server reads of a catalogue: the ids and the category its requests key by."""


def gate_passed(report: Path) -> bool:
    """Whether the gate's ``report.json`` exists and says ``"success": true``."""
    return report.is_file() and bool(json.loads(report.read_text()).get("success"))


def catalogue_partitions(lake: Lake, source: str) -> list[str]:
    """The partition dates of ``source``'s catalogue that hold parquet files, oldest first."""
    return dated_partitions(lake.ctr_catalogue_root(source))


def newest_published(lake: Lake, source: str) -> str | None:
    """The newest partition of ``source`` whose catalogue was written and whose gate passed;
    None when there is none (a partition whose gate failed, or has no verdict, is skipped)."""
    for ds in reversed(catalogue_partitions(lake, source)):
        if gate_passed(lake.ctr_cross_gate_report(source, ds)):
            return ds
    return None


def read_newest_catalogue(lake: Lake, source: str) -> tuple[str, pd.DataFrame] | None:
    """``(ds, frame)`` of :func:`newest_published`: one row per item, the columns
    :data:`CATALOGUE_COLUMNS` (``item_id`` int64, ``item_category`` string or None); None when
    no partition is published."""
    ds = newest_published(lake, source)
    if ds is None:
        return None
    frame = pd.read_parquet(lake.ctr_catalogue(source, ds), columns=list(CATALOGUE_COLUMNS))
    frame = frame[frame["item_id"].notna()].drop_duplicates("item_id", keep="last")
    frame["item_id"] = frame["item_id"].astype("int64")
    category = frame["item_category"]
    frame["item_category"] = category.astype(object).where(category.notna(), None)
    return ds, frame.reset_index(drop=True)
