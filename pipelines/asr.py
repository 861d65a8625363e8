"""ASR: Spark speech corpus -> GX -> DeepSpeed ConvDFSMN (RSQ int8) -> compile -> serving.

Runs daily at 04:00 UTC and whenever a ``cascade.data.landed`` (dataset ``speech``) or
``cascade.retrain.requested`` (model ``asr``) event arrives on Kafka, through the same shared
watcher stream, claim ledger and coalescing as ``ctr_preranking``. DVC stages are ``asr_*``
(``cascade step NAME --pipeline asr --ds DS``).

Each takes the partition date ``ds`` and returns a JSON-able summary; everything lives under the
lake, keyed on ``ds``:

- ``landing/speech/dt=DS``: WAVs + ``transcripts.jsonl`` as ``cascade land speech`` (or a
  producer) landed them. A synthesized batch (espeak-ng utterances plus the human recordings of
  :mod:`jobs.speech_human`, always test data) is the named source ``synthetic``, landed only
  when asked for (``cascade land speech --source synthetic``); a run with nothing landed ends as
  skipped ("nothing landed for DS") and trains, registers and promotes nothing;
- ``corpora/speech/dt=DS``: the Spark corpus (shards, manifest, quarantine, summary, gate);
- ``reports/asr_*/dt=DS``: each later step's result.

The training config is ``CASCADE_ASR_CONFIG`` (default ``synthetic``; the CI run uses ``debug``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field
from pydantic.dataclasses import dataclass

from cascade.assets import (
    ASR_EVENT_SELECTORS,
    ASSET_ASR_CHAMPION,
    ASSET_SPEECH_CORPUS,
    ASSET_SPEECH_DATA_LANDED,
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
from cascade.settings_fields import SETTINGS_CONFIG
from cascade.step_context import StepContext, with_settings
from models.asr import REGISTERED_MODEL

CONFIG_ENV = "CASCADE_ASR_CONFIG"
DEFAULT_CONFIG = "synthetic"


@dataclass(kw_only=True, frozen=True, config=SETTINGS_CONFIG)
class AsrSettings:
    """The ``asr`` pipeline's variables."""

    env_pattern: ClassVar[str] = "CASCADE_ASR_{}"
    title: ClassVar[str] = "Pipeline asr"

    config: str = DEFAULT_CONFIG
    """Training config (``models.asr.config_registry``; the CI run uses ``debug``)."""
    utterances: int | None = Field(default=None, ge=1)
    """Size of a batch of the ``synthetic`` source (``cascade land speech --source synthetic``;
    unset: the config's ``corpus_utterances``)."""
    cer_tolerance: float | None = Field(default=None, ge=0, lt=1, allow_inf_nan=False)
    """How much worse (absolute CER) than the champion a challenger may be and still be
    promoted, instead of the spec's 0.005: two evaluations of one model on the same rows agree
    exactly, so the tolerance only absorbs real noise."""


def landing_dir(lake: Lake, ds: str) -> Path:
    return lake.landing("speech", ds)


def corpus_dir(lake: Lake, ds: str) -> Path:
    return lake.corpus("speech", ds)


def _synthetic_count(knobs: AsrSettings) -> int:
    count = knobs.utterances
    if count is None:
        from models.asr.config_registry import get_config

        count = get_config(knobs.config).corpus_utterances
    if count < 1:
        raise ValueError(f"CASCADE_ASR_UTTERANCES must be >= 1, got {count}")
    return count


@with_settings(AsrSettings)
def land_synthetic_batch(
    dest: Path, *, ds: str, platform: Settings, settings: AsrSettings
) -> dict[str, int]:
    """The ``synthetic`` source of dataset ``speech``: the partition's espeak-ng utterances
    (``CASCADE_ASR_UTTERANCES``, else the config's size) plus the human recordings of
    :mod:`jobs.speech_human` (always test data). Chosen explicitly (the demo, benchmarks and
    tests: ``cascade land speech --source synthetic``), never for want of data."""
    from jobs.audio_corpus import land_synthetic, spark_session
    from jobs.speech_human import land_human

    count = _synthetic_count(settings)
    print(f"[asr] synthesizing {count} utterances for ds={ds}", flush=True)
    synthesized = land_synthetic(spark_session(), dest, count=count, seed=partition_seed(ds))
    human = land_human(dest)
    print(f"[asr] landed {human} human recordings (test split only)", flush=True)
    return {"utterances": synthesized + human, "synthesized": synthesized, "human": human}


SPEECH = Dataset(
    name="speech",
    description="recorded utterances and their transcripts (jobs.speech_landing): a Kaldi data "
    "directory, a LibriSpeech folder, a Common Voice TSV, or wav/ + transcripts.jsonl; WAV, FLAC, "
    "Ogg or MP3 at any rate, resampled; bad items quarantined with their reason; people recorded "
    "in Debian packages (asterisk_en, fillets_cs, fillets_nl)",
    formats={
        fmt: deferred(f"jobs.speech_landing:{function}")
        for fmt, function in (
            ("kaldi", "land_kaldi"),
            ("librispeech", "land_librispeech"),
            ("common_voice", "land_common_voice"),
            ("jsonl", "land_speech_jsonl"),
        )
    },
    sources={
        "synthetic": land_synthetic_batch,
        # recorded people from installed Debian packages (jobs.speech_packages)
        "asterisk_en": deferred("jobs.speech_packages:land_asterisk_en"),
        "fillets_cs": deferred("jobs.speech_packages:land_fillets_cs"),
        "fillets_nl": deferred("jobs.speech_packages:land_fillets_nl"),
    },
    source_importer=deferred("jobs.speech_packages:package_source_importer"),
)
"""What ``corpus`` reads from ``landing/speech/dt=DS`` (``cascade land speech``)."""


def corpus(ctx: StepContext) -> dict[str, Any]:
    """Build the partition's corpus on Spark from its landing folder; a partition with nothing
    landed ends the run as skipped (:class:`~cascade.errors.NothingLanded`)."""
    from jobs.audio_corpus import build_corpus, spark_session

    ds = ctx.ds
    landing = ctx.inputs["speech_landing"].path
    if not (landing / "transcripts.jsonl").exists() and not (landing / "wav").exists():
        raise NothingLanded(
            f"nothing landed for {ds}: no speech batch at {landing}; land one with `cascade "
            f"land speech PATH --ds {ds}` (or `--source synthetic` for a synthesized batch)"
        )
    record = landing_record(landing) or {}
    summary = build_corpus(spark_session(), landing, ctx.outputs["speech_corpus"].path)
    summary.update(
        ds=ds,
        landing=str(landing),
        landed_from=landed_from(record),
        synthesized=(record.get("counts") or {}).get("synthesized", 0),
    )
    return summary


def validate(ctx: StepContext) -> dict[str, Any]:
    """The GX gate on the manifest; a failure stops the DAG before training."""
    from jobs.audio_corpus_gate import validate_corpus

    ds, lake = ctx.ds, ctx.lake
    corpus = ctx.inputs["speech_corpus"].path
    report = validate_corpus(corpus, docs=lake.data_docs("asr", "validate", ds))
    return {k: report[k] for k in ("success", "rows", "voices", "path", "data_docs")} | {"ds": ds}


def train(ctx: StepContext) -> dict[str, Any]:
    """DeepSpeed training (fp32, then range-scaled int8 QAT with distillation) on the corpus;
    a killed attempt resumes from its checkpoints on the task's retry."""
    from models.asr.train import train_asr

    ds, settings = ctx.ds, ctx.platform
    result = train_asr(
        settings,
        ctx.settings.config,
        ctx.inputs["speech_corpus"].path,
        ctx.outputs["asr_training"].path,
    )
    return {**result, "ds": ds}


def compile(ctx: StepContext) -> dict[str, Any]:  # noqa: A001
    """Build the int8 AOTInductor package of the trained model and gate it on the partition's
    held-out voices (:mod:`compilers.asr_gate`); a failed gate is recorded, and the register
    step then keeps the champion."""
    from compilers.asr_gate import compile_and_gate

    return compile_and_gate(
        ctx.platform,
        ds=ctx.ds,
        trained=ctx.result_of("train"),
        corpus=ctx.inputs["speech_corpus"].path,
    )


def register(ctx: StepContext) -> dict[str, Any]:
    """Register the int8 model trained for ``ds`` (with its compiled artifact) as a new version of
    MLflow model ``asr`` (alias ``challenger``); move ``champion`` to it when the compile gate
    passed and its CER on this partition's held-out voices is within the tolerance of the
    champion's CER on the same utterances (:mod:`models.asr.registration`). Calling it again
    returns the first decision."""
    from models.asr.registration import register_and_promote

    promotion = ctx.pipeline.promotion(ctx.settings)
    assert promotion is not None
    return register_and_promote(
        ctx.platform,
        ds=ctx.ds,
        trained=ctx.result_of("train"),
        compile_gate=ctx.result_of("compile"),
        corpus=ctx.inputs["speech_corpus"].path,
        promotion=promotion,
    )


def deploy(ctx: StepContext) -> dict[str, Any]:
    """Wait until the ASR server transcribes with the registry's champion
    (:func:`serving.asr_client.roll_out`); says why a challenger that was not promoted is not
    the one served."""
    from serving.asr_client import roll_out

    return roll_out(ctx.platform, ctx.ds, ctx.result_of("register"))


@with_settings(None)
def score(request: Mapping[str, Any], *, platform: Settings) -> dict[str, Any]:
    """``cascade score --model asr --audio FILE.wav``: the served champion's transcript."""
    from serving.asr_client import transcribe

    path = request.get("audio")
    if not path:
        raise ValueError("transcribing needs --audio FILE.wav")
    return transcribe(platform, Path(str(path)).read_bytes())


PIPELINE = Pipeline(
    name="asr",
    description=__doc__ or "",
    cron="0 4 * * *",
    trigger=Trigger(
        asset=ASSET_SPEECH_DATA_LANDED,
        watcher="speech_data_landed_watcher",
        selectors=ASR_EVENT_SELECTORS,
        unbuildable=nothing_landed("speech", "transcripts.jsonl", "wav"),
    ),
    tags=("asr", "speech"),
    settings=AsrSettings,
    datasets=(SPEECH,),
    catalog=(
        Data(
            name="speech_landing",
            kind="landing",
            key="speech",
            format="wav + transcripts.jsonl",
            description="the partition's landed batch (`cascade land speech`)",
        ),
        Data(
            name="speech_corpus",
            kind="corpus",
            key="speech",
            format="parquet manifest + log-mel features",
            contract="jobs/audio_corpus_gate.py",
            description="validated, featurized utterances split by voice",
            asset=ASSET_SPEECH_CORPUS,
        ),
        Data(
            name="asr_training",
            kind="report",
            key="asr_train",
            format="json + curves",
            description="the training's result, loss curves and checkpoints",
            persist=True,
            cache=False,
        ),
    ),
    model=RegisteredModel(
        name=REGISTERED_MODEL,
        promotion=Promotion(
            metric="cer",
            higher_is_better=False,
            tolerance=0.005,
            requires_compile_gate=True,
            tolerance_setting="cer_tolerance",
        ),
        score=score,
        score_needs=("audio",),
    ),
    dvc_prefix="asr_",
    steps=(
        Step(
            name="corpus",
            run=corpus,
            spark=True,
            doc="the partition's landed WAVs + transcripts validated, resampled, featurized and "
            "split by voice on Spark; bad files quarantined; nothing landed: the run is skipped",
            timeout_minutes=30,
            inputs=("speech_landing",),
            outputs=("speech_corpus",),
            dvc_deps=("jobs/audio_corpus.py", "jobs/speech_synth.py", "domains/speech"),
            params={"config": CONFIG_ENV},
        ),
        Step(
            name="validate",
            run=validate,
            data_docs=True,
            doc="the GX suite on the manifest (durations, rates, lengths, voice-disjoint splits)",
            inputs=("speech_corpus",),
            dvc_deps=("jobs/audio_corpus_gate.py",),
        ),
        Step(
            name="train",
            run=train,
            heavy=True,
            doc="fp32 training, then range-scaled int8 QAT with distillation, on DeepSpeed",
            timeout_minutes=60,
            inputs=("speech_corpus",),
            outputs=("asr_training",),
            dvc_deps=("models/asr",),
            params={"config": CONFIG_ENV},
            metrics=("cer_fp32", "cer_int8", "wer_fp32", "wer_int8"),
            plots=(
                Plot(
                    output="asr_training",
                    file="curves",
                    x="step",
                    y="loss",
                    title="ASR loss (fp32, then int8 QAT)",
                ),
            ),
        ),
        Step(
            name="compile",
            run=compile,
            heavy=True,
            doc="the int8 .pt2 artifact with parity and accuracy gates",
            timeout_minutes=20,
            inputs=("speech_corpus",),
            dvc_deps=("compilers",),
        ),
        Step(
            name="register",
            run=register,
            queue=PROMOTION_QUEUE,  # acts as the MLflow promoter and signs
            doc="new MLflow version; champion only when its CER on the held-out voices is no "
            "worse than the champion's and the compile gate passed",
            outlets=(ASSET_ASR_CHAMPION,),
            # The trained model's files and figures, the gate's verdict (the previous step's),
            # and the held-out voices both versions are scored on.
            inputs=("speech_corpus",),
            reads=("train",),
            dvc_deps=(
                "pipelines/asr.py",
                "models/asr/registration.py",
                "cascade/registration.py",
                "cascade/promotion.py",
                "cascade/registry.py",
            ),
            params={"cer_tolerance": "CASCADE_ASR_CER_TOLERANCE"},  # the promotion override
        ),
        Step(
            name="deploy",
            run=deploy,
            doc="waits until the ASR server transcribes with the champion",
            dvc_deps=("serving",),
        ),
    ),
)
