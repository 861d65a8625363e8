"""Benchmark options reach the benchmark; aliases and unknown options are handled."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from benchmarks import registry as bench


def echo_benchmark(out: Path, quick: bool) -> dict[str, Any]:
    from benchmarks.provenance import bench_repeats

    return {
        "quick": quick,
        "events": os.environ.get("CASCADE_BENCH_EVENTS"),
        "repeats": bench_repeats(5),
    }


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(bench.BENCHMARKS, "events", f"{__name__}:echo_benchmark")
    monkeypatch.delenv("CASCADE_BENCH_EVENTS", raising=False)


def test_option_reaches_the_benchmark_and_is_not_left_behind(fake: None, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    result = bench.run_benchmark("events", out, options={"events": "1000", "config": None})
    assert result["events"] == "1000"
    assert json.loads(out.read_text())["benchmark"] == "events"
    assert "machine" in result and result["machine"]["cpus"]
    assert "CASCADE_BENCH_EVENTS" not in os.environ


def test_unknown_option_names_what_the_benchmark_takes(fake: None, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="takes no --model; it takes --repeats, --events"):
        bench.run_benchmark("events", tmp_path / "r.json", options={"model": "asr"})


def test_issue_names_are_aliases_and_unknown_names_are_listed(tmp_path: Path) -> None:
    assert bench.ALIASES["ctr-features"] in bench.BENCHMARKS
    assert bench.ALIASES["compile"] in bench.BENCHMARKS
    with pytest.raises(KeyError, match="ctr-features"):
        bench.run_benchmark("nope", tmp_path / "r.json")


def test_every_benchmark_takes_repeats(fake: None, tmp_path: Path) -> None:
    from benchmarks.provenance import bench_repeats

    assert bench.benchmark_options("events")["repeats"] == "CASCADE_BENCH_REPEATS"
    assert bench.benchmark_options("ctr")["repeats"] == "CASCADE_BENCH_CTR_REPEATS"
    assert bench_repeats(7) == 7 and bench_repeats(7, quick=True, quick_default=2) == 2
    result = bench.run_benchmark("events", tmp_path / "r.json", options={"repeats": "3"})
    assert result["inputs"]["parameters"]["CASCADE_BENCH_REPEATS"] == "3"
    assert result["repeats"] == 3
    assert bench.run_benchmark("events", tmp_path / "d.json")["repeats"] == 5
