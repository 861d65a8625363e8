"""Generated benchmark inputs are kept under a folder named by the generator's code and
parameters: the same code and parameters reuse it, changed ones generate anew."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks import ctr_cross_stats, multimodal_corpus, provenance
from benchmarks.provenance import digest_of, frame_digest, input_folder


def edited_source(module: str) -> Any:
    """A stand-in for :func:`benchmarks.provenance.module_source` in which ``module``'s code
    has changed (one more line), every other module as it is."""
    original = provenance.module_source

    def source(name: str) -> bytes:
        return original(name) + (b"\n# edited\n" if name == module else b"")

    return source


def test_the_folder_follows_the_generator_code_and_parameters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, digest = input_folder(tmp_path, ["jobs.impression_log"], {"n": 1})
    assert folder == tmp_path / digest.removeprefix("sha256:")[:16]
    assert input_folder(tmp_path, ["jobs.impression_log"], {"n": 1}) == (folder, digest)
    assert input_folder(tmp_path, ["jobs.impression_log"], {"n": 2})[0] != folder
    monkeypatch.setattr(provenance, "module_source", edited_source("jobs.impression_log"))
    changed, changed_digest = input_folder(tmp_path, ["jobs.impression_log"], {"n": 1})
    assert changed != folder and changed_digest != digest
    assert digest_of([digest, changed_digest]) != digest_of([changed_digest, digest])


def test_ctr_log_folder_is_keyed_by_the_impression_generator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, digest = ctr_cross_stats.log_folder(tmp_path, 20_000)
    assert log.name == "n=20000_seed=7" and log.parent.parent == tmp_path
    assert ctr_cross_stats.log_folder(tmp_path, 20_000) == (log, digest)
    other, other_digest = ctr_cross_stats.log_folder(tmp_path, 30_000)
    assert other.parent != log.parent and other_digest != digest
    # The benchmark's own code is not the generator: editing it keeps the log.
    monkeypatch.setattr(provenance, "module_source", edited_source("benchmarks.ctr_cross_stats"))
    assert ctr_cross_stats.log_folder(tmp_path, 20_000) == (log, digest)
    monkeypatch.setattr(provenance, "module_source", edited_source("jobs.impression_log"))
    edited, edited_digest = ctr_cross_stats.log_folder(tmp_path, 20_000)
    assert edited.name == log.name and edited.parent != log.parent and edited_digest != digest


def test_multimodal_landing_is_reused_until_the_generator_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    landings: list[Path] = []

    def land(spark: Any, landing: Path, *, count: int, config: Any) -> int:
        landing.mkdir(parents=True)
        (landing / "captions.jsonl").write_text("")
        landings.append(landing)
        return count

    # Landing itself is Spark's work; this checks only which folder is landed or reused.
    monkeypatch.setattr(multimodal_corpus, "land_generated", land)
    first, seconds, digest = multimodal_corpus.landed(None, tmp_path, 10)
    assert seconds is not None and (first / "_LANDED").is_file() and landings == [first]
    assert multimodal_corpus.landed(None, tmp_path, 10) == (first, None, digest)
    assert landings == [first]  # reused, not landed again

    monkeypatch.setattr(provenance, "module_source", edited_source("jobs.multimodal_sources"))
    second, seconds, new_digest = multimodal_corpus.landed(None, tmp_path, 10)
    assert second != first and seconds is not None and new_digest != digest
    assert landings == [first, second]

    # A batch left without its marker (an interrupted landing) is landed again from scratch.
    (second / "_LANDED").unlink()
    assert multimodal_corpus.landed(None, tmp_path, 10)[0] == second
    assert landings == [first, second, second]


def test_frame_digest_follows_values_columns_and_order() -> None:
    import pandas as pd

    frame = pd.DataFrame({"user_id": [1, 2, 3], "label": [0, 1, 0]})
    digest = frame_digest(frame)
    assert (
        digest == frame_digest(frame.copy()) == frame_digest(frame.set_index("label", drop=False))
    )
    assert frame_digest(frame.assign(label=[0, 1, 1])) != digest
    assert frame_digest(frame.iloc[::-1]) != digest
    assert frame_digest(frame.rename(columns={"label": "click"})) != digest
    assert frame_digest(frame.astype({"label": "float64"})) != digest
