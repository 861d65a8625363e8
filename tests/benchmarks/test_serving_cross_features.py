"""``cascade bench serving``'s engine features: the partitions, catalogue and training set its
setup writes, the online-read histogram as each worker reports it, the fields the server says
it reads, and the switch that leaves them out. (End to end, with the server reading the online
store: the ``--quick`` test of test_serving_load.)"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import pytest

from benchmarks.serving_cross_features import (
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
    assert summary["one_read_per_view_ms"] == pytest.approx(1.25)
    assert summary["workers_scraped"] == ["41", "42"]
    # A server that read nothing: no mean, no figure made up.
    empty = summarize_online_reads({"41": {}})
    assert (empty["reads"], empty["one_read_per_view_ms"]) == (0, None)


def test_the_fields_read_online_come_from_the_servers_log() -> None:
    log = (
        "INFO loading preranking version 1\n"
        "INFO version 1: fields read from the online store per request: cross_user_cat "
        "(user_cat_ctr_7d, user_cat_decay_ctr)\n"
    )
    fields = ("user_cat_ctr_7d", "user_cat_ctr_30d", "user_cat_decay_ctr")
    assert cross_fields_read(log, fields) == ["user_cat_ctr_7d", "user_cat_decay_ctr"]
    assert cross_fields_read("INFO serving preranking version 1\n", fields) == []


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

    assert absent_cross_reason(False, ()) == "--no-cross-features"
    assert "FSCD" in absent_cross_reason(True, ())
    assert "no online reads" in absent_cross_reason(True, ("user_cat_ctr_7d",))


def test_the_benchmark_serves_what_the_pipeline_trains_and_never_the_dense_mlp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from benchmarks.serving_load import serving_network
    from cascade.config import load_settings

    monkeypatch.delenv("CASCADE_BENCH_SERVING_MODEL", raising=False)
    assert serving_network(load_settings(), quick=True)["model"] == "fscd"
    monkeypatch.setenv("CASCADE_BENCH_SERVING_MODEL", "mlp")  # not a value the setting takes
    with pytest.raises(ValueError, match="CASCADE_BENCH_SERVING_MODEL"):
        load_settings()


def test_the_setup_writes_engine_partitions_a_catalogue_and_the_pipelines_training_set(
    tmp_path: Path,
) -> None:
    from benchmarks.serving_cross_features import (
        ID_FIELDS,
        SOURCE,
        publish_engine_partitions,
        write_engine_training_set,
    )
    from cascade.config import Settings
    from cascade.lake import TRAINING_PROVENANCE, Lake
    from domains.ctr.catalogue import read_newest_catalogue
    from models.preranking.fields import FieldSet
    from models.preranking.synthetic_data import synthetic_training_frame

    settings = Settings(home=tmp_path / "home")
    ds = "2026-02-01"
    frame = synthetic_training_frame(3_000, users=50, items=80, seed=3, end=ds)
    log = engine_log(frame)
    done = publish_engine_partitions(log, settings, ds, tmp_path / "work", train_days=2)
    assert done["days"] == ["2026-01-30", "2026-01-31", ds]
    assert set(done["rows"]) == {"user", "item", "user_cat"} and done["rows"]["user"] > 0
    assert done["materialized_rows"] > 0 and "gate not run" in done["gate"]
    lake = Lake(settings.lake_root)
    verdict = json.loads(lake.ctr_cross_gate_report(SOURCE, ds).read_text())
    assert verdict["success"] is True and "benchmark setup" in verdict["by"]
    # The catalogue of ds: every item impressed in the 30 days before it, its newest category.
    published, catalogue = read_newest_catalogue(lake, SOURCE)
    assert published == ds
    window = frame[frame["event_timestamp"] < pd.Timestamp(ds, tz="UTC")]
    assert sorted(catalogue["item_id"]) == sorted(window["item_id"].unique())
    newest = window.sort_values("event_timestamp").groupby("item_id")["genre"].last()
    assert dict(zip(catalogue["item_id"], catalogue["item_category"], strict=True)) == dict(newest)
    # The training set: the two days before ds, each row joined with its own day's partition.
    training, folder = write_engine_training_set(log, settings, ds, train_days=2)
    days = training["event_timestamp"].dt.strftime("%Y-%m-%d")
    assert set(days) == {"2026-01-30", "2026-01-31"} and len(training) > 100
    names = FieldSet.beside(folder).names
    assert names[:3] == ID_FIELDS and "user_cat_ctr_7d" in names and "item_ctr_30d" in names
    assert json.loads((folder / TRAINING_PROVENANCE).read_text())["source"] == SOURCE
    first = training[days == "2026-01-31"].iloc[0]
    user_day = pd.read_parquet(lake.root / "features/ctr_cross/generated/user/dt=2026-01-31")
    expected = user_day.loc[user_day["user_id"] == first["user_id"], "user_ctr_7d"]
    assert list(expected) == [pytest.approx(first["user_ctr_7d"])]
    # Without cross features only the id fields are declared.
    _, folder = write_engine_training_set(log, settings, ds, train_days=2, cross_features=False)
    assert FieldSet.beside(folder).names == ID_FIELDS
