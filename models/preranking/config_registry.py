"""Named, complete training configs for the pre-ranking model.

Each config is a function returning a :class:`TrainConfig`; variants copy a base and change
fields. ``debug`` trains on CPU in seconds; ``ml100k`` is sized for the MovieLens-100k
impressions (~100k rows, ~55% clicks). Pick one by name with :func:`get_config`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from models.preranking.model import CascadeNetConfig, PreRankerConfig


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
    checkpoint_every: int = 50
    """Save a resumable DeepSpeed checkpoint every this many optimizer steps."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("TrainConfig.name must be a non-empty config name")
        if self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {self.checkpoint_every}")
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
        checkpoint_every=10,
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
        checkpoint_every=50,
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


# --- The ranking cascade: teacher, FSCD pre-ranker, two-tower (models.preranking.cascade_train)


@dataclass(kw_only=True)
class CascadeTrainConfig:
    """One run of ``models.preranking.cascade_train``: the three models and the FSCD sweep."""

    name: str
    """Config name, as given to :func:`get_cascade_config`; logged with the run."""
    data: str = "synthetic"
    """``synthetic`` (models.preranking.synthetic_data), ``ml100k`` (MovieLens-100k, point in
    time) or a path to a training parquet with the training-set columns."""
    rows: int = 20_000
    """Rows of synthetic data (ignored for other sources)."""
    net: CascadeNetConfig = field(default_factory=CascadeNetConfig)
    """Shape of the three networks."""
    bins: int = 16
    """Quantile bins per dense field."""
    batch_size: int = 512
    """Micro-batch per process."""
    lr: float = 3e-3
    """Adam learning rate, every phase."""
    epochs: int = 2
    """Passes over the training split per phase."""
    seed: int = 0
    """Seed of initialization, shuffling and the relaxed-Bernoulli noise."""
    test_fraction: float = 0.2
    """Latest share of rows (by event time) held out for the reported evaluation. It is never
    used to choose anything: selection hyper-parameters are chosen on the validation split."""
    validation_fraction: float = 0.2
    """Latest share of the training period (the rows before the test split) held out to choose
    the regularizer strength λ; the networks train on the rows before it."""
    zero_stage: int = 0
    """DeepSpeed ZeRO stage (0-3)."""
    bf16: bool = False
    """bfloat16 where the accelerator supports it (fp32 otherwise)."""
    gradient_clipping: float = 0.0
    """Clip the global gradient norm to this (0 = off), in the DeepSpeed and the plain loop
    alike. Set explicitly because DeepSpeed's own default is 1.0, which would make its step
    a different algorithm from the plain PyTorch baseline."""
    checkpoint_every: int = 50
    """Save a resumable DeepSpeed checkpoint every this many steps of a phase."""
    log_every: int = 20
    """Log the loss to MLflow every this many steps."""
    fscd_strengths: tuple[float, ...] = (0.003, 0.01, 0.03)
    """Regularizer strengths (lambda) of the FSCD selection sweep; each gets its own model."""
    gate_lr: float = 0.05
    """Adam learning rate of the FSCD gate logits (select phases)."""
    gate_init: float = 2.0
    """Initial gate logit: keep probability sigmoid(2) = 0.88 for every field."""
    fscd_temperature: float = 0.5
    """Temperature of the relaxed Bernoulli gates."""
    cost_budget: float = 0.5
    """The deployed FSCD model is the one with the best validation AUC whose cost ratio to the
    teacher is at most this; when none that ranks is, the run fails (no model over budget is
    deployed)."""
    beat_baseline: bool = True
    """The chosen FSCD model must beat item popularity's validation AUC on the same rows, else
    the run fails (:class:`~models.preranking.fscd_metrics.BelowBaseline`); off only for smoke
    runs too short to learn (the ``debug`` flavours)."""
    recall_k: int = 10
    """k of recall@k against the teacher's top-k per user."""
    min_validation_clicks: int = 100
    """Clicks (and non-clicks) the validation split needs before λ is chosen on it: AUC's
    standard error is about sqrt(AUC (1 - AUC) / clicks), ~0.05 at 100 clicks. The pipeline's
    train step checks it on the training set before starting any process."""
    fields: str | dict[str, dict[str, Any]] | None = None
    """The fields the networks read (:class:`models.preranking.fields.FieldSet`). None: a
    ``fields.json`` beside the training parquet when ``data`` is a path and one is there,
    else the default 11 fields (``FIELDS``). A string: the path of a fields JSON file (a whole
    field list as a saved model's ``fields.json`` holds it, or declarations extending the
    default set). A mapping: inline declarations ``{name: {"kind": "cross", "categorical":
    false, "window_days": 7}}`` appended to the default set (``--fields`` on the command
    line takes either)."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("CascadeTrainConfig.name must be a non-empty config name")
        if self.min_validation_clicks < 1:
            raise ValueError(
                f"min_validation_clicks must be >= 1, got {self.min_validation_clicks}"
            )
        if self.rows < 100:
            raise ValueError(f"rows must be >= 100, got {self.rows}")
        if self.bins < 2:
            raise ValueError(f"bins must be >= 2, got {self.bins}")
        if self.batch_size < 1 or self.epochs < 1 or self.seed < 0:
            raise ValueError("batch_size and epochs must be >= 1 and seed >= 0")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {self.test_fraction}")
        if not 0.0 < self.validation_fraction < 1.0:
            raise ValueError(
                f"validation_fraction must be in (0, 1), got {self.validation_fraction}"
            )
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage}")
        if not self.gradient_clipping >= 0:
            raise ValueError(
                f"gradient_clipping must be >= 0 (0 = off), got {self.gradient_clipping}"
            )
        if self.checkpoint_every < 1 or self.log_every < 1 or self.recall_k < 1:
            raise ValueError("checkpoint_every, log_every and recall_k must be >= 1")
        if not self.fscd_strengths or min(self.fscd_strengths) < 0:
            raise ValueError(
                f"fscd_strengths must list regularizer strengths >= 0, got {self.fscd_strengths}"
            )
        if not self.gate_lr > 0:
            raise ValueError(f"gate_lr must be > 0, got {self.gate_lr}")
        if not self.fscd_temperature > 0 or not 0 < self.cost_budget <= 1:
            raise ValueError("fscd_temperature must be > 0 and cost_budget in (0, 1]")
        if self.fields is not None and not isinstance(self.fields, str | dict):
            raise ValueError(
                "fields must be a path to a fields JSON file or a mapping of declarations, got "
                f"{type(self.fields).__name__}"
            )

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if data["fields"] is None:
            del data["fields"]  # the default set: what configs written before it said
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CascadeTrainConfig:
        data = dict(data)
        net = dict(data.pop("net"))
        net["hidden"] = tuple(net["hidden"])
        data["fscd_strengths"] = tuple(data["fscd_strengths"])
        return cls(net=CascadeNetConfig(**net), **data)


def cascade_debug() -> CascadeTrainConfig:
    """Seconds on CPU: 5k synthetic rows (3.2k to train), one epoch per phase, one FSCD
    strength."""
    return CascadeTrainConfig(
        name="debug",
        data="synthetic",
        rows=5_000,
        net=CascadeNetConfig(embedding_dim=4, hidden=(16, 8), cross_layers=1, tower_dim=8),
        batch_size=256,
        lr=1e-2,
        epochs=1,
        checkpoint_every=5,
        log_every=5,
        fscd_strengths=(0.05,),
        gate_lr=0.2,
        recall_k=3,
        # A smoke run on tiny data: its λ choice is not meant to mean anything, and one epoch
        # prunes no field nor learns much, so it has no cost budget and no popularity floor to
        # fail (the others keep 0.5 and the floor).
        min_validation_clicks=20,
        cost_budget=1.0,
        beat_baseline=False,
    )


def cascade_ml100k() -> CascadeTrainConfig:
    """MovieLens-100k, point-in-time features: ~64k training rows, bf16 if supported.

    ZeRO stage 0: these networks have well under a million parameters, so partitioning
    optimizer state saves nothing worth having, and on CPU ZeRO-1's flatten/partition work
    cost ~30% of the teacher's throughput (2 processes, 74k vs 109k samples/s; 1 process,
    0.64x vs 0.93x of the plain PyTorch loop). Other stages stay a one-field change.
    """
    return dataclasses.replace(
        cascade_debug(),
        name="ml100k",
        data="ml100k",
        net=CascadeNetConfig(embedding_dim=8, hidden=(64, 32), cross_layers=2, tower_dim=16),
        batch_size=512,
        lr=3e-3,
        epochs=3,
        zero_stage=0,
        bf16=True,
        checkpoint_every=100,
        log_every=20,
        fscd_strengths=(0.0003, 0.001, 0.002, 0.003, 0.01, 0.03),
        gate_lr=0.05,
        recall_k=10,
        min_validation_clicks=100,
        cost_budget=0.5,
        beat_baseline=True,
    )


def cascade_generated() -> CascadeTrainConfig:
    """Generated logs with a known ground truth (synthetic_data), 200k rows."""
    return dataclasses.replace(
        cascade_ml100k(),
        name="generated",
        data="synthetic",
        rows=200_000,
        epochs=2,
        batch_size=1024,
        # Denser between 0.003 and 0.005: there the kept set crosses the 50% cost budget
        # (ids + clicks + CTRs + ug_ctr at 0.52 of the teacher's cost; CTRs alone at 0.14).
        fscd_strengths=(0.0003, 0.001, 0.003, 0.0035, 0.004, 0.0045, 0.005, 0.01),
    )


def cascade_generated_cross() -> CascadeTrainConfig:
    """The ``generated`` networks on a training set built by the cross-statistics engine
    (``--data``, its ``fields.json`` beside it: ~110 fields), with a three-point λ sweep: the
    with/without-cross comparison trains it twice per seed, and eight λ phases each made
    that too slow to run. Weaker than ``generated``'s: the regularizer sums over ten times the
    fields, and at 0.001 only five of 111 fields were left (2.9% of the teacher's cost)."""
    return dataclasses.replace(
        cascade_generated(),
        name="generated_cross",
        fscd_strengths=(0.0001, 0.0003, 0.001),
    )


def cascade_debug_cross() -> CascadeTrainConfig:
    """``debug`` with a weak regularizer, for a smoke run on a tiny engine-built training set
    (~110 fields): ``debug``'s strength there leaves one field, which scores every row alike."""
    return dataclasses.replace(cascade_debug(), name="debug_cross", fscd_strengths=(0.001,))


def cascade_pipeline() -> CascadeTrainConfig:
    """The ``ctr_preranking`` DAG's train step: the ml100k networks on the partition's
    engine-built training set (``--data``, its ``fields.json`` beside it: the ids and the
    user, item and user x category statistics, ~45 fields), a three-point λ sweep."""
    return dataclasses.replace(
        cascade_ml100k(),
        name="pipeline",
        epochs=2,
        fscd_strengths=(0.0003, 0.001, 0.003),
    )


CASCADE_CONFIGS: dict[str, Callable[[], CascadeTrainConfig]] = {
    "debug": cascade_debug,
    "debug_cross": cascade_debug_cross,
    "ml100k": cascade_ml100k,
    "generated": cascade_generated,
    "generated_cross": cascade_generated_cross,
    "pipeline": cascade_pipeline,
}
"""Config names accepted by :func:`get_cascade_config` and ``cascade_train --config``."""


def get_cascade_config(name: str) -> CascadeTrainConfig:
    """The named cascade config, freshly built."""
    try:
        return CASCADE_CONFIGS[name]()
    except KeyError:
        raise ValueError(
            f"unknown cascade config {name!r}; choose one of {sorted(CASCADE_CONFIGS)}"
        ) from None


ConfigT = TypeVar("ConfigT", TrainConfig, CascadeTrainConfig)


def with_overrides(
    config: ConfigT, *, epochs: int | None = None, lr: float | None = None
) -> ConfigT:
    """``config`` with the epochs and learning rate given (None keeps the config's)."""
    if epochs is not None and epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    if lr is not None and not lr > 0:
        raise ValueError(f"the learning rate must be > 0, got {lr}")
    changes = {k: v for k, v in (("epochs", epochs), ("lr", lr)) if v is not None}
    return dataclasses.replace(config, **changes) if changes else config


def override_args(*, epochs: int | None = None, lr: float | None = None) -> list[str]:
    """The trainers' command-line options for :func:`with_overrides`'s values."""
    args = [] if epochs is None else ["--epochs", str(epochs)]
    return args + ([] if lr is None else ["--lr", repr(lr)])
