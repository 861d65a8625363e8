"""The image-text corpus benchmark: registered with its option, scores planted duplicates."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from benchmarks.multimodal_corpus import planted_outcome
from benchmarks.registry import BENCHMARKS, OPTIONS
from jobs.multimodal_sources import GeneratorConfig, generated_pair


def test_benchmark_is_registered_and_scores_planted_duplicates(tmp_path: Path) -> None:
    assert BENCHMARKS["multimodal-corpus"].startswith("benchmarks.multimodal_corpus:")
    assert OPTIONS["multimodal-corpus"] == {"pairs": "CASCADE_BENCH_MULTIMODAL_SIZES"}
    landing, corpus = tmp_path / "landing", tmp_path / "corpus"
    landing.mkdir()
    config = GeneratorConfig(image_dup_share=0.2, caption_dup_share=0.2)
    records = [generated_pair(i, config)[0] for i in range(20)]
    (landing / "captions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    planted = [r["pair_id"] for r in records if r["planted"] != "original"]
    assert planted, "the generator planted no duplicates"
    removed = pd.DataFrame({"pair_id": [*planted[1:], records[0]["pair_id"]]})
    removed["duplicate_kind"] = "image"
    (corpus / "duplicates").mkdir(parents=True)
    removed.to_parquet(corpus / "duplicates" / "part-0.parquet")
    outcome = planted_outcome(landing, corpus)
    assert outcome["planted_image"] + outcome["planted_caption"] == len(planted)
    assert outcome["originals_removed"] == 1
    found = (outcome["recall_image"] or 0) * outcome["planted_image"] + (
        outcome["recall_caption"] or 0
    ) * outcome["planted_caption"]
    assert round(found) == len(planted) - 1
