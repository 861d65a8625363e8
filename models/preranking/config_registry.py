"""Named, complete training configs for the pre-ranking model.

Each config is a function returning a :class:`TrainConfig`; variants copy a base and change
fields. ``debug`` trains on CPU in seconds; ``ml100k`` is sized for the MovieLens-100k
impressions (~100k rows, ~55% clicks). Pick one by name with :func:`get_config`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from models.preranking.model import PreRankerConfig


@dataclass(kw_only=True)
class TrainConfig:
    """Everything one pre-ranking training run needs besides its data and output paths."""

    name: str
    """Config name, as given to :func:`get_config`; logged with the run."""
    model: PreRankerConfig = field(default_factory=PreRankerConfig)
    """Shape of the network."""
    batch_size: int = 512
    """Micro-batch per process; the global batch is ``batch_size * world_size``."""
    lr: float = 2e-3
    """Adam learning rate."""
    weight_decay: float = 0.0
    """Adam (L2) weight decay."""
    epochs: int = 3
    """Passes over the training split."""
    max_steps: int | None = None
    """Stop after this many optimizer steps even if epochs remain; ``None`` means no cap."""
    seed: int = 0
    """Seed for initialization and the distributed sampler's shuffling."""
    test_fraction: float = 0.2
    """Share of rows held out for the test AUC: the latest rows by ``event_timestamp``."""
    zero_stage: int = 0
    """DeepSpeed ZeRO stage (0-3)."""
    bf16: bool = False
    """Train in bfloat16 where the accelerator supports it (fp32 otherwise)."""
    log_every: int = 50
    """Print and log the loss every this many steps."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("TrainConfig.name must be a non-empty config name")
        if not isinstance(self.model, PreRankerConfig):
            raise TypeError(
                f"TrainConfig.model must be a PreRankerConfig, got {type(self.model).__name__}"
            )
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 or None, got {self.max_steps}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(
                f"test_fraction must be in (0, 1) so both splits are non-empty, "
                f"got {self.test_fraction}"
            )
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage}")
        if self.log_every < 1:
            raise ValueError(f"log_every must be >= 1, got {self.log_every}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the run config saved beside every model)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Inverse of :meth:`to_dict`; JSON turns tuples into lists, so they are restored."""
        data = dict(data)
        model = dict(data.pop("model"))
        model["hidden"] = tuple(model["hidden"])
        return cls(model=PreRankerConfig(**model), **data)

    def flat_params(self) -> dict[str, str]:
        """``model.hidden``-style flat keys, for MLflow params."""
        flat: dict[str, str] = {}
        for key, value in self.to_dict().items():
            if isinstance(value, dict):
                flat.update({f"{key}.{k}": str(v) for k, v in value.items()})
            else:
                flat[key] = str(value)
        return flat


def preranking_debug() -> TrainConfig:
    """A tiny network, two short epochs: trains on CPU in seconds (tests, smoke runs)."""
    return TrainConfig(
        name="debug",
        model=PreRankerConfig(id_buckets=512, embedding_dim=8, hidden=(32, 16)),
        batch_size=256,
        lr=5e-3,
        epochs=2,
        seed=0,
        test_fraction=0.2,
        zero_stage=1,
        bf16=False,
        log_every=10,
    )


def preranking_ml100k() -> TrainConfig:
    """MovieLens-100k impressions: ~80k training rows, ZeRO-2, bf16 where supported."""
    return dataclasses.replace(
        preranking_debug(),
        name="ml100k",
        model=PreRankerConfig(id_buckets=4096, embedding_dim=16, hidden=(64, 32), dropout=0.1),
        batch_size=512,
        lr=2e-3,
        weight_decay=1e-6,
        epochs=3,
        zero_stage=2,
        bf16=True,
        log_every=20,
    )


CONFIGS: dict[str, Callable[[], TrainConfig]] = {
    "debug": preranking_debug,
    "ml100k": preranking_ml100k,
}
"""Config names accepted by :func:`get_config` and ``train --config``."""


def get_config(name: str) -> TrainConfig:
    """The named config, freshly built (callers may change it without affecting others)."""
    try:
        return CONFIGS[name]()
    except KeyError:
        raise ValueError(
            f"unknown pre-ranking config {name!r}; choose one of {sorted(CONFIGS)}"
        ) from None
