"""Great Expectations gate on the speech corpus manifest, before any training reads it.

    cascade asr gate --corpus DIR

Checks the manifest :func:`jobs.audio_corpus.build_corpus` writes: ids unique, durations and
speaking rates within the job's filters, transcripts non-empty and bounded, splits known, and
the splits speaker-disjoint (every voice in exactly one split), and the train and test splits
non-empty (training evaluates on the held-out test voices: a corpus too small to hold any out is
refused here, not after minutes of training). Writes ``gate.json`` beside the
manifest and raises :class:`CorpusGateFailed` naming the failed checks.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from domains.speech.audio_features import CorpusConfig
from jobs.audio_corpus import SPLITS
from jobs.gx_suites import GateFailed, build_data_docs, gate_report, run_suite

MAX_TRANSCRIPT_CHARS = 400
REQUIRED_SPLITS = ("train", "test")
"""Splits that must hold an utterance: training fits on one and evaluates on the other (dev is
optional)."""


class CorpusGateFailed(GateFailed):
    what = "speech corpus"


def validate_corpus(
    corpus: Path, config: CorpusConfig | None = None, *, docs: Path | None = None
) -> dict[str, Any]:
    """Validate ``corpus/manifest``; returns the report, raises CorpusGateFailed on failure.
    With ``docs``, the results are also rendered there as GX Data Docs (``data_docs``)."""
    import great_expectations as gx
    from great_expectations import expectations as gxe

    config = config or CorpusConfig()
    manifest_dir = corpus / "manifest"
    if not manifest_dir.exists():
        raise FileNotFoundError(f"no manifest in {corpus}; build the corpus first")
    manifest = pd.read_parquet(manifest_dir)
    voices = manifest.groupby("voice", as_index=False).agg(splits=("split", "nunique"))
    sizes = manifest["split"].value_counts()
    splits = pd.DataFrame({f"{s}_utterances": [int(sizes.get(s, 0))] for s in REQUIRED_SPLITS})
    context = gx.get_context(mode="ephemeral")
    source = context.data_sources.add_pandas(name="corpus")
    outcomes = [
        run_suite(
            context,
            source,
            suite_name="speech_manifest",
            dataset="manifest",
            frame=manifest,
            expectations=[
                gxe.ExpectTableRowCountToBeBetween(min_value=1),
                gxe.ExpectColumnValuesToBeUnique(column="utterance_id"),
                gxe.ExpectColumnValuesToNotBeNull(column="transcript"),
                gxe.ExpectColumnValueLengthsToBeBetween(
                    column="transcript", min_value=1, max_value=MAX_TRANSCRIPT_CHARS
                ),
                gxe.ExpectColumnValuesToBeBetween(
                    column="seconds", min_value=config.min_seconds, max_value=config.max_seconds
                ),
                gxe.ExpectColumnValuesToBeBetween(
                    column="chars_per_s",
                    min_value=config.min_chars_per_s,
                    max_value=config.max_chars_per_s,
                ),
                gxe.ExpectColumnValuesToBeBetween(column="num_frames", min_value=1),
                gxe.ExpectColumnValuesToBeInSet(column="split", value_set=list(SPLITS)),
            ],
        ),
        run_suite(
            context,
            source,
            suite_name="speech_voices",
            dataset="voices",
            frame=voices,
            # Speaker-disjoint: a voice in two splits would leak speakers into evaluation.
            expectations=[
                gxe.ExpectColumnValuesToBeBetween(column="splits", min_value=1, max_value=1)
            ],
        ),
        run_suite(
            context,
            source,
            suite_name="speech_splits",
            dataset="splits",
            frame=splits,
            expectations=[
                gxe.ExpectColumnValuesToBeBetween(column=column, min_value=1)
                for column in splits.columns
            ],
        ),
    ]
    report = gate_report(
        outcomes,
        corpus / "gate.json",
        rows=len(manifest),
        voices=len(voices),
        data_docs=build_data_docs(context, docs),
    )
    if not report["success"]:
        raise CorpusGateFailed(report)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True)
    args = parser.parse_args(argv)
    report = validate_corpus(args.corpus)
    print(json.dumps({k: report[k] for k in ("success", "rows", "voices")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
