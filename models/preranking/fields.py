"""Feature fields of the ranking cascade, their computing cost, and their integer encoding.

Every input of the teacher, the FSCD pre-ranker and the two-tower baseline is a *field*: a
user-side, item-side or cross (user x item) value that is looked up or computed at serving time.
Each field is encoded as one integer per row (ids through a vocabulary, dense values through
quantile bins fitted on the training split, 0 = unknown/missing) and embedded by the networks.

The cost of a field (:func:`field_cost`) is what FSCD trades accuracy against. It follows the
three properties the paper uses: the field type (a user-side value is computed once per request
and an item-side one is precomputed per item, but a cross value must be looked up or computed for
every user x candidate pair), the key cardinality (bigger tables cost more memory and lookups),
and the embedding width. Check the costs with::

    python -c "from models.preranking.fields import describe_costs; print(describe_costs())"
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch

from cascade.ctr_schema import ITEM_FEATURES, USER_FEATURES, USER_GENRE_FEATURES

FieldKind = Literal["user", "item", "cross"]

KIND_WEIGHT: dict[str, float] = {"user": 1.0, "item": 1.0, "cross": 3.0}
"""Relative per-request cost by type: a cross field is evaluated for every candidate, and its
lookup key (user, genre) cannot be cached per item or per request."""

BASE_EMBEDDING_DIM = 8
"""The embedding width at which a field's width factor is 1."""


@dataclass(frozen=True, kw_only=True)
class FieldSpec:
    """One input field: its source column, side and encoding."""

    name: str
    """Field name, also the frame column it is read from."""
    kind: FieldKind
    """``user`` (computed once per request), ``item`` (per candidate, cacheable per item) or
    ``cross`` (per user x candidate pair)."""
    categorical: bool
    """True for ids and strings (vocabulary encoding); False for numbers (quantile bins)."""


ID_FIELDS = (
    FieldSpec(name="user_id", kind="user", categorical=True),
    FieldSpec(name="item_id", kind="item", categorical=True),
    FieldSpec(name="genre", kind="item", categorical=True),
)
FIELDS: tuple[FieldSpec, ...] = (
    *ID_FIELDS,
    *(FieldSpec(name=n, kind="user", categorical=False) for n in USER_FEATURES),
    *(FieldSpec(name=n, kind="item", categorical=False) for n in ITEM_FEATURES),
    *(FieldSpec(name=n, kind="cross", categorical=False) for n in USER_GENRE_FEATURES),
)
"""Every field, in the column order of :meth:`FieldEncoder.encode`."""
FIELD_NAMES = tuple(f.name for f in FIELDS)


def field_cost(kind: str, cardinality: int, embedding_dim: int) -> float:
    """Cost of one field: type weight x (1 + log10 cardinality) x width factor.

    The log keeps a 1,000-key id table a few times dearer than a 17-bin dense value rather
    than 60 times: the lookup, not the table size, dominates per-request latency.
    """
    if kind not in KIND_WEIGHT:
        raise ValueError(f"unknown field kind {kind!r}; use one of {sorted(KIND_WEIGHT)}")
    if cardinality < 1 or embedding_dim < 1:
        raise ValueError("cardinality and embedding_dim must be >= 1")
    return (
        KIND_WEIGHT[kind] * (1.0 + math.log10(cardinality)) * (embedding_dim / BASE_EMBEDDING_DIM)
    )


class FieldEncoder:
    """Fitted on the training split; turns a frame into ``LongTensor [N, len(FIELDS)]``.

    Value 0 of every field means unknown (unseen id, missing number), so the encoding of the
    test split and of serving requests never fails on new keys.
    """

    def __init__(self, *, bins: int = 16) -> None:
        if bins < 2:
            raise ValueError(f"bins must be >= 2, got {bins}")
        self.bins = bins
        self.vocab: dict[str, pd.Index] = {}
        self.edges: dict[str, np.ndarray] = {}

    def fit(self, frame: pd.DataFrame) -> FieldEncoder:
        missing = [f.name for f in FIELDS if f.name not in frame.columns]
        if missing:
            raise ValueError(
                f"frame lacks field columns {missing}; expected {list(FIELD_NAMES)} "
                "(the pre-ranking training-set contract)"
            )
        for spec in FIELDS:
            column = frame[spec.name]
            if spec.categorical:
                self.vocab[spec.name] = pd.Index(pd.unique(column.dropna())).sort_values()
            else:
                values = pd.to_numeric(column, errors="coerce").dropna().to_numpy(np.float64)
                quantiles = np.linspace(0, 1, self.bins + 1)[1:-1]
                edges = np.unique(np.quantile(values, quantiles)) if len(values) else np.array([])
                self.edges[spec.name] = edges
        return self

    def cardinality(self, name: str) -> int:
        """Number of codes of a field, the unknown code 0 included."""
        if name in self.vocab:
            return len(self.vocab[name]) + 1
        if name in self.edges:
            return len(self.edges[name]) + 2
        raise KeyError(f"field {name!r} is not fitted; call fit() first")

    def cardinalities(self) -> list[int]:
        return [self.cardinality(f.name) for f in FIELDS]

    def encode(self, frame: pd.DataFrame) -> torch.Tensor:
        if not self.vocab:
            raise RuntimeError("FieldEncoder.encode before fit(); fit it on the training split")
        codes = np.zeros((len(frame), len(FIELDS)), dtype=np.int64)
        for j, spec in enumerate(FIELDS):
            codes[:, j] = self.encode_column(spec.name, frame[spec.name])
        return torch.from_numpy(codes)

    def encode_column(self, name: str, values: Any) -> np.ndarray:
        """int64 codes of one field's values (a column, list or array; None/NaN: unknown).

        What :meth:`encode` does per column; serving calls it on the few values of a request
        without building a frame."""
        if name in self.vocab:
            index = self.vocab[name].get_indexer(pd.Index(values))
            return (index + 1).astype(np.int64)  # -1 (unseen) becomes 0
        if name not in self.edges:
            raise KeyError(f"field {name!r} is not fitted; call fit() first")
        if isinstance(values, np.ndarray) and values.dtype.kind == "f":
            numbers = values.astype(np.float64, copy=False)  # no pandas round trip per request
        else:
            numbers = pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(np.float64)
        bucket = np.searchsorted(self.edges[name], numbers, side="right") + 1
        return np.where(np.isnan(numbers), 0, bucket).astype(np.int64)

    def costs(self, embedding_dim: int) -> list[float]:
        """Per-field cost, in FIELDS order."""
        return [field_cost(f.kind, self.cardinality(f.name), embedding_dim) for f in FIELDS]

    def state(self) -> dict[str, Any]:
        """JSON-ready state, saved beside every model so serving encodes the same way."""
        return {
            "bins": self.bins,
            "vocab": {
                k: [v.item() if hasattr(v, "item") else v for v in idx]
                for k, idx in self.vocab.items()
            },
            "edges": {k: e.tolist() for k, e in self.edges.items()},
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> FieldEncoder:
        """Inverse of :meth:`state`."""
        encoder = cls(bins=int(state["bins"]))
        encoder.vocab = {k: pd.Index(v) for k, v in state["vocab"].items()}
        encoder.edges = {k: np.asarray(v, dtype=np.float64) for k, v in state["edges"].items()}
        return encoder


def describe_costs(embedding_dim: int = BASE_EMBEDDING_DIM) -> str:
    """The cost of every field on a small synthetic frame (for a quick look)."""
    from models.preranking.synthetic_data import synthetic_training_frame

    encoder = FieldEncoder().fit(synthetic_training_frame(5_000))
    costs = encoder.costs(embedding_dim)
    return "\n".join(
        f"{f.name:18s} {f.kind:5s} card={encoder.cardinality(f.name):5d} cost={c:.2f}"
        for f, c in zip(FIELDS, costs, strict=True)
    )
