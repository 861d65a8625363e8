"""The FSCD request scorer's cross side: encoded and computed once per distinct cross key."""

from __future__ import annotations

from typing import Any

import numpy as np
import serving_fakes
import torch
from serving_fakes import CATALOG, CROSS_FIELD, GENRES, ITEM_FIELDS, USER_FIELDS

from serving.cold_scorer import CompiledColdScorer, _combine, eager_run
from serving.online_fields import KeyedColumn


def scorer_of(run: Any, model: Any, encoder: Any) -> CompiledColdScorer:
    """The scorer over the catalogue, with the store's item fields in its table."""
    item_dense = np.array([[serving_fakes.item_value(f, i) for f in ITEM_FIELDS] for i in CATALOG])
    genres = [serving_fakes.genre_of(i) for i in CATALOG]
    return CompiledColdScorer(
        run, model.eval(), encoder, np.asarray(CATALOG), item_dense, genres, ITEM_FIELDS
    )


def request(n: int, seed: int = 0) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """``(user_id, rows, item_ids, genre codes)`` of one request: n candidates from the
    table and, last, one unknown item (no genre: code -1)."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, len(CATALOG), n)
    rows[-1] = -1
    item_ids = np.asarray(CATALOG)[rows]
    item_ids[-1] = 999_999
    codes = np.array([GENRES.index(serving_fakes.genre_of(int(i))) for i in item_ids])
    codes[-1] = -1
    return 5, rows, item_ids, codes


def test_the_cross_side_runs_once_per_key_and_scores_as_per_candidate() -> None:
    model, encoder = serving_fakes.engine_network(3, cross=True)
    keys_seen: list[int] = []
    eager = eager_run(model)

    def keyed_run(*inputs: torch.Tensor) -> torch.Tensor:
        keys_seen.append(inputs[2].shape[0])
        return eager(*inputs)

    def per_candidate(user: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():  # the signature of a package built before keys
            return model.score_request(user[0], candidates)

    per_candidate.inputs = 2  # type: ignore[attr-defined]
    keyed = scorer_of(keyed_run, model, encoder)
    older = scorer_of(per_candidate, model, encoder)
    assert keyed.table_fields == set(ITEM_FIELDS)
    assert keyed.request_fields == dict.fromkeys(USER_FIELDS, "user") | {
        "user_cat_ctr_7d": "cross",
        CROSS_FIELD: "cross",
    }
    user_id, rows, item_ids, codes = request(300)
    n = len(rows)
    user = {f: np.array([serving_fakes.user_value(f, user_id)]) for f in USER_FIELDS}
    # Two cross fields read online from two views: one per (user, genre) key, 3 keys, one
    # per item parity, 2 keys; the unknown item has neither key.
    valid = codes >= 0
    by_genre = KeyedColumn(values=np.array([0.1, 0.7, 0.4]), inverse=codes[valid], valid=valid)
    parity = KeyedColumn(values=np.array([0.2, 0.9]), inverse=item_ids[valid] % 2, valid=valid)
    columns = {"user_cat_ctr_7d": by_genre, CROSS_FIELD: parity}
    got = keyed.logits(user_id, rows, item_ids, extra=user, keyed=columns)
    # Genres (3) x parities (2) pair up per candidate, and the unknown item: 7 keys, not 300.
    assert keys_seen == [7]
    want = older.logits(user_id, rows, item_ids, extra=user, keyed=columns)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    # The same values given per candidate (a request's own values): the same scores.
    every = {**user, **{name: column.expanded() for name, column in columns.items()}}
    expanded = keyed.logits(user_id, rows, item_ids, extra=every)
    assert keys_seen[-1] == n  # one row per candidate: their values are not keyed
    torch.testing.assert_close(expanded, got, rtol=0, atol=1e-6)
    # The cross values matter.
    other = KeyedColumn(values=by_genre.values[::-1].copy(), inverse=by_genre.inverse, valid=valid)
    changed = keyed.logits(
        user_id, rows, item_ids, extra=user, keyed={**columns, "user_cat_ctr_7d": other}
    )
    assert not torch.allclose(changed, got, atol=1e-4)


def test_factors_combine_into_the_distinct_pairs_candidates_have() -> None:
    width = 4
    genre = np.zeros((3, width), dtype=np.int64)
    genre[:, 1] = [5, 6, 7]
    view = np.zeros((4, width), dtype=np.int64)
    view[:, 3] = [1, 2, 3, 0]
    genre_rows = np.array([0, 1, 0, 2, 0, 1])
    view_rows = np.array([3, 1, 3, 0, 2, 1])
    table, rows = _combine([(genre, genre_rows), (view, view_rows)], 6, width)
    assert len(table) == 4  # (0, 3), (1, 1), (2, 0), (0, 2)
    np.testing.assert_array_equal(table[rows], genre[genre_rows] + view[view_rows])
    alone, zeros = _combine([], 6, width)
    assert alone.shape == (1, width) and not alone.any() and (zeros == 0).all()


def test_remembered_encodings_give_the_codes_and_scores_encoding_gives() -> None:
    model, encoder = serving_fakes.engine_network(3, cross=True)
    eager = eager_run(model)
    codes_in: list[torch.Tensor] = []

    def run(*inputs: torch.Tensor) -> torch.Tensor:
        codes_in.append(torch.cat([inputs[0], inputs[2]]))  # the user's and the keys' codes
        return eager(*inputs)

    scorer = scorer_of(run, model, encoder)
    user_id, rows, item_ids, codes = request(200, seed=3)
    valid = codes >= 0
    by_genre = KeyedColumn(values=np.array([0.1, np.nan, 0.4]), inverse=codes[valid], valid=valid)
    parity = KeyedColumn(values=np.array([0.2, 0.9]), inverse=item_ids[valid] % 2, valid=valid)
    columns = {"user_cat_ctr_7d": by_genre, CROSS_FIELD: parity}
    user = {f: np.array([serving_fakes.user_value(f, user_id)]) for f in USER_FIELDS}
    first = scorer.logits(user_id, rows, item_ids, extra=user, keyed=columns)
    remembered = len(scorer._memo)
    assert remembered > 0
    again = scorer.logits(user_id, rows, item_ids, extra=user, keyed=columns)
    assert len(scorer._memo) == remembered  # answered from memory
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    assert torch.equal(codes_in[0], codes_in[1])
    # Each remembered answer is the encoder's own, NaN (unknown) included.
    for (names, shape, raw), held in scorer._memo.items():
        values = np.frombuffer(raw, dtype=np.float64).reshape(shape)
        np.testing.assert_array_equal(held, encoder.encode_numbers(names, values))
    # Other values are encoded afresh, not mistaken for the remembered ones.
    other = {f: v + 0.5 for f, v in user.items()}
    scorer.logits(user_id, rows, item_ids, extra=other, keyed=columns)
    assert len(scorer._memo) == remembered + 1
    # Bounded: past MEMO_ENTRIES all are dropped before the next is held.
    scorer.MEMO_ENTRIES = len(scorer._memo)
    shifted = {f: v + 1.5 for f, v in user.items()}
    scorer.logits(user_id, rows, item_ids, extra=shifted, keyed=columns)
    assert len(scorer._memo) <= scorer.MEMO_ENTRIES
    assert any(
        raw == np.concatenate(list(shifted.values())).tobytes() for _, _, raw in scorer._memo
    )
