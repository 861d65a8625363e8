"""Fakes of the registry and the online store for the serving tests (no MLflow, no Feast).

The champion lives in a JSON file ``{"version": "3", "seed": 3}`` that a test rewrites to
promote another version; the network of a version is a PreRanker initialised from its seed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from cascade.config import Settings
from cascade.ctr_schema import ITEM_FEATURES, ITEM_GENRE, USER_FEATURES, USER_GENRE_FEATURES
from models.preranking.fields import FIELD_NAMES, FIELDS, FieldEncoder, FieldSet
from models.preranking.model import CascadeNetConfig, ColdPreRanker, PreRanker, PreRankerConfig
from serving.preranking import Backends

GENRES = ("Action", "Comedy", "Drama")
CATALOG = tuple(range(1, 201))
"""Items with known features; every other id is unknown to the store."""


@dataclass
class FakeLoaded:
    """Stands in for models.preranking.inference.LoadedModel."""

    model: PreRanker | ColdPreRanker
    version: str
    run_id: str
    test_auc: float = 0.7
    encoder: FieldEncoder | None = None
    compiled: Path | None = None
    compiled_reason: str = ""


CROSS_FIELD = "ctr_user_x_item_genre_7d"
"""An extra cross field of the ``fscd_cross`` champion: no store serves it, requests carry it."""


def cross_value(user_id: int, item_id: int) -> float:
    return ((user_id * 7 + item_id * 3) % 11) / 10.0


def feature_rows(cross: bool = False) -> pd.DataFrame:
    """Users 1..11 x the catalogue with the fake store's features, as training-set fields
    (``cross``: with :data:`CROSS_FIELD` too)."""
    items = item_features(FakeStore(), CATALOG)
    rows = []
    for user_id in range(1, 12):
        user, per_genre = user_features(FakeStore(), user_id, GENRES)
        for item_id, item in items.iterrows():
            rows.append(
                {
                    "user_id": user_id,
                    "item_id": item_id,
                    "genre": item[ITEM_GENRE],
                    **user,
                    **{f: item[f] for f in ITEM_FEATURES},
                    **per_genre[item[ITEM_GENRE]],
                }
            )
    frame = pd.DataFrame(rows, columns=list(FIELD_NAMES))
    if cross:
        frame[CROSS_FIELD] = [
            cross_value(u, i) for u, i in zip(frame["user_id"], frame["item_id"], strict=True)
        ]
    return frame


def cold_network(
    seed: int,
    cross: bool = False,
    extra: pd.DataFrame | None = None,
    declarations: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[ColdPreRanker, FieldEncoder]:
    """An FSCD pre-ranker over a subset of the fields (as FSCD keeps), with its encoder fitted
    on the fake store's features; random weights of a scale that spreads the scores. ``cross``:
    its field set has :data:`CROSS_FIELD` too, and it keeps it. ``extra``: more field columns
    over the rows of :func:`feature_rows` (same order), declared by ``declarations`` (as
    ``FieldSet.from_declarations`` takes them); the network keeps them too."""
    declared = dict(declarations or {})
    if cross:
        declared = {CROSS_FIELD: {"kind": "cross", "window_days": 7}, **declared}
    rows = feature_rows(cross)
    if extra is not None:
        rows = pd.concat([rows, extra.reset_index(drop=True)], axis=1)
    field_set = FieldSet.from_declarations(declared, rows) if declared else FIELDS
    encoder = FieldEncoder(field_set, bins=6).fit(rows)
    fields = ("user_id", "user_ctr", "item_id", "genre", "item_ctr", "ug_ctr", "ug_clicks")
    return spread_preranker(seed, fields + tuple(declared), encoder), encoder


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


def network(seed: int) -> PreRanker:
    torch.manual_seed(seed)
    net = PreRanker(PreRankerConfig(id_buckets=512, embedding_dim=8, hidden=(16,)))
    # Standardize like training would, so the scores are spread and not saturated at 1.0.
    rows = []
    for user_id in range(1, 12):
        user, per_genre = user_features(FakeStore(), user_id, GENRES)
        items = item_features(FakeStore(), CATALOG)
        for _, item in items.iterrows():
            ug = per_genre[item[ITEM_GENRE]]
            rows.append(
                [user[f] for f in USER_FEATURES]
                + [item[f] for f in ITEM_FEATURES]
                + [ug[f] for f in USER_GENRE_FEATURES]
            )
    net.fit_normalizer(torch.tensor(rows, dtype=torch.float32))
    return net


def genre_of(item_id: int) -> str:
    return GENRES[item_id % len(GENRES)]


@dataclass
class FakeStore:
    """Records the lookups so tests can check what the server asked for."""

    user_calls: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)
    item_calls: list[tuple[int, ...]] = field(default_factory=list)


def user_features(
    store: FakeStore, user_id: int, genres: Sequence[str]
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    store.user_calls.append((user_id, tuple(genres)))
    if user_id <= 0:
        nan = math.nan
        return (
            {"user_impressions": nan, "user_clicks": nan, "user_ctr": nan, "user_age": nan},
            {g: dict.fromkeys(USER_GENRE_FEATURES, nan) for g in genres},
        )
    user = {
        "user_impressions": 10.0 * user_id,
        "user_clicks": float(user_id % 9 + 1),
        "user_ctr": (user_id % 9 + 1) / (10.0 * user_id),
        "user_age": 20.0 + user_id % 40,
    }
    per_genre = {
        g: {
            "ug_impressions": 5.0 + i + user_id % 5,
            "ug_clicks": 1.0 + i,
            "ug_ctr": (1.0 + i) / (5.0 + i + user_id % 5),
        }
        for g in genres
        for i in [GENRES.index(g) if g in GENRES else 0]
    }
    return user, per_genre


def item_features(store: FakeStore, item_ids: Sequence[int]) -> pd.DataFrame:
    store.item_calls.append(tuple(item_ids))
    rows = []
    for item_id in item_ids:
        known = item_id in CATALOG
        rows.append(
            {
                "item_id": item_id,
                "item_impressions": 100.0 + item_id if known else math.nan,
                "item_clicks": 10.0 + item_id % 7 if known else math.nan,
                "item_ctr": (10.0 + item_id % 7) / (100.0 + item_id) if known else math.nan,
                "item_release_year": 1990.0 + item_id % 10 if known else math.nan,
                ITEM_GENRE: genre_of(item_id) if known else None,
            }
        )
    frame = pd.DataFrame(rows, columns=["item_id", *ITEM_FEATURES, ITEM_GENRE])
    return frame.set_index("item_id")


def catalogue_frame(item_ids: Sequence[int] = CATALOG) -> pd.DataFrame:
    """The fake catalogue as the engine writes it (``item_id``, ``item_category``)."""
    return pd.DataFrame(
        {"item_id": list(item_ids), "item_category": [genre_of(i) for i in item_ids]}
    )


def write_champion(
    path: Path, version: str | None, seed: int = 0, kind: str = "mlp", compiled: Path | None = None
) -> None:
    """Promote ``version`` (None removes the alias); written atomically for the poller.
    ``kind``: ``mlp`` (a PreRanker), ``fscd`` (a ColdPreRanker with its encoder, and the
    ``compiled`` package of its run when given)."""
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


def backends(
    champion_file: Path,
    store: FakeStore | None = None,
    *,
    sources: Mapping[str, str] | None = None,
    catalogue: pd.DataFrame | None = None,
) -> Backends:
    """The fake registry and store; ``sources``: ``{run_id: cross source}`` of the versions
    trained on the cross-statistics engine (every other run is legacy); ``catalogue``: the
    engine's item catalogue of every source (default :func:`catalogue_frame`)."""
    store = store or FakeStore()
    runs = dict(sources or {})
    items = catalogue_frame() if catalogue is None else catalogue

    def champion_version(settings: Settings, alias: str) -> str | None:
        champ = _champion(champion_file)
        return None if champ is None else str(champ["version"])

    def load_champion(settings: Settings, alias: str) -> FakeLoaded | None:
        champ = _champion(champion_file)
        if champ is None:
            return None
        version, run_id = str(champ["version"]), f"run-{champ['version']}"
        if champ.get("kind") in ("fscd", "fscd_cross"):
            cold, encoder = cold_network(int(champ["seed"]), cross=champ["kind"] == "fscd_cross")
            compiled = champ.get("compiled")
            return FakeLoaded(
                model=cold,
                version=version,
                run_id=run_id,
                encoder=encoder,
                compiled=None if compiled is None else Path(compiled),
            )
        return FakeLoaded(model=network(int(champ["seed"])), version=version, run_id=run_id)

    return Backends(
        champion_version=champion_version,
        load_champion=load_champion,
        open_feature_store=lambda settings: store,
        user_features=user_features,
        item_features=item_features,
        catalog_item_ids=lambda settings: CATALOG,
        version_source=lambda settings, run_id: runs.get(run_id),
        item_catalogue=lambda settings, source: items.copy(),
    )
