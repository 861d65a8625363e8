"""Training sets from the cross engine: statistics as of the impression's day, never its own."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import SparkSession

from cascade.config import Settings
from jobs import ctr_cross_stats as job
from jobs import ctr_training_set as ts
from jobs import impression_log as gen

UTC = dt.UTC


def stamp(day: int, hour: int = 0, second: int = 0) -> pd.Timestamp:
    return pd.Timestamp(dt.datetime(2026, 11, day, hour, 0, second, tzinfo=UTC))


def user_cat_partition(ds: str, rows: list[tuple[int, str, float]]) -> pd.DataFrame:
    """A hand-built engine partition of user_cat for windows (1,): ``(user, category, ctr)``."""
    columns = job.feature_columns(job.USER_CAT, (1,))
    frame = pd.DataFrame(
        {
            "user_id": [r[0] for r in rows],
            "item_category": [r[1] for r in rows],
            "event_timestamp": pd.Timestamp(job.ds_midnight(ds)),
        }
    )
    for column in columns:
        frame[column] = [r[2] for r in rows]
    return frame


def impressions(rows: list[tuple[int, str, pd.Timestamp]]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "user_id": [r[0] for r in rows],
            "item_id": [100 + i for i in range(len(rows))],
            "item_category": [r[1] for r in rows],
            "event_timestamp": [r[2] for r in rows],
            "click": [i % 2 for i in range(len(rows))],
        }
    )


def test_rows_read_the_partition_of_their_day_never_a_later_one() -> None:
    partitions = {
        "user_cat": {
            # dt=20 counts days <= 19; dt=21 counts day 20 too, so a row of day 20 must not see it.
            "2026-11-20": user_cat_partition("2026-11-20", [(1, "c1", 0.20), (2, "c1", 0.50)]),
            "2026-11-21": user_cat_partition("2026-11-21", [(1, "c1", 0.21)]),
        }
    }
    log = impressions(
        [
            (1, "c1", stamp(20, 0)),  # the first instant of day 20: dt=20
            (1, "c1", stamp(20, 23, 59)),  # last moments of day 20: still dt=20
            (1, "c1", stamp(21, 0)),  # day 21: dt=21
            (2, "c1", stamp(21, 12)),  # in dt=20 but not in dt=21: missing, not carried over
            (1, "c2", stamp(20, 5)),  # never seen: missing
            (1, "c1", stamp(22, 5)),  # day 22 has no partition: missing (lag 0)
            (1, "c1", stamp(19, 5)),  # before every partition: missing
        ]
    )

    frame, declared = ts.training_set(log, partitions, windows=(1,))
    stale, _ = ts.training_set(log, partitions, windows=(1,), max_lag_days=1)

    np.testing.assert_array_equal(
        frame["user_cat_ctr_1d"].to_numpy(), [0.20, 0.20, 0.21, np.nan, np.nan, np.nan, np.nan]
    )
    assert frame.attrs["rows_without_partition"] == {"user_cat": 2}
    # With one day of lag, day 22 reads dt=21; day 19 still has nothing within a day.
    assert stale["user_cat_ctr_1d"].iloc[5] == 0.21 and np.isnan(stale["user_cat_ctr_1d"].iloc[6])
    assert list(frame.columns[:3]) == ["user_id", "item_id", "genre"]
    assert frame["genre"].tolist() == log["item_category"].tolist()
    assert declared["user_cat_ctr_1d"] == {
        "kind": "cross",
        "categorical": False,
        "window_days": 1,
        "key_columns": ["user_id", "genre"],
    }
    assert declared["user_cat_decay_ctr"]["window_days"] is None
    assert set(declared) == set(job.feature_columns(job.USER_CAT, (1,)))


def test_kinds_follow_the_sides_of_the_keys() -> None:
    user = job.CrossPair(name="user", keys=("user_id",))
    item = job.CrossPair(name="item", keys=("item_id",))
    assert [ts.pair_kind(p) for p in (user, item, job.USER_CAT, job.ITEM_POS)] == [
        "user",
        "item",
        "cross",
        "cross",
    ]
    with pytest.raises(ValueError, match="lack columns"):
        ts.training_set(impressions([]).drop(columns="click"), {"user_cat": {}})


DS = "2026-11-21"
PAIRS = (job.SEG_CAT, job.USER_CAT, job.ITEM_POS)


@pytest.fixture(scope="module")
def engine_lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny generated log (with its truth) and the engine's partition DS of three pairs."""
    root = tmp_path_factory.mktemp("training_set")
    config = gen.GeneratorConfig(
        impressions=4_000, users=300, items=80, days=4, end_ds="2026-11-23", seed=5
    )
    gen.write(spark, config, root / "log")
    settings = Settings(home=root / "home")
    stats = job.CrossStatsConfig(pairs=PAIRS, windows_days=(1, 7))
    job.run(DS, log_path=root / "log", settings=settings, spark=spark, config=stats)
    log = pd.read_parquet(root / "log")
    log["event_timestamp"] = pd.to_datetime(log["event_timestamp"], utc=True)
    return {"config": config, "log_path": root / "log", "log": log, "lake": settings.lake_root}


@pytest.mark.spark
def test_recorded_truth_reproduces_the_generators_relevance(
    spark: SparkSession, engine_lake: dict
) -> None:
    config, tables = gen.read_truth(engine_lake["log_path"])
    sample = spark.read.parquet(str(engine_lake["log_path"])).limit(500)
    want = gen.ground_truth_relevance(engine_lake["config"], sample).toPandas()

    logit = gen.true_logit(config, tables, want)

    assert config == engine_lake["config"]
    np.testing.assert_allclose(1 / (1 + np.exp(-logit)), want.true_relevance, rtol=1e-9)
    users = tables["users"].set_index("user_id").user_segment
    assert (users.loc[want.user_id].to_numpy() == want.user_segment.to_numpy()).all()
    assert np.isnan(
        gen.pair_effect(
            config, tables, "user_cat", pd.DataFrame({"user_id": [10**9], "item_category": ["c0"]})
        )
    ).all()


@pytest.mark.spark
def test_training_set_from_a_generated_log_and_the_engine(engine_lake: dict) -> None:
    log = engine_lake["log"]
    days = log.event_timestamp.dt.strftime("%Y-%m-%d")
    on_days = log[days.isin([DS, "2026-11-22"])].reset_index(drop=True)

    frame, declared = ts.training_set_from_lake(
        on_days, engine_lake["lake"], source="generated", pairs=PAIRS, windows=(1, 7)
    )

    statistics = [c for p in PAIRS for c in job.feature_columns(p, (1, 7))]
    assert list(frame.columns) == [
        "user_id",
        "item_id",
        "genre",
        "user_segment",
        "position",
        "event_timestamp",
        "click",
        *statistics,
    ]
    assert list(declared) == statistics
    assert {d["kind"] for d in declared.values()} == {"cross"}
    assert declared["item_pos_ctr_7d"]["key_columns"] == ["item_id", "position"]
    assert frame.attrs["rows_without_partition"]["user_cat"] == int((days == "2026-11-22").sum())
    # A row of DS reads counts of the day before: recount user x genre on 2026-11-20 by hand.
    before = log[days == "2026-11-20"].groupby(["user_id", "item_category"]).size()
    today = frame[frame.event_timestamp.dt.strftime("%Y-%m-%d") == DS]
    expected = np.array(
        [before.get((u, g), np.nan) for u, g in zip(today.user_id, today.genre, strict=True)],
        dtype=float,
    )
    got = today["user_cat_imp_1d"].to_numpy()
    seen = ~np.isnan(expected)
    assert seen.sum() > 10
    np.testing.assert_array_equal(got[seen], expected[seen])
    # Pairs unseen on the day before but seen within the week have 0 one-day impressions.
    assert (got[~seen & ~np.isnan(got)] == 0).all()
    later = frame.event_timestamp.dt.strftime("%Y-%m-%d") > DS
    assert frame.loc[later, statistics].isna().all().all()


@pytest.mark.spark
def test_engine_training_set_is_point_in_time_and_declares_every_field_with_its_cost(
    spark: SparkSession, engine_lake: dict, tmp_path: Path
) -> None:
    from models.preranking.fields import BASE_EMBEDDING_DIM, FieldEncoder, FieldSet

    last = "2026-11-22"
    built = ts.build_engine_training_set(
        tmp_path / "set", spark=spark, log=engine_lake["log_path"], train_days=1, windows=(1, 7)
    )

    log = engine_lake["log"]
    days = log.event_timestamp.dt.strftime("%Y-%m-%d")
    frame = pd.read_parquet(built["data"])
    assert built["engine_days"] == [last] and built["rows"] == len(frame) == (days == last).sum()
    # Day D's rows read partition D: the user's 1-day counts are those of D - 1, not D's own.
    before = log[days == "2026-11-21"].groupby("user_id").click.agg(["size", "sum"])
    own = log[days == last].groupby("user_id").click.agg(["size", "sum"])
    seen = frame.user_id.isin(before.index).to_numpy()
    assert seen.sum() > 10
    np.testing.assert_array_equal(
        frame.user_imp_1d[seen], frame.user_id[seen].map(before["size"]).to_numpy(float)
    )
    np.testing.assert_array_equal(
        frame.user_clk_1d[seen], frame.user_id[seen].map(before["sum"]).to_numpy(float)
    )
    assert (frame.user_clk_1d[seen] != frame.user_id[seen].map(own["sum"])).any()

    entries = json.loads(Path(built["fields_file"]).read_text())["fields"]
    names = [e["name"] for e in entries]
    assert names[:3] == ["user_id", "item_id", "genre"] and len(names) == built["fields"]
    assert set(names) <= set(frame.columns)
    kinds = {e["name"]: e["kind"] for e in entries}
    assert kinds["user_ctr_7d"] == "user" and kinds["item_dctr_1d"] == "item"
    cross = [e for e in entries if e["kind"] == "cross"]
    assert {"user_cat_ctr_7d", "ctx_item_imp_1d", "user_cat_learned_ctr_7d"} <= {
        e["name"] for e in cross
    }
    assert all(e["key_cardinality"] >= 1 for e in cross)
    assert {e["window_days"] for e in cross if "window_days" in e} == {1, 7}
    learned = frame["user_cat_learned_ctr_7d"].dropna()
    assert len(learned) > 10 and learned.between(0, 1).all()
    # The pre-ranker reads it as its field set; a cross statistic costs more than the user's.
    fields = FieldSet.load(Path(built["fields_file"]), frame)
    costs = dict(
        zip(
            fields.names,
            FieldEncoder(fields).fit(frame).costs(BASE_EMBEDDING_DIM),
            strict=True,
        )
    )
    assert costs["user_cat_ctr_7d"] > costs["user_ctr_7d"] > 0
    assert costs["user_cat_ctr_7d"] > costs["user_cat_ctr_1d"]


def test_the_published_partition_names_its_source(tmp_path: Path) -> None:
    """The pre-ranker's training set reads the source whose partition passed its gate; a
    partition published by two sources needs one named, and an unpublished one is refused."""
    from cascade.lake import Lake

    lake = Lake(tmp_path)
    ds = "2026-11-22"

    def publish(source: str, *, passed: bool) -> None:
        where = job.CrossLake(lake, source)
        where.summary(ds).parent.mkdir(parents=True)
        where.summary(ds).write_text(json.dumps({"ds": ds, "log_path": f"/logs/{source}"}))
        where.gate_report(ds).parent.mkdir(parents=True)
        where.gate_report(ds).write_text(json.dumps({"success": passed}))

    with pytest.raises(ts.MissingPartitions, match="any source for ds=2026-11-22"):
        ts.published_summary(lake.root, ds)
    publish("generated", passed=True)
    publish("clicks", passed=False)  # built, but its gate failed: not published
    summary = ts.published_summary(lake.root, ds)
    assert (summary["source"], summary["log_path"]) == ("generated", "/logs/generated")
    with pytest.raises(ts.MissingPartitions, match="source 'clicks'"):
        ts.published_summary(lake.root, ds, "clicks")
    publish("ml100k", passed=True)
    with pytest.raises(ValueError, match=r"\['generated', 'ml100k'\]; name one"):
        ts.published_summary(lake.root, ds)
    assert ts.published_summary(lake.root, ds, "ml100k")["source"] == "ml100k"


def test_missing_training_days_are_not_ready_with_advice_that_is_not_the_run_just_done(
    tmp_path: Path,
) -> None:
    """A landed log's first day can never be built (its windows end before it): the advice is
    fewer training days or an earlier log, never the history build that already ran; the CLI
    exits 3 (not ready), as the README's exit-code table says."""
    from cascade.cli import exit_code
    from cascade.lake import Lake

    where = job.CrossLake(Lake(tmp_path / "lake"), "clicks")
    days = ["2026-11-18", "2026-11-19", "2026-11-20", "2026-11-21"]
    where.quarantine(days[0]).mkdir(parents=True)  # tried: nothing in its windows
    for day, success in ((days[1], False), (days[2], True), (days[3], True)):
        where.summary(day).parent.mkdir(parents=True)
        where.summary(day).write_text("{}")
        where.gate_report(day).parent.mkdir(parents=True, exist_ok=True)
        where.gate_report(day).write_text(json.dumps({"success": success}))

    advice = ts.missing_days_advice(where, "2026-11-22", days, days[:2])

    assert advice == (
        "['2026-11-18'] had no impression in their windows (a log's first day has none); "
        "['2026-11-19'] failed the gate (see its reports): land the log of the days before "
        "2026-11-18 and build them, or train on the 2 latest days that have one "
        "(CASCADE_PRERANKING_TRAIN_DAYS=2)"
    )
    assert "HISTORY_DAYS" not in advice
    never = ts.missing_days_advice(where, "2026-11-23", [*days[2:], "2026-11-22"], ["2026-11-22"])
    assert never.startswith("['2026-11-22'] never built: build them (ctr_cross for ds=2026-11-23")
    assert exit_code(ts.MissingPartitions(advice)) == 3
