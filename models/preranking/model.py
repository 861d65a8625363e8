"""The pre-ranking network: a plain ``nn.Module``, no distributed code.

Inputs are raw feature values in :data:`domains.ctr.schema.MODEL_FEATURES` order plus the ids;
the module applies ``log1p`` to counts and standardizes with statistics fitted on the training
set (held as buffers, so they travel with the state dict).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from domains.ctr.schema import COUNT_FEATURES, MODEL_FEATURES
from models.preranking.fields import FIELDS, ID_FIELDS, FieldSet


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


STORE_FIELDS: dict[str, str] = {f.name: f.kind for f in ID_FIELDS}
"""Fields the server takes from its own sources, by kind: the user and item ids from the
request, the item's genre (its catalogue category) from the in-memory item table."""


def request_fields(model: nn.Module) -> dict[str, str]:
    """``{name: kind}`` of the fields a ColdPreRanker reads that are not :data:`STORE_FIELDS`
    (the statistics of its field set): the server reads them from the online store, or a
    request carries their values."""
    field_set: FieldSet = getattr(model, "field_set", FIELDS)
    out: dict[str, str] = {}
    for name in getattr(model, "fields", ()):
        kind = field_set.spec(name).kind
        if STORE_FIELDS.get(name) != kind:
            out[name] = kind
    return out
