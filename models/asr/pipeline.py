"""The steps of DAG ``asr`` (and DVC stages ``asr_*``), one function per task.

Each takes the partition date ``ds`` and returns a JSON-able summary; everything lives under the
lake, keyed on ``ds``:

- ``landing/speech/dt=DS``: WAVs + ``transcripts.jsonl`` as a producer landed them (when nothing
  landed, the corpus step synthesizes the partition's batch with espeak-ng and adds the human
  recordings of :mod:`jobs.speech_human`, which are always test data);
- ``corpora/speech/dt=DS``: the Spark corpus (shards, manifest, quarantine, summary, gate);
- ``reports/asr_*/dt=DS``: each later step's result.

The training config is ``CASCADE_ASR_CONFIG`` (default ``synthetic``; the CI run uses ``debug``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from cascade.config import Settings, load_settings
from cascade.lake import Lake, check_ds

CONFIG_ENV = "CASCADE_ASR_CONFIG"
DEFAULT_CONFIG = "synthetic"
UTTERANCES_ENV = "CASCADE_ASR_UTTERANCES"
"""Overrides the size of a synthesized batch (the config's ``utterances`` otherwise)."""
MODEL_NAME = "asr"


def config_name() -> str:
    return os.environ.get(CONFIG_ENV, DEFAULT_CONFIG)


def landing_dir(lake: Lake, ds: str) -> Path:
    return lake.root / "landing" / "speech" / f"dt={check_ds(ds)}"


def corpus_dir(lake: Lake, ds: str) -> Path:
    return lake.root / "corpora" / "speech" / f"dt={check_ds(ds)}"


def _write_result(lake: Lake, kind: str, ds: str, result: dict[str, Any]) -> dict[str, Any]:
    out = lake.reports(kind, ds)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "result.json.tmp"
    tmp.write_text(json.dumps(result, indent=2, default=str))
    tmp.replace(out / "result.json")
    return result


def read_result(lake: Lake, kind: str, ds: str, *, produced_by: str) -> dict[str, Any]:
    path = lake.reports(kind, ds) / "result.json"
    if not path.is_file():
        raise FileNotFoundError(f"no {kind} result {path}; run step {produced_by!r} for ds={ds}")
    return json.loads(path.read_text())


def partition_seed(ds: str) -> int:
    """A stable per-partition seed: every day's synthetic batch holds different utterances."""
    return int.from_bytes(hashlib.sha256(check_ds(ds).encode()).digest()[:4], "little")


def _synthetic_count() -> int:
    if os.environ.get(UTTERANCES_ENV):
        count = int(os.environ[UTTERANCES_ENV])
    else:
        from models.asr.config_registry import get_config

        count = get_config(config_name()).utterances
    if count < 1:
        raise ValueError(f"{UTTERANCES_ENV} must be >= 1, got {count}")
    return count


def corpus(ds: str, *, settings: Settings | None = None) -> dict[str, Any]:
    """Build the partition's corpus on Spark from its landing folder (synthesized if empty)."""
    from jobs.audio_corpus import build_corpus, land_synthetic, spark_session
    from jobs.speech_human import land_human

    settings = settings or load_settings()
    lake = Lake(settings.lake_root)
    landing = landing_dir(lake, ds)
    spark = spark_session()
    synthesized = 0
    if not (landing / "transcripts.jsonl").exists() and not (landing / "wav").exists():
        # Land into a scratch folder and rename: a killed attempt never leaves half a batch.
        scratch = landing.with_name(landing.name + ".landing")
        shutil.rmtree(scratch, ignore_errors=True)
        count = _synthetic_count()
        print(f"[asr] nothing landed for ds={ds}: synthesizing {count} utterances", flush=True)
        synthesized = land_synthetic(spark, scratch, count=count, seed=partition_seed(ds))
        human = land_human(scratch)
        print(f"[asr] landed {human} human recordings (test split only)", flush=True)
        scratch.rename(landing)
    summary = build_corpus(spark, landing, corpus_dir(lake, ds))
    summary.update(ds=ds, landing=str(landing), synthesized=synthesized)
    return _write_result(lake, "asr_corpus", ds, summary)


def validate(ds: str, *, settings: Settings | None = None) -> dict[str, Any]:
    """The GX gate on the manifest; a failure stops the DAG before training."""
    from jobs.audio_corpus_gate import validate_corpus

    settings = settings or load_settings()
    lake = Lake(settings.lake_root)
    report = validate_corpus(corpus_dir(lake, ds))
    return {k: report[k] for k in ("success", "rows", "voices", "path")} | {"ds": ds}
