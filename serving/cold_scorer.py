"""The FSCD ColdPreRanker scored one user x N candidates per request: by its compiled
AOTInductor package, or eagerly by the network's own request call behind the same scorer."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from models.preranking.fields import FieldEncoder
from models.preranking.model import ColdPreRanker, request_fields
from serving.online_fields import KeyedColumn
from serving.request_profile import StageClock


@dataclass(frozen=True, slots=True)
class UserSide:
    """One user's share of a request's network inputs, the same for every request of that user
    while the online store answers the same (:meth:`CompiledColdScorer.user_side`)."""

    user: np.ndarray
    """The user's codes ``[1, F]``."""
    cross_columns: np.ndarray
    """The columns of ``F`` where :meth:`genre_cross` holds a code other than 0."""
    cross_codes: np.ndarray
    """``[G + 1, len(cross_columns)]``: those columns of :meth:`genre_cross` (held compact: a
    user's share is then about a kilobyte for a few dozen fields)."""
    width: int
    values: dict[str, float]
    """The user fields' values the request is scored with (the feedback log keeps them)."""

    def genre_cross(self) -> np.ndarray:
        """``[G + 1, F]``: row ``g`` the cross codes of the user and genre code ``g``, the last
        row those of a candidate without a genre."""
        out = np.zeros((len(self.cross_codes), self.width), dtype=np.int64)
        out[:, self.cross_columns] = self.cross_codes
        return out


def eager_run(model: ColdPreRanker) -> Callable[..., torch.Tensor]:
    """The network's own request call, in the package's signature: ``(user_codes [1, F],
    candidate_codes [N, F], cross_codes [K, F], cross_rows [N]) -> logits [N]``
    (:meth:`ColdPreRanker.score_request`)."""

    def run(
        user_codes: torch.Tensor,
        candidate_codes: torch.Tensor,
        cross_codes: torch.Tensor,
        cross_rows: torch.Tensor,
    ) -> torch.Tensor:
        with torch.no_grad():
            return model.score_request(user_codes[0], candidate_codes, cross_codes, cross_rows)

    return run


class CompiledColdScorer:
    """A ColdPreRanker's AOTInductor package (:func:`compilers.preranking.compile_cold_preranking`:
    one user's codes ``[1, F]``, N candidates' codes ``[N, F]``, the codes of the request's K
    distinct cross keys ``[K, F]`` and each candidate's key ``[N]`` in, logits out; F: the
    model's field set). With :func:`eager_run` as ``run`` it is the eager scorer of the model.

    The item fields of every table item (its id, its genre, the columns of the item table) are
    encoded once per version (a ``[M + 1, F]`` code table, the last row for an item not in the
    table: every item field unknown but its id); per request the user fields are encoded once
    and the candidates' rows gathered from the table. The cross fields are encoded once per key
    of their source (a key of the view read online; one per candidate only for values the
    request carries), the candidates' combinations of those keys deduplicated, and the network
    computes its cross side once per combination (1,000 candidates of one user: a few dozen).
    Only the fields the network reads are encoded; the package ignores the other columns. A
    package built with the earlier two-input signature still loads: its candidates' rows then
    carry their cross codes.

    Fields beyond the ids (:func:`models.preranking.model.request_fields`: the statistics of
    the field set) come with each request in ``extra``: ``{name: values}``, one value for a
    user field, one per candidate otherwise (NaN: unknown), or per distinct key in ``keyed``;
    an item field the item table holds (``item_columns``: read once per version) is encoded
    with the table's items instead, and ``extra`` may still override it.
    """

    PARITY_ATOL = 1e-4
    """Largest logit difference to the eager scorer :meth:`check_against` accepts."""
    MEMO_ENTRIES = 8_192
    """Encoded rows of numbers :meth:`_numbers` remembers."""

    def __init__(
        self,
        run: Callable[..., Any],
        model: ColdPreRanker,
        encoder: FieldEncoder,
        item_ids: np.ndarray,
        item_dense: np.ndarray,
        item_genres: Sequence[str | None],
        item_columns: Sequence[str] = (),
    ) -> None:
        """``item_dense [M, len(item_columns)]``: the table's values of ``item_columns``."""
        self.run = run
        self.encoder = encoder
        field_set = model.field_set
        if tuple(field_set) != tuple(encoder.fields):
            raise ValueError(
                f"the model reads fields {list(field_set.names)}, its encoder encodes "
                f"{list(encoder.fields.names)}"
            )
        self.width = len(field_set)
        outside = request_fields(model)
        self.table_fields = frozenset(
            name for name, kind in outside.items() if kind == "item" and name in item_columns
        )
        """Fields beyond the ids whose codes come from the item table."""
        self.request_fields = {n: k for n, k in outside.items() if n not in self.table_fields}
        """``{name: kind}`` of the fields every request must carry in ``extra``."""
        self._extra = [(name, field_set.position(name), kind) for name, kind in outside.items()]
        self._numeric = frozenset(n for n in outside if n in encoder.edges)
        """Extra fields encoded by edges (numbers), several at once per request."""
        self._user_id_position = next(
            (p for p in model.user_index.tolist() if field_set[p].name == "user_id"), None
        )
        """The column of the request's user id, when the network reads it (its only user field
        that is not a request field)."""
        item_ids = np.asarray(item_ids, dtype=np.int64)
        dense = np.asarray(item_dense)
        if dense.dtype.kind != "f":
            dense = dense.astype(np.float64)
        dense = dense.reshape(len(item_ids), len(item_columns))
        columns: dict[str, Any] = {"item_id": item_ids, "genre": list(item_genres)}
        columns.update({name: dense[:, j] for j, name in enumerate(item_columns)})
        self.item_codes = np.zeros((len(item_ids) + 1, self.width), dtype=np.int64)
        self._item_id_position: int | None = None
        for position in model.item_index.tolist():
            name = field_set[position].name
            if name in self.request_fields or name not in columns:
                continue
            self.item_codes[:-1, position] = encoder.encode_column(name, columns[name])
            if name == "item_id":
                self._item_id_position = position
        self._memo: dict[tuple[Any, ...], np.ndarray] = {}
        self._keyed_cross = getattr(run, "inputs", 4) == 4
        """The package takes the cross side per key (``cross_codes``, ``cross_rows``); a
        package built before that takes each candidate's cross codes in its row."""

    @property
    def keyed_cross(self) -> bool:
        """Whether the package takes the cross side per key (its four-input signature)."""
        return self._keyed_cross

    def logits(
        self,
        user_id: int,
        rows: np.ndarray,
        item_ids: np.ndarray,
        extra: Mapping[str, np.ndarray] | None = None,
        keyed: Mapping[str, KeyedColumn] | None = None,
        clock: StageClock | None = None,
    ) -> torch.Tensor:
        """Logits ``[N]`` for ``user_id`` and the candidates ``item_ids [N]``; ``rows [N]``:
        each candidate's row in the item table (-1: not in it). ``extra``: the values of
        :attr:`request_fields` (ValueError naming any that is missing); ``keyed``:
        per-candidate fields read per distinct key (:class:`serving.online_fields.KeyedColumn`),
        in place of their ``[N]`` values in ``extra``: encoded once per key and gathered, the
        codes encoding each candidate's value would give. ``clock``: laps ``encode`` before
        the network runs (:mod:`serving.request_profile`)."""
        inputs = self.encode(user_id, rows, item_ids, extra, keyed)
        if clock is not None:
            clock.lap("encode")
        return self.run_inputs(*inputs)

    def side_logits(
        self,
        side: UserSide,
        rows: np.ndarray,
        item_ids: np.ndarray,
        genre_codes: np.ndarray,
        clock: StageClock | None = None,
    ) -> torch.Tensor:
        """:meth:`logits` of a request whose every field beyond the ids is the user's or a
        cross of the user and the candidate's genre, from the user's :class:`UserSide`
        (:meth:`user_side`): the candidates' rows gathered from the item table, each one's
        cross codes the side's row of its genre (``genre_codes [N]``, -1: none). The same
        codes :meth:`logits` gives the request, without reading or encoding per request."""
        candidates = self._candidates(rows, item_ids)
        cross = side.genre_cross()
        cross_rows = np.where(genre_codes >= 0, genre_codes, len(cross) - 1)
        if clock is not None:
            clock.lap("encode")
        return self.run_inputs(side.user, candidates, cross, cross_rows)

    def user_side(
        self,
        user_id: int,
        genres: int,
        extra: Mapping[str, np.ndarray],
        keyed: Mapping[str, KeyedColumn],
        values: Mapping[str, float],
    ) -> UserSide:
        """The :class:`UserSide` of ``user_id`` from its fields as read for ``genres + 1``
        pseudo-candidates, one of each genre code ``0..genres - 1`` and the last without a
        genre (``extra``: the user fields; ``keyed``: the user x genre ones, per genre):
        :meth:`encode` of them, its cross codes put in genre order. ``values``: the user
        fields' values as the feedback log keeps them."""
        count = genres + 1
        user, _, cross, cross_rows = self.encode(
            user_id,
            np.full(count, -1, dtype=np.int64),
            np.zeros(count, dtype=np.int64),
            extra,
            keyed,
        )
        by_genre = cross[cross_rows]
        columns = np.flatnonzero(by_genre.any(axis=0))
        return UserSide(
            user=user,
            cross_columns=columns,
            cross_codes=np.ascontiguousarray(by_genre[:, columns]),
            width=self.width,
            values=dict(values),
        )

    def encode(
        self,
        user_id: int,
        rows: np.ndarray,
        item_ids: np.ndarray,
        extra: Mapping[str, np.ndarray] | None = None,
        keyed: Mapping[str, KeyedColumn] | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The package's inputs of :meth:`logits`: ``(user [1, F], candidates [N, F], cross
        [K, F], cross_rows [N])``."""
        extra = extra or {}
        keyed = keyed or {}
        absent = [n for n in self.request_fields if n not in extra and n not in keyed]
        if absent:
            raise ValueError(f"the request lacks values of fields {absent} the model reads")
        user = np.zeros((1, self.width), dtype=np.int64)
        if self._user_id_position is not None:
            code = self.encoder.encode_column("user_id", [int(user_id)])[0]
            user[0, self._user_id_position] = code
        rows = np.asarray(rows, dtype=np.int64)
        n = len(rows)
        candidates = self._candidates(rows, item_ids)
        # The cross fields are encoded per key, not per candidate: each source of them is a
        # factor (a code table [n, F] and each candidate's row in it), combined below.
        factors: list[tuple[np.ndarray, np.ndarray]] = []
        numeric_user: list[tuple[str, int, float]] = []
        by_keys: dict[tuple[int, int], list[tuple[str, int, str, KeyedColumn]]] = {}
        per_candidate: np.ndarray | None = None  # cross fields given one value per candidate
        for name, position, kind in self._extra:
            column = keyed.get(name) if kind != "user" else None
            if column is not None:
                if len(column.valid) != n:
                    raise ValueError(
                        f"field {name!r} has keys for {len(column.valid)} candidates, the "
                        f"request {n}"
                    )
                shared = (id(column.inverse), id(column.valid))
                by_keys.setdefault(shared, []).append((name, position, kind, column))
                continue
            if name not in extra:  # a table field: its codes are in the candidates' rows
                continue
            values = np.asarray(extra[name]).reshape(-1)
            if kind == "user":
                if name in self._numeric and values.dtype.kind == "f":
                    numeric_user.append((name, position, values[0]))
                else:
                    user[0, position] = self.encoder.encode_column(name, values[:1])[0]
                continue
            if len(values) != n:
                raise ValueError(f"field {name!r} has {len(values)} values for {n} candidates")
            if kind == "cross":
                if per_candidate is None:
                    per_candidate = np.zeros((n, self.width), dtype=np.int64)
                per_candidate[:, position] = self.encoder.encode_column(name, values)
            else:
                candidates[:, position] = self.encoder.encode_column(name, values)
        if per_candidate is not None:
            factors.append((per_candidate, np.arange(n, dtype=np.int64)))
        if numeric_user:
            names, positions, scalars = zip(*numeric_user, strict=True)
            user[0, list(positions)] = self._numbers(names, np.array([scalars]))[0]
        for group in by_keys.values():  # one view's fields: the same keys, one encoding
            table = self._encode_keyed(group)
            first = group[0][3]
            key_rows = np.full(n, len(table) - 1, dtype=np.int64)  # no key: the zero row
            key_rows[first.valid] = first.inverse
            per_key = [(p, k) for _, p, k, _ in group]
            item_side = [p for p, k in per_key if k != "cross"]
            if item_side:  # other per-candidate fields read by key: expanded on the rows
                candidates[:, item_side] = table[key_rows][:, item_side]
            if any(k == "cross" for _, k in per_key):
                table[:, item_side] = 0
                factors.append((table, key_rows))
        cross, cross_rows = _combine(factors, n, self.width)
        return user, candidates, cross, cross_rows

    def _candidates(self, rows: np.ndarray, item_ids: np.ndarray) -> np.ndarray:
        """The candidates' item codes ``[N, F]``: their rows of the item code table, an item
        not in the table (row -1) with its id encoded."""
        # Row -1 picks the last row: an unknown item (take: half the time of a[rows] here).
        candidates = np.take(self.item_codes, rows, axis=0)
        missing = rows < 0
        if self._item_id_position is not None and missing.any():
            candidates[missing, self._item_id_position] = self.encoder.encode_column(
                "item_id", np.asarray(item_ids, dtype=np.int64)[missing]
            )
        return candidates

    def run_inputs(
        self, user: np.ndarray, candidates: np.ndarray, cross: np.ndarray, cross_rows: np.ndarray
    ) -> torch.Tensor:
        """Logits ``[N]`` of the package's inputs (:meth:`encode`)."""
        with torch.inference_mode():
            if self._keyed_cross:
                out = self.run(
                    torch.from_numpy(user),
                    torch.from_numpy(candidates),
                    torch.from_numpy(cross),
                    torch.from_numpy(cross_rows),
                )
            else:  # a package of the per-candidate signature: the cross codes on each row
                candidates = candidates + cross[cross_rows]
                out = self.run(torch.from_numpy(user), torch.from_numpy(candidates))
        return torch.as_tensor(out).reshape(-1)

    def _encode_keyed(self, group: list[tuple[str, int, str, KeyedColumn]]) -> np.ndarray:
        """Codes ``[K + 1, F]`` of a group of fields read with the same keys: row ``k`` the
        fields' codes for key ``k``, the last row zeros (no key: every field missing)."""
        first = group[0][3]
        table = np.zeros((len(first.values) + 1, self.width), dtype=np.int64)
        numeric = [(name, p, c) for name, p, _, c in group if name in self._numeric]
        if numeric:  # encoded together
            names, positions, columns = zip(*numeric, strict=True)
            per_key = np.column_stack([c.values for c in columns])
            table[:-1, list(positions)] = self._numbers(names, per_key)
        for name, position, _, column in group:
            if name not in self._numeric:
                table[:-1, position] = self.encoder.encode_column(name, column.values)
        return table

    def _numbers(self, names: Sequence[str], values: np.ndarray) -> np.ndarray:
        """:meth:`FieldEncoder.encode_numbers` of ``values`` (float ``[R, len(names)]``),
        remembered by the values' bytes: a user's fields and its per-key fields come again with
        every request of that user, with the same values until the online store changes. The
        codes are a function of the values alone (a served version's encoder is never refitted),
        so a remembered answer is the one encoding gives; at most :attr:`MEMO_ENTRIES` are
        held (then all are dropped)."""
        values = np.ascontiguousarray(values, dtype=np.float64)
        key = (tuple(names), values.shape, values.tobytes())
        codes = self._memo.get(key)
        if codes is None:
            codes = self.encoder.encode_numbers(names, values)
            if len(self._memo) >= self.MEMO_ENTRIES:
                self._memo.clear()
            self._memo[key] = codes
        return codes

    def check_against(self, eager: CompiledColdScorer, candidates: int = 64) -> None:
        """Raise unless the package scores a probe request (the first table items, an item not
        in the table, an unknown user with unknown fields) like the eager scorer."""
        count = min(candidates, len(self.item_codes) - 1)
        rows = np.append(np.arange(count, dtype=np.int64), -1)
        item_ids = np.append(np.arange(1, count + 1, dtype=np.int64), -7)
        extra = {
            name: np.full(1 if kind == "user" else len(rows), np.nan, dtype=np.float32)
            for name, kind in self.request_fields.items()
        }
        with torch.inference_mode():
            got = self.logits(-1, rows, item_ids, extra=extra)
            want = eager.logits(-1, rows, item_ids, extra=extra)
        gap = float((got - want).abs().max())
        if not gap <= self.PARITY_ATOL:
            raise ValueError(
                f"the package's logits differ from the network's by {gap:.3g} on a probe request "
                f"(allowed {self.PARITY_ATOL:g}); recompile it for this model"
            )


def _combine(
    factors: list[tuple[np.ndarray, np.ndarray]], n: int, width: int
) -> tuple[np.ndarray, np.ndarray]:
    """One code table ``[K, F]`` and each of ``n`` candidates' row in it from factors
    ``(table [m, F], rows [n])`` holding disjoint columns: the distinct combinations of their
    rows that candidates have (K = 1, all zeros, without a factor)."""
    if not factors:
        return np.zeros((1, width), dtype=np.int64), np.zeros(n, dtype=np.int64)
    table, rows = factors[0]
    for other, other_rows in factors[1:]:
        pairs, rows = np.unique(rows * len(other) + other_rows, return_inverse=True)
        table = table[pairs // len(other)] + other[pairs % len(other)]
    return table, rows.reshape(-1)
