"""The pre-ranker split by input side for serving: item side precomputed per item when the item
table is loaded, user side once per request; the scores are the full network's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cascade.ctr_schema import ITEM_FEATURES, MODEL_FEATURES, USER_FEATURES, USER_GENRE_FEATURES
from models.preranking.model import PreRanker, PreRankerConfig, SharedUserScorer

_USER = [MODEL_FEATURES.index(f) for f in USER_FEATURES]
_ITEM = [MODEL_FEATURES.index(f) for f in ITEM_FEATURES]
_GENRE = [MODEL_FEATURES.index(f) for f in USER_GENRE_FEATURES]


def trained_like(config: PreRankerConfig, seed: int = 0) -> PreRanker:
    """A PreRanker with random weights and a normalizer fitted on count-like data."""
    torch.manual_seed(seed)
    model = PreRanker(config)
    sample = torch.rand(500, len(MODEL_FEATURES)) * 200
    sample[:, MODEL_FEATURES.index("item_release_year")] += 1900
    model.fit_normalizer(sample)
    return model.eval()


def full_forward(
    model: PreRanker,
    user_id: int,
    user: np.ndarray,
    genre_table: np.ndarray,
    item_dense: np.ndarray,
    rows: np.ndarray,
    codes: np.ndarray,
    item_ids: np.ndarray,
) -> torch.Tensor:
    """The network run on every candidate's full row, as the server did before the split."""
    n = len(item_ids)
    dense = np.empty((n, len(MODEL_FEATURES)), dtype=np.float32)
    dense[:, _USER] = user
    dense[:, _ITEM] = np.nan
    known = rows >= 0
    dense[np.flatnonzero(known)[:, None], _ITEM] = item_dense[rows[known]]
    dense[:, _GENRE] = genre_table[codes]  # code -1: the last row
    with torch.inference_mode():
        return model(
            torch.from_numpy(dense),
            torch.full((n,), user_id, dtype=torch.int64),
            torch.from_numpy(item_ids),
        )


@pytest.mark.parametrize(
    "config",
    [
        PreRankerConfig(),
        PreRankerConfig(id_buckets=512, embedding_dim=8, hidden=(16,)),
        PreRankerConfig(embedding_dim=4, hidden=(32, 16, 8), dropout=0.2),
    ],
    ids=["default", "one-hidden-layer", "three-layers-dropout"],
)
def test_precomputed_item_side_scores_equal_the_full_forward(config: PreRankerConfig) -> None:
    model = trained_like(config)
    rng = np.random.default_rng(1)
    m, genres = 300, 7
    item_ids = rng.choice(np.arange(1, 10_000), size=m, replace=False)
    item_dense = (rng.random((m, len(ITEM_FEATURES))) * 150).astype(np.float32)
    item_dense[rng.random(item_dense.shape) < 0.1] = np.nan  # unknown features stay NaN
    scorer = SharedUserScorer(model, item_ids, item_dense)
    assert scorer.item_part.shape == (m, config.hidden[0])

    for user_id in (3, 4095, 10_001, -5):
        user = (rng.random(len(USER_FEATURES)) * 80).astype(np.float32)
        if user_id == -5:
            user[:] = np.nan  # a user the store does not know
        genre_table = (rng.random((genres + 1, len(USER_GENRE_FEATURES))) * 20).astype(np.float32)
        genre_table[-1] = np.nan  # the row of code -1
        genre_table[2] = np.nan  # a genre the user never saw
        n = 1_000
        rows = rng.integers(0, m, n)
        rows[:25] = -1  # candidates the item table does not hold
        candidates = np.where(rows >= 0, item_ids[np.maximum(rows, 0)], 77_777 + np.arange(n))
        codes = rng.integers(-1, genres, n)
        got = scorer.logits(user_id, user, genre_table, rows, codes, candidates)
        want = full_forward(model, user_id, user, genre_table, item_dense, rows, codes, candidates)
        assert got.shape == (n,)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_only_a_plain_fp32_preranker_in_eval_mode_is_split() -> None:
    model = trained_like(PreRankerConfig())
    assert SharedUserScorer.supports(model)
    assert not SharedUserScorer.supports(PreRanker(PreRankerConfig()).train())
    assert not SharedUserScorer.supports(trained_like(PreRankerConfig()).to(torch.bfloat16))
    assert not SharedUserScorer.supports(torch.nn.Linear(3, 1))
    with pytest.raises(TypeError, match="cannot be split"):
        SharedUserScorer(PreRanker(PreRankerConfig()).train(), np.arange(3), np.zeros((3, 4)))


def test_an_empty_item_table_scores_every_candidate_as_unknown() -> None:
    model = trained_like(PreRankerConfig(id_buckets=64, embedding_dim=4, hidden=(8,)))
    scorer = SharedUserScorer(model, np.array([], dtype=np.int64), np.zeros((0, 4), np.float32))
    genre_table = np.full((1, len(USER_GENRE_FEATURES)), np.nan, dtype=np.float32)
    rows = np.full(5, -1)
    codes = np.full(5, -1)
    ids = np.arange(5)
    user = np.ones(len(USER_FEATURES), dtype=np.float32)
    got = scorer.logits(1, user, genre_table, rows, codes, ids)
    want = full_forward(model, 1, user, genre_table, np.zeros((0, 4), np.float32), rows, codes, ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
