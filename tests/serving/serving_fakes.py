"""Fakes of the registry and the online store for the serving tests (no MLflow, no Feast).

The champion lives in a JSON file ``{"version": "3", "seed": 3, "kind": "engine"}`` that a test
rewrites to promote another version. A version of kind ``engine`` (the default) is what the
pipeline trains: a ColdPreRanker over the ids and engine statistics of the three served pairs
(``jobs.ctr_training_set.SERVED_PAIRS``), named and kinded as the training-set builder declares
them, initialised from its seed, whose run names the cross source :data:`SOURCE`. The online
store is :class:`EngineStore`, a recording fake over fixed tables keyed as the engine's
``cross_<pair>`` views are; the item catalogue is :data:`CATALOG`. The other kinds are versions
the server refuses (see :func:`write_champion`).
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from cascade.config import Settings
from domains.ctr.online_cross import CrossFeatureSource
from jobs import ctr_cross_stats as engine
from jobs.ctr_training_set import SERVED_PAIRS, declarations
from models.preranking.fields import FIELDS, ID_FIELDS, FieldEncoder, FieldSet
from models.preranking.model import CascadeNetConfig, ColdPreRanker, PreRanker, PreRankerConfig
from models.preranking.synthetic_data import synthetic_training_frame
from serving.preranking import Backends

GENRES = ("Action", "Comedy", "Drama")
CATALOG = tuple(range(1, 201))
"""The items of the source's catalogue; every other id is unknown to the server."""
SOURCE = "generated"
"""The cross source every engine version's run names."""
USER_FIELDS = ("user_ctr_7d", "user_imp_7d")
ITEM_FIELDS = ("item_dctr_7d", "item_imp_7d")
CROSS_FIELDS = ("user_cat_ctr_7d",)
ENGINE_FIELDS = (*USER_FIELDS, *ITEM_FIELDS, *CROSS_FIELDS)
USERS = range(1, 12)
ABSENT_USER = 3
"""A user the store holds no statistics of."""
ABSENT_USER_CAT = (4, "Drama")
OUTSIDE = 250
"""An item the store holds statistics of, but the catalogue does not list."""
UNKNOWN = 999_999
"""An item nobody knows."""
CROSS_FIELD = "ctr_user_x_item_genre_7d"
"""An extra cross field of an ``engine_cross`` version: no view serves it, requests carry it."""


@dataclass
class FakeLoaded:
    """Stands in for models.preranking.inference.LoadedModel."""

    model: torch.nn.Module
    version: str
    run_id: str
    test_auc: float = 0.7
    encoder: FieldEncoder | None = None
    compiled: Path | None = None
    compiled_reason: str = ""


def genre_of(item_id: int) -> str:
    return GENRES[item_id % len(GENRES)]


def user_value(name: str, user_id: int) -> float:
    if user_id == ABSENT_USER or user_id not in USERS:
        return math.nan
    return ((user_id * 7) % 11 + 1) / 20 if name == "user_ctr_7d" else 10.0 * user_id


def item_value(name: str, item_id: int) -> float:
    """The store's value (NaN for every seventh item: no statistics)."""
    if item_id % 7 == 0 or not (item_id in CATALOG or item_id == OUTSIDE):
        return math.nan
    return ((item_id * 3) % 13 + 1) / 30 if name == "item_dctr_7d" else 5.0 * item_id + 1


def user_cat_value(user_id: int, genre: str | None) -> float:
    if genre is None or user_id not in USERS or (user_id, genre) == ABSENT_USER_CAT:
        return math.nan
    return ((user_id * 5 + GENRES.index(genre) * 3) % 9 + 1) / 15


def cross_value(user_id: int, item_id: int) -> float:
    return ((user_id * 7 + item_id * 3) % 11) / 10.0


def engine_rows(
    user_ids: Sequence[int], item_ids: Sequence[int], catalogue: Sequence[int] = CATALOG
) -> pd.DataFrame:
    """Training-set rows as the offline join assembles them: each candidate's category from
    the catalogue (None outside it), its item statistics only when the catalogue lists it."""
    rows = []
    for user_id in user_ids:
        for item_id in item_ids:
            listed = item_id in catalogue
            genre = genre_of(item_id) if listed else None
            row: dict[str, Any] = {"user_id": user_id, "item_id": item_id, "genre": genre}
            row.update({f: user_value(f, user_id) for f in USER_FIELDS})
            row.update({f: item_value(f, item_id) if listed else math.nan for f in ITEM_FIELDS})
            row["user_cat_ctr_7d"] = user_cat_value(user_id, genre)
            rows.append(row)
    return pd.DataFrame(rows)


def engine_network(
    seed: int = 5,
    *,
    cross: bool = False,
    extra: pd.DataFrame | None = None,
    declared: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[ColdPreRanker, FieldEncoder]:
    """A ColdPreRanker over the ids and :data:`ENGINE_FIELDS` (no MovieLens-shaped field),
    kinded by the training-set builder's declarations, its encoder fitted on
    :func:`engine_rows` of :data:`USERS` x :data:`CATALOG`; random weights of a scale that
    spreads the scores. ``cross``: :data:`CROSS_FIELD` too. ``declared``: the ids and these
    fields instead (as ``FieldSet.from_declarations`` takes them), their values ``extra``'s
    columns over the same rows, in order."""
    rows = engine_rows(list(USERS), CATALOG)
    if declared is None:
        built = declarations(SERVED_PAIRS, (7,))
        chosen = {
            name: {"kind": built[name]["kind"], "window_days": built[name]["window_days"]}
            for name in ENGINE_FIELDS
        }
        assert [chosen[n]["kind"] for n in ENGINE_FIELDS] == ["user"] * 2 + ["item"] * 2 + ["cross"]
    else:
        chosen = {name: dict(spec) for name, spec in declared.items()}
        rows = rows[[spec.name for spec in ID_FIELDS]]
    if cross:
        chosen[CROSS_FIELD] = {"kind": "cross", "window_days": 7}
        rows[CROSS_FIELD] = [
            cross_value(u, i) for u, i in zip(rows["user_id"], rows["item_id"], strict=True)
        ]
    if extra is not None:
        rows = pd.concat([rows, extra.reset_index(drop=True)], axis=1)
    field_set = FieldSet.from_declarations(chosen, rows, base=ID_FIELDS)
    encoder = FieldEncoder(field_set, bins=6).fit(rows)
    net = spread_preranker(seed, tuple(field_set.names), encoder)
    net.eval()
    return net, encoder


def spread_preranker(seed: int, fields: tuple[str, ...], encoder: FieldEncoder) -> ColdPreRanker:
    """A small ColdPreRanker reading ``fields`` of the encoder's field set, with random
    embeddings of a scale that spreads the scores."""
    torch.manual_seed(seed)
    net = ColdPreRanker(
        CascadeNetConfig(embedding_dim=4, hidden=(16, 8)),
        fields,
        encoder.cardinalities(),
        field_set=encoder.fields,
    )
    with torch.no_grad():
        for name, parameter in net.named_parameters():
            if "embedding" in name:
                parameter.normal_(0, 0.5)
    return net


def movielens_network(seed: int) -> tuple[ColdPreRanker, FieldEncoder]:
    """A ColdPreRanker over the default MovieLens-shaped field set (a version the server
    refuses: no store serves those fields)."""
    frame = synthetic_training_frame(2_000, users=40, items=60, seed=seed)
    encoder = FieldEncoder(FIELDS, bins=6).fit(frame)
    fields = ("user_id", "user_ctr", "item_id", "genre", "item_ctr", "ug_ctr")
    net = spread_preranker(seed, fields, encoder)
    net.eval()
    return net, encoder


def dense_network(seed: int) -> PreRanker:
    """A dense-feature PreRanker (a version the server refuses)."""
    torch.manual_seed(seed)
    return PreRanker(PreRankerConfig(id_buckets=512, embedding_dim=8, hidden=(16,))).eval()


def engine_loaded(version: str = "7", seed: int = 5, **network: Any) -> FakeLoaded:
    """An engine version of run ``run-<version>``; ``network``: :func:`engine_network`'s."""
    net, encoder = engine_network(seed, **network)
    return FakeLoaded(model=net, version=version, run_id=f"run-{version}", encoder=encoder)


class EngineStore:
    """The online store's ``cross_user``, ``cross_item`` and ``cross_user_cat`` views:
    records each read's view and keys."""

    def __init__(self) -> None:
        self.reads: list[tuple[str, list[tuple[Any, ...]]]] = []

    def sources(self, fields: Sequence[str]) -> dict[str, CrossFeatureSource]:
        out = {}
        for pair in (engine.USER, engine.ITEM, engine.USER_CAT):
            for column in engine.feature_columns(pair, (7,)):
                out[column] = CrossFeatureSource(
                    field=column, view=f"cross_{pair.name}", feature=column, join_keys=pair.keys
                )
        return {name: out[name] for name in fields if name in out}

    def read(
        self, view: str, join_keys: Sequence[str], keys: Sequence[Sequence[Any]], features: Any
    ) -> np.ndarray:
        self.reads.append((view, [tuple(k) for k in keys]))
        value: dict[str, Callable[[tuple[Any, ...], str], float]] = {
            "cross_user": lambda key, f: user_value(f, key[0]),
            "cross_item": lambda key, f: item_value(f, key[0]),
            "cross_user_cat": lambda key, f: user_cat_value(key[0], key[1]),
        }
        return np.array(
            [[value[view](tuple(k), f) for f in features] for k in keys], dtype=np.float64
        ).reshape(len(keys), len(features))

    def views(self) -> list[str]:
        return [view for view, _ in self.reads]


KINDS = ("engine", "engine_cross", "unsourced", "movielens", "mlp")
"""Versions :func:`write_champion` promotes: ``engine``, ``engine_cross`` (with
:data:`CROSS_FIELD`) are served; ``unsourced`` (an engine network whose run names no source),
``movielens`` (a ColdPreRanker over the MovieLens-shaped fields) and ``mlp`` (a dense
PreRanker) are refused."""


def write_champion(
    path: Path,
    version: str | None,
    seed: int = 0,
    kind: str = "engine",
    compiled: Path | None = None,
) -> None:
    """Promote ``version`` (None removes the alias); written atomically for the poller.
    ``kind``: one of :data:`KINDS`; ``compiled``: the package of its run."""
    assert kind in KINDS, kind
    tmp = path.with_suffix(".tmp")
    package = None if compiled is None else str(compiled)
    champion = (
        None
        if version is None
        else {"version": version, "seed": seed, "kind": kind, "compiled": package}
    )
    tmp.write_text(json.dumps(champion))
    tmp.replace(path)


def _champion(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    return json.loads(path.read_text())


def catalogue_frame(item_ids: Sequence[int] = CATALOG) -> pd.DataFrame:
    """The fake catalogue as the engine writes it (``item_id``, ``item_category``)."""
    return pd.DataFrame(
        {"item_id": list(item_ids), "item_category": [genre_of(i) for i in item_ids]}
    )


def backends(
    champion_file: Path,
    store: EngineStore | None = None,
    *,
    sources: Mapping[str, str] | None = None,
    catalogue: pd.DataFrame | None = None,
) -> Backends:
    """The fake registry, online store (``store``, default a new :class:`EngineStore`) and
    catalogue; ``sources``: ``{run_id: cross source}`` of every run (default: each run names
    :data:`SOURCE` but those of ``unsourced`` champions); ``catalogue``: the engine's item
    catalogue of every source (default :func:`catalogue_frame`)."""
    reader = store or EngineStore()
    items = catalogue_frame() if catalogue is None else catalogue
    unsourced: set[str] = set()

    def champion_version(settings: Settings, alias: str) -> str | None:
        champ = _champion(champion_file)
        return None if champ is None else str(champ["version"])

    def load_champion(settings: Settings, alias: str) -> FakeLoaded | None:
        champ = _champion(champion_file)
        if champ is None:
            return None
        version, seed, kind = str(champ["version"]), int(champ["seed"]), champ.get("kind")
        run_id = f"run-{version}"
        compiled = None if champ.get("compiled") is None else Path(champ["compiled"])
        if kind == "mlp":
            return FakeLoaded(model=dense_network(seed), version=version, run_id=run_id)
        if kind == "movielens":
            net, encoder = movielens_network(seed)
        else:
            net, encoder = engine_network(seed, cross=kind == "engine_cross")
        if kind == "unsourced":
            unsourced.add(run_id)
        return FakeLoaded(
            model=net, version=version, run_id=run_id, encoder=encoder, compiled=compiled
        )

    def version_source(settings: Settings, run_id: str) -> str | None:
        if sources is not None:
            return sources.get(run_id)
        return None if run_id in unsourced else SOURCE

    return Backends(
        champion_version=champion_version,
        load_champion=load_champion,
        version_source=version_source,
        open_cross_reader=lambda settings: reader,
        item_catalogue=lambda settings, source: items.copy(),
    )


@dataclass
class PinnedClock:
    """A clock a test moves: it says ``now``."""

    now: dt.datetime

    def __call__(self) -> dt.datetime:
        return self.now
