"""The pre-ranking network: a plain ``nn.Module``, no distributed code.

Inputs are raw feature values in :data:`cascade.ctr_schema.MODEL_FEATURES` order plus the ids;
the module applies ``log1p`` to counts and standardizes with statistics fitted on the training
set (held as buffers, so they travel with the state dict).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from cascade.ctr_schema import COUNT_FEATURES, MODEL_FEATURES
from models.preranking.fields import FIELDS


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
# These networks read ``codes: LongTensor [B, len(FIELDS)]`` from ``FieldEncoder.encode`` and
# use the subset of fields they were built with, so one encoded batch feeds all of them.


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


def _field_positions(field_names: tuple[str, ...], kind: str | None = None) -> list[int]:
    by_name = {f.name: (i, f) for i, f in enumerate(FIELDS)}
    unknown = [n for n in field_names if n not in by_name]
    if unknown:
        raise ValueError(f"unknown fields {unknown}; see models.preranking.fields.FIELDS")
    return [by_name[n][0] for n in field_names if kind is None or by_name[n][1].kind == kind]


class DCNTeacher(nn.Module):
    """The ranking model: DCN-v2 (cross network in parallel with a deep MLP) over all fields."""

    field_index: torch.Tensor

    def __init__(
        self, config: CascadeNetConfig, fields: tuple[str, ...], cardinalities: list[int]
    ) -> None:
        super().__init__()
        self.fields = fields
        positions = _field_positions(fields)
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
        self, config: CascadeNetConfig, fields: tuple[str, ...], cardinalities: list[int]
    ) -> None:
        super().__init__()
        self.fields = tuple(
            n for n in fields if _field_positions((n,), "user") or _field_positions((n,), "item")
        )
        user, item = _field_positions(fields, "user"), _field_positions(fields, "item")
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
    ) -> None:
        super().__init__()
        if not fields:
            raise ValueError("a pre-ranker needs at least one field")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        d = config.embedding_dim
        user = _field_positions(fields, "user")
        item = _field_positions(fields, "item")
        cross = _field_positions(fields, "cross")
        self.fields = fields
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
        # Gate order = user fields, item fields, cross fields (the order of the parts below).
        self.gate_fields = tuple(FIELDS[p].name for p in user + item + cross)
        # A buffer when not gated: optimizers (and ZeRO's flattening) never see a frozen param.
        gate_logits = torch.full((len(fields),), gate_init)
        if gated:
            self.gate_logits = nn.Parameter(gate_logits)
        else:
            self.register_buffer("gate_logits", gate_logits)

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

    def score_request(
        self, user_codes: torch.Tensor, candidate_codes: torch.Tensor
    ) -> torch.Tensor:
        """Logits ``[N]`` for one user (``user_codes [len(FIELDS)]``, only its user fields are
        read) and N candidates (``[N, len(FIELDS)]``; item and cross fields are read).

        The user side runs once, not N times; eval mode only (hard gates).
        """
        if self.training:
            raise RuntimeError("score_request is for serving; call model.eval() first")
        gu, gi, gc = self._split_gates(self._gates(1, None))
        u = self._side("user", user_codes.reshape(1, -1), gu)
        n = candidate_codes.shape[0]
        gi = None if gi is None else gi.expand(n, -1)
        gc = None if gc is None else gc.expand(n, -1)
        i = self._side("item", candidate_codes, gi)
        c = self._side("cross", candidate_codes, gc)
        return self._candidate_logits(self._user_part(u), u, i, c)
