"""Feature fields of the ranking cascade, their computing cost, and their integer encoding.

Every input of the teacher, the FSCD pre-ranker and the two-tower baseline is a *field*: a
user-side, item-side or cross (user x item) value that is looked up or computed at serving time.
Each field is encoded as one integer per row (ids through a vocabulary, dense values through
quantile bins fitted on the training split, 0 = unknown/missing) and embedded by the networks.

The cost of a field (:func:`field_cost`) is what FSCD trades accuracy against. It follows the
three properties the paper uses: the field type (a user-side value is computed once per request
and an item-side one is precomputed per item, but a cross value must be looked up or computed for
every user x candidate pair), the key cardinality (bigger tables cost more memory and lookups),
and the embedding width; a windowed statistic (the cross-statistics engine's 1/7/30-day
windows) also by its window, and by its lookup keys' cardinality when known. Check the costs
with::

    python -c "from models.preranking.fields import describe_costs; print(describe_costs())"

The fields are data, not a constant: a :class:`FieldSet` (an ordered tuple of
:class:`FieldSpec`) is fitted into the :class:`FieldEncoder`, built into the networks, written
as ``fields.json`` beside every saved model and read back by the compiler and the server.
:data:`FIELDS` is the default set (the MovieLens-shaped training-set contract). A training set
with more columns declares them, e.g. as a training-set builder returns them beside its frame::

    fields = FieldSet.from_declarations(
        {"ctr_user_x_item_genre_7d": {"kind": "cross", "categorical": False, "window_days": 7}},
        frame,  # checks the columns; counts "keys" (optional) into key_cardinality
    )

and a training run takes them from ``CascadeTrainConfig.fields`` (inline declarations or a
JSON file's path, ``cascade_train --fields PATH``) or from a ``fields.json`` of declarations
written beside the training parquet (see :func:`models.preranking.fscd_data.resolve_fields`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch

from domains.ctr.schema import ITEM_FEATURES, USER_FEATURES, USER_GENRE_FEATURES

FieldKind = Literal["user", "item", "cross"]

KIND_WEIGHT: dict[str, float] = {"user": 1.0, "item": 1.0, "cross": 3.0}
"""Relative per-request cost by type: a cross field is evaluated for every candidate, and its
lookup key (user, genre) cannot be cached per item or per request."""

BASE_EMBEDDING_DIM = 8
"""The embedding width at which a field's width factor is 1."""

WINDOW_LOG_WEIGHT = 0.25
"""How much a statistic's window adds to its cost: the factor is
``1 + WINDOW_LOG_WEIGHT * log10(window_days)`` (1 day: 1.0, 7 days: 1.21, 30 days: 1.37). A
longer window holds more keys in the online store and costs more to refresh."""

DECLARATION_KEYS = frozenset({"kind", "categorical", "window_days", "keys", "key_cardinality"})
"""What one field declaration may say (see :meth:`FieldSet.from_declarations`)."""


@dataclass(frozen=True, kw_only=True)
class FieldSpec:
    """One input field: its source column, side, encoding and what its cost depends on."""

    name: str
    """Field name, also the frame column it is read from."""
    kind: FieldKind
    """``user`` (computed once per request), ``item`` (per candidate, cacheable per item) or
    ``cross`` (per user x candidate pair)."""
    categorical: bool
    """True for ids and strings (vocabulary encoding); False for numbers (quantile bins)."""
    window_days: int | None = None
    """The window of a windowed statistic (1, 7, 30 days of the cross-statistics engine);
    None for a value without one. Enters :func:`field_cost`."""
    key_cardinality: int | None = None
    """Distinct lookup keys behind the value (e.g. user x genre pairs seen in the window), when
    known; :func:`field_cost` then uses it in place of the encoded cardinality if larger."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a field needs a non-empty name, got {self.name!r}")
        if self.kind not in KIND_WEIGHT:
            raise ValueError(
                f"field {self.name!r}: unknown kind {self.kind!r}; use one of {sorted(KIND_WEIGHT)}"
            )
        if not isinstance(self.categorical, bool):
            raise ValueError(f"field {self.name!r}: categorical must be true or false")
        for label, value in (
            ("window_days", self.window_days),
            ("key_cardinality", self.key_cardinality),
        ):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(
                    f"field {self.name!r}: {label} must be an integer >= 1, got {value!r}"
                )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "categorical": self.categorical,
        }
        if self.window_days is not None:
            out["window_days"] = self.window_days
        if self.key_cardinality is not None:
            out["key_cardinality"] = self.key_cardinality
        return out


class FieldSet(tuple[FieldSpec, ...]):
    """The ordered fields a model reads: the column order of :meth:`FieldEncoder.encode`.

    A tuple of :class:`FieldSpec` (so ``fields[j]``, ``len(fields)`` and iteration work) whose
    names are unique. It travels as data: fitted into the encoder, built into the networks,
    written as ``fields.json`` beside every saved model (:meth:`save` / :meth:`load`), read back
    by the compiler and the server. :data:`FIELDS` is the default set.
    """

    def __new__(cls, specs: Iterable[FieldSpec] = ()) -> FieldSet:
        specs = tuple(specs)
        for spec in specs:
            if not isinstance(spec, FieldSpec):
                raise ValueError(f"a FieldSet holds FieldSpec values, got {spec!r}")
        names = [s.name for s in specs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate field names {duplicates}; every field needs its own name")
        return super().__new__(cls, specs)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self)

    def spec(self, name: str) -> FieldSpec:
        for s in self:
            if s.name == name:
                return s
        raise KeyError(f"no field {name!r}; the field set has {list(self.names)}")

    def position(self, name: str) -> int:
        """Column of ``name`` in the encoded codes."""
        try:
            return self.names.index(name)
        except ValueError:
            raise KeyError(f"no field {name!r}; the field set has {list(self.names)}") from None

    def require_columns(self, frame: pd.DataFrame, what: str = "frame") -> None:
        """ValueError naming every field without its column in ``frame``."""
        missing = [n for n in self.names if n not in frame.columns]
        if missing:
            raise ValueError(
                f"{what} lacks field columns {missing}; the field set expects {list(self.names)}"
            )

    def is_default(self) -> bool:
        return tuple(self) == tuple(FIELDS)

    # --- building from declarations -------------------------------------------------------

    @classmethod
    def from_declarations(
        cls,
        declarations: Mapping[str, Mapping[str, Any]],
        frame: pd.DataFrame | None = None,
        *,
        base: Iterable[FieldSpec] | None = None,
    ) -> FieldSet:
        """``base`` (default: :data:`FIELDS`) followed by the declared fields, in order.

        ``declarations``: ``{name: {"kind": "user"|"item"|"cross", "categorical": bool
        (default false), "window_days": int (optional), "keys": [columns] (optional),
        "key_cardinality": int (optional)}}`` -- what a training-set builder returns beside
        its frame. With ``frame``, every declared column must be in it, and ``keys`` (the
        statistic's lookup key columns, e.g. ``["user_id", "item_genre"]``) are counted on it
        into ``key_cardinality``.
        """
        if not isinstance(declarations, Mapping):
            raise ValueError(
                "field declarations must map a field name to {kind, categorical, window_days}, "
                f"got {type(declarations).__name__}"
            )
        specs = list(FIELDS if base is None else base)
        for name, declared in declarations.items():
            if not isinstance(declared, Mapping):
                raise ValueError(
                    f"field {name!r}: its declaration must be an object, got {declared!r}"
                )
            unknown = sorted(set(declared) - DECLARATION_KEYS)
            if unknown:
                raise ValueError(
                    f"field {name!r}: unknown declaration keys {unknown}; "
                    f"use {sorted(DECLARATION_KEYS)}"
                )
            if "kind" not in declared:
                raise ValueError(
                    f"field {name!r}: its declaration needs a kind ({sorted(KIND_WEIGHT)})"
                )
            key_cardinality = declared.get("key_cardinality")
            keys = declared.get("keys")
            if keys is not None:
                if isinstance(keys, str) or not all(isinstance(k, str) for k in keys) or not keys:
                    raise ValueError(f"field {name!r}: keys must list column names, got {keys!r}")
                if frame is not None:
                    absent = [k for k in keys if k not in frame.columns]
                    if absent:
                        raise ValueError(
                            f"field {name!r}: key columns {absent} are not in the frame"
                        )
                    present = (
                        frame.loc[frame[name].notna(), list(keys)]
                        if name in frame.columns
                        else frame[list(keys)]
                    )
                    key_cardinality = max(1, len(present.drop_duplicates()))
            specs.append(
                FieldSpec(
                    name=str(name),
                    kind=declared["kind"],
                    categorical=declared.get("categorical", False),
                    window_days=declared.get("window_days"),
                    key_cardinality=key_cardinality,
                )
            )
        fields = cls(specs)
        if frame is not None:
            fields.require_columns(frame)
        return fields

    # --- fields.json ----------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """``{"version": 1, "fields": [{name, kind, categorical, window_days?,
        key_cardinality?}, ...]}``: the whole ordered set."""
        return {"version": FIELDS_FORMAT, "fields": [s.to_dict() for s in self]}

    @classmethod
    def from_json(cls, data: Any, frame: pd.DataFrame | None = None) -> FieldSet:
        """Inverse of :meth:`to_json`; also takes a bare mapping of declarations (extending the
        default set, see :meth:`from_declarations`): what a training-set builder writes."""
        if isinstance(data, Mapping) and isinstance(data.get("fields"), list):
            version = data.get("version", FIELDS_FORMAT)
            if version != FIELDS_FORMAT:
                raise ValueError(
                    f"fields.json version {version!r}; this code reads {FIELDS_FORMAT}"
                )
            specs = []
            for entry in data["fields"]:
                if not isinstance(entry, Mapping) or "name" not in entry:
                    raise ValueError(f"a field entry needs a name, got {entry!r}")
                unknown = sorted(set(entry) - DECLARATION_KEYS - {"name"})
                if unknown:
                    raise ValueError(f"field {entry['name']!r}: unknown keys {unknown}")
                if "kind" not in entry or "categorical" not in entry:
                    raise ValueError(f"field {entry['name']!r}: needs kind and categorical")
                specs.append(
                    FieldSpec(
                        name=entry["name"],
                        kind=entry["kind"],
                        categorical=entry["categorical"],
                        window_days=entry.get("window_days"),
                        key_cardinality=entry.get("key_cardinality"),
                    )
                )
            fields = cls(specs)
            if frame is not None:
                fields.require_columns(frame)
            return fields
        return cls.from_declarations(data, frame)

    def save(self, folder: Path) -> Path:
        """Write ``folder/fields.json`` (the folder made if need be); returns its path."""
        path = Path(folder) / FIELDS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: Path, frame: pd.DataFrame | None = None) -> FieldSet:
        """A field set from a JSON file (:meth:`from_json`); duplicate names are refused."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(), object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from exc
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc
        return cls.from_json(data, frame)

    @classmethod
    def beside(cls, folder: Path) -> FieldSet:
        """``folder/fields.json``, or the default set when the folder has none (a model saved
        before field sets were recorded)."""
        path = Path(folder) / FIELDS_FILE
        return cls.load(path) if path.is_file() else FIELDS


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise ValueError(f"duplicate field names {duplicates}")
    return dict(pairs)


FIELDS_FILE = "fields.json"
"""Written beside every saved model's weights: the :class:`FieldSet` it reads."""
FIELDS_FORMAT = 1

ID_FIELDS = (
    FieldSpec(name="user_id", kind="user", categorical=True),
    FieldSpec(name="item_id", kind="item", categorical=True),
    FieldSpec(name="genre", kind="item", categorical=True),
)
FIELDS: FieldSet = FieldSet(
    (
        *ID_FIELDS,
        *(FieldSpec(name=n, kind="user", categorical=False) for n in USER_FEATURES),
        *(FieldSpec(name=n, kind="item", categorical=False) for n in ITEM_FEATURES),
        *(FieldSpec(name=n, kind="cross", categorical=False) for n in USER_GENRE_FEATURES),
    )
)
"""The default field set (the MovieLens-shaped training-set contract of the ``debug``,
``ml100k``, ``generated`` and ``pipeline`` configs), in the column order of
:meth:`FieldEncoder.encode`."""
FIELD_NAMES = FIELDS.names


def field_cost(
    kind: str,
    cardinality: int,
    embedding_dim: int,
    *,
    window_days: int | None = None,
    key_cardinality: int | None = None,
) -> float:
    """Cost of one field: type weight x (1 + log10 cardinality) x width factor x window factor.

    The type weight charges a cross value (looked up for every candidate) three times a user or
    item one. The cardinality is the larger of the encoded codes and ``key_cardinality`` (the
    lookup keys behind a statistic); the log keeps a 1,000-key id table a few times dearer than
    a 17-bin dense value rather than 60 times: the lookup, not the table size, dominates
    per-request latency. The window factor is ``1 + WINDOW_LOG_WEIGHT * log10(window_days)``
    (1 without a window).
    """
    if kind not in KIND_WEIGHT:
        raise ValueError(f"unknown field kind {kind!r}; use one of {sorted(KIND_WEIGHT)}")
    if cardinality < 1 or embedding_dim < 1:
        raise ValueError("cardinality and embedding_dim must be >= 1")
    if window_days is not None and window_days < 1:
        raise ValueError(f"window_days must be >= 1, got {window_days}")
    keys = max(cardinality, key_cardinality or 1)
    window = 1.0 if window_days is None else 1.0 + WINDOW_LOG_WEIGHT * math.log10(window_days)
    return (
        KIND_WEIGHT[kind] * (1.0 + math.log10(keys)) * (embedding_dim / BASE_EMBEDDING_DIM) * window
    )


SMALL_LOOKUP = 64
"""Categorical values encoded through a dict rather than a pandas Index up to this many (a
request's user id, its unknown item ids): building the Index cost more than the lookup."""


class FieldEncoder:
    """Fitted on the training split; turns a frame into ``LongTensor [N, len(fields)]``.

    ``fields`` (default :data:`FIELDS`) names the columns and their order. Value 0 of every
    field means unknown (unseen id, missing number), so the encoding of the test split and of
    serving requests never fails on new keys.
    """

    def __init__(self, fields: Iterable[FieldSpec] | None = None, *, bins: int = 16) -> None:
        if bins < 2:
            raise ValueError(f"bins must be >= 2, got {bins}")
        self.fields: FieldSet = (
            FIELDS
            if fields is None
            else fields
            if isinstance(fields, FieldSet)
            else FieldSet(fields)
        )
        if not self.fields:
            raise ValueError("a FieldEncoder needs at least one field")
        self.bins = bins
        self.vocab: dict[str, pd.Index] = {}
        self.edges: dict[str, np.ndarray] = {}
        self._buckets: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._edge_matrices: dict[tuple[str, ...], tuple[list[Any], np.ndarray]] = {}
        self._lookups: dict[str, tuple[pd.Index, dict[Any, int] | None]] = {}

    def fit(self, frame: pd.DataFrame) -> FieldEncoder:
        self.fields.require_columns(frame, "the training frame")
        for spec in self.fields:
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
        return [self.cardinality(f.name) for f in self.fields]

    def encode(self, frame: pd.DataFrame) -> torch.Tensor:
        if not self.vocab and not self.edges:
            raise RuntimeError("FieldEncoder.encode before fit(); fit it on the training split")
        self.fields.require_columns(frame)
        codes = np.zeros((len(frame), len(self.fields)), dtype=np.int64)
        for j, spec in enumerate(self.fields):
            codes[:, j] = self.encode_column(spec.name, frame[spec.name])
        return torch.from_numpy(codes)

    def encode_column(self, name: str, values: Any) -> np.ndarray:
        """int64 codes of one field's values (a column, list or array; None/NaN: unknown).

        What :meth:`encode` does per column; serving calls it on the few values of a request
        without building a frame."""
        if name in self.vocab:
            lookup = self._vocab_lookup(name)
            if lookup is not None and not isinstance(values, pd.Series | pd.Index):
                try:  # a request's few ids: a dict, not an Index built per call
                    if len(values) <= SMALL_LOOKUP:
                        return np.fromiter(
                            (lookup.get(v, 0) for v in values), dtype=np.int64, count=len(values)
                        )
                except TypeError:  # an unhashable value: as the Index answers it
                    pass
            index = self.vocab[name].get_indexer(pd.Index(values))
            return (index + 1).astype(np.int64)  # -1 (unseen) becomes 0
        if name not in self.edges:
            raise KeyError(f"field {name!r} is not fitted; call fit() first")
        if isinstance(values, np.ndarray) and values.dtype.kind == "f":
            numbers = values.astype(np.float64, copy=False)  # no pandas round trip per request
        else:
            numbers = pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(np.float64)
        bounds, codes = self._bucket_table(name)
        return codes[np.searchsorted(bounds, numbers, side="right")]

    def _vocab_lookup(self, name: str) -> dict[Any, int] | None:
        """``{value: code}`` of a categorical field (what ``get_indexer`` + 1 gives for a
        value of the vocabulary; Python's equality, like the Index's, matches 5, 5.0 and
        ``np.int64(5)``); None when the vocabulary holds a NaN (never equal to itself, so a
        dict would miss it). Rebuilt when the field's vocabulary is replaced."""
        vocab = self.vocab[name]
        cached = self._lookups.get(name)
        if cached is None or cached[0] is not vocab:
            table = None if vocab.hasnans else {v: i + 1 for i, v in enumerate(vocab.tolist())}
            cached = self._lookups[name] = (vocab, table)
        return cached[1]

    def encode_numbers(self, names: Sequence[str], values: np.ndarray) -> np.ndarray:
        """int64 ``[R, K]`` codes of ``values`` (float ``[R, K]``: column ``k`` holds numbers
        of the numeric field ``names[k]``): :meth:`encode_column` on every column in one step,
        for the few rows of a request (a user's values, the values per distinct key). A number
        gets one plus the count of its field's edges at or below it, NaN gets 0."""
        values = np.asarray(values, dtype=np.float64)
        if values.ndim != 2 or values.shape[1] != len(names):
            raise ValueError(f"values of shape {values.shape} for {len(names)} fields")
        padded = self._edge_matrix(tuple(names))
        below = (padded[None, :, :] <= values[:, :, None]).sum(axis=2)  # NaN edges count 0
        return np.where(np.isnan(values), 0, below + 1).astype(np.int64)

    def _edge_matrix(self, names: tuple[str, ...]) -> np.ndarray:
        """``[K, max edges]``: each field's edges padded with NaN (never ``<=`` a number);
        rebuilt when a field's edges are replaced."""
        for name in names:
            if name in self.vocab:
                raise ValueError(f"field {name!r} is categorical: encode it with encode_column")
            if name not in self.edges:
                raise KeyError(f"field {name!r} is not fitted; call fit() first")
        edges = [self.edges[n] for n in names]
        cached = self._edge_matrices.get(names)
        if cached is None or any(a is not b for a, b in zip(cached[0], edges, strict=True)):
            width = max((len(e) for e in edges), default=0)
            matrix = np.full((len(names), max(width, 1)), np.nan)
            for k, e in enumerate(edges):
                matrix[k, : len(e)] = np.asarray(e, dtype=np.float64)
            cached = self._edge_matrices[names] = (edges, matrix)
        return cached[1]

    def _bucket_table(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """``(bounds, codes)`` of a numeric field: its edges with NaN appended, and the code of
        each position ``searchsorted(bounds, x, side="right")`` can return. NumPy orders NaN
        after every number, so a number lands at ``i <= len(edges)`` (code ``i + 1``) and a
        NaN at ``len(edges) + 1`` (code 0, unknown): one search and one take per column,
        the codes ``searchsorted(edges) + 1`` with NaN as 0 would give. Rebuilt when the
        field's edges are replaced."""
        edges = self.edges[name]
        cached = self._buckets.get(name)
        if cached is None or cached[0] is not edges:
            bounds = np.append(np.asarray(edges, dtype=np.float64), np.nan)
            codes = np.append(np.arange(1, len(edges) + 2, dtype=np.int64), 0)
            cached = self._buckets[name] = (edges, bounds, codes)
        return cached[1], cached[2]

    def costs(self, embedding_dim: int) -> list[float]:
        """Per-field cost, in the order of :attr:`fields`."""
        return [
            field_cost(
                f.kind,
                self.cardinality(f.name),
                embedding_dim,
                window_days=f.window_days,
                key_cardinality=f.key_cardinality,
            )
            for f in self.fields
        ]

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
    def from_state(
        cls, state: dict[str, Any], fields: Iterable[FieldSpec] | None = None
    ) -> FieldEncoder:
        """Inverse of :meth:`state`; ``fields``: the set it was fitted on (``fields.json``
        beside it; default :data:`FIELDS`). Every field must be in the state."""
        encoder = cls(fields, bins=int(state["bins"]))
        encoder.vocab = {k: pd.Index(v) for k, v in state["vocab"].items()}
        encoder.edges = {k: np.asarray(v, dtype=np.float64) for k, v in state["edges"].items()}
        unfitted = [
            f.name
            for f in encoder.fields
            if f.name not in encoder.vocab and f.name not in encoder.edges
        ]
        if unfitted:
            raise ValueError(
                f"the encoder state has no fit for fields {unfitted}; the field set and the "
                "encoder were not saved together"
            )
        return encoder


def describe_costs(embedding_dim: int = BASE_EMBEDDING_DIM) -> str:
    """The cost of every field on a small synthetic frame (for a quick look)."""
    from models.preranking.synthetic_data import synthetic_training_frame

    encoder = FieldEncoder().fit(synthetic_training_frame(5_000))
    costs = encoder.costs(embedding_dim)
    return "\n".join(
        f"{f.name:18s} {f.kind:5s} card={encoder.cardinality(f.name):5d} cost={c:.2f}"
        for f, c in zip(encoder.fields, costs, strict=True)
    )
