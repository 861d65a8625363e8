"""A served version's fields read from the online store per request: one batched read per view.

A model version reads fields beyond the ids (:attr:`ServedVersion.request_fields`, e.g. the
cross statistics ``user_cat_ctr_7d``). Those a ``cross_<pair>`` view of the online store
holds (:func:`domains.ctr.online_cross.cross_feature_sources`) and whose keys the server knows for
every candidate are read per request by :class:`OnlineFieldPlan`; the others still come with
the request. The keys the server knows (:data:`SERVED_KEYS`): the request's ``user_id``, each
candidate's ``item_id``, and its ``item_category``: the genre of the in-memory item table (the
engine's ``item_category`` is the pre-ranker's ``genre``). A pair keyed by a column no request
carries (``user_segment``, ``context``, ``position``) is not read here.

Per request and view the candidates' keys are deduplicated before the read: user x
item_category over 1,000 candidates is one key per distinct genre of the request. A candidate
without a key (an item not in the table has no genre) or a key the store does not hold gets
NaN (the encoder's code 0, unknown), never an error.

A view keyed by the item alone (:data:`ITEM_KEYS`: ``cross_item`` by ``item_id``) has the same
values for an item in every request: the server reads it once per version for the whole item
table (:meth:`OnlineFieldPlan.split_item_reads`, :meth:`OnlineFieldPlan.item_values`) and
not per request.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

import numpy as np

from domains.ctr.online_cross import CrossFeatureSource

USER_KEY = "user_id"
ITEM_KEY = "item_id"
GENRE_KEY = "item_category"
SERVED_KEYS = frozenset({USER_KEY, ITEM_KEY, GENRE_KEY})
"""Join keys the server fills: the request's user, each candidate's id and genre."""
ITEM_KEYS = frozenset({ITEM_KEY, GENRE_KEY})
"""Join keys known per item of the table, the same in every request."""


class CrossReader(Protocol):
    """What the plan needs of :class:`domains.ctr.online_cross.OnlineCrossReader`."""

    def sources(self, fields: Sequence[str]) -> Mapping[str, CrossFeatureSource]: ...

    def read(
        self,
        view: str,
        join_keys: Sequence[str],
        keys: Sequence[Sequence[Any]],
        features: Sequence[str],
    ) -> np.ndarray: ...


def servable(source: CrossFeatureSource, kind: str) -> bool:
    """Whether the server can key ``source`` for a field of ``kind``: every join key is one it
    fills, and a user field (one value per request) is keyed by the user alone."""
    keys = set(source.join_keys)
    if not keys or not keys <= SERVED_KEYS:
        return False
    return kind != "user" or keys == {USER_KEY}


@dataclass(frozen=True, slots=True)
class KeyedColumn:
    """A per-candidate field as read: one value per distinct key of the view and, for each
    candidate with a key (``valid``, ``[N]``), the index of its key (``inverse``); a candidate
    without a key is missing. Candidate ``i`` (the ``j``-th valid one) has
    ``values[inverse[j]]``: what :meth:`OnlineFieldPlan.values` expands it to, and what a
    scorer can encode once per key instead of once per candidate."""

    values: np.ndarray
    inverse: np.ndarray
    valid: np.ndarray

    def expanded(self) -> np.ndarray:
        """The field's value for every candidate, float64 ``[N]`` (NaN: no key)."""
        out = np.full(len(self.valid), np.nan, dtype=np.float64)
        out[self.valid] = self.values[self.inverse]
        return out


@dataclass(frozen=True, kw_only=True)
class ViewRead:
    """The fields of one served version held by one view: one online read per request."""

    view: str
    join_keys: tuple[str, ...]
    fields: tuple[str, ...]
    """Field names, equal to the view's feature names."""
    kinds: tuple[str, ...]
    """Each field's kind (``user``: one value per request, else one per candidate)."""


@dataclass(frozen=True)
class OnlineFieldPlan:
    """The views a served version reads per request, each with its fields."""

    reads: tuple[ViewRead, ...]

    @classmethod
    def build(
        cls, fields: Mapping[str, str], sources: Mapping[str, CrossFeatureSource]
    ) -> OnlineFieldPlan:
        """The plan of ``fields`` (``{name: kind}``) that ``sources`` serve and the server can
        key (:func:`servable`), grouped by view in field order."""
        grouped: dict[str, list[tuple[str, str, CrossFeatureSource]]] = {}
        for name, kind in fields.items():
            source = sources.get(name)
            if source is not None and servable(source, kind):
                grouped.setdefault(source.view, []).append((name, kind, source))
        reads = []
        for view, members in grouped.items():
            join_keys = members[0][2].join_keys
            reads.append(
                ViewRead(
                    view=view,
                    join_keys=join_keys,
                    fields=tuple(m[2].feature for m in members),
                    kinds=tuple(m[1] for m in members),
                )
            )
        return cls(tuple(reads))

    @cached_property
    def fields(self) -> frozenset[str]:
        return frozenset(f for read in self.reads for f in read.fields)

    def split_item_reads(self) -> tuple[OnlineFieldPlan, OnlineFieldPlan]:
        """``(per request, per item)``: the reads with a user key, and those keyed by
        :data:`ITEM_KEYS` alone (their values depend on the item only, see
        :meth:`item_values`)."""
        per_item = tuple(r for r in self.reads if set(r.join_keys) <= ITEM_KEYS)
        rest = tuple(r for r in self.reads if r not in per_item)
        return OnlineFieldPlan(rest), OnlineFieldPlan(per_item)

    def item_values(
        self,
        reader: CrossReader,
        *,
        item_ids: np.ndarray,
        genre_codes: np.ndarray,
        genres: Sequence[str],
        batch: int,
    ) -> dict[str, np.ndarray]:
        """``{field: float64 [M]}`` (in plan order) of a plan of per-item reads
        (:meth:`split_item_reads`) for every item of a table (``genre_codes``: each item's
        index into ``genres``, -1: none): one read per view and batch of ``batch`` items. NaN
        where the store holds no value."""
        if any(not set(r.join_keys) <= ITEM_KEYS for r in self.reads):
            raise ValueError("item_values reads views keyed by the item alone; split the plan")
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        item_ids = np.asarray(item_ids, dtype=np.int64)
        genre_codes = np.asarray(genre_codes, dtype=np.int64)
        names = [f for read in self.reads for f in read.fields]
        out = {name: np.full(len(item_ids), np.nan, dtype=np.float64) for name in names}
        for start in range(0, len(item_ids), batch):
            part = slice(start, start + batch)
            values = self.values(
                reader,
                user_id=0,  # no view here is keyed by the user
                item_ids=item_ids[part],
                genre_codes=genre_codes[part],
                genres=genres,
            )
            for name, column in values.items():
                out[name][part] = column
        return out

    def values(
        self,
        reader: CrossReader,
        *,
        user_id: int,
        item_ids: np.ndarray,
        genre_codes: np.ndarray,
        genres: Sequence[str],
        given: Mapping[str, np.ndarray] | None = None,
        timed: Callable[[str, float], None] | None = None,
        keyed: dict[str, KeyedColumn] | None = None,
        expires: list[int] | None = None,
    ) -> dict[str, np.ndarray]:
        """``{field: values}`` read from the online store for one user and N candidates: float64
        ``[1]`` for a user field, ``[N]`` otherwise, NaN where unknown. Fields in ``given``
        (the request's own values) are not read; a view all of whose fields are given is not
        read at all. ``genre_codes``: each candidate's index into ``genres`` (-1: none).
        ``timed(view, seconds)`` is told each read's duration. ``keyed``, when given,
        receives each per-candidate field read as a :class:`KeyedColumn` (its values per
        distinct key) in place of its ``[N]`` values, which are then not built (a scorer encodes
        per key and gathers; :meth:`KeyedColumn.expanded` gives the ``[N]`` values). A reader
        with a ``one_version`` context (:class:`domains.ctr.online_cross.OnlineCrossReader`)
        reads every view of the request inside one. ``expires`` (a reader with a ``stamp``)
        receives, per view read, when its ttl first turns a value of the answer missing."""
        given = given or {}
        n = len(item_ids)
        out: dict[str, np.ndarray] = {}
        one_version = getattr(reader, "one_version", None)
        with contextlib.nullcontext() if one_version is None else one_version():
            for read in self.reads:
                wanted = [(j, f) for j, f in enumerate(read.fields) if f not in given]
                if not wanted:
                    continue
                if read.join_keys == (USER_KEY,) and all(
                    read.kinds[j] == "user" for j, _ in wanted
                ):
                    # One key, one value per field for the whole request: no candidate keys.
                    keys, inverse, valid = (
                        [(int(user_id),)],
                        np.empty(0, np.int64),
                        np.empty(0, bool),
                    )
                else:
                    keys, inverse, valid = _distinct_keys(
                        read.join_keys, user_id, item_ids, genre_codes, genres
                    )
                features = [f for _, f in wanted]
                started = time.perf_counter()
                if expires is None:
                    found = reader.read(read.view, read.join_keys, keys, features)
                else:
                    found = reader.read(read.view, read.join_keys, keys, features, expires=expires)
                if timed is not None:
                    timed(read.view, time.perf_counter() - started)
                per_candidate: np.ndarray | None = None
                for k, (j, name) in enumerate(wanted):
                    if read.kinds[j] == "user":
                        out[name] = found[:1, k] if len(found) else np.full(1, np.nan)
                    elif keyed is not None:
                        keyed[name] = KeyedColumn(found[:, k], inverse, valid)
                    else:
                        if per_candidate is None:
                            per_candidate = np.full((n, len(features)), np.nan, dtype=np.float64)
                            per_candidate[valid] = found[inverse]
                        out[name] = per_candidate[:, k]
        return out


def _distinct_keys(
    join_keys: Sequence[str],
    user_id: int,
    item_ids: np.ndarray,
    genre_codes: np.ndarray,
    genres: Sequence[str],
) -> tuple[list[tuple[Any, ...]], np.ndarray, np.ndarray]:
    """``(keys, inverse, valid)``: the distinct keys of the candidates (tuples in
    ``join_keys`` order), each valid candidate's index into them, and which candidates have a
    key at all (an item without a genre has no ``item_category``). The user is the same for
    every candidate, so only the candidates' columns are deduplicated: a genre through a count
    over the genre codes, an item id by sorting; several such columns by their combined code."""
    n = len(item_ids)
    valid = np.ones(n, dtype=bool)
    if GENRE_KEY in join_keys:
        codes = np.asarray(genre_codes, dtype=np.int64)
        valid = codes >= 0
    varying: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # key -> (distinct values, inverse)
    for key in join_keys:
        if key == ITEM_KEY:
            varying[key] = np.unique(
                np.asarray(item_ids, dtype=np.int64)[valid], return_inverse=True
            )
        elif key == GENRE_KEY:
            seen = np.bincount(codes[valid], minlength=len(genres)) > 0
            distinct = np.flatnonzero(seen)
            position = np.cumsum(seen) - 1
            varying[key] = (distinct, position[codes[valid]])
    count = int(valid.sum())
    if not varying:  # keyed by the user alone: one key for every candidate
        return [(int(user_id),)], np.zeros(count, dtype=np.int64), valid
    if len(varying) == 1:
        ((column, (distinct, inverse)),) = varying.items()
        rows = [{column: v} for v in distinct.tolist()]
    else:
        combined = np.zeros(count, dtype=np.int64)
        for distinct, inverse in varying.values():
            combined = combined * len(distinct) + inverse
        codes_seen, inverse = np.unique(combined, return_inverse=True)
        rows = []
        for code in codes_seen.tolist():
            row: dict[str, int] = {}
            for column, (distinct, _) in reversed(varying.items()):
                code, index = divmod(code, len(distinct))
                row[column] = int(distinct[index])
            rows.append(row)
    keys = [
        tuple(
            int(user_id) if key == USER_KEY else genres[row[key]] if key == GENRE_KEY else row[key]
            for key in join_keys
        )
        for row in rows
    ]
    return keys, inverse.reshape(-1), valid
