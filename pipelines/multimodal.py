"""Multimodal: Spark image-text corpus -> GX -> DeepSpeed MoE transformer -> registry.

Runs daily at 05:00 UTC and whenever a ``cascade.data.landed`` (dataset ``images``) or
``cascade.retrain.requested`` (model ``multimodal``) event arrives on Kafka, through the same
shared watcher stream, claim ledger and coalescing as ``ctr_preranking``. DVC stages are
``mm_*``.

    cascade step corpus --pipeline multimodal --ds 2026-11-22
    CASCADE_MULTIMODAL_CONFIG=debug cascade step train --pipeline multimodal --ds 2026-11-22

Each takes the partition date ``ds`` and returns a JSON-able summary; everything lives under the
lake, keyed on ``ds``:

- ``landing/images/dt=DS``: ``images/`` + ``captions.jsonl`` as ``cascade land images`` (or a
  producer) landed them. The installed offline sources (Tux Paint stamps, emoji) plus the
  partition's generated pictures (:mod:`jobs.multimodal_sources`) are the named source
  ``generated``, landed only when asked for (``cascade land images --source generated``); a run
  with nothing landed ends as skipped ("nothing landed for DS") and trains and registers
  nothing;
- ``corpora/images/dt=DS``: the Spark corpus (shards, manifest, quarantine, duplicates,
  tokenizer, summary, ``gate.json``);
- ``reports/mm_*/dt=DS``: each later step's result (the training run folder is
  ``reports/mm_train/dt=DS``).

The training config is ``CASCADE_MULTIMODAL_CONFIG`` (default ``small``; the CI run uses
``debug``). Nothing is served: the model ends in the registry (``multimodal@champion``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field
from pydantic.dataclasses import dataclass

from cascade.assets import (
    ASSET_IMAGES_CORPUS,
    ASSET_IMAGES_DATA_LANDED,
    ASSET_MULTIMODAL_CHAMPION,
    MULTIMODAL_EVENT_SELECTORS,
)
from cascade.config import Settings
from cascade.errors import NothingLanded
from cascade.lake import Lake, nothing_landed
from cascade.landing import landed_from, landing_record
from cascade.partitions import partition_seed
from cascade.pipeline_spec import (
    PROMOTION_QUEUE,
    Data,
    Dataset,
    Pipeline,
    Plot,
    Promotion,
    RegisteredModel,
    Step,
    Trigger,
    deferred,
)
from cascade.settings_fields import SETTINGS_CONFIG, Flag
from cascade.step_context import StepContext, with_settings
from models.multimodal import REGISTERED_MODEL
from models.multimodal.registration import (
    MODEL_ARTIFACT_PATH,
    RECALL_KEYS,
    mean_recall_at_1,
)

DEFAULT_CONFIG = "small"
DEFAULT_GENERATED = 2_000


@dataclass(kw_only=True, frozen=True, config=SETTINGS_CONFIG)
class MultimodalSettings:
    """The ``multimodal`` pipeline's variables."""

    env_pattern: ClassVar[str] = "CASCADE_MULTIMODAL_{}"
    title: ClassVar[str] = "Pipeline multimodal"

    config: str = DEFAULT_CONFIG
    """Training config (``models.multimodal.config_registry``; the e2e stack uses ``debug``)."""
    generated: int = Field(default=DEFAULT_GENERATED, ge=0)
    """Generated pairs of a batch of the ``generated`` source (``cascade land images --source
    generated``)."""
    source_limit: int | None = Field(default=None, ge=0)
    """Caps the stamps and the emoji a ``generated`` batch takes from each offline source (unset:
    all of them)."""
    dense_twin: Flag = True
    """``1``: the evaluate step also trains the config's dense twin on the same shards and
    records its recall beside the MoE's; ``0``: the MoE's figures only (the report says so)."""
    recall_tolerance: float | None = Field(default=None, ge=0, lt=1, allow_inf_nan=False)
    """How much lower (absolute) than the champion's a challenger's mean recall@1 may be and
    still be promoted, instead of the spec's 0.02 (the held-out split is small: one pair in
    fifty is 0.02)."""


def landing_dir(lake: Lake, ds: str) -> Path:
    return lake.landing("images", ds)


def corpus_dir(lake: Lake, ds: str) -> Path:
    return lake.corpus("images", ds)


@with_settings(MultimodalSettings)
def land_generated_batch(
    dest: Path, *, ds: str, platform: Settings, settings: MultimodalSettings
) -> dict[str, int]:
    """The ``generated`` source of dataset ``images``: the installed offline sources (Tux Paint
    stamps and emoji; a missing one is skipped and named) plus the partition's generated
    pictures (``CASCADE_MULTIMODAL_GENERATED``). Chosen explicitly (the demo, benchmarks and
    tests: ``cascade land images --source generated``), never for want of data."""
    from jobs.multimodal_corpus import spark_session
    from jobs.multimodal_sources import GeneratorConfig, land_emoji, land_generated, land_tuxpaint

    limit = settings.source_limit
    landed: dict[str, int] = {}
    missing: dict[str, str] = {}
    for name, land in (("tuxpaint", land_tuxpaint), ("emoji", land_emoji)):
        if limit == 0:
            continue
        try:
            landed[name] = land(dest, limit=limit)
        except FileNotFoundError as exc:
            missing[name] = str(exc)
            print(f"[multimodal] offline source {name} not installed: {exc}", flush=True)
    generated = settings.generated
    if generated:
        config = GeneratorConfig(seed=partition_seed(ds))
        landed["generated"] = land_generated(spark_session(), dest, count=generated, config=config)
    if not sum(landed.values()):
        raise RuntimeError(
            f"nothing to land for ds={ds}: no offline source is installed ({missing}) and "
            f"CASCADE_MULTIMODAL_GENERATED=0; install them (infra/install.sh) or generate pairs"
        )
    return landed


IMAGES = Dataset(
    name="images",
    description="image-text pairs (jobs.image_landing): images/ + captions.jsonl (image_folder), "
    "a COCO captions file, or WebDataset tar shards; captions in any language; bad items "
    "quarantined with their reason",
    formats={
        fmt: deferred(f"jobs.image_landing:land_{fmt}")
        for fmt in ("image_folder", "coco", "webdataset")
    },
    sources={"generated": land_generated_batch},
)
"""What ``corpus`` reads from ``landing/images/dt=DS`` (``cascade land images``)."""


def corpus(ctx: StepContext) -> dict[str, Any]:
    """Build the partition's corpus on Spark from its landing folder: quarantine, near-duplicate
    removal, tokenized shards. A partition with nothing landed ends the run as skipped
    (:class:`~cascade.errors.NothingLanded`)."""
    from jobs.multimodal_corpus import build_corpus, spark_session

    ds, settings = ctx.ds, ctx.platform
    lake = Lake(settings.lake_root)
    landing = landing_dir(lake, ds)
    if not (landing / "captions.jsonl").is_file():
        raise NothingLanded(
            f"nothing landed for {ds}: no image-text batch at {landing}; land one with `cascade "
            f"land images PATH --ds {ds}` (or `--source generated` for the offline sources and "
            "generated pictures)"
        )
    record = landing_record(landing) or {}
    # A rebuilt corpus has not been validated yet: the previous build's gate must not vouch for it.
    (corpus_dir(lake, ds) / "gate.json").unlink(missing_ok=True)
    summary = build_corpus(spark_session(), landing, corpus_dir(lake, ds))
    summary.pop("shards", None)  # per-shard figures stay in the corpus's shards.json
    generated = record.get("source") == "generated"
    summary.update(
        ds=ds,
        landing=str(landing),
        producer_landed=not generated,
        landed_from=landed_from(record),
        landed=dict(record.get("counts") or {}),
    )
    return summary


def validate(ctx: StepContext) -> dict[str, Any]:
    """The GX gate on the manifest; a failure (``MultimodalGateFailed`` naming the checks)
    stops the DAG before training, and train and register refuse the partition."""
    from jobs.multimodal_corpus_gate import validate_corpus

    ds, settings = ctx.ds, ctx.platform
    lake = Lake(settings.lake_root)
    report = validate_corpus(
        corpus_dir(lake, ds), docs=lake.data_docs("multimodal", "validate", ds)
    )
    return {k: report[k] for k in ("success", "rows", "groups", "path", "data_docs")} | {"ds": ds}


def require_gate(lake: Lake, ds: str) -> dict[str, Any]:
    """The corpus's passed GX report; a clear error when validate did not run or failed."""
    path = corpus_dir(lake, ds) / "gate.json"
    if not path.is_file():
        raise RuntimeError(
            f"the multimodal corpus of ds={ds} has not been validated ({path} missing); "
            f"run step 'validate' first"
        )
    report = json.loads(path.read_text())
    if not report.get("success"):
        raise RuntimeError(
            f"the multimodal corpus of ds={ds} failed its GX gate "
            f"({', '.join(report.get('failed') or ['unknown checks'])}; see {path}): fix the "
            f"landed data and run steps 'corpus' and 'validate' again"
        )
    return report


def train(ctx: StepContext) -> dict[str, Any]:
    """DeepSpeed training (experts split over the processes) on the corpus shards, logged to
    the MLflow experiment ``multimodal``; the final checkpoint's module states go to the run as
    artifact ``model``. A killed attempt resumes from its checkpoints on the task's retry."""
    from mlflow.tracking import MlflowClient

    from models.multimodal.stored import stored_files
    from models.multimodal.train import train_multimodal

    ds, settings = ctx.ds, ctx.platform
    lake = Lake(settings.lake_root)
    require_gate(lake, ds)
    out = lake.reports("mm_train", ds)
    result = train_multimodal(settings, ctx.settings.config, corpus_dir(lake, ds), out)
    final = Path(result["model_checkpoint"]) / "final"
    client = MlflowClient(tracking_uri=settings.tracking_uri)
    # The stored model only: the optimizer's ZeRO partitions are for resuming, not for using.
    for path in stored_files(final):
        client.log_artifact(result["run_id"], str(path), MODEL_ARTIFACT_PATH)
    client.log_artifact(result["run_id"], str(out / "result.json"), MODEL_ARTIFACT_PATH)
    return {**result, "ds": ds}


def evaluate(ctx: StepContext) -> dict[str, Any]:
    """Recall@1/5 both ways on the corpus's held-out (test) split. The MoE's figures are those
    the training measured on that split with the final weights (every process scores with its
    share of the experts, which only the training's process group holds); with
    ``CASCADE_MULTIMODAL_DENSE_TWIN=1`` the config's dense twin (same active parameters) is
    trained on the same shards and scored on the same pairs, side by side."""
    from mlflow.tracking import MlflowClient

    ds, settings = ctx.ds, ctx.platform
    lake = Lake(settings.lake_root)
    trained = ctx.result_of("train")
    keys = ("i2t_recall_at_1", "i2t_recall_at_5", "t2i_recall_at_1", "t2i_recall_at_5")
    report: dict[str, Any] = {
        "ds": ds,
        "config": trained["config"],
        "split": "test",
        "eval_pairs": int(trained["eval_pairs"]),
        **{k: float(trained[k]) for k in keys},
        "mean_recall_at_1": mean_recall_at_1(trained),
        "run_id": trained["run_id"],
        "dense": None,
        "comparison": None,
    }
    if not trained["moe"]:
        report["dense_note"] = f"config {trained['config']!r} is dense itself: no twin to compare"
    elif not ctx.settings.dense_twin:
        report["dense_note"] = (
            "dense twin not trained (CASCADE_MULTIMODAL_DENSE_TWIN=0): MoE figures only"
        )
    else:
        # Imported here: torch and DeepSpeed cost seconds that a MoE-only evaluation skips.
        from models.multimodal.config_registry import dense_twin, get_config
        from models.multimodal.evaluate import side_by_side
        from models.multimodal.train import train_multimodal

        twin = dense_twin(get_config(trained["config"])).name
        dense = train_multimodal(
            settings, twin, corpus_dir(lake, ds), lake.reports("mm_evaluate", ds) / "dense"
        )
        report["dense"] = {
            "config": twin,
            "run_id": dense["run_id"],
            **{k: float(dense[k]) for k in keys},
            "mean_recall_at_1": mean_recall_at_1(dense),
        }
        report["comparison"] = side_by_side(trained, dense)
    client = MlflowClient(tracking_uri=settings.tracking_uri)
    client.log_metric(trained["run_id"], "mean_recall_at_1", report["mean_recall_at_1"])
    if report["dense"] is not None:
        client.log_metric(
            trained["run_id"], "dense_mean_recall_at_1", report["dense"]["mean_recall_at_1"]
        )
    print(
        f"[multimodal] held-out recall@1 i2t {report['i2t_recall_at_1']:.3f} "
        f"t2i {report['t2i_recall_at_1']:.3f} ({report['eval_pairs']} pairs)"
        + (
            f"; dense twin {report['dense']['mean_recall_at_1']:.3f}"
            if report["dense"]
            else f"; {report['dense_note']}"
        ),
        flush=True,
    )
    return report


def register(ctx: StepContext) -> dict[str, Any]:
    """Register the model trained for ``ds`` as a new version of MLflow model ``multimodal``
    (alias ``challenger``); move ``champion`` to it when its mean recall@1 is within the
    tolerance of the champion's, both measured on this partition's held-out split
    (:mod:`models.multimodal.registration`). Refuses a corpus that failed its GX gate; calling
    it again returns the first decision."""
    from models.multimodal.registration import register_and_promote

    ds, lake = ctx.ds, ctx.lake
    require_gate(lake, ds)
    promotion = ctx.pipeline.promotion(ctx.settings)
    assert promotion is not None
    return register_and_promote(
        ctx.platform,
        ds=ds,
        evaluation=ctx.result_of("evaluate"),
        corpus=corpus_dir(lake, ds),
        scratch=lake.reports("mm_register", ds),
        promotion=promotion,
    )


PIPELINE = Pipeline(
    name="multimodal",
    description=__doc__ or "",
    cron="0 5 * * *",
    trigger=Trigger(
        asset=ASSET_IMAGES_DATA_LANDED,
        watcher="images_data_landed_watcher",
        selectors=MULTIMODAL_EVENT_SELECTORS,
        unbuildable=nothing_landed("images", "captions.jsonl"),
    ),
    tags=("multimodal", "images"),
    settings=MultimodalSettings,
    model=RegisteredModel(
        name=REGISTERED_MODEL,
        promotion=Promotion(
            metric="mean_recall_at_1",
            higher_is_better=True,
            tolerance=0.02,
            tolerance_setting="recall_tolerance",
        ),
    ),
    datasets=(IMAGES,),
    catalog=(
        Data(
            name="images_landing",
            kind="landing",
            key="images",
            format="images + captions.jsonl",
            description="the partition's landed image-text pairs (`cascade land images`)",
        ),
        Data(
            name="image_corpus",
            kind="corpus",
            key="images",
            format="tokenized shards + parquet manifest",
            contract="jobs/multimodal_corpus_gate.py",
            description="decoded, quarantined, near-deduplicated and tokenized pairs",
            asset=ASSET_IMAGES_CORPUS,
        ),
        Data(
            name="mm_training",
            kind="report",
            key="mm_train",
            format="json + curves",
            description="the training's result, loss curves and checkpoints",
            persist=True,
            cache=False,
        ),
    ),
    dvc_prefix="mm_",
    steps=(
        Step(
            name="corpus",
            run=corpus,
            spark=True,
            doc="landed image-text pairs decoded, quarantined, near-deduplicated and tokenized on "
            "Spark; nothing landed: the run is skipped",
            timeout_minutes=30,
            inputs=("images_landing",),
            outputs=("image_corpus",),
            dvc_deps=(
                "jobs/multimodal_sources.py",
                "jobs/multimodal_corpus.py",
                "domains/captions/tokenizer.py",
            ),
        ),
        Step(
            name="validate",
            run=validate,
            data_docs=True,
            doc="the GX suite on the manifest (unique pairs, token counts, languages, no group "
            "across splits); a failure stops the run",
            timeout_minutes=10,
            inputs=("image_corpus",),
            dvc_deps=("jobs/multimodal_corpus_gate.py",),
        ),
        Step(
            name="train",
            run=train,
            heavy=True,
            doc="the MoE image-text transformer on DeepSpeed, experts split over the processes",
            timeout_minutes=60,
            inputs=("image_corpus",),
            outputs=("mm_training",),
            dvc_deps=("models/multimodal",),
            params={"config": "CASCADE_MULTIMODAL_CONFIG"},
            plots=(
                Plot(
                    output="mm_training",
                    file="curves",
                    x="step",
                    y="loss",
                    title="multimodal loss",
                ),
            ),
        ),
        Step(
            name="evaluate",
            run=evaluate,
            doc="image->text and text->image recall@1/5 on the held-out split, beside the dense "
            "twin's (same active parameters)",
            timeout_minutes=60,
            inputs=("image_corpus",),
            dvc_deps=("models/multimodal/evaluate.py",),
            params={"dense_twin": "CASCADE_MULTIMODAL_DENSE_TWIN"},
            metrics=RECALL_KEYS + ("mean_recall_at_1",),
        ),
        Step(
            name="register",
            run=register,
            queue=PROMOTION_QUEUE,  # acts as the MLflow promoter and signs
            doc="new MLflow version; champion only when its mean recall@1 is no worse than the "
            "champion's within the promotion tolerance",
            timeout_minutes=10,
            outlets=(ASSET_MULTIMODAL_CHAMPION,),
            inputs=("image_corpus",),
            dvc_deps=(
                "pipelines/multimodal.py",
                "models/multimodal/registration.py",
                "models/multimodal/stored.py",
                "cascade/registration.py",
                "cascade/promotion.py",
            ),
            params={"recall_tolerance": "CASCADE_MULTIMODAL_RECALL_TOLERANCE"},  # promotion
        ),
    ),
)
