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

import json
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

CONFIG_ENV = "CASCADE_ASR_CONFIG"
DEFAULT_CONFIG = "synthetic"
MODEL_NAME = "asr"
SERVED_ARTIFACT_PATH = "int8"
"""Folder of the training's MLflow run that a registered version points at: the int8 model file
(training logs it) and its compiled ``.pt2`` (the compile step adds it)."""


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
    "in Debian packages (asterisk_en, fillets_cs)",
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


def held_out_cer(artifact: Path, corpus: Path) -> dict[str, Any]:
    """The served (int8) model's CER and WER on the corpus test split (held-out voices), and
    how many reference characters it has no output for (its alphabet never held them)."""
    from models.asr.evaluate import evaluate_artifacts

    evaluation = evaluate_artifacts(artifact, artifact, corpus, split="test")
    return {
        "cer": evaluation["cer_int8"],
        "wer": evaluation["wer_int8"],
        "utterances": evaluation["utterances"],
        "unseen_characters": evaluation["unseen_characters"],
    }


def register(ctx: StepContext) -> dict[str, Any]:
    """Register the int8 model trained for ``ds`` (with its compiled artifact) as a new version of
    MLflow model ``asr`` (alias ``challenger``); move ``champion`` to it when the compile gate
    passed and its CER on this partition's held-out voices is within the tolerance of the
    champion's CER on the same utterances. Calling it again returns the first decision.

    The version's folder also gets the files of an MLflow pyfunc (:mod:`models.asr.pyfunc`)
    before its digests are recorded, so it loads the standard way too."""
    import tempfile

    import mlflow

    from cascade.artifacts import DIGESTS_TAG, digests_tag
    from cascade.promotion import Decision, NewVersion, Scores, register_and_promote
    from cascade.registry import (
        add_pyfunc_files,
        download_verified,
        freeze_release,
        registry_client,
    )
    from cascade.signing import check_tested, load_signing_key
    from models.asr.pyfunc import save_pyfunc

    ds, settings = ctx.ds, ctx.platform
    lake = Lake(settings.lake_root)
    trained = ctx.result_of("train")
    gate = ctx.result_of("compile")
    client = registry_client(settings)
    run_id = trained["run_id"]
    promotion = ctx.pipeline.promotion(ctx.settings)
    assert promotion is not None

    def score(champion: Any) -> Scores:
        corpus = corpus_dir(lake, ds)
        challenger_cer = held_out_cer(Path(trained["int8_artifact"]), corpus)
        # The champion's files are read only once they match what its registration recorded.
        with tempfile.TemporaryDirectory(prefix="asr-champion-") as scratch:
            champion_dir = download_verified(
                settings, MODEL_NAME, str(champion.version), Path(scratch)
            )
            champion_cer = held_out_cer(champion_dir, corpus)
        utterances = challenger_cer["utterances"]
        return Scores(
            challenger=challenger_cer["cer"],
            champion=champion_cer["cer"],
            rows=f"the same {utterances} held-out utterances",
            details={
                "utterances": utterances,
                # A champion fitted to older data may lack characters this partition holds.
                "unseen_characters": {
                    "challenger": challenger_cer["unseen_characters"],
                    "champion": champion_cer["unseen_characters"],
                },
            },
        )

    def report(decision: Decision) -> dict[str, Any]:
        return {
            "ds": ds,
            **decision.record(),
            "run_id": run_id,
            "cer_int8": trained["cer_int8"],
            "cer_fp32": trained["cer_fp32"],
            "compile_gate": {k: gate.get(k) for k in ("passed", "reasons", "artifact")},
        }

    source = f"{mlflow.get_run(run_id).info.artifact_uri}/{SERVED_ARTIFACT_PATH}"
    # MLmodel, code file and input example beside the model file, for the standard loader.
    add_pyfunc_files(settings, run_id, SERVED_ARTIFACT_PATH, save_pyfunc)
    # What the registry holds now is what every later load must find (cascade.artifacts).
    # The registered version is a write-once copy: a re-run of compile rewrites int8/, not it.
    source, files = freeze_release(settings, run_id, {"": source})
    check_tested(files, gate.get("tested") or {}, f"{MODEL_NAME} run {run_id}")
    digests = digests_tag(files)
    result = register_and_promote(
        client,
        NewVersion(
            name=MODEL_NAME,
            model_description="Speech recognition, ConvDFSMN int8 (Cascade)",
            run_id=run_id,
            source=source,
            tags={
                "ds": ds,
                "cer_int8": repr(float(trained["cer_int8"])),
                "run_id": run_id,
                DIGESTS_TAG: digests,
            },
            description=f"trained for ds={ds} with config {trained.get('config')}",
        ),
        promotion=promotion,
        score=score,
        compile_gate=gate,
        report=report,
        signing_key=load_signing_key(settings.home, create=True),
        settings=settings,
    )
    return result


GATE_UTTERANCES = 200
"""Held-out utterances the compile gate transcribes with both the package and the reference."""
MIN_AGREEMENT = 0.95
"""Share of those transcripts on which the int8 package must agree with the fake-quant model it
was compiled from (a compiler bug shows up as disagreement, not as a small CER change)."""


def compile(ctx: StepContext) -> dict[str, Any]:  # noqa: A001
    """Build the int8 AOTInductor package of the trained model and gate it: its transcripts
    must agree with the fake-quant model's and its CER stay within the config's
    ``int8_max_cer_delta`` of the fp32 model's on the same held-out utterances. The package and
    the gate's report go to the training's MLflow run beside the model file (what a registered
    version holds); a failed gate is recorded, and the register step then keeps the champion."""
    import torch
    from mlflow.tracking import MlflowClient

    from cascade.artifacts import sha256_file
    from compilers.asr import compile_asr
    from domains.speech.audio_features import HUMAN_VOICE_PREFIX
    from models.asr.artifact import FILENAME, load_artifact
    from models.asr.compiled import INT8_FILE, MAX_FRAMES, MIN_FRAMES, REPORT_FILE, load_compiled
    from models.asr.config_registry import get_config
    from models.asr.corpus import load_split
    from models.asr.evaluate import int8_model
    from models.asr.inference import transcribe
    from models.asr.metrics import cer

    ds, settings = ctx.ds, ctx.platform
    lake = Lake(settings.lake_root)
    trained = ctx.result_of("train")
    model_dir = Path(trained["int8_artifact"]).parent
    threads = torch.get_num_threads()
    report = compile_asr(model_dir, fp32=False, int8=True, onnx=False)
    torch.set_num_threads(threads)

    artifact = load_artifact(model_dir)
    package = load_compiled(model_dir / INT8_FILE, artifact.model.config)
    reference = int8_model(artifact)
    fp32 = load_artifact(Path(trained["fp32_artifact"]))
    data = load_split(corpus_dir(lake, ds), "test", artifact.alphabet)
    keep = [
        not voice.startswith(HUMAN_VOICE_PREFIX) and MIN_FRAMES <= len(f) <= MAX_FRAMES
        for voice, f in zip(data.voices, data.features, strict=True)
    ]
    data = data.subset(keep)
    texts, features = data.texts[:GATE_UTTERANCES], data.features[:GATE_UTTERANCES]
    if not texts:
        raise ValueError(f"no held-out utterances in {corpus_dir(lake, ds)} to gate the package")
    hyps = {
        kind: [transcribe(model, artifact.alphabet, f).text for f in features]
        for kind, model in (("package", package), ("reference", reference), ("fp32", fp32.model))
    }
    agreement = sum(a == b for a, b in zip(hyps["package"], hyps["reference"], strict=True))
    agreement /= len(texts)
    cer_package, cer_fp32 = cer(texts, hyps["package"]), cer(texts, hyps["fp32"])
    max_delta = get_config(trained["config"]).int8_max_cer_delta
    reasons = []
    if agreement < MIN_AGREEMENT:
        reasons.append(
            f"the int8 package agrees with its fake-quant reference on {agreement:.1%} of "
            f"{len(texts)} transcripts (at least {MIN_AGREEMENT:.0%} required)"
        )
    if cer_package > cer_fp32 + max_delta:
        reasons.append(
            f"int8 package CER {cer_package:.4f} exceeds fp32 CER {cer_fp32:.4f} by more than "
            f"{max_delta}"
        )
    gate = {
        "ds": ds,
        "passed": not reasons,
        "reasons": reasons,
        "artifact": str(model_dir / INT8_FILE),
        "utterances": len(texts),
        "agreement": agreement,
        "cer_package": cer_package,
        "cer_fp32": cer_fp32,
        "cer_delta_points": 100 * (cer_package - cer_fp32),
        "max_cer_delta": max_delta,
        "compile_s": report["int8"]["compile_s"],
        # The files this gate ran, as registration must find them in the run (then signed).
        "tested": {
            name: sha256_file(model_dir / name) for name in (INT8_FILE, REPORT_FILE, FILENAME)
        },
    }
    (model_dir / "compile_gate.json").write_text(json.dumps(gate, indent=2))
    client = MlflowClient(tracking_uri=settings.tracking_uri)
    run_id = trained["run_id"]
    for name in (INT8_FILE, REPORT_FILE, "compile_gate.json"):
        client.log_artifact(run_id, str(model_dir / name), SERVED_ARTIFACT_PATH)
    client.log_metric(run_id, "compile_int8_cer", cer_package)
    client.log_metric(run_id, "compile_agreement", agreement)
    client.set_tag(run_id, "compile_gate", "passed" if gate["passed"] else "failed")
    print(
        f"[asr] compile gate {'passed' if gate['passed'] else 'FAILED'}: agreement "
        f"{agreement:.1%}, CER package {cer_package:.2%} vs fp32 {cer_fp32:.2%} "
        f"({len(texts)} held-out utterances)",
        flush=True,
    )
    return gate


def _transcribe(settings: Settings, wav: bytes, *, timeout_s: float) -> dict[str, Any] | None:
    """The ASR server's v2 response to one WAV, None while down, not ready or refusing it."""
    import base64

    import requests

    body = {
        "inputs": [
            {
                "name": "audio",
                "datatype": "BYTES",
                "shape": [1],
                "data": [base64.b64encode(wav).decode()],
            }
        ]
    }
    base = f"{settings.asr_serving_url}/v2/models/{MODEL_NAME}"
    try:
        headers = settings.serving.auth_headers()
        if requests.get(f"{base}/ready", headers=headers, timeout=timeout_s).status_code != 200:
            return None
        response = requests.post(f"{base}/infer", json=body, headers=headers, timeout=timeout_s)
    except requests.RequestException:
        return None
    if response.status_code != 200:
        return None
    return dict(response.json())


def served_version(settings: Settings, *, timeout_s: float = 10.0) -> str | None:
    """The registry version the ASR server transcribes with, None while down or not ready
    (a half-second probe tone; the response names its ``model_version``)."""
    import io
    import wave

    import numpy as np

    tone = (0.1 * np.sin(np.arange(8000) * 2 * np.pi * 440 / 16000) * 32767).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(tone.tobytes())
    response = _transcribe(settings, buffer.getvalue(), timeout_s=timeout_s)
    if response is None:
        return None
    version = (response.get("parameters") or {}).get("model_version")
    return None if version is None else str(version)


@with_settings(None)
def score(request: Mapping[str, Any], *, platform: Settings) -> dict[str, Any]:
    """``cascade score --model asr --audio FILE.wav``: the served champion's transcript."""
    path = request.get("audio")
    if not path:
        raise ValueError("transcribing needs --audio FILE.wav")
    wav = Path(str(path)).read_bytes()
    response = _transcribe(platform, wav, timeout_s=30.0)
    if response is None:
        raise RuntimeError(
            "the ASR server did not answer (not running, not ready, or it refused the file); "
            "start the stack with `cascade up`"
        )
    return response


def deploy(ctx: StepContext, *, timeout_s: float = 300) -> dict[str, Any]:
    """Wait until the ASR server transcribes with the registry's champion; says why a
    challenger that was not promoted is not the one served."""
    from serving.champion import champion_version
    from serving.deploy import wait_until_served

    ds, settings = ctx.ds, ctx.platform
    decision = ctx.result_of("register")
    champion = champion_version(settings, MODEL_NAME)
    if champion is None:
        raise RuntimeError(
            f"the registry has no '{MODEL_NAME}@champion' to deploy; the challenger of ds={ds} "
            f"was refused: {'; '.join(decision.get('reasons') or [])}"
        )
    url = f"{settings.asr_serving_url}/v2/models/{MODEL_NAME}"
    served, waited = wait_until_served(
        champion,
        lambda: served_version(settings),
        timeout_s=timeout_s,
        poll_s=2.0,
        what=f"ds={ds}: {url}",
        hint=f"check that the ASR server runs (cascade asr serve) and its log under "
        f"{settings.logs_dir}",
    )
    return {
        "ds": ds,
        "served_version": served,
        "champion_version": champion,
        "url": url,
        "waited_s": round(waited, 3),
        "challenger_version": decision.get("version"),
        "promoted": decision.get("promoted"),
        "blocked_by": decision.get("reasons") or [],
    }


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
        name=MODEL_NAME,
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
            dvc_deps=("pipelines/asr.py", "cascade/promotion.py", "cascade/registry.py"),
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
