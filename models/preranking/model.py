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
