"""CTR pre-ranking: engine training set -> DeepSpeed -> compile -> registry -> serving.

Chained by data: runs when ``ctr_cross`` publishes a partition of cross statistics (the asset
its ``feast`` step updates), on that partition, each partition published its own run and built
once, and whenever a ``cascade.retrain.requested`` (model preranking) event arrives on Kafka
(Airflow's AssetWatcher with the shared-stream trigger: offsets committed after the asset event
is stored). The training set is the clean impressions of the days before the partition, each
joined point in time with the gate-passed statistics of its own day
(:func:`jobs.ctr_training_set.pipeline_training_set`). The first task claims the run's event
ids, so a redelivered event never does the work twice, and a burst coalesces into one run per
partition (see :mod:`cascade.event_claims`). Each step is also
``cascade step NAME --pipeline ctr_preranking --ds DS`` and a DVC stage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from cascade.assets import (
    ASSET_CTR_CROSS_FEATURES,
    ASSET_CTR_DATA_LANDED,
    ASSET_PRERANKING_CHAMPION,
    CTR_EVENT_SELECTORS,
)
from cascade.pipeline_spec import (
    PROMOTION_QUEUE,
    Data,
    Pipeline,
    Plot,
    Promotion,
    RegisteredModel,
    Step,
    Trigger,
)
from cascade.settings_fields import SETTINGS_CONFIG
from cascade.step_context import StepContext
from models.preranking import PROMOTION_METRICS, REGISTERED_MODEL

DEFAULT_CONFIG = "pipeline"
"""The training config when ``CASCADE_PRERANKING_CONFIG`` is unset."""


@dataclass(kw_only=True, frozen=True, config=SETTINGS_CONFIG)
class PrerankingSettings:
    """The ``ctr_preranking`` train step's knobs (``params.yaml``'s ``ctr_preranking.*``)."""

    env_pattern: ClassVar[str] = "CASCADE_PRERANKING_{}"
    title: ClassVar[str] = "Pipeline ctr_preranking"

    config: str = ""
    """Training config (a cascade config of ``models.preranking.config_registry``; unset:
    ``pipeline``)."""
    epochs: int | None = Field(default=None, ge=1)
    """Epochs of each training phase, instead of the config's."""
    lr: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Learning rate, instead of the config's."""
    source: str = Field(default="", pattern=r"^([a-z][a-z0-9_]{0,47})?$")
    """The cross-statistics source the training set reads (unset: the one whose ``ctr_cross``
    run published the partition)."""
    validation_fraction: float | None = Field(default=None, gt=0, lt=1, allow_inf_nan=False)
    """Share of the training period (its latest rows, before the test split) that chooses
    FSCD's regularizer strength, instead of the config's (0.2). Raise it when the train step
    refuses a validation split with too few clicks (it checks before starting processes)."""
    cost_budget: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    """The serving cost (share of the teacher's) FSCD's chosen model must stay within, instead
    of the config's (0.5); the step fails when no model that ranks is within it. 1 sets no
    budget: for runs too short to prune a field (smoke and wiring runs)."""
    train_days: int = Field(default=7, ge=1, le=90)
    """Days of impressions before ``ds`` the training set holds; each reads its own day's
    published partition (``ctr_cross`` builds them: ``CASCADE_CROSS_HISTORY_DAYS``)."""
    promotion_metric: Literal["auc", "logloss"] | None = None
    """What the register step compares challenger and champion on, instead of the spec's
    ``auc``: ``auc`` (higher is better) or ``logloss`` (lower is better)."""
    promotion_tolerance: float | None = Field(default=None, ge=0, lt=1, allow_inf_nan=False)
    """How much worse than the champion on the promotion metric a challenger may be and still
    become champion, instead of the spec's 0.005 (both scored on the same held-out rows)."""


def training_set(ctx: StepContext) -> dict[str, Any]:
    from jobs import ctr_cross_stats as engine
    from jobs.ctr_training_set import pipeline_training_set
    from jobs.spark_sessions import active_or_new

    settings, knobs = ctx.platform, ctx.settings
    out = ctx.lake.training_set("preranking", ctx.ds)
    app = "cascade.ctr_preranking.training_set"
    with active_or_new(lambda: engine.build_session(settings, app=app)) as spark:
        return pipeline_training_set(
            ctx.ds,
            out,
            spark=spark,
            lake_root=settings.lake_root,
            source=knobs.source or None,
            train_days=knobs.train_days,
        )


def train(ctx: StepContext) -> dict[str, Any]:
    from models.preranking.cascade_train import launch_pipeline

    knobs = ctx.settings
    return launch_pipeline(
        ctx.ds,
        config=knobs.config or DEFAULT_CONFIG,
        settings=ctx.platform,
        epochs=knobs.epochs,
        lr=knobs.lr,
        validation_fraction=knobs.validation_fraction,
        cost_budget=knobs.cost_budget,
    )


def compile_gate(ctx: StepContext) -> dict[str, Any]:
    from compilers.preranking_gate import compile_and_gate

    return compile_and_gate(ctx.ds)


def register(ctx: StepContext) -> dict[str, Any]:
    from models.preranking.registration import register_and_promote

    promotion = ctx.pipeline.promotion(ctx.settings)
    assert promotion is not None
    return register_and_promote(ctx.ds, promotion=promotion)


def deploy(ctx: StepContext) -> dict[str, Any]:
    from serving.preranking_client import roll_out

    return roll_out(ctx.ds)


def score(request: Mapping[str, Any]) -> dict[str, Any]:
    """``cascade score --model preranking --user 1 --items 10 20 30``."""
    from serving.preranking_client import score as score_served

    if request.get("user") is None or not request.get("items"):
        raise ValueError("scoring the pre-ranker needs --user ID and --items ID [ID ...]")
    return score_served(int(request["user"]), [int(item) for item in request["items"]])


PIPELINE = Pipeline(
    name="ctr_preranking",
    description=__doc__ or "",
    # Chained by data: a run starts when ctr_cross publishes a partition (one run for each).
    after=(ASSET_CTR_CROSS_FEATURES,),
    trigger=Trigger(
        asset=ASSET_CTR_DATA_LANDED,
        watcher="ctr_data_landed_watcher",
        selectors=CTR_EVENT_SELECTORS,
        # This watcher owns dead-lettering: one record per bad message.
        dead_letter=True,
    ),
    tags=("ctr", "preranking"),
    settings=PrerankingSettings,
    model=RegisteredModel(
        name=REGISTERED_MODEL,
        promotion=Promotion(
            metric="auc",
            higher_is_better=True,
            tolerance=0.005,
            requires_compile_gate=True,
            metrics=PROMOTION_METRICS,
            metric_setting="promotion_metric",
            tolerance_setting="promotion_tolerance",
        ),
        score=score,
        score_needs=("user", "items"),
    ),
    dvc_prefix="",
    catalog=(
        Data(
            name="published_cross_features",
            kind="report",
            key="step_cross_feast",
            file="summary.json",
            format="json",
            description="what ctr_cross published for the partition (dvc repro chains the two)",
        ),
        Data(
            name="training_set",
            kind="training_set",
            key="preranking",
            format="parquet + training.json",
            description="the clean impressions of the train_days before ds with their "
            "point-in-time cross statistics",
        ),
        Data(
            name="train_report",
            kind="report",
            key="train",
            format="json + curves + tradeoff.csv",
            description="the training's result, loss curves and FSCD's trade-off",
            persist=True,
            cache=False,
        ),
    ),
    steps=(
        Step(
            name="training_set",
            run=training_set,
            spark=True,
            doc="the clean impressions of the train_days before ds, each point-in-time joined "
            "with the gate-passed cross statistics of its own day (user, item, user x "
            "category), from the partition's published source",
            inputs=("published_cross_features",),
            outputs=("training_set",),
            dvc_deps=("jobs/ctr_training_set.py",),
            params={
                "source": "CASCADE_PRERANKING_SOURCE",
                "train_days": "CASCADE_PRERANKING_TRAIN_DAYS",
            },
        ),
        Step(
            name="train",
            run=train,
            heavy=True,
            doc="the FSCD pre-ranker on DeepSpeed; AUC on a held-out time split",
            timeout_minutes=30,
            inputs=("training_set",),
            outputs=("train_report",),
            dvc_deps=("models/preranking",),
            params={
                "config": "CASCADE_PRERANKING_CONFIG",
                "epochs": "CASCADE_PRERANKING_EPOCHS",
                "lr": "CASCADE_PRERANKING_LR",
                "validation_fraction": "CASCADE_PRERANKING_VALIDATION_FRACTION",
                "cost_budget": "CASCADE_PRERANKING_COST_BUDGET",
            },
            metrics=(
                "test_auc",
                "fscd_auc",
                "fscd_gauc",
                "teacher_auc",
                "two_tower_auc",
                "auc_ratio",
                "cost_ratio",
                "recall_at_k",
                "train_seconds",
            ),  # fmt: skip
            plots=(
                Plot(
                    output="train_report",
                    file="curves",
                    x="step",
                    y="loss",
                    title="pre-ranker loss",
                ),
                Plot(
                    output="train_report",
                    file="tradeoff.csv",
                    x="cost_ratio",
                    y="auc",
                    title="FSCD: AUC against feature cost",
                ),
            ),
        ),
        Step(
            name="compile",
            run=compile_gate,
            heavy=True,
            doc="AOTInductor package gated on parity, accuracy and latency; a failure is "
            "recorded and the registry then keeps the champion",
            timeout_minutes=20,
            dvc_deps=("compilers",),
        ),
        Step(
            name="register",
            run=register,
            queue=PROMOTION_QUEUE,  # acts as the MLflow promoter and signs
            doc="new MLflow version; champion only if the compile gate passed and it is not "
            "worse than the champion on the same held-out rows",
            outlets=(ASSET_PRERANKING_CHAMPION,),
            reads=("train",),
            dvc_deps=(
                "models/preranking/registration.py",
                "cascade/registration.py",
                "cascade/promotion.py",
            ),
            # The promotion rule's overrides, for one run: `dvc exp run -S
            # ctr_preranking.promotion_tolerance=0.01` or `--param promotion_metric=logloss`.
            params={
                "promotion_metric": "CASCADE_PRERANKING_PROMOTION_METRIC",
                "promotion_tolerance": "CASCADE_PRERANKING_PROMOTION_TOLERANCE",
            },
        ),
        Step(
            name="deploy",
            run=deploy,
            doc="waits until the model server answers with the new champion",
            dvc_deps=("serving",),
        ),
    ),
)
