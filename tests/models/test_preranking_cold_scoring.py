"""ColdSharedScorer: the FSCD pre-ranker scored one user x N candidates with the user side
computed once and the item side precomputed per item, equal to the full forward."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from cascade.ctr_schema import ITEM_FEATURES, USER_FEATURES, USER_GENRE_FEATURES
from models.preranking.config_registry import cascade_debug
from models.preranking.fields import FIELD_NAMES, FieldEncoder
from models.preranking.model import ColdPreRanker, ColdSharedScorer, PreRanker, PreRankerConfig
from models.preranking.synthetic_data import synthetic_training_frame

GENRES = ("Action", "Comedy", "Drama")


@pytest.fixture(scope="module")
def encoder() -> FieldEncoder:
    return FieldEncoder(bins=8).fit(synthetic_training_frame(3_000, users=80, items=120, seed=1))


def item_table(encoder: FieldEncoder) -> tuple[np.ndarray, np.ndarray, list[str | None]]:
    """40 known items with features; one of them with an unknown genre and a missing value."""
    rng = np.random.default_rng(0)
    ids = np.asarray(encoder.vocab["item_id"][:40], dtype=np.int64)
    dense = rng.uniform(0, 200, (len(ids), len(ITEM_FEATURES))).astype(np.float32)
    dense[:, 2] = rng.uniform(0, 1, len(ids))
    dense[3, 1] = np.nan
    genres: list[str | None] = [str(encoder.vocab["genre"][i % 3]) for i in range(len(ids))]
    genres[5] = None
    return ids, dense, genres


def full_forward(
    model: ColdPreRanker,
    encoder: FieldEncoder,
    user_id: int,
    user_dense: np.ndarray,
    genre_dense: np.ndarray,
    genre_names: list[str],
    table: tuple[np.ndarray, np.ndarray, list[str | None]],
    candidates: np.ndarray,
) -> torch.Tensor:
    """The reference: one frame row per candidate, encoded, through ``model.forward``."""
    ids, dense, genres = table
    row_of = {int(i): r for r, i in enumerate(ids)}
    records = []
    for item in candidates.tolist():
        row = row_of.get(item)
        genre = None if row is None else genres[row]
        code = genre_names.index(genre) if genre in genre_names else -1
        record = {"user_id": user_id, "item_id": item, "genre": genre}
        record.update(zip(USER_FEATURES, user_dense.tolist(), strict=True))
        item_values = [np.nan] * len(ITEM_FEATURES) if row is None else dense[row].tolist()
        record.update(zip(ITEM_FEATURES, item_values, strict=True))
        record.update(zip(USER_GENRE_FEATURES, genre_dense[code].tolist(), strict=True))
        records.append(record)
    frame = pd.DataFrame(records, columns=list(FIELD_NAMES))
    with torch.no_grad():
        return model(encoder.encode(frame))


def request(encoder: FieldEncoder, table) -> dict:
    ids, _, genres = table
    genre_names = sorted({g for g in genres if g is not None})
    rng = np.random.default_rng(1)
    genre_dense = np.full((len(genre_names) + 1, len(USER_GENRE_FEATURES)), np.nan, np.float32)
    genre_dense[:-1] = rng.uniform(0, 30, (len(genre_names), len(USER_GENRE_FEATURES)))
    genre_dense[0, 2] = np.nan  # a missing cross value
    candidates = np.concatenate([ids[::2], [10**9, -5]]).astype(np.int64)  # two unknown items
    row_of = {int(i): r for r, i in enumerate(ids)}
    rows = np.array([row_of.get(int(i), -1) for i in candidates], dtype=np.int64)
    codes = np.array(
        [genre_names.index(genres[r]) if r >= 0 and genres[r] is not None else -1 for r in rows],
        dtype=np.int64,
    )
    user_id = int(encoder.vocab["user_id"][7])
    user_dense = np.array([120.0, 30.0, 0.25, 31.0], dtype=np.float32)
    return {
        "user_id": user_id,
        "user_dense": user_dense,
        "genre_dense": genre_dense,
        "genre_names": genre_names,
        "rows": rows,
        "codes": codes,
        "candidates": candidates,
    }


def cold_model(encoder: FieldEncoder, fields: tuple[str, ...], gated: bool) -> ColdPreRanker:
    torch.manual_seed(3)
    model = ColdPreRanker(cascade_debug().net, fields, encoder.cardinalities(), gated=gated)
    with torch.no_grad():  # random embeddings of a realistic scale, so scores spread
        for name, param in model.named_parameters():
            if "embedding" in name:
                param.normal_(0, 0.5)
        if gated:  # drop a user, an item and a cross field
            for name in ("user_ctr", "genre", "ug_clicks"):
                model.gate_logits[model.gate_fields.index(name)] = -2.0
    return model.eval()


@pytest.mark.parametrize(
    ("fields", "gated"),
    [
        (FIELD_NAMES, False),
        (FIELD_NAMES, True),
        (("user_id", "user_ctr", "item_id", "item_ctr", "ug_ctr"), False),  # a kept subset
        (("item_id", "genre", "item_clicks"), False),  # item side only
    ],
)
def test_shared_scores_equal_the_full_forward(encoder, fields, gated) -> None:
    model = cold_model(encoder, fields, gated)
    table = item_table(encoder)
    req = request(encoder, table)
    scorer = ColdSharedScorer(model, encoder, *table)
    assert scorer.item_part.shape == (40, model.user_linear.out_features)
    got = scorer.logits(
        req["user_id"], req["user_dense"], req["genre_dense"], req["rows"], req["codes"],
        req["candidates"],
    )  # fmt: skip
    want = full_forward(
        model, encoder, req["user_id"], req["user_dense"], req["genre_dense"],
        req["genre_names"], table, req["candidates"],
    )  # fmt: skip
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert got.std() > 1e-3  # the scores depend on the candidate


def test_user_side_runs_once_per_request_and_items_once_per_load(encoder) -> None:
    model = cold_model(encoder, FIELD_NAMES, False)
    calls: dict[str, list[int]] = {"user": [], "item": []}
    model.user_linear.register_forward_hook(lambda m, i, o: calls["user"].append(i[0].shape[0]))
    model.item_linear.register_forward_hook(lambda m, i, o: calls["item"].append(i[0].shape[0]))
    table = item_table(encoder)
    scorer = ColdSharedScorer(model, encoder, *table)
    assert calls == {"user": [], "item": [40]}  # every item of the table, once, at load
    req = request(encoder, table)
    known = req["rows"] >= 0
    scorer.logits(
        req["user_id"], req["user_dense"], req["genre_dense"], req["rows"][known],
        req["codes"][known], req["candidates"][known],
    )  # fmt: skip
    assert calls == {"user": [1], "item": [40]}  # one user row; no item work for known items


def test_supports_only_an_eval_fp32_cold_preranker(encoder) -> None:
    model = cold_model(encoder, FIELD_NAMES, False)
    assert ColdSharedScorer.supports(model)
    assert not ColdSharedScorer.supports(cold_model(encoder, FIELD_NAMES, False).train())
    assert not ColdSharedScorer.supports(PreRanker(PreRankerConfig()).eval())
    with pytest.raises(TypeError, match="cannot be split"):
        ColdSharedScorer(model.train(), encoder, *item_table(encoder))
