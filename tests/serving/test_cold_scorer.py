"""The FSCD request scorer's cross side: encoded and computed once per distinct cross key."""

from __future__ import annotations

from typing import Any

import numpy as np
import serving_fakes
import torch
from serving_fakes import CATALOG, CROSS_FIELD, GENRES, FakeStore

from cascade.ctr_schema import ITEM_FEATURES, ITEM_GENRE, USER_FEATURES, USER_GENRE_FEATURES
from serving.cold_scorer import CompiledColdScorer, _combine, eager_run
from serving.online_fields import KeyedColumn


def scorer_of(run: Any, model: Any, encoder: Any) -> CompiledColdScorer:
    items = serving_fakes.item_features(FakeStore(), CATALOG)
    return CompiledColdScorer(
        run,
        model.eval(),
        encoder,
        np.asarray(CATALOG),
        items[list(ITEM_FEATURES)].to_numpy(),
        items[ITEM_GENRE].tolist(),
    )


def request(n: int, seed: int = 0) -> tuple[Any, ...]:
    """``(user_id, user_dense, genre_dense, rows, codes, item_ids)`` of one request: n
    candidates from the table (one unknown item, no genre)."""
    rng = np.random.default_rng(seed)
    user, per_genre = serving_fakes.user_features(FakeStore(), 5, GENRES)
    user_dense = np.array([user[f] for f in USER_FEATURES], dtype=np.float32)
    genre_dense = np.array(
        [[per_genre[g][f] for f in USER_GENRE_FEATURES] for g in GENRES]
        + [[np.nan] * len(USER_GENRE_FEATURES)],
        dtype=np.float32,
    )
    rows = rng.integers(0, len(CATALOG), n)
    rows[-1] = -1
    item_ids = np.asarray(CATALOG)[rows]
    item_ids[-1] = 999_999
    codes = np.array([GENRES.index(serving_fakes.genre_of(int(i))) for i in item_ids])
    codes[-1] = -1
    return 5, user_dense, genre_dense, rows, codes, item_ids


def test_the_cross_side_runs_once_per_key_and_scores_as_per_candidate() -> None:
    model, encoder = serving_fakes.cold_network(3, cross=True)
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
    args = request(300)
    n = len(args[3])
    # The extra cross field read online: one value per (user, genre) key, 3 keys; the
    # unknown item has no key.
    per_key = np.array([0.1, 0.7, 0.4])
    valid = args[4] >= 0
    column = KeyedColumn(values=per_key, inverse=args[4][valid], valid=valid)
    got = keyed.logits(*args, keyed={CROSS_FIELD: column})
    # Genres (3 + unknown) x keys (3 + none) pair up per candidate: 4 distinct keys, not 300.
    assert keys_seen == [4]
    want = older.logits(*args, keyed={CROSS_FIELD: column})
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    # The same values given per candidate (a request's own values): the same scores.
    expanded = keyed.logits(*args, extra={CROSS_FIELD: column.expanded()})
    assert keys_seen[-1] == n  # one row per candidate: their values are not keyed
    torch.testing.assert_close(expanded, got, rtol=0, atol=1e-6)
    # The cross values matter.
    other = KeyedColumn(values=per_key[::-1].copy(), inverse=column.inverse, valid=valid)
    assert not torch.allclose(keyed.logits(*args, keyed={CROSS_FIELD: other}), got, atol=1e-4)


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
