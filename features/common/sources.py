"""Batch sources of the CTR feature views, one per lake view folder.

Each source reads ONE partition, ``<lake>/features/ctr/<view>/dt=<ds>/``, never the whole view
folder: every daily run of the Spark job writes a complete cumulative recompute, so reading all
``dt=`` folders would repeat every snapshot row once per run (rows with equal timestamps, whose
tie Feast breaks arbitrarily), grow without bound, and let a backfill of an old ``ds`` see
partitions written after it. ``cascade.feature_store`` builds the sources for the ``ds`` it
applies; the module-level sources below (what ``feast apply`` picks up) read the newest
partition present, under the lake of the active settings (so ``CASCADE_HOME`` moves them).
"""

from __future__ import annotations

from pathlib import Path

from feast import FileSource
from feast.data_format import ParquetFormat
from feast.data_source import DataSource
from feast.infra.offline_stores.contrib.spark_offline_store.spark_source import SparkSource

from cascade.config import Settings, load_settings
from cascade.ctr_schema import TIMESTAMP
from cascade.lake import CTR_VIEWS, Lake


def newest_partition(lake: Lake, view: str) -> str | None:
    """The newest ``ds`` with a ``dt=<ds>`` folder for ``view``, or None when there is none."""
    root = lake.ctr_view_root(view)
    if not root.is_dir():
        return None
    dates = sorted(p.name.removeprefix("dt=") for p in root.glob("dt=*") if p.is_dir())
    return dates[-1] if dates else None


def ctr_source(view: str, *, settings: Settings, ds: str | None) -> DataSource:
    """The batch source of one CTR view: partition ``ds``, or the view folder when ds is None.

    The ``local`` profile reads parquet through Feast's file (dask) offline store; the
    ``cluster`` profile needs a ``SparkSource`` because the Spark offline store accepts no other.
    """
    lake = Lake(settings.lake_root)
    path: Path = lake.ctr_features(view, ds) if ds else lake.ctr_view_root(view)
    name = f"ctr_{view}"
    if settings.profile == "cluster":
        return SparkSource(
            name=name, path=str(path), file_format="parquet", timestamp_field=TIMESTAMP
        )
    return FileSource(
        name=name, path=str(path), file_format=ParquetFormat(), timestamp_field=TIMESTAMP
    )


def ctr_sources(settings: Settings, ds: str | None) -> dict[str, DataSource]:
    """The sources of all CTR views (keyed by lake view name) for one partition."""
    return {view: ctr_source(view, settings=settings, ds=ds) for view in CTR_VIEWS}


_settings = load_settings()
_lake = Lake(_settings.lake_root)
user_source = ctr_source("user", settings=_settings, ds=newest_partition(_lake, "user"))
item_source = ctr_source("item", settings=_settings, ds=newest_partition(_lake, "item"))
user_genre_source = ctr_source(
    "user_genre", settings=_settings, ds=newest_partition(_lake, "user_genre")
)
