"""Great Expectations gate on the image-text corpus manifest, before any training reads it.

    cascade multimodal gate --corpus DIR

Checks the manifest :func:`jobs.multimodal_corpus.build_corpus` writes: pair ids unique,
captions non-empty, token counts within ``[3, max_tokens]`` (BOS, at least one token, EOS),
a language code on every row (any language), splits known, and no group (near-duplicates, a
picture's translations) in more than one split, which would leak evaluation pictures into
training. Writes ``gate.json`` beside
the manifest and raises :class:`MultimodalGateFailed` naming the failed checks.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from jobs.gx_suites import GateFailed, build_data_docs, gate_report, run_suite
from jobs.multimodal_corpus import LANGUAGE_TAG, SPLITS, CorpusConfig


class MultimodalGateFailed(GateFailed):
    what = "multimodal corpus"


def validate_corpus(
    corpus: Path, config: CorpusConfig | None = None, *, docs: Path | None = None
) -> dict[str, Any]:
    """Validate ``corpus/manifest``; returns the report, raises MultimodalGateFailed on failure.
    With ``docs``, the results are also rendered there as GX Data Docs (``data_docs``)."""
    import great_expectations as gx
    from great_expectations import expectations as gxe

    config = config or CorpusConfig()
    manifest_dir = corpus / "manifest"
    if not manifest_dir.exists():
        raise FileNotFoundError(f"no manifest in {corpus}; build the corpus first")
    manifest = pd.read_parquet(manifest_dir)
    groups = manifest.groupby("group_id", as_index=False).agg(splits=("split", "nunique"))
    context = gx.get_context(mode="ephemeral")
    source = context.data_sources.add_pandas(name="multimodal")
    outcomes = [
        run_suite(
            context,
            source,
            suite_name="multimodal_manifest",
            dataset="manifest",
            frame=manifest,
            expectations=[
                gxe.ExpectTableRowCountToBeBetween(min_value=1),
                gxe.ExpectColumnValuesToBeUnique(column="pair_id"),
                gxe.ExpectColumnValuesToNotBeNull(column="caption"),
                gxe.ExpectColumnValueLengthsToBeBetween(column="caption", min_value=1),
                gxe.ExpectColumnValuesToBeBetween(
                    column="num_tokens", min_value=3, max_value=config.max_tokens
                ),
                gxe.ExpectColumnValuesToNotBeNull(column="language"),
                gxe.ExpectColumnValuesToMatchRegex(
                    column="language", regex=f"^(?:{LANGUAGE_TAG.pattern})$"
                ),
                gxe.ExpectColumnValuesToBeInSet(column="split", value_set=list(SPLITS)),
                gxe.ExpectColumnValuesToNotBeNull(column="group_id"),
            ],
        ),
        run_suite(
            context,
            source,
            suite_name="multimodal_groups",
            dataset="groups",
            frame=groups,
            expectations=[
                gxe.ExpectColumnValuesToBeBetween(column="splits", min_value=1, max_value=1)
            ],
        ),
    ]
    report = gate_report(
        outcomes,
        corpus / "gate.json",
        rows=len(manifest),
        groups=len(groups),
        data_docs=build_data_docs(context, docs),
    )
    if not report["success"]:
        raise MultimodalGateFailed(report)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True)
    args = parser.parse_args(argv)
    report = validate_corpus(args.corpus)
    print(json.dumps({k: report[k] for k in ("success", "rows", "groups")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
