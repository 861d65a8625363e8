"""``cascade bench serving``'s cross features: the online-read histogram as each worker reports
it, the fields the server says it reads, and the switch that leaves them out. (End to end, with
the statistics in the lake and the online store: the ``--quick`` test of test_serving_load.)"""

from __future__ import annotations

import argparse

import pandas as pd
import pytest

from benchmarks.serving_cross_features import (
    CROSS_FIELDS,
    cross_fields_read,
    engine_log,
    parse_online_reads,
    summarize_online_reads,
)


def exposition(pid: str, count: int, total_s: float, below_1ms: int) -> str:
    """One worker's ``/metrics``: its pid gauge and the read histogram of one view."""
    name = "cascade_online_feature_read_seconds"
    labels = 'model_name="preranking",view="cross_user_cat"'
    return "\n".join(
        [
            f"# HELP {name} Seconds of one batched online-store read",
            f"# TYPE {name} histogram",
            f'{name}_bucket{{{labels},le="0.001"}} {float(below_1ms)}',
            f'{name}_bucket{{{labels},le="0.01"}} {float(count)}',
            f'{name}_bucket{{{labels},le="+Inf"}} {float(count)}',
            f"{name}_count{{{labels}}} {float(count)}",
            f"{name}_sum{{{labels}}} {total_s}",
            f'cascade_serving_torch_threads{{pid="{pid}"}} 1.0',
            'cascade_inference_errors_total{model_name="preranking",kind="model"} 0.0',
        ]
    )


def test_the_read_histograms_of_every_worker_are_summed_per_view() -> None:
    pid, views = parse_online_reads(exposition("41", 100, 0.05, 90))
    assert pid == "41"
    assert views["cross_user_cat"]["count"] == 100
    assert views["cross_user_cat"]["buckets"] == {"0.001": 90.0, "0.01": 100.0, "+Inf": 100.0}
    _, other = parse_online_reads(exposition("42", 300, 0.45, 100))
    summary = summarize_online_reads({"41": views, "42": other})
    view = summary["by_view"]["cross_user_cat"]
    assert (summary["reads"], view["reads"]) == (400, 400)
    assert view["mean_ms"] == pytest.approx(1.25)  # 0.5 s over 400 reads
    # 190 of 400 reads took under 1 ms: the median lies in the 10 ms bucket, so does the p99.
    assert (view["p50_le_ms"], view["p99_le_ms"]) == (10.0, 10.0)
    assert summary["per_request_mean_ms"] == pytest.approx(1.25)
    assert summary["workers_scraped"] == ["41", "42"]
    # A server that read nothing: no mean, no figure made up.
    empty = summarize_online_reads({"41": {}})
    assert (empty["reads"], empty["per_request_mean_ms"]) == (0, None)


def test_the_fields_read_online_come_from_the_servers_log() -> None:
    log = (
        "INFO loading preranking version 1\n"
        "INFO version 1: fields read from the online store per request: cross_user_cat "
        "(user_cat_ctr_7d, user_cat_decay_ctr)\n"
    )
    assert cross_fields_read(log, CROSS_FIELDS) == ["user_cat_ctr_7d", "user_cat_decay_ctr"]
    assert cross_fields_read("INFO serving preranking version 1\n", CROSS_FIELDS) == []


def test_the_log_goes_to_the_engine_in_its_schema() -> None:
    from jobs.ctr_log_sources import LOG_COLUMNS

    frame = pd.DataFrame(
        {
            "user_id": [1, 2],
            "item_id": [10, 11],
            "genre": ["Action", "Drama"],
            "event_timestamp": pd.to_datetime(["2026-01-01", "2026-01-02"], utc=True),
            "click": [1, 0],
        }
    )
    table = engine_log(frame)
    assert table.column_names == list(LOG_COLUMNS)
    assert table.column("item_category").to_pylist() == ["Action", "Drama"]
    assert table.column("user_segment").null_count == 2
    assert all(1 <= p <= 10 for p in table.column("position").to_pylist())


def test_no_cross_features_is_a_flag_and_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import commands
    from cascade.config import load_settings

    parser = argparse.ArgumentParser()
    commands.register(parser.add_subparsers())
    args = parser.parse_args(["bench", "serving", "--out", "x.json", "--no-cross-features"])
    assert getattr(args, "cross-features") == "0"
    args = parser.parse_args(["bench", "serving", "--out", "x.json"])
    assert getattr(args, "cross-features") is None
    monkeypatch.delenv("CASCADE_BENCH_SERVING_CROSS_FEATURES", raising=False)
    assert load_settings().bench.serving_cross_features is True
    monkeypatch.setenv("CASCADE_BENCH_SERVING_CROSS_FEATURES", "0")
    assert load_settings().bench.serving_cross_features is False


def test_a_run_without_cross_features_says_why() -> None:
    from benchmarks.serving_load import absent_cross_reason

    assert absent_cross_reason(False, "fscd", ()) == "--no-cross-features"
    assert "PreRanker" in absent_cross_reason(True, "mlp", ())
    assert "FSCD" in absent_cross_reason(True, "fscd", ())
    assert "no online reads" in absent_cross_reason(True, "cold", ("user_cat_ctr_7d",))
