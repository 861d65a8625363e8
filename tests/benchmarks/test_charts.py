"""What each benchmark chart shows, planned from its result before anything is drawn."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import charts, docs
from benchmarks.goals import goal
from benchmarks.provenance import REPO_ROOT


def _panel(panels: list[charts.Panel], title: str) -> charts.Panel:
    return next(p for p in panels if p.title.startswith(title))


def test_variants_are_grouped_bars_and_a_missing_variant_has_no_bar() -> None:
    result = {
        "eager_ms": 2.6,
        "cascade_ms": 1.0,
        "onnxruntime_static_int8_ms": 0.9,
        "cascade_int8_ms": 0.5,
        "inductor_ms": None,  # a peer that did not build: no bar, not a zero
        "spread": {"cascade_ms": {"min": 0.9, "median": 1.0, "max": 1.2, "n": 3}},
    }
    (panel,) = charts.plan(result, "compilers")
    got = [(b.group, b.label, b.value) for b in panel.bars]
    assert got == [
        ("fp32", "eager", 2.6),
        ("fp32", "Cascade package", 1.0),
        ("int8", "ONNX Runtime static int8", 0.9),
        ("int8", "Cascade int8 package", 0.5),
    ]
    assert (panel.bars[1].low, panel.bars[1].high) == (0.9, 1.2) and panel.unit == "ms"


def test_serving_plots_latency_against_the_loads_it_measured_and_invents_none() -> None:
    result = {
        "rps": 1279.0,
        "p50_ms": 6.5,
        "p99_ms": 14.9,
        "open_loop": {"achieved_rps": 894.0, "p50_ms": 2.4, "p99_ms": 11.8},
        "eager_scorer": {"rps": 863.0, "p50_ms": 9.5, "p99_ms": 19.9},  # no open loop
    }
    panel = charts.serving_load(result)
    series = {s.label: s for s in panel.series}
    assert (series["compiled, 2 workers, p99"].x, series["compiled, 2 workers, p99"].y) == (
        [894.0, 1279.0],
        [11.8, 14.9],
    )
    assert series["compiled, 2 workers, p99"].points == ["open loop", "closed loop"]
    assert series["eager, 2 workers, p50"].x == [863.0]  # one load point: one point
    assert "compiled, 1 worker, p50" not in series
    assert panel.line is not None and panel.line[0] == goal("serving", "p99_ms").bound
    assert panel.log_y  # a saturated step's seconds would flatten the milliseconds
    # With a load sweep the main configuration is drawn step by step.
    steps = [{"achieved_rps": r, "p50_ms": r / 400, "p99_ms": r / 100} for r in (200, 600, 1000)]
    swept = {s.label: s for s in charts.serving_load({**result, "latency_by_load": steps}).series}
    assert swept["compiled, 2 workers, p99"].y == [2.0, 6.0, 10.0]


def test_the_ctr_job_is_time_against_size() -> None:
    result = {
        "sizes": [
            {"impressions": 1_000_000, "job_s": 12.1, "duckdb_s": 1.8},
            {"impressions": 10_000_000, "job_s": 35.6, "duckdb_s": 11.1, "pipeline_s": 83.4},
        ],
        "spread": {"sizes.1.job_s": {"min": 34.7, "median": 35.6, "max": 36.3, "n": 3}},
    }
    panel = _panel(charts.plan(result, "ctr"), "Time against log size")
    series = {s.label: s for s in panel.series}
    job = series["cross statistics job (Spark)"]
    assert (job.x, job.y, job.high) == ([1e6, 1e7], [12.1, 35.6], [None, 36.3])
    assert series["log to online store (pipeline)"].x == [1e7]
    assert panel.log_x and panel.unit == "s"


def test_a_measured_zero_keeps_its_bar() -> None:
    # The cluster's lost and duplicated rows are counted from the landed log to the training set.
    cluster = charts.plan({"run_s": 336.0, "lost": 0, "duplicates": 0}, "cluster")
    paths = [b.path for p in cluster for b in p.bars]
    assert "lost" in paths and "duplicates" in paths
    events = _panel(charts.plan({"lost": 0, "runs_started": 12}, "events"), "What happened")
    assert [b.path for b in events.bars] == ["runs_started", "lost"] and events.counts


def test_every_published_chart_has_panels_and_names_its_commit_and_machine(
    tmp_path: Path,
) -> None:
    page = (REPO_ROOT / "docs" / "benchmarks.md").read_text()
    for block in docs.BLOCK.finditer(page):
        result = json.loads((REPO_ROOT / block["path"]).read_text())
        assert charts.plan(result, block["name"]), f"{block['name']}'s chart would be empty"
        caption = charts.subtitle(result)
        assert str(result["git_commit"])[:12] in caption and "cores" in caption
    drawn = docs.chart(
        json.loads((REPO_ROOT / "docs/results/serving.json").read_text()),
        "serving",
        tmp_path / "s.png",
    )
    assert drawn.read_bytes()[:4] == b"\x89PNG"
