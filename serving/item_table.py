"""The catalogue's items held in memory by the pre-ranking server, one table per served model
version (their genres, and the item fields read once when the version loads), and the catalogue
itself: the cross-statistics engine's newest published item catalogue of a source
(:func:`lake_item_catalogue`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from cascade.config import Settings
from cascade.lake import Lake
from domains.ctr.catalogue import read_newest_catalogue
from domains.ctr.schema import ITEM_GENRE

log = logging.getLogger(__name__)


def lake_item_catalogue(settings: Settings, source: str) -> pd.DataFrame | None:
    """The engine's item catalogue of ``source``: ``item_id``, ``item_category`` of its newest
    partition whose gate passed (:func:`domains.ctr.catalogue.read_newest_catalogue`); None when
    the lake has none."""
    lake = Lake(settings.lake_root)
    found = read_newest_catalogue(lake, source)
    if found is None:
        return None
    ds, frame = found
    log.info(
        "item catalogue of %s: partition %s, %d items (%s)",
        source,
        ds,
        len(frame),
        lake.ctr_catalogue(source, ds),
    )
    return frame


@dataclass(frozen=True, kw_only=True)
class ItemTable:
    """In-memory item fields: row ``i`` belongs to ``ids[i]``."""

    ids: pd.Index
    """Item ids, unique."""
    dense: np.ndarray
    """``[M, len(columns)]`` numbers (float64 for values read from the online store, as the
    scorer encodes them), NaN where unknown."""
    genre_codes: np.ndarray
    """int64 ``[M]``: index into ``genres``, -1 where the genre is unknown."""
    genres: tuple[str, ...]
    """Distinct genres."""
    columns: tuple[str, ...] = ()
    """The field name of each column of ``dense``."""

    def __post_init__(self) -> None:
        if self.dense.shape != (len(self.ids), len(self.columns)):
            raise ValueError(
                f"item table of {len(self.ids)} ids and columns {list(self.columns)} holds "
                f"values of shape {self.dense.shape}"
            )

    @classmethod
    def from_frame(cls, frame: pd.DataFrame, columns: Sequence[str] = ()) -> ItemTable:
        """Build from a frame indexed by item_id with ITEM_GENRE and the numeric ``columns``
        (stored as float32; NaN where not a number)."""
        columns = tuple(columns)
        missing = [c for c in (*columns, ITEM_GENRE) if c not in frame.columns]
        if missing:
            raise ValueError(
                f"the item frame lacks columns {missing}; it needs {[*columns, ITEM_GENRE]}"
            )
        frame = frame[~frame.index.duplicated(keep="last")]
        dense = (
            frame[list(columns)]
            .apply(pd.to_numeric, errors="coerce")
            .to_numpy(dtype=np.float32, na_value=np.nan)
        )
        genre = frame[ITEM_GENRE].where(frame[ITEM_GENRE].notna(), None)
        codes, uniques = pd.factorize(genre, use_na_sentinel=True)
        return cls(
            ids=pd.Index(frame.index.astype(np.int64)),
            dense=dense.reshape(len(frame), len(columns)),
            genre_codes=codes.astype(np.int64),
            genres=tuple(str(g) for g in uniques),
            columns=columns,
        )

    def with_columns(self, values: Mapping[str, np.ndarray]) -> ItemTable:
        """This table with more columns: ``{name: float64 [M]}`` in row order (NaN: unknown);
        the table's values become float64 (a float32 value converts exactly)."""
        clash = sorted(set(values) & set(self.columns))
        if clash:
            raise ValueError(f"the item table already holds columns {clash}")
        added = [np.asarray(v, dtype=np.float64).reshape(len(self.ids)) for v in values.values()]
        dense = np.column_stack([self.dense.astype(np.float64), *added]) if added else self.dense
        return ItemTable(
            ids=self.ids,
            dense=dense.reshape(len(self.ids), len(self.columns) + len(added)),
            genre_codes=self.genre_codes,
            genres=self.genres,
            columns=(*self.columns, *values),
        )

    @cached_property
    def _row_of_id(self) -> np.ndarray | None:
        """Row per id as a flat array (-1 = unknown) when ids are non-negative and dense
        enough: one gather per request instead of building and probing a hash index."""
        if len(self.ids) == 0:
            return None
        low, high = int(self.ids.min()), int(self.ids.max())
        if low < 0 or high >= max(1_000_000, 8 * len(self.ids)):
            return None
        row_of = np.full(high + 1, -1, dtype=np.int64)
        row_of[self.ids.to_numpy()] = np.arange(len(self.ids))
        return row_of

    def rows(self, item_ids: np.ndarray) -> np.ndarray:
        """Row of each candidate in the table, -1 for ids not in it."""
        row_of = self._row_of_id
        if row_of is None:
            return self.ids.get_indexer(item_ids)
        inside = (item_ids >= 0) & (item_ids < len(row_of))
        return np.where(inside, row_of[np.where(inside, item_ids, 0)], -1)

    def feature_column(self, name: str) -> np.ndarray:
        """Column ``name`` of every row, float64 (NaN where unknown)."""
        return self._feature_columns[name]

    @cached_property
    def _feature_columns(self) -> dict[str, np.ndarray]:
        return {
            name: np.ascontiguousarray(self.dense[:, j], dtype=np.float64)
            for j, name in enumerate(self.columns)
        }

    def codes(self, rows: np.ndarray) -> np.ndarray:
        """Genre code per table row (-1 for row -1: unknown item or genre)."""
        return self._codes_by_row[rows]

    @cached_property
    def _codes_by_row(self) -> np.ndarray:
        # One extra trailing entry, -1, so row -1 (not in the table) maps to code -1.
        return np.append(self.genre_codes, -1).astype(np.int64)
