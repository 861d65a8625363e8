"""The pre-ranking network: a plain ``nn.Module``, no distributed code.

Inputs are raw feature values in :data:`cascade.ctr_schema.MODEL_FEATURES` order plus the ids;
the module applies ``log1p`` to counts and standardizes with statistics fitted on the training
set (held as buffers, so they travel with the state dict).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from cascade.ctr_schema import (
    COUNT_FEATURES,
    ITEM_FEATURES,
    MODEL_FEATURES,
    USER_FEATURES,
    USER_GENRE_FEATURES,
)
from models.preranking.fields import FIELDS, FieldEncoder, FieldSet


@dataclass(kw_only=True)
class PreRankerConfig:
    """Shape of the network."""

    num_dense: int = len(MODEL_FEATURES)
    """Number of dense inputs."""
    id_buckets: int = 4096
    """Hash buckets for user and item ids (id % buckets)."""
    embedding_dim: int = 16
    """Width of each id embedding."""
    hidden: tuple[int, ...] = (64, 32)
    """Hidden layer widths of the MLP."""
    dropout: float = 0.0
    """Dropout after each hidden layer."""

    def __post_init__(self) -> None:
        if self.num_dense < 1 or self.id_buckets < 1 or self.embedding_dim < 1:
            raise ValueError("num_dense, id_buckets and embedding_dim must be >= 1")
        if not self.hidden or min(self.hidden) < 1:
            raise ValueError("hidden must list positive widths")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError("dropout must be in [0, 1)")


class PreRanker(nn.Module):
    # Buffers, declared so type checkers see tensors rather than ``Tensor | Module``.
    count_mask: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, config: PreRankerConfig) -> None:
        super().__init__()
        self.config = config
        count_mask = torch.tensor(
            [name in COUNT_FEATURES for name in MODEL_FEATURES][: config.num_dense]
            + [False] * max(0, config.num_dense - len(MODEL_FEATURES))
        )
        self.register_buffer("count_mask", count_mask)
        self.register_buffer("mean", torch.zeros(config.num_dense))
        self.register_buffer("std", torch.ones(config.num_dense))
        self.user_embedding = nn.Embedding(config.id_buckets, config.embedding_dim)
        self.item_embedding = nn.Embedding(config.id_buckets, config.embedding_dim)
        layers: list[nn.Module] = []
        width = config.num_dense + 2 * config.embedding_dim
        for hidden in config.hidden:
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            if config.dropout:
                layers.append(nn.Dropout(config.dropout))
            width = hidden
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)

    def transform(self, dense: torch.Tensor) -> torch.Tensor:
        """log1p on counts, NaN (missing feature) to 0; the input to standardization."""
        dense = torch.nan_to_num(dense.float(), nan=0.0)
        return torch.where(self.count_mask, torch.log1p(dense.clamp_min(0.0)), dense)

    @torch.no_grad()
    def fit_normalizer(self, dense: torch.Tensor) -> None:
        """Set the standardization statistics from a sample of training rows."""
        x = self.transform(dense)
        self.mean.copy_(x.mean(dim=0))
        self.std.copy_(x.std(dim=0).clamp_min(1e-6))

    def forward(
        self, dense: torch.Tensor, user_id: torch.Tensor, item_id: torch.Tensor
    ) -> torch.Tensor:
        """Logits ``[B]`` from ``dense [B, num_dense]``, ``user_id [B]``, ``item_id [B]``."""
        x = (self.transform(dense) - self.mean) / self.std
        buckets = self.config.id_buckets
        u = self.user_embedding(torch.remainder(user_id.long(), buckets))
        i = self.item_embedding(torch.remainder(item_id.long(), buckets))
        # Under bf16 training the engine casts parameters but the dense input stays fp32.
        x = x.to(u.dtype)
        return self.mlp(torch.cat([x, u, i], dim=-1)).squeeze(-1)


_F32_MAX = np.float32(np.finfo(np.float32).max)


class _Side:
    """PreRanker's input transform and first-layer weights for some of its dense columns."""

    def __init__(self, model: PreRanker, columns: list[int]) -> None:
        self.count = model.count_mask[columns].numpy().copy()
        self.mean = model.mean[columns].float().numpy().copy()
        self.std = model.std[columns].float().numpy().copy()
        weight = model.mlp[0].weight  # type: ignore[index]
        self.weight = weight[:, columns].detach().float().T.numpy().copy()  # [k, h0]

    def part(self, values: np.ndarray) -> np.ndarray:
        """``values [B, k]`` raw (NaN: unknown) -> their share of the first layer ``[B, h0]``:
        the same steps as :meth:`PreRanker.transform` and the standardization."""
        x = np.asarray(values, dtype=np.float32)
        # nan_to_num(nan=0.0) as torch does it (infinities to the largest finite float), in
        # three ufuncs: numpy's own nan_to_num costs ~10x that on arrays this small.
        x = np.clip(np.where(np.isnan(x), np.float32(0.0), x), -_F32_MAX, _F32_MAX)
        x = np.where(self.count, np.log1p(np.maximum(x, np.float32(0.0))), x)
        return ((x - self.mean) / self.std) @ self.weight


class SharedUserScorer:
    """A :class:`PreRanker` split by input side, for one user x N candidates per request.

    The network's first layer is linear in its input (the user's, the item's and the user x
    genre features, then the user and item embeddings) and every input transform (log1p of
    counts, standardization) works per column, so the layer's pre-activation is a sum of
    per-side parts:

    * item side (item features, item embedding): computed for every item of the table when
      it is loaded, ``[M, h0]``, and gathered per candidate;
    * user side (user features, user embedding, the bias): once per request, ``[h0]``;
    * user x genre side: once per genre of the request, ``[G + 1, h0]`` (the last row: unknown
      genre), gathered per candidate by genre code.

    The rest of the MLP then runs on the ``[N, h0]`` sum as in the full forward. Scores equal
    the full forward's up to float rounding (the first layer's sum is taken in another
    order); a candidate missing from the table gets its item part computed on the spot, with
    unknown (NaN) features, as the full forward would. Per request this is two gathers, one
    add and the MLP after the first layer, in plain tensors (no autograd bookkeeping).
    """

    _USER = [MODEL_FEATURES.index(f) for f in USER_FEATURES]
    _ITEM = [MODEL_FEATURES.index(f) for f in ITEM_FEATURES]
    _GENRE = [MODEL_FEATURES.index(f) for f in USER_GENRE_FEATURES]

    @classmethod
    def supports(cls, model: nn.Module) -> bool:
        """True for a plain fp32 PreRanker over MODEL_FEATURES in eval mode whose MLP is
        Linear layers, ReLUs and (inactive) dropouts, starting with a Linear."""
        return (
            type(model) is PreRanker
            and not model.training
            and model.config.num_dense == len(MODEL_FEATURES)
            and isinstance(model.mlp[0], nn.Linear)
            and all(isinstance(m, nn.Linear | nn.ReLU | nn.Dropout) for m in model.mlp)
            and all(p.dtype == torch.float32 for p in model.parameters())
        )

    @torch.no_grad()
    def __init__(self, model: PreRanker, item_ids: np.ndarray, item_dense: np.ndarray) -> None:
        """``item_ids [M]`` and their raw ``ITEM_FEATURES`` ``item_dense [M, 4]`` (NaN where
        unknown): the in-memory item table the server scores against."""
        if not self.supports(model):
            raise TypeError(f"{type(model).__name__} cannot be split by input side (or in train)")
        first: nn.Linear = model.mlp[0]  # type: ignore[assignment]
        d, n = model.config.embedding_dim, len(MODEL_FEATURES)
        weight = first.weight.detach().float()
        self._buckets = model.config.id_buckets
        self._user = _Side(model, self._USER)
        self._item = _Side(model, self._ITEM)
        self._genre = _Side(model, self._GENRE)
        self._user_embedding = model.user_embedding.weight.detach().numpy().copy()
        self._item_embedding = model.item_embedding.weight.detach().numpy().copy()
        self._w_user_emb = weight[:, n : n + d].T.numpy().copy()  # [d, h0]
        self._w_item_emb = weight[:, n + d : n + 2 * d].T.numpy().copy()
        bias = first.bias.detach() if first.bias is not None else torch.zeros(weight.shape[0])
        self._bias = bias.float().numpy().copy()
        # The layers after the first as (weight^T, bias) for Linear, None for ReLU; dropout is
        # the identity in eval mode.
        self._layers: list[tuple[torch.Tensor, torch.Tensor] | None] = []
        for module in list(model.mlp)[1:]:
            if isinstance(module, nn.Linear):
                b = module.bias if module.bias is not None else torch.zeros(module.out_features)
                self._layers.append((module.weight.detach().T.clone(), b.detach().clone()))
            elif isinstance(module, nn.ReLU):
                self._layers.append(None)
        self.item_part = self._item_part(
            np.asarray(item_dense, dtype=np.float32).reshape(-1, len(self._ITEM)),
            np.asarray(item_ids, dtype=np.int64),
        )
        """``[M, h0]`` float32: the item side of the first layer, per row of the item table."""

    def _item_part(self, dense: np.ndarray, item_ids: np.ndarray) -> np.ndarray:
        embedding = self._item_embedding[np.remainder(item_ids, self._buckets)]
        part = self._item.part(dense) + embedding @ self._w_item_emb
        return np.ascontiguousarray(part, dtype=np.float32)

    def logits(
        self,
        user_id: int,
        user_dense: np.ndarray,
        genre_dense: np.ndarray,
        rows: np.ndarray,
        codes: np.ndarray,
        item_ids: np.ndarray,
    ) -> torch.Tensor:
        """Logits ``[N]``.

        ``user_dense [4]``: the user's USER_FEATURES; ``genre_dense [G + 1, 3]``: the user's
        USER_GENRE_FEATURES per genre code, the last row for code -1; ``rows [N]``: each
        candidate's row in the item table (-1: not in it); ``codes [N]``: its genre code
        (-1: unknown); ``item_ids [N]``: the candidates. NaN marks an unknown feature.
        """
        embedding = self._user_embedding[user_id % self._buckets]
        shared = self._bias + embedding @ self._w_user_emb
        shared = shared + self._user.part(np.reshape(user_dense, (1, -1)))[0]  # [h0]
        per_genre = self._genre.part(genre_dense) + shared  # [G + 1, h0]
        known = rows >= 0
        if known.all():
            h = self.item_part.take(rows, axis=0)
        else:
            h = np.empty((len(rows), self.item_part.shape[1]), dtype=np.float32)
            h[known] = self.item_part[rows[known]]
            unknown = ~known
            h[unknown] = self._item_part(
                np.full((int(unknown.sum()), len(self._ITEM)), np.nan, dtype=np.float32),
                np.asarray(item_ids, dtype=np.int64)[unknown],
            )
        h += per_genre.take(codes, axis=0, mode="wrap")  # code -1: the last row
        x = torch.from_numpy(h)
        for layer in self._layers:
            x = torch.relu_(x) if layer is None else torch.addmm(layer[1], x, layer[0])
        return x.squeeze(-1)


# --- The ranking cascade over encoded fields (models.preranking.fields) --------------------
#
# These networks read ``codes: LongTensor [B, len(field_set)]`` from ``FieldEncoder.encode``
# (``field_set``: the encoder's FieldSet, default FIELDS) and use the subset of fields they were
# built with, so one encoded batch feeds all of them.


@dataclass(kw_only=True)
class CascadeNetConfig:
    """Shape shared by the teacher, the FSCD pre-ranker and the two-tower baseline."""

    embedding_dim: int = 8
    """Width of every field embedding (enters each field's cost)."""
    hidden: tuple[int, ...] = (64, 32)
    """MLP widths: the teacher's deep part, the pre-ranker's interaction MLP, each tower."""
    cross_layers: int = 2
    """DCN-v2 cross layers of the teacher."""
    tower_dim: int = 16
    """Output width of each two-tower tower (the dot-product space)."""

    def __post_init__(self) -> None:
        if self.embedding_dim < 1 or self.tower_dim < 1 or self.cross_layers < 0:
            raise ValueError(
                "embedding_dim and tower_dim must be >= 1 and cross_layers >= 0, got "
                f"{self.embedding_dim}, {self.tower_dim}, {self.cross_layers}"
            )
        if not self.hidden or min(self.hidden) < 1:
            raise ValueError(f"hidden must list positive widths, got {self.hidden}")


def _mlp(width: int, hidden: tuple[int, ...], out: int | None) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    if out is not None:
        layers.append(nn.Linear(width, out))
    return nn.Sequential(*layers)


class FieldEmbedding(nn.Module):
    """One table for several fields: field ``j``'s codes are offset past fields ``< j``."""

    offsets: torch.Tensor

    def __init__(self, cardinalities: list[int], dim: int) -> None:
        super().__init__()
        self.num_fields = len(cardinalities)
        starts = [0]
        for c in cardinalities[:-1]:
            starts.append(starts[-1] + c)
        self.register_buffer("offsets", torch.tensor(starts, dtype=torch.long))
        self.table = nn.Embedding(max(1, sum(cardinalities)), dim)
        nn.init.normal_(self.table.weight, std=0.05)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """``[..., F]`` codes -> ``[..., F, dim]`` embeddings."""
        return self.table(codes + self.offsets)


def _field_positions(
    field_names: tuple[str, ...], kind: str | None = None, field_set: FieldSet = FIELDS
) -> list[int]:
    by_name = {f.name: (i, f) for i, f in enumerate(field_set)}
    unknown = [n for n in field_names if n not in by_name]
    if unknown:
        raise ValueError(
            f"unknown fields {unknown}; the field set has {list(field_set.names)} "
            "(models.preranking.fields.FieldSet)"
        )
    return [by_name[n][0] for n in field_names if kind is None or by_name[n][1].kind == kind]


def _check_cardinalities(field_set: FieldSet, cardinalities: list[int]) -> None:
    if len(cardinalities) != len(field_set):
        raise ValueError(
            f"{len(cardinalities)} cardinalities for a field set of {len(field_set)} fields; "
            "pass the encoder's cardinalities() and its fields"
        )


class DCNTeacher(nn.Module):
    """The ranking model: DCN-v2 (cross network in parallel with a deep MLP) over all fields."""

    field_index: torch.Tensor

    def __init__(
        self,
        config: CascadeNetConfig,
        fields: tuple[str, ...],
        cardinalities: list[int],
        *,
        field_set: FieldSet = FIELDS,
    ) -> None:
        super().__init__()
        _check_cardinalities(field_set, cardinalities)
        self.fields = fields
        self.field_set = field_set
        positions = _field_positions(fields, field_set=field_set)
        self.register_buffer("field_index", torch.tensor(positions, dtype=torch.long))
        self.embedding = FieldEmbedding([cardinalities[p] for p in positions], config.embedding_dim)
        width = len(fields) * config.embedding_dim
        self.cross = nn.ModuleList(nn.Linear(width, width) for _ in range(config.cross_layers))
        self.deep = _mlp(width, config.hidden, None)
        self.head = nn.Linear(width + config.hidden[-1], 1)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        x0 = self.embedding(codes[:, self.field_index]).flatten(1)
        x = x0
        for layer in self.cross:
            x = x0 * layer(x) + x
        return self.head(torch.cat([x, self.deep(x0)], dim=-1)).squeeze(-1)


class TwoTower(nn.Module):
    """Baseline: a user tower and an item tower, scored by their dot product (no cross fields)."""

    user_index: torch.Tensor
    item_index: torch.Tensor

    def __init__(
        self,
        config: CascadeNetConfig,
        fields: tuple[str, ...],
        cardinalities: list[int],
        *,
        field_set: FieldSet = FIELDS,
    ) -> None:
        super().__init__()
        _check_cardinalities(field_set, cardinalities)
        self.field_set = field_set
        user = _field_positions(fields, "user", field_set)
        item = _field_positions(fields, "item", field_set)
        self.fields = tuple(n for n in fields if field_set.spec(n).kind in ("user", "item"))
        if not user or not item:
            raise ValueError("a two-tower model needs at least one user and one item field")
        self.register_buffer("user_index", torch.tensor(user, dtype=torch.long))
        self.register_buffer("item_index", torch.tensor(item, dtype=torch.long))
        d = config.embedding_dim
        self.user_embedding = FieldEmbedding([cardinalities[p] for p in user], d)
        self.item_embedding = FieldEmbedding([cardinalities[p] for p in item], d)
        self.user_tower = _mlp(len(user) * d, config.hidden, config.tower_dim)
        self.item_tower = _mlp(len(item) * d, config.hidden, config.tower_dim)
        self.bias = nn.Parameter(torch.zeros(1))  # 1-d: DeepSpeed cannot broadcast 0-d params

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        u = self.user_tower(self.user_embedding(codes[:, self.user_index]).flatten(1))
        i = self.item_tower(self.item_embedding(codes[:, self.item_index]).flatten(1))
        return (u * i).sum(-1) + self.bias


ITEM_FOLD_MAX_ROWS = 64
"""Item fields with at most this many codes are folded into the first layer per request by
:meth:`ColdPreRanker.score_request`: folding a field costs its rows x ``d`` x ``h0`` multiplies
once per request where its share of the per-candidate product costs candidates x ``d`` x
``h0``, so below a request's candidate count it is cheaper, and each candidate then fetches one
row instead. Binned statistics have ~17 codes; an id field with hundreds or more stays in the
product."""


class ColdPreRanker(nn.Module):
    """The pre-ranker in the spirit of COLD, optionally with FSCD's learnable field gates.

    Fields are split by side. The first layer is a sum of per-side linear maps plus one over the
    user x item embedding dot products, so the user side (its embeddings and its share of the
    first layer) is computed once per request and broadcast over all candidates
    (:meth:`score_request`); only item, cross and interaction terms are per candidate.

    With ``gated=True`` every field has a keep logit ``gate_logits[j]``; in training the field's
    embedding is scaled by a relaxed Bernoulli sample (temperature ``temperature``), in eval by
    the hard decision ``keep probability > 0.5`` (FSCD, arXiv 2105.07706).
    """

    user_index: torch.Tensor
    item_index: torch.Tensor
    cross_index: torch.Tensor
    gate_logits: torch.Tensor
    # Set with setattr per side in __init__; declared for type checkers.
    user_linear: nn.Linear
    item_linear: nn.Linear
    cross_linear: nn.Linear

    def __init__(
        self,
        config: CascadeNetConfig,
        fields: tuple[str, ...],
        cardinalities: list[int],
        *,
        gated: bool = False,
        temperature: float = 0.5,
        gate_init: float = 3.0,
        field_set: FieldSet = FIELDS,
    ) -> None:
        super().__init__()
        if not fields:
            raise ValueError("a pre-ranker needs at least one field")
        _check_cardinalities(field_set, cardinalities)
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        d = config.embedding_dim
        user = _field_positions(fields, "user", field_set)
        item = _field_positions(fields, "item", field_set)
        cross = _field_positions(fields, "cross", field_set)
        self.fields = fields
        self.field_set = field_set
        self.gated = gated
        self.temperature = temperature
        h0 = config.hidden[0]
        for name, positions in (("user", user), ("item", item), ("cross", cross)):
            self.register_buffer(f"{name}_index", torch.tensor(positions, dtype=torch.long))
            setattr(
                self, f"{name}_embedding", FieldEmbedding([cardinalities[p] for p in positions], d)
            )
            # The user side carries the first layer's bias: it is the part computed once.
            setattr(
                self,
                f"{name}_linear",
                nn.Linear(max(1, len(positions)) * d, h0, bias=name == "user"),
            )
        self.interaction_linear = nn.Linear(max(1, len(user) * len(item)), h0, bias=False)
        self.mlp = _mlp(h0, config.hidden[1:], 1)
        self._fold_item_fields(item, [cardinalities[p] for p in item])
        # Gate order = user fields, item fields, cross fields (the order of the parts below).
        self.gate_fields = tuple(field_set[p].name for p in user + item + cross)
        # A buffer when not gated: optimizers (and ZeRO's flattening) never see a frozen param.
        gate_logits = torch.full((len(fields),), gate_init)
        if gated:
            self.gate_logits = nn.Parameter(gate_logits)
        else:
            self.register_buffer("gate_logits", gate_logits)

    def _fold_item_fields(self, positions: list[int], cardinalities: list[int]) -> None:
        """Which item fields :meth:`score_request` folds per request (their cardinality at most
        :data:`ITEM_FOLD_MAX_ROWS`) and the item table's rows of each, padded to the largest:
        ``item_fold_rows [J, C]`` (not saved: rebuilt from the cardinalities)."""
        folded = [j for j, c in enumerate(cardinalities) if c <= ITEM_FOLD_MAX_ROWS]
        self.item_folded = tuple(folded)
        self.item_fold_columns = tuple(positions[j] for j in folded)
        self.item_unfolded = tuple(j for j in range(len(cardinalities)) if j not in folded)
        width = max((cardinalities[j] for j in folded), default=1)
        starts = self.item_embedding.offsets.tolist()
        rows = [[starts[j] + min(r, cardinalities[j] - 1) for r in range(width)] for j in folded]
        self.item_fold_width = width
        self.register_buffer(
            "item_fold_rows",
            torch.tensor(rows, dtype=torch.long).reshape(-1, width),
            persistent=False,
        )
        self.register_buffer(
            "item_fold_index", torch.tensor(folded, dtype=torch.long), persistent=False
        )
        self.register_buffer(
            "item_gemm_index",
            torch.tensor(self.item_unfolded, dtype=torch.long),
            persistent=False,
        )

    def keep_probability(self) -> torch.Tensor:
        """``sigmoid(gate_logits)`` in :attr:`gate_fields` order."""
        return torch.sigmoid(self.gate_logits.float())

    def kept_fields(self) -> tuple[str, ...]:
        """The fields whose keep probability exceeds 0.5 (all of them when not gated)."""
        keep = self.keep_probability() > 0.5
        return tuple(n for n, k in zip(self.gate_fields, keep.tolist(), strict=True) if k)

    def _gates(self, batch: int, noise: torch.Tensor | None) -> torch.Tensor | None:
        if not self.gated:
            return None
        logits = self.gate_logits.float()
        if self.training:
            if noise is None:
                raise ValueError("a gated pre-ranker in training mode needs uniform noise [B, F]")
            u = noise.clamp(1e-6, 1 - 1e-6)
            return torch.sigmoid((logits + torch.log(u) - torch.log1p(-u)) / self.temperature)
        return (logits > 0).float().expand(batch, -1)

    def _side(self, name: str, codes: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        """``[B, F_side, d]`` embeddings of one side, scaled by its gates."""
        index = getattr(self, f"{name}_index")
        emb = getattr(self, f"{name}_embedding")(codes[:, index])
        if gate is not None:
            emb = emb * gate.unsqueeze(-1).to(emb.dtype)
        return emb

    def _split_gates(
        self, gates: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        if gates is None:
            return None, None, None
        nu, ni = len(self.user_index), len(self.item_index)
        return gates[:, :nu], gates[:, nu : nu + ni], gates[:, nu + ni :]

    def _candidate_logits(
        self, hu: torch.Tensor, u: torch.Tensor, i: torch.Tensor, c: torch.Tensor
    ) -> torch.Tensor:
        """Logits from the user part ``hu [B|1, h0]``, ``u [B|1, Fu, d]`` and per-candidate
        item ``i [N, Fi, d]`` and cross ``c [N, Fc, d]`` embeddings."""
        h = hu
        if i.shape[1]:
            h = h + self.item_linear(i.flatten(1))
        if c.shape[1]:
            h = h + self.cross_linear(c.flatten(1))
        if u.shape[1] and i.shape[1]:
            # [B|1, Fu, d] @ [N, d, Fi] -> [N, Fu, Fi]; a shared user row broadcasts. (matmul,
            # not einsum: einsum summed over the size-1 user batch ~100x slower here.)
            interactions = torch.matmul(u, i.transpose(1, 2))
            h = h + self.interaction_linear(interactions.flatten(1))
        return self.mlp(torch.relu(h)).squeeze(-1)

    def _user_part(self, u: torch.Tensor) -> torch.Tensor:
        if u.shape[1]:
            return self.user_linear(u.flatten(1))
        return self.user_linear.bias.expand(u.shape[0], -1)

    def forward(self, codes: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        gu, gi, gc = self._split_gates(self._gates(codes.shape[0], noise))
        u = self._side("user", codes, gu)
        i = self._side("item", codes, gi)
        c = self._side("cross", codes, gc)
        return self._candidate_logits(self._user_part(u), u, i, c)

    def request_sides(
        self,
        user_codes: torch.Tensor,
        candidate_codes: torch.Tensor,
        cross_codes: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(u [1, Fu, d], i [N, Fi, d], c [N|K, Fc, d])``: one request's embeddings by side,
        scaled by the hard gates (eval mode), the user's once; the cross side's of
        ``cross_codes [K, F]`` when given (one row per distinct cross key), else of the
        candidates'."""
        cross = candidate_codes if cross_codes is None else cross_codes
        u, c, gi = self._user_and_cross(user_codes, cross)
        gi = None if gi is None else gi.expand(candidate_codes.shape[0], -1)
        return u, self._side("item", candidate_codes, gi), c

    def _user_and_cross(
        self, user_codes: torch.Tensor, cross: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(u [1, Fu, d], c [K, Fc, d], gi [1, Fi] | None)``: a request's user side and the
        cross side of ``cross [K, F]``, scaled by the hard gates, and the item side's gates,
        left to the caller (:meth:`score_request` takes the item embeddings its own way)."""
        gu, gi, gc = self._split_gates(self._gates(1, None))
        u = self._side("user", user_codes.reshape(1, -1), gu)
        c = self._side("cross", cross, None if gc is None else gc.expand(cross.shape[0], -1))
        return u, c, gi

    def _item_part(
        self, candidate_codes: torch.Tensor, gate: torch.Tensor | None, weight: torch.Tensor
    ) -> torch.Tensor:
        """``[N, h0]``: the item embeddings of ``candidate_codes`` times ``weight [Fi * d, h0]``
        (the item Linear's with the user's interaction terms added), the hard gates ``gate
        [1, Fi]`` applied. A field of at most :data:`ITEM_FOLD_MAX_ROWS` codes is folded per
        request: its table rows times its block of ``weight`` (one batched product of
        ``[J, C, d] x [J, d, h0]`` for the folded fields), so a candidate fetches its row of
        ``h0`` finished values; the other fields' embeddings take the ``[N, Fb * d] x [Fb * d,
        h0]`` product as before."""
        table = self.item_embedding.table.weight
        d, h0 = table.shape[1], weight.shape[1]
        blocks = weight.reshape(len(self.item_index), d, h0)
        out: torch.Tensor | None = None
        if self.item_folded:
            rows = table[self.item_fold_rows]  # [J, C, d]
            if gate is not None:
                rows = rows * gate[0, self.item_fold_index].reshape(-1, 1, 1).to(rows.dtype)
            folded = torch.bmm(rows, blocks[self.item_fold_index]).reshape(-1, h0)  # [J * C, h0]
            for k, column in enumerate(self.item_fold_columns):
                code = candidate_codes[:, column] + k * self.item_fold_width
                part = nn.functional.embedding(code, folded)
                out = part if out is None else out + part
        if self.item_unfolded:
            index = self.item_gemm_index
            codes = candidate_codes[:, self.item_index[index]] + self.item_embedding.offsets[index]
            emb = table[codes]  # [N, Fb, d]
            if gate is not None:
                emb = emb * gate[:, index].unsqueeze(-1).to(emb.dtype)
            part = emb.flatten(1) @ blocks[index].reshape(-1, h0)
            out = part if out is None else out + part
        assert out is not None
        return out

    def score_request(
        self,
        user_codes: torch.Tensor,
        candidate_codes: torch.Tensor,
        cross_codes: torch.Tensor | None = None,
        cross_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``[N]`` for one user (``user_codes [len(field_set)]``, only its user fields
        are read) and N candidates (``[N, len(field_set)]``; item and cross fields are read).

        The user side runs once, not N times; eval mode only (hard gates). With the user fixed,
        the interaction term is linear in the item embeddings: its weights and the user's
        embeddings collapse to one ``[Fi * d, h0]`` matrix per request, added to the item
        linear map's, so each candidate takes one ``Fi * d -> h0`` product where
        :meth:`forward` takes that, an ``Fu x Fi`` batch of dot products and an
        ``Fu * Fi -> h0`` product (equal up to float rounding; the two packages side by side:
        ``speedup_vs_cascade_rowwise`` of ``cascade bench compile --model preranking``).

        ``cross_codes [K, len(field_set)]`` and ``cross_rows [N]`` (both or neither): the cross
        fields once per distinct cross key (e.g. the request's user x category pairs: a few
        dozen rows for 1,000 candidates) and each candidate's row among them; the cross side's
        share of the first layer is then computed per key and gathered, and the candidates'
        own cross columns are not read (:func:`cross_keys` builds both from candidate rows).

        Traced (``torch.export``, ``torch.compile``), item fields of at most
        :data:`ITEM_FOLD_MAX_ROWS` codes are folded per request (:meth:`_item_part`): a
        candidate fetches their rows of the request's first layer instead of multiplying their
        embeddings, the fetches fused into one kernel. Eager PyTorch runs each fetch and add
        as its own pass over ``[N, h0]``, slower than the product (one thread, 1 x 1,000
        candidates: 0.51 against 0.41 ms a request), so there the embeddings take the product.
        """
        if self.training:
            raise RuntimeError("score_request is for serving; call model.eval() first")
        if (cross_codes is None) != (cross_rows is None):
            raise ValueError("score_request takes cross_codes and cross_rows together")
        cross = candidate_codes if cross_codes is None else cross_codes
        u, c, gi = self._user_and_cross(user_codes, cross)
        hu = self._user_part(u)
        fu, fi = u.shape[1], len(self.item_index)
        h = hu
        if fi:
            weight = self.item_linear.weight.t()
            if fu:
                # interaction_linear(u_a . i_b over (a, b)) = i.flatten(1) @ q, q[b * d + k, h]
                # = sum_a W[h, a * Fi + b] * u[a, k].
                w = self.interaction_linear.weight.reshape(-1, fu, fi)
                weight = weight + torch.einsum("hab,ak->bkh", w, u[0]).reshape(fi * u.shape[2], -1)
            if torch.compiler.is_compiling():
                h = h + self._item_part(candidate_codes, gi, weight)
            else:  # unfused, the per-field fetches cost more than the product they replace
                i = self._side("item", candidate_codes, gi)
                h = h + i.flatten(1) @ weight
        if c.shape[1]:
            hc = self.cross_linear(c.flatten(1))
            h = h + (hc if cross_rows is None else hc[cross_rows])
        return self.mlp(torch.relu(h)).squeeze(-1)


def cross_keys(
    model: ColdPreRanker, candidate_codes: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cross_codes [K, F], cross_rows [N])`` of :meth:`ColdPreRanker.score_request` from
    candidate rows: their distinct cross-field codes (zeros in the other columns) and each
    candidate's row among them (K = 1 when the model has no cross field)."""
    index = model.cross_index
    n, width = candidate_codes.shape
    device = candidate_codes.device  # the request's: the model's on a GPU
    if not len(index):
        return (
            torch.zeros(1, width, dtype=candidate_codes.dtype, device=device),
            torch.zeros(n, dtype=torch.long, device=device),
        )
    keys, rows = torch.unique(candidate_codes[:, index], dim=0, return_inverse=True)
    cross = torch.zeros(keys.shape[0], width, dtype=candidate_codes.dtype, device=device)
    cross[:, index] = keys
    return cross, rows.reshape(-1)


STORE_FIELDS: dict[str, str] = {f.name: f.kind for f in FIELDS}
"""Fields the server takes from its own sources, by kind: ids from the request, the user's and
user x genre features from the online store, item features from the in-memory item table."""


def request_fields(model: nn.Module) -> dict[str, str]:
    """``{name: kind}`` of the fields a ColdPreRanker reads that are not :data:`STORE_FIELDS`
    (extra fields of its field set, e.g. cross statistics): a request must carry their values."""
    field_set: FieldSet = getattr(model, "field_set", FIELDS)
    out: dict[str, str] = {}
    for name in getattr(model, "fields", ()):
        kind = field_set.spec(name).kind
        if STORE_FIELDS.get(name) != kind:
            out[name] = kind
    return out


class ColdSharedScorer:
    """A :class:`ColdPreRanker` with its encoder, split by side for one user x N candidates.

    The pre-ranker's first layer is a sum of per-side parts (see :class:`ColdPreRanker`), and
    the user x item interaction part is linear in the item embeddings once the user is fixed,
    so per served version and per request the work splits as:

    * item side (``item_id``, ``genre``, ITEM_FEATURES): encoded and embedded for every item of
      the table when a version loads; its share of the first layer, ``[M, h0]``, and its
      flattened embeddings, ``[M, Fi * d]``, are kept;
    * user side (``user_id``, USER_FEATURES): encoded, embedded and put through the user
      linear map once per request; with it the interaction weights collapse to one
      ``[Fi * d, h0]`` matrix for the request, so the interactions of all candidates are one
      matmul of their gathered item embeddings;
    * cross side (USER_GENRE_FEATURES): encoded and put through the cross linear map once per
      genre of the request, ``[G + 1, h0]`` (the last row: unknown genre), gathered per
      candidate by genre code.

    Scores equal :meth:`ColdPreRanker.forward` on the encoded rows up to float rounding; a
    candidate missing from the table gets its item side computed on the spot (its id encoded,
    every item feature unknown), as the full forward would score it.
    """

    @classmethod
    def supports(cls, model: nn.Module) -> bool:
        """True for an fp32 ColdPreRanker in eval mode (hard gates, if gated) that reads only
        fields of the default contract (:data:`models.preranking.fields.FIELDS`), whose values
        this scorer takes from the item table, the user's and the user x genre features."""
        return (
            type(model) is ColdPreRanker
            and not model.training
            and all(p.dtype == torch.float32 for p in model.parameters())
            and not request_fields(model)
        )

    @torch.no_grad()
    def __init__(
        self,
        model: ColdPreRanker,
        encoder: FieldEncoder,
        item_ids: np.ndarray,
        item_dense: np.ndarray,
        item_genres: Sequence[str | None],
    ) -> None:
        """``item_ids [M]``, their raw ``ITEM_FEATURES`` ``item_dense [M, 4]`` (NaN: unknown)
        and primary genres ``item_genres [M]`` (None: unknown): the in-memory item table."""
        if not self.supports(model):
            raise TypeError(
                f"{type(model).__name__} cannot be split by side (in train, not fp32, or it "
                f"reads fields outside the default contract: {list(request_fields(model))})"
            )
        self.model = model
        self.encoder = encoder
        field_set = model.field_set
        self._user_fields = [field_set[int(p)].name for p in model.user_index.tolist()]
        self._item_fields = [field_set[int(p)].name for p in model.item_index.tolist()]
        self._cross_fields = [field_set[int(p)].name for p in model.cross_index.tolist()]
        gu, gi, gc = model._split_gates(model._gates(1, None))
        self._gates = (gu, gi, gc)
        item_ids = np.asarray(item_ids, dtype=np.int64)
        dense = np.asarray(item_dense, dtype=np.float32).reshape(len(item_ids), -1)
        self.item_flat, self.item_part = self._item_side(item_ids, dense, list(item_genres))
        self._interaction: torch.Tensor | None = None
        if len(self._user_fields) and len(self._item_fields):
            weight = model.interaction_linear.weight  # [h0, Fu * Fi], Fu-major
            self._interaction = weight.reshape(
                weight.shape[0], len(self._user_fields), len(self._item_fields)
            )

    def _codes(self, names: list[str], columns: dict[str, Any], rows: int) -> torch.Tensor:
        """``[rows, len(names)]`` codes of the named fields from raw values."""
        codes = np.zeros((rows, len(names)), dtype=np.int64)
        for j, name in enumerate(names):
            codes[:, j] = self.encoder.encode_column(name, columns[name])
        return torch.from_numpy(codes)

    def _embed(self, side: str, codes: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        emb = getattr(self.model, f"{side}_embedding")(codes)
        if gate is not None:
            emb = emb * gate[:1].unsqueeze(-1).to(emb.dtype)
        return emb

    def _item_side(
        self, item_ids: np.ndarray, dense: np.ndarray, genres: list[str | None]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(flattened item embeddings [M, Fi * d], item share of the first layer [M, h0])``."""
        columns: dict[str, Any] = {"item_id": item_ids, "genre": genres}
        columns.update({name: dense[:, j] for j, name in enumerate(ITEM_FEATURES)})
        codes = self._codes(self._item_fields, columns, len(item_ids))
        emb = self._embed("item", codes, self._gates[1])
        flat = emb.flatten(1)
        h0 = self.model.user_linear.out_features
        if not self._item_fields:
            return flat, torch.zeros(len(item_ids), h0)
        return flat, self.model.item_linear(flat)

    @torch.no_grad()
    def logits(
        self,
        user_id: int,
        user_dense: np.ndarray,
        genre_dense: np.ndarray,
        rows: np.ndarray,
        codes: np.ndarray,
        item_ids: np.ndarray,
    ) -> torch.Tensor:
        """Logits ``[N]``; the arguments as in :meth:`SharedUserScorer.logits`."""
        model = self.model
        user_columns: dict[str, Any] = {"user_id": [int(user_id)]}
        user_values = np.asarray(user_dense, dtype=np.float32).reshape(1, -1)
        user_columns.update({name: user_values[:, j] for j, name in enumerate(USER_FEATURES)})
        u = self._embed("user", self._codes(self._user_fields, user_columns, 1), self._gates[0])
        shared = model._user_part(u)  # [1, h0], the bias included
        # Cross side, once per genre of the request (the last row: unknown genre).
        if self._cross_fields:
            genre_values = np.asarray(genre_dense, dtype=np.float32)
            cross_columns = {name: genre_values[:, j] for j, name in enumerate(USER_GENRE_FEATURES)}
            c = self._embed(
                "cross",
                self._codes(self._cross_fields, cross_columns, len(genre_values)),
                self._gates[2],
            )
            per_genre = model.cross_linear(c.flatten(1)) + shared  # [G + 1, h0]
        else:
            per_genre = shared.expand(len(genre_dense), -1)
        rows = np.asarray(rows, dtype=np.int64)
        known = rows >= 0
        if known.all():
            index = torch.from_numpy(rows)
            item_flat, h = self.item_flat[index], self.item_part[index]
        else:
            item_flat = torch.empty(len(rows), self.item_flat.shape[1])
            h = torch.empty(len(rows), self.item_part.shape[1])
            inside = torch.from_numpy(known)
            item_flat[inside] = self.item_flat[torch.from_numpy(rows[known])]
            h[inside] = self.item_part[torch.from_numpy(rows[known])]
            missing = ~known
            count = int(missing.sum())
            unknown_flat, unknown_part = self._item_side(
                np.asarray(item_ids, dtype=np.int64)[missing],
                np.full((count, len(ITEM_FEATURES)), np.nan, dtype=np.float32),
                [None] * count,
            )
            item_flat[~inside], h[~inside] = unknown_flat, unknown_part
        # code -1 (unknown genre) wraps to the last row, as numpy's take(mode="wrap") does.
        genre_rows = torch.from_numpy(np.where(codes < 0, len(genre_dense) - 1, codes))
        h = h + per_genre[genre_rows]
        if self._interaction is not None:
            # sum_{f,g} W[:, f, g] <u_f, i_g> = i_flat @ A with A[g*d + k] = sum_f W[:, f, g] u_f[k]
            collapsed = torch.einsum("hfg,fk->gkh", self._interaction, u[0]).reshape(-1, h.shape[1])
            h = h + item_flat @ collapsed
        return model.mlp(torch.relu(h)).squeeze(-1)
