"""Named, complete training configs for the image-text transformer, MoE and dense.

Every MoE config has a dense twin (``NAME-dense``) with the SAME ACTIVE parameters per token:
the MoE layers use ``prototypes`` groups of top-1 experts of hidden size
``ffn_hidden / prototypes``, so a token runs ``ffn_hidden`` hidden units in either model; only the
gates' ``dim x num_experts`` weights are extra (:func:`models.multimodal.model.parameter_counts`).

* ``debug``: a tiny network, ~24 steps on generated pairs; seconds on CPU (tests, CI).
* ``base``: 4 blocks of width 128, 16 experts in 2 prototype groups in every other block,
  ~600 steps of 2 x 32 pairs: the comparison the benchmark reports.
* ``small``: ``base`` at half the width, 300 steps: the same comparison in minutes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from models.multimodal.model import MoEConfig, MultimodalConfig
from models.multimodal.pairs import WORDS


@dataclass(frozen=True, kw_only=True)
class MultimodalTrainConfig:
    """Everything one training run needs besides its pairs and output folder."""

    name: str
    """Config name, as given to :func:`get_config`; logged with the run."""
    model: MultimodalConfig = field(default_factory=MultimodalConfig)
    """Shape of the network; ``ep_size`` is set by the launcher, not here."""
    generated_pairs: int = 4_000
    """Without a corpus: train on the train split of generator pairs ``0 .. N-1`` (80%) and
    evaluate on their test split (10%)."""
    max_train_pairs: int | None = None
    """Use only the first this many training pairs (by id); ``None``: all."""
    eval_pairs: int = 512
    """Held-out pairs retrieval is scored on (the first by id); fewer if the split is smaller."""
    batch_size: int = 32
    """Pairs per micro-batch and process (the contrastive negatives are the local batch)."""
    steps: int = 600
    lr: float = 1e-3
    warmup_steps: int = 50
    weight_decay: float = 0.01
    gradient_clipping: float = 1.0
    zero_stage: int = 2
    seed: int = 0
    """Initialization and batch order are functions of the seed and the step: a resumed run
    draws the same batches."""
    log_every: int = 25
    checkpoint_every: int = 200

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("MultimodalTrainConfig.name must be a non-empty config name")
        positive = {
            "generated_pairs": self.generated_pairs,
            "eval_pairs": self.eval_pairs,
            "batch_size": self.batch_size,
            "steps": self.steps,
            "log_every": self.log_every,
            "checkpoint_every": self.checkpoint_every,
        }
        bad = [f"{k}={v}" for k, v in positive.items() if v < 1]
        if bad:
            raise ValueError(f"these must be >= 1: {', '.join(bad)}")
        if self.batch_size < 2:
            raise ValueError("batch_size must be >= 2: the contrastive loss needs negatives")
        if not self.lr > 0 or self.weight_decay < 0 or self.warmup_steps < 0:
            raise ValueError("lr must be > 0, weight_decay and warmup_steps >= 0")
        if self.zero_stage not in (0, 1, 2):
            raise ValueError(
                f"zero_stage must be 0, 1 or 2 (MoE expert groups with ZeRO-3 are not "
                f"supported here), got {self.zero_stage}"
            )
        if self.model.vocab_size < len(WORDS):
            raise ValueError(
                f"model.vocab_size {self.model.vocab_size} < {len(WORDS)} generator words"
            )

    @property
    def is_moe(self) -> bool:
        return self.model.moe is not None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def flat_params(self) -> dict[str, str]:
        """``model.moe.num_experts``-style flat keys, for MLflow params."""

        def flat(value: Any, prefix: str) -> dict[str, str]:
            if isinstance(value, dict):
                return {
                    k: v
                    for key, item in value.items()
                    for k, v in flat(item, f"{prefix}{key}.").items()
                }
            return {prefix.rstrip("."): str(value)}

        return flat(self.to_dict(), "")


def dense_twin(config: MultimodalTrainConfig) -> MultimodalTrainConfig:
    """The same run with dense feed-forward blocks of the same active size."""
    return dataclasses.replace(
        config, name=f"{config.name}-dense", model=dataclasses.replace(config.model, moe=None)
    )


def multimodal_debug() -> MultimodalTrainConfig:
    """A tiny MoE network (8 experts in 2 prototype groups, every block), 24 steps: seconds."""
    return MultimodalTrainConfig(
        name="debug",
        model=MultimodalConfig(
            patch=16,
            vocab_size=32,
            max_tokens=12,
            dim=32,
            heads=2,
            layers=2,
            ffn_hidden=64,
            embed_dim=32,
            moe=MoEConfig(num_experts=8, prototypes=2, capacity_factor=1.25, min_capacity=4),
        ),
        generated_pairs=400,
        eval_pairs=40,
        batch_size=16,
        steps=24,
        lr=3e-3,
        warmup_steps=2,
        log_every=4,
        checkpoint_every=8,
    )


def multimodal_base() -> MultimodalTrainConfig:
    """4 blocks of 128, 16 experts in 2 prototype groups every other block; 600 steps."""
    return MultimodalTrainConfig(
        name="base",
        model=MultimodalConfig(
            patch=8,
            vocab_size=32,
            max_tokens=12,
            dim=128,
            heads=4,
            layers=4,
            ffn_hidden=512,
            embed_dim=128,
            moe=MoEConfig(num_experts=16, prototypes=2, every=2, capacity_factor=1.25),
        ),
        generated_pairs=6_000,
        eval_pairs=512,
        batch_size=32,
        steps=600,
        lr=1e-3,
        warmup_steps=50,
        log_every=25,
        checkpoint_every=200,
    )


def multimodal_small() -> MultimodalTrainConfig:
    """``base``'s layout at half the width and 300 steps: a dense-vs-MoE comparison that
    finishes in minutes on a shared 2-core machine."""
    base = multimodal_base()
    return dataclasses.replace(
        base,
        name="small",
        model=dataclasses.replace(base.model, dim=64, ffn_hidden=256, embed_dim=64),
        generated_pairs=4_000,
        eval_pairs=400,
        steps=300,
        checkpoint_every=100,
    )


CONFIGS: dict[str, Callable[[], MultimodalTrainConfig]] = {
    "debug": multimodal_debug,
    "debug-dense": lambda: dense_twin(multimodal_debug()),
    "base": multimodal_base,
    "base-dense": lambda: dense_twin(multimodal_base()),
    "small": multimodal_small,
    "small-dense": lambda: dense_twin(multimodal_small()),
}
"""Config names accepted by :func:`get_config` and ``models.multimodal.train --config``."""


def get_config(name: str) -> MultimodalTrainConfig:
    try:
        return CONFIGS[name]()
    except KeyError:
        raise ValueError(
            f"unknown multimodal config {name!r}; choose one of {sorted(CONFIGS)}"
        ) from None
