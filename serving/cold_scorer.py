"""The FSCD ColdPreRanker scored by its compiled AOTInductor package, behind the same call
as the eager :class:`models.preranking.model.ColdSharedScorer`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from cascade.ctr_schema import ITEM_FEATURES, USER_FEATURES, USER_GENRE_FEATURES
from models.preranking.fields import FIELDS, FieldEncoder
from models.preranking.model import ColdPreRanker, ColdSharedScorer

_USER_INDEX = {name: j for j, name in enumerate(USER_FEATURES)}


class CompiledColdScorer:
    """A ColdPreRanker's AOTInductor package (:func:`compilers.preranking.compile_cold_preranking`:
    one user's codes ``[1, F]`` and N candidates' codes ``[N, F]`` in, logits out) behind the
    same call as :class:`ColdSharedScorer`.

    The item fields of every table item are encoded once per version (a ``[M + 1, F]`` code
    table, the last row for an item not in the table: every item field unknown but its id);
    per request the user fields are encoded once, the cross fields once per genre of the
    request, and the candidates' rows are gathered from the tables. Only the fields the network
    reads are encoded; the package ignores the other columns.
    """

    PARITY_ATOL = 1e-4
    """Largest logit difference to the eager scorer :meth:`check_against` accepts."""

    def __init__(
        self,
        run: Callable[..., Any],
        model: ColdPreRanker,
        encoder: FieldEncoder,
        item_ids: np.ndarray,
        item_dense: np.ndarray,
        item_genres: Sequence[str | None],
    ) -> None:
        self.run = run
        self.encoder = encoder
        self._user = [(FIELDS[p].name, p) for p in model.user_index.tolist()]
        self._cross = [(FIELDS[p].name, p) for p in model.cross_index.tolist()]
        item_ids = np.asarray(item_ids, dtype=np.int64)
        dense = np.asarray(item_dense, dtype=np.float32).reshape(len(item_ids), -1)
        columns: dict[str, Any] = {"item_id": item_ids, "genre": list(item_genres)}
        columns.update({name: dense[:, j] for j, name in enumerate(ITEM_FEATURES)})
        self.item_codes = np.zeros((len(item_ids) + 1, len(FIELDS)), dtype=np.int64)
        self._item_id_position: int | None = None
        for position in model.item_index.tolist():
            name = FIELDS[position].name
            self.item_codes[:-1, position] = encoder.encode_column(name, columns[name])
            if name == "item_id":
                self._item_id_position = position
        self._cross_positions = [p for _, p in self._cross]
        self._cross_columns = [USER_GENRE_FEATURES.index(name) for name, _ in self._cross]

    def logits(
        self,
        user_id: int,
        user_dense: np.ndarray,
        genre_dense: np.ndarray,
        rows: np.ndarray,
        codes: np.ndarray,
        item_ids: np.ndarray,
    ) -> torch.Tensor:
        """Logits ``[N]``; the arguments as in :meth:`ColdSharedScorer.logits`."""
        user = np.zeros((1, len(FIELDS)), dtype=np.int64)
        user_values = np.asarray(user_dense, dtype=np.float32).reshape(-1)
        for name, position in self._user:
            value = [int(user_id)] if name == "user_id" else user_values[[_USER_INDEX[name]]]
            user[0, position] = self.encoder.encode_column(name, value)[0]
        rows = np.asarray(rows, dtype=np.int64)
        candidates = self.item_codes[rows]  # row -1 picks the last row: an unknown item
        missing = rows < 0
        if self._item_id_position is not None and missing.any():
            candidates[missing, self._item_id_position] = self.encoder.encode_column(
                "item_id", np.asarray(item_ids, dtype=np.int64)[missing]
            )
        if self._cross:
            genre_values = np.asarray(genre_dense, dtype=np.float32)
            per_genre = np.empty((len(genre_values), len(self._cross)), dtype=np.int64)
            for k, (name, _) in enumerate(self._cross):
                column = genre_values[:, self._cross_columns[k]]
                per_genre[:, k] = self.encoder.encode_column(name, column)
            # code -1 (unknown genre) is the last row of genre_dense, as in ColdSharedScorer.
            genre_rows = np.where(codes < 0, len(genre_values) - 1, codes)
            candidates[:, self._cross_positions] = per_genre[genre_rows]
        with torch.inference_mode():
            out = self.run(torch.from_numpy(user), torch.from_numpy(candidates))
        return torch.as_tensor(out).reshape(-1)

    def check_against(self, eager: ColdSharedScorer, candidates: int = 64) -> None:
        """Raise unless the package scores a probe request (the first table items, an item not
        in the table, an unknown user with unknown features) like the eager scorer."""
        count = min(candidates, len(self.item_codes) - 1)
        rows = np.append(np.arange(count, dtype=np.int64), -1)
        item_ids = np.append(np.arange(1, count + 1, dtype=np.int64), -7)
        genre_dense = np.full((2, len(USER_GENRE_FEATURES)), np.nan, dtype=np.float32)
        codes = np.full(len(rows), -1, dtype=np.int64)
        user_dense = np.full(len(USER_FEATURES), np.nan, dtype=np.float32)
        args = (-1, user_dense, genre_dense, rows, codes, item_ids)
        with torch.inference_mode():
            got, want = self.logits(*args), eager.logits(*args)
        gap = float((got - want).abs().max())
        if not gap <= self.PARITY_ATOL:
            raise ValueError(
                f"the package's logits differ from the network's by {gap:.3g} on a probe request "
                f"(allowed {self.PARITY_ATOL:g}); recompile it for this model"
            )
