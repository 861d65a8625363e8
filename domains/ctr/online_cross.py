"""Which online feature serves a model's field, and batched reads of those features.

The cross-statistics engine (``jobs.ctr_cross_stats``) names its columns ``<pair>_<statistic>``
(:func:`jobs.ctr_cross_stats.feature_columns`: ``user_cat_ctr_7d``, ``seg_item_decay_ctr``,
...); its partitions are served by the Feast view ``cross_<pair>`` (``features/ctr/cross_views.py``)
whose features carry the same names and whose join keys are the pair's key columns
(``user_id`` x ``item_category``, ...); training sets name their fields after those columns
(``jobs.ctr_training_set``). So a model field ``f`` is served online by the ``cross_*`` view
that has a feature named ``f``, keyed by that view's join keys:
:func:`cross_feature_sources` reads that mapping off the store's registry (the views the store
was applied with, so only what :func:`jobs.ctr_cross_features.materialize_cross` can load).

:class:`OnlineCrossReader` reads some features of one view for a batch of keys in ONE call of
the online store (SQLite locally: a packed view, :mod:`domains.ctr.online_packed`, is read as one
float matrix without per-value objects; Redis in the cluster profile) and answers as the
training set and the offline point-in-time join (:func:`jobs.ctr_cross_features.cross_features_at`)
do, so a request at time ``t`` sees the values a training row at ``t`` saw:

* the engine's partitions are snapshots: a key absent from the newest partition loaded into the
  online store had no impression in its longest window and is missing (NaN), although the store
  still holds the row an older partition wrote for it (loading writes keys, it never deletes
  them). The newest partition is the largest end of the view's materialization intervals in
  the registry, re-read at most every ``refresh_s`` seconds (so for that long after a load a
  retired key may still answer with its older row);
* a row older than the view's ttl is missing (no partition loaded for that long).

(Feast's ``get_online_features`` applies neither.)
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

CROSS_VIEW_PREFIX = "cross_"
"""The engine's pair views are named ``cross_<pair>``."""

REFRESH_S = 10.0
"""How long a reader trusts the newest partition it read from the registry for a view."""
CACHE_KEYS = 65_536
"""Keys of a view (per feature list) whose rows a reader holds between reads of a packed SQLite
store (see :class:`OnlineCrossReader`); past that the held rows are dropped and read again."""

_KEY_VALUE_FIELDS = {"INT64": "int64_val", "INT32": "int32_val", "STRING": "string_val"}
"""Join key types the reader builds entity keys of (ValueType name -> ValueProto field)."""


@dataclass(frozen=True, kw_only=True)
class CrossFeatureSource:
    """Where the online store keeps one model field."""

    field: str
    """The model's field name."""
    view: str
    """The Feast feature view, ``cross_<pair>``."""
    feature: str
    """The view's feature (the engine's column; equal to ``field``)."""
    join_keys: tuple[str, ...]
    """The view's key columns, in the view's order (``("user_id", "item_category")``)."""

    @property
    def pair(self) -> str:
        return self.view.removeprefix(CROSS_VIEW_PREFIX)


def cross_feature_sources(store: Any, fields: Iterable[str]) -> dict[str, CrossFeatureSource]:
    """``{field: source}`` for every field in ``fields`` that a ``cross_*`` view of ``store``
    (a ``feast.FeatureStore``) holds as a feature of the same name; other fields are left out
    (no view serves them)."""
    by_feature: dict[str, CrossFeatureSource] = {}
    for view in store.list_feature_views():
        if not view.name.startswith(CROSS_VIEW_PREFIX):
            continue
        keys = tuple(column.name for column in view.entity_columns) or tuple(view.join_keys)
        for feature in view.features:
            by_feature[feature.name] = CrossFeatureSource(
                field=feature.name, view=view.name, feature=feature.name, join_keys=keys
            )
    return {name: by_feature[name] for name in fields if name in by_feature}


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _number(proto: Any) -> float:
    kind = proto.WhichOneof("val")
    return math.nan if kind is None else float(getattr(proto, kind))


def newest_partition(view: Any) -> dt.datetime | None:
    """The newest partition loaded into the online store for ``view`` (a ``FeatureView`` read
    from the registry): the largest end of its materialization intervals (a partition is
    recorded as ``(ds midnight, ds midnight)``), None when nothing was loaded."""
    ends = [end for _, end in getattr(view, "materialization_intervals", None) or ()]
    if not ends:
        return None
    newest = max(ends)
    return newest if newest.tzinfo else newest.replace(tzinfo=dt.UTC)


class OnlineCrossReader:
    """Batched reads of cross features from a Feast online store: rows older than the view's
    newest loaded partition or than its ttl are missing.

    ``store``: a ``feast.FeatureStore`` (its views must be applied); ``clock``: the time a row's
    age is measured at (UTC now by default; a test pins it). ``online_store``: the store's
    online store object when the caller already has one. ``refresh_s``: how long the newest
    partition read from the registry is trusted (0: re-read on every read).

    From a packed SQLite store (:mod:`domains.ctr.online_packed`) the rows read are held, at
    most ``cache_keys`` keys per view and feature list (0: none), as the store answered them
    (values and event time, before any age bound), so a user read again costs no query: they
    are used only while the store's :meth:`~domains.ctr.online_packed.PackedSqliteOnlineStore.
    data_version` is the one read before they were fetched, so any committed write (a
    partition loaded by another process, a rerun of the same one) drops them all; the newest
    partition and the ttl are applied to their event times on every read, as to rows just
    fetched. The answer is the uncached read's, value for value.
    """

    def __init__(
        self,
        store: Any,
        *,
        clock: Callable[[], dt.datetime] = _utc_now,
        online_store: Any = None,
        refresh_s: float = REFRESH_S,
        cache_keys: int = CACHE_KEYS,
    ) -> None:
        from feast.infra.online_stores.helpers import get_online_store_from_config

        self.store = store
        self.config = store.config
        self.online_store = online_store or get_online_store_from_config(store.config.online_store)
        self.clock = clock
        self.refresh_s = refresh_s
        self._views: dict[str, tuple[Any, dict[str, str]]] = {}
        self._newest: dict[str, tuple[float, dt.datetime | None]] = {}
        if cache_keys < 0:
            raise ValueError(f"cache_keys must be >= 0, got {cache_keys}")
        self.cache_keys = cache_keys
        self._held: dict[tuple[Any, ...], tuple[Any, dict[tuple[Any, ...], Any]]] = {}
        """Per (view, join keys, features): the store's data version the rows were read at,
        and ``{key: (event µs, values)}``."""
        self._local = threading.local()
        """Per thread (the server scores on its event loop, a shadow version on its observer
        thread): ``pinned``, inside :meth:`one_version`, the data version its first packed
        read asked for (empty until then)."""

    @contextlib.contextmanager
    def one_version(self) -> Iterator[None]:
        """Reads inside (one request's views) ask the packed store's data version once, at
        the first of them, and hold rows under it: a write committed between two of them is
        seen by the next request, as one committed just after the last would be. Rows fetched
        inside are at least as new as that version, so the cache's rule still holds. Nested
        inside another, it shares the outer one's version."""
        local = self._local
        if getattr(local, "pinned", None) is not None:
            yield
            return
        local.pinned = []
        try:
            yield
        finally:
            local.pinned = None

    def stamp(self, views: Sequence[str]) -> tuple[Any, ...] | None:
        """What the answers of ``views`` depend on besides the clock, for a caller that holds
        something derived from them: the packed store's data version (inside
        :meth:`one_version`, the one its reads use) and each view's newest partition as this
        reader applies it. None when a view is not stored packed: there is no version to
        compare, so nothing derived may be held."""
        from domains.ctr.online_packed import PackedSqliteOnlineStore, wants_packed

        store = self.online_store
        if not isinstance(store, PackedSqliteOnlineStore):
            return None
        if not all(wants_packed(self._view(view)[0]) for view in views):
            return None
        return (self._data_version(store), *(self.newest_partition(view) for view in views))

    def _data_version(self, store: Any) -> Any:
        pinned = getattr(self._local, "pinned", None)
        if pinned is None:
            return store.data_version(self.config)
        if not pinned:
            pinned.append(store.data_version(self.config))
        return pinned[0]

    def sources(self, fields: Iterable[str]) -> dict[str, CrossFeatureSource]:
        """:func:`cross_feature_sources` on this reader's store."""
        return cross_feature_sources(self.store, fields)

    def _view(self, name: str) -> tuple[Any, dict[str, str]]:
        cached = self._views.get(name)
        if cached is None:
            view = self.store.get_feature_view(name)
            types: dict[str, str] = {}
            for column in view.entity_columns:
                value_type = column.dtype.to_value_type().name
                if value_type not in _KEY_VALUE_FIELDS:
                    raise ValueError(
                        f"view {name}: join key {column.name!r} has type {value_type}; the "
                        f"reader builds keys of {sorted(_KEY_VALUE_FIELDS)}"
                    )
                types[column.name] = _KEY_VALUE_FIELDS[value_type]
            cached = self._views[name] = (view, types)
            self._newest[name] = (time.monotonic(), newest_partition(view))
        return cached

    def newest_partition(self, name: str) -> dt.datetime | None:
        """:func:`newest_partition` of view ``name``, re-read from the registry when the one
        held is older than ``refresh_s``."""
        self._view(name)
        read_at, newest = self._newest[name]
        if time.monotonic() - read_at >= self.refresh_s:
            newest = newest_partition(self.store.get_feature_view(name))
            self._newest[name] = (time.monotonic(), newest)
        return newest

    def read(
        self,
        view: str,
        join_keys: Sequence[str],
        keys: Sequence[Sequence[Any]],
        features: Sequence[str],
        expires: list[int] | None = None,
    ) -> np.ndarray:
        """float64 ``[len(keys), len(features)]``: the features of ``view`` for each key (a
        tuple of values in ``join_keys`` order), one online-store call for all of them. NaN
        for a key the store does not hold, a row older than the view's newest loaded partition
        (the key is not in it) or than its ttl, or a null value. ``expires``, from a packed
        store (see :meth:`stamp`): receives the moment (µs since the epoch, the clock's) the
        ttl first turns a row of this answer missing, when the view has a ttl and a row
        answered."""
        table, types = self._view(view)
        unknown = [k for k in join_keys if k not in types]
        if unknown:
            raise ValueError(f"view {view} has no join keys {unknown}; it has {list(types)}")
        out = np.full((len(keys), len(features)), np.nan, dtype=np.float64)
        if not keys:
            return out
        ttl = table.ttl.total_seconds() if table.ttl else 0.0
        bounds = [self.newest_partition(view)]
        if ttl > 0:
            bounds.append(self.clock() - dt.timedelta(seconds=ttl))
        oldest = max((b for b in bounds if b is not None), default=None)
        packed = self._packed_read(table, join_keys, keys, features, oldest, ttl, expires)
        if packed is not None:
            return packed
        from feast.protos.feast.types.EntityKey_pb2 import EntityKey
        from feast.protos.feast.types.Value_pb2 import Value

        kinds = [types[k] for k in join_keys]
        names = list(join_keys)
        entity_keys = [
            EntityKey(
                join_keys=names,
                entity_values=[
                    Value(**{kind: value}) for kind, value in zip(kinds, key, strict=True)
                ],
            )
            for key in keys
        ]
        rows = self.online_store.online_read(
            config=self.config,
            table=table,
            entity_keys=entity_keys,
            requested_features=list(features),
        )
        for i, (timestamp, values) in enumerate(rows):
            if values is None or (
                oldest is not None and timestamp is not None and timestamp < oldest
            ):
                continue
            for j, feature in enumerate(features):
                proto = values.get(feature)
                if proto is not None:
                    out[i, j] = _number(proto)
        return out

    def _packed_read(
        self,
        table: Any,
        join_keys: Sequence[str],
        keys: Sequence[Sequence[Any]],
        features: Sequence[str],
        oldest: dt.datetime | None,
        ttl: float = 0.0,
        expires: list[int] | None = None,
    ) -> np.ndarray | None:
        """The same answer straight from a packed view (:mod:`domains.ctr.online_packed`): the
        rows held since the store last changed, the others fetched with one query (keys
        serialized from fixed parts, payloads decoded as one array); None when the view is not
        stored packed."""
        from domains.ctr.online_packed import (
            NOT_STORED,
            PackedSqliteOnlineStore,
            age_bounded,
            micros,
            wants_packed,
        )

        store = self.online_store
        if not (isinstance(store, PackedSqliteOnlineStore) and wants_packed(table)):
            return None
        if not self.cache_keys:
            values, events = store.read_rows(self.config, table, join_keys, keys, features)
        else:
            # The version first: rows fetched after it are at least as new as it says.
            version = self._data_version(store)
            slot = (table.name, tuple(join_keys), tuple(features))
            held = self._held.get(slot)
            keys = [tuple(key) for key in keys]
            if held is None or held[0] != version or len(held[1]) + len(keys) > self.cache_keys:
                held = self._held[slot] = (version, {})
            rows = held[1]
            missing = [key for key in dict.fromkeys(keys) if key not in rows]
            got = at = None
            if missing:
                got, at = store.read_rows(self.config, table, join_keys, missing, features)
                rows.update(zip(missing, zip(at.tolist(), got, strict=True), strict=True))
            if got is not None and len(missing) == len(keys):  # none held: the rows as read
                values, events = got.copy(), at  # the held rows are views of ``got``
            else:
                found = [rows[key] for key in keys]
                values = np.array([row for _, row in found], dtype=np.float64)
                values = values.reshape(len(keys), len(features))
                events = np.fromiter((e for e, _ in found), dtype=np.int64, count=len(keys))
        if expires is not None and ttl > 0:
            limit = micros(oldest)
            kept = events if limit is None else events[events >= limit]
            kept = kept[kept != NOT_STORED]
            if len(kept):
                expires.append(int(kept.min()) + int(ttl * 1_000_000))
        return age_bounded(values, events, oldest)
