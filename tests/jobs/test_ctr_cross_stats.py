"""Cross statistics engine: smoothing in closed form, windows vs the future, quarantine,
adapters, and recovery of the generator's hidden cross effects."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from cascade.config import Settings
from cascade.lake import Lake
from jobs import ctr_cross_stats as job
from jobs import ctr_log_sources as sources
from jobs import impression_log as gen

pytestmark = pytest.mark.spark

DS = "2026-11-22"
CUTOFF = dt.datetime(2026, 11, 22, tzinfo=dt.UTC)
T0 = CUTOFF.replace(tzinfo=None)  # Spark returns naive datetimes in the session zone (UTC)
DAY = dt.timedelta(days=1)
US = dt.timedelta(microseconds=1)
SCHEMA = ", ".join(f"{name} {sql_type}" for name, sql_type in sources.LOG_SCHEMA)


def log(spark: SparkSession, rows: list[tuple]) -> DataFrame:
    """Rows of (user_id, item_id, user_segment, item_category, position, event_timestamp, click)."""
    full = [(u, i, s, c, None, p, t, k) for u, i, s, c, p, t, k in rows]
    return spark.createDataFrame(full, SCHEMA)


def features(
    spark: SparkSession, rows: list[tuple], config: job.CrossStatsConfig
) -> tuple[dict[str, pd.DataFrame], dict]:
    aggregate, facts = job.compute(log(spark, rows), config, cutoff=CUTOFF)
    try:
        out = {
            pair.name: job.pair_features(
                aggregate.frame, pair, config, priors=facts["priors"][pair.name], cutoff=CUTOFF
            ).toPandas()
            for pair in config.pairs
        }
    finally:
        aggregate.unpersist()
    return out, facts


def test_beta_fit_recovers_a_known_beta_binomial() -> None:
    rng = np.random.default_rng(0)
    rates = rng.beta(2.0, 18.0, size=4000)
    trials = rng.integers(20, 400, size=rates.size).astype(float)
    clicks = rng.binomial(trials.astype(int), rates).astype(float)

    a, b = job.beta_from_moments(
        keys=rates.size,
        trials=trials.sum(),
        clicks=clicks.sum(),
        sum_sq=(clicks**2 / trials).sum(),
        min_strength=1,
        max_strength=1e6,
    )

    assert a / (a + b) == pytest.approx(0.1, rel=0.03)
    assert a + b == pytest.approx(20.0, rel=0.15)


def test_beta_fit_without_spread_between_keys_uses_the_maximum_strength() -> None:
    # Every key clicks exactly at the mean: nothing beyond binomial noise, so shrink fully.
    a, b = job.beta_from_moments(
        keys=10,
        trials=1000,
        clicks=100,
        sum_sq=10 * 10**2 / 100,
        min_strength=1,
        max_strength=5000,
    )
    assert (a, b) == pytest.approx((500.0, 4500.0))


def test_smoothing_matches_the_closed_form(spark: SparkSession) -> None:
    config = job.CrossStatsConfig(pairs=(job.SEG_CAT,), windows_days=(1, 7))
    rng = np.random.default_rng(1)
    rows = []
    for k in range(60):
        segment, category = f"s{k % 6}", f"c{k // 6}"
        for j in range(int(rng.integers(1, 40))):
            age = dt.timedelta(hours=float(rng.uniform(0.01, 24 * 7 - 0.01)))
            rows.append(
                (k, j, segment, category, None, T0 - age, int(rng.random() < 0.1 + k / 200))
            )

    got, facts = features(spark, rows, config)

    frame = pd.DataFrame(rows, columns=["u", "i", "s", "c", "p", "t", "click"])
    frame["age_days"] = (T0 - frame.t).dt.total_seconds() / 86_400
    for w in (1, 7):
        inside = frame[frame.age_days <= w]
        per_key = inside.groupby(["s", "c"]).click.agg(["size", "sum"])
        n, c = per_key["size"].to_numpy(float), per_key["sum"].to_numpy(float)
        # Method of moments written out independently of the job's helper.
        mu = c.sum() / n.sum()
        spread = ((c / n - mu) ** 2 * n).sum()
        tau2 = (spread - len(n) * mu * (1 - mu)) / (n.sum() - len(n))
        m = mu * (1 - mu) / tau2 - 1
        a, b = mu * m, (1 - mu) * m
        assert facts["priors"]["seg_cat"][f"ctr_{w}"] == pytest.approx((a, b))
        expected = ((per_key["sum"] + a) / (per_key["size"] + a + b)).rename("want")
        merged = (
            got["seg_cat"]
            .set_index(["user_segment", "item_category"])
            .join(expected.rename_axis(["user_segment", "item_category"]), how="inner")
        )
        assert len(merged) == len(per_key)
        np.testing.assert_allclose(merged[f"seg_cat_ctr_{w}d"], merged["want"], rtol=1e-12)
        # No positions: the debiased CTR divides by plain impressions (examination 1).
        assert (merged[f"seg_cat_imp_{w}d"] >= merged[f"seg_cat_clk_{w}d"]).all()


def test_rollup_parents_are_the_smallest_containing_root_pairs() -> None:
    parents = job.rollup_parents(job.GENERATED_PAIRS)
    assert {name: parent.name for name, parent in parents.items()} == {
        "user": "user_cat",
        "item": "seg_item",
    }
    assert job.rollup_parents((job.USER, job.SEG_CAT)) == {}
    assert job.rollup_parents((job.ITEM, job.ITEM_POS))["item"] is job.ITEM_POS


def test_rolled_up_pairs_equal_their_own_aggregation(spark: SparkSession) -> None:
    """``user`` and ``item`` summed from ``user_cat`` and ``seg_item`` give the rows they get
    when aggregated on their own (every window, recency, decay, priors)."""
    rng = np.random.default_rng(5)
    rows = []
    for _ in range(3_000):
        age = dt.timedelta(hours=float(rng.uniform(0.01, 24 * 30 - 0.01)))
        user, item = int(rng.integers(0, 40)), int(rng.integers(0, 25))
        click = int(rng.random() < 0.05 + user / 200)
        rows.append(
            (user, item, f"s{user % 3}", f"c{item % 4}", int(rng.integers(1, 6)), T0 - age, click)
        )
    pairs = (job.USER, job.ITEM, job.SEG_CAT, job.USER_CAT, job.SEG_ITEM, job.ITEM_POS)
    rolled, rolled_facts = features(spark, rows, job.CrossStatsConfig(pairs=pairs))
    assert set(job.rollup_parents(pairs)) == {"user", "item"}
    for pair in (job.USER, job.ITEM):
        alone, alone_facts = features(spark, rows, job.CrossStatsConfig(pairs=(pair,)))
        want = alone[pair.name].sort_values(list(pair.keys)).reset_index(drop=True)
        got = rolled[pair.name].sort_values(list(pair.keys)).reset_index(drop=True)
        assert len(got) == len(want) > 10
        pd.testing.assert_frame_equal(got[want.columns], want, check_exact=False, rtol=1e-9)
        for tag, prior in alone_facts["priors"][pair.name].items():
            assert rolled_facts["priors"][pair.name][tag] == pytest.approx(prior, rel=1e-9)
        assert rolled_facts["pair_rows"][pair.name] == len(want)


def test_windows_end_at_ds_and_never_see_the_future(spark: SparkSession) -> None:
    config = job.CrossStatsConfig(pairs=(job.USER_CAT,), windows_days=(1, 7))
    past = [
        (1, 1, "s", "c", None, T0 - US, 1),  # last instant before ds: in 1d and 7d
        (1, 2, "s", "c", None, T0 - DAY, 0),  # exactly 1 day back: still in the 1d window
        (1, 3, "s", "c", None, T0 - DAY - US, 1),  # just older: 7d only
        (1, 4, "s", "c", None, T0 - 7 * DAY - US, 1),  # older than every window: ignored
    ]
    future = [
        (1, 5, "s", "c", None, T0, 1),  # at ds midnight: the future
        (1, 6, "s", "c", None, T0 + DAY, 1),
        (2, 6, "s", "c", None, T0 + DAY, 1),  # a key seen only in the future
    ]

    without, _ = features(spark, past, config)
    with_future, _ = features(spark, past + future, config)

    row = without["user_cat"].iloc[0]
    assert len(without["user_cat"]) == 1
    assert (row.user_cat_imp_1d, row.user_cat_clk_1d) == (2, 1)
    assert (row.user_cat_imp_7d, row.user_cat_clk_7d) == (3, 2)
    assert row.user_cat_days_since_imp == pytest.approx(1e-6 / 86_400)
    assert row.event_timestamp == T0
    pd.testing.assert_frame_equal(without["user_cat"], with_future["user_cat"])


def test_examination_is_relative_to_the_top_position() -> None:
    got = job.examination_by_position([(1, 1000, 200), (2, 1000, 100), (3, 500, 0)])
    assert got == pytest.approx({1: 1.0, 2: 0.5, 3: 1e-3})


def test_debiased_ctr_divides_by_expected_examinations(spark: SparkSession) -> None:
    config = job.CrossStatsConfig(pairs=(job.ITEM_POS,), windows_days=(1,))
    rows = [(1, 9, "s", "c", 1, T0 - US, 1)] * 4 + [(1, 9, "s", "c", 2, T0 - US, 0)] * 4
    rows += [(1, 9, "s", "c", 2, T0 - US, 1)] * 2 + [(1, 9, "s", "c", 1, T0 - US, 0)] * 2
    # ctr(1) = 4/6, ctr(2) = 2/6, so examination(2) = 0.5
    aggregate, facts = job.compute(log(spark, rows), config, cutoff=CUTOFF)
    assert facts["examination"] == pytest.approx({1: 1.0, 2: 0.5})
    got = (
        job.pair_features(
            aggregate.frame,
            job.ITEM_POS,
            config,
            priors={"ctr_1": (1, 1), "dctr_1": (1, 1), "decay_None": (1, 1)},
            cutoff=CUTOFF,
        )
        .toPandas()
        .set_index("position")
    )
    aggregate.unpersist()
    assert got.loc[2, "item_pos_dctr_1d"] == pytest.approx((2 + 1) / (6 * 0.5 + 2))
    assert got.loc[1, "item_pos_dctr_1d"] == pytest.approx((4 + 1) / (6 + 2))


def test_debiased_ctr_is_a_probability_when_clicks_exceed_expected_examinations(
    spark: SparkSession,
) -> None:
    from pyspark.sql import functions as F

    # 3 clicks where 0.5 examinations were expected: (3 + 0.1) / (0.5 + 0.2) would be 4.4.
    capped, plain = (
        spark.range(1)
        .select(
            job.debiased(F.lit(3), F.lit(0.5), (0.1, 0.1)),
            job.debiased(F.lit(1), F.lit(4.0), (1.0, 1.0)),
        )
        .first()
    )
    assert capped == 1.0
    assert plain == pytest.approx(2 / 6)


def test_map_log_renames_casts_and_names_missing_columns(spark: SparkSession) -> None:
    raw = spark.createDataFrame(
        [("7", 3, "2026-11-21 10:00:00", 4.5), ("x", 3, "2026-11-21 11:00:00", 2.0)],
        "uid string, movie long, ts string, rating double",
    )
    mapping = sources.LogMapping(
        columns={"user_id": "uid", "item_id": "movie", "event_timestamp": "ts"},
        click_expression="rating >= 4",
    )

    mapped = sources.map_log(raw, mapping)

    assert mapped.columns == list(sources.LOG_COLUMNS)
    rows = mapped.orderBy("event_timestamp").collect()
    assert [(r.user_id, r.item_id, r.click, r.position) for r in rows] == [
        (7, 3, 1, None),
        (None, 3, 0, None),  # unparseable id: null, left for the row rules to quarantine
    ]
    with pytest.raises(ValueError, match=r"no column for \['event_timestamp', 'click'\]"):
        sources.map_log(raw, sources.LogMapping(columns={"user_id": "uid", "item_id": "movie"}))


def test_generator_is_deterministic_whatever_the_partitioning(spark: SparkSession) -> None:
    one = gen.generate(spark, gen.GeneratorConfig(impressions=3000, partitions=1))
    three = gen.generate(spark, gen.GeneratorConfig(impressions=3000, partitions=3))
    other_seed = gen.generate(spark, gen.GeneratorConfig(impressions=3000, seed=8))

    assertDataFrameEqual(one, three)
    assert one.exceptAll(other_seed).count() > 2000
    stats = one.agg(F.max("event_timestamp"), F.min("position"), F.max("position")).first()
    assert stats[0] < T0 and (stats[1], stats[2]) == (1, 10)


def test_run_quarantines_bad_rows_and_overwrites(spark: SparkSession, tmp_path: Path) -> None:
    rows = [
        (1, 1, "s1", "c1", None, 1, T0 - DAY / 2, 1),
        (2, 1, "s1", "c2", None, 2, T0 - 3 * DAY, 0),
        (None, 1, "s1", "c1", None, 1, T0 - DAY, 1),  # no user
        (3, 2, "s2", "c1", None, 1, T0 - DAY, 3),  # click 3
        (3, 2, None, "c1", None, 1, T0 - DAY, 0),  # segment needed by seg_cat
        (4, 2, "s2", "c1", None, 0, T0 - DAY, 0),  # position 0
        (5, 2, "s2", "c1", None, 1, T0 + DAY, 1),  # at/after ds: misfiled, quarantined
    ]
    folder = tmp_path / "log"
    spark.createDataFrame(rows, SCHEMA).write.parquet(str(folder))
    settings = Settings(home=tmp_path / "home")
    config = job.CrossStatsConfig(pairs=(job.SEG_CAT, job.USER_CAT), windows_days=(1, 7))

    summary = job.run(DS, log_path=folder, settings=settings, spark=spark, config=config)
    again = job.run(DS, log_path=folder, settings=settings, spark=spark, config=config)

    assert (summary["input_rows"], summary["quarantined_rows"]) == (7, 5)
    assert summary["future_rows_quarantined"] == 1
    assert summary["rows"] == again["rows"] == {"seg_cat": 2, "user_cat": 2}
    bad = pd.read_parquet(summary["quarantine_path"]).sort_values("reason")
    assert bad.reason.tolist() == [
        "click is not 0 or 1",
        sources.FUTURE_REASON,
        "position < 1",
        "user_id is null or not an integer",
        "user_segment is null but a configured pair uses it",
    ]
    assert summary["quarantined_by_reason"] == dict.fromkeys(sorted(bad.reason), 1)
    assert json.loads(bad.line.iloc[0])["click"] == 3
    written = pd.read_parquet(summary["paths"]["user_cat"])
    assert str(written.event_timestamp.dtype) == "datetime64[us, UTC]"
    # The catalogue: item 1 (its two clean rows; category at its newest impression), not item
    # 2 (every row of it quarantined).
    catalogue = pd.read_parquet(summary["catalogue"]["path"])
    assert summary["catalogue"]["items"] == 1
    assert catalogue[["item_id", "item_category", "impressions"]].values.tolist() == [[1, "c1", 2]]
    # Built as history from a later log, the row at/after ds belongs to a later partition:
    # left out, not quarantined as misfiled.
    earlier = job.run(
        DS, log_path=folder, settings=settings, spark=spark, config=config, history=True
    )
    assert (earlier["input_rows"], earlier["quarantined_rows"]) == (6, 4)
    assert earlier["history"] and earlier["future_rows_quarantined"] == 0
    assert json.loads(Path(summary["summary_path"]).read_text())["rows"] == summary["rows"]


@pytest.mark.slow
def test_recovered_cross_ctrs_correlate_with_the_ground_truth(spark: SparkSession) -> None:
    truth_config = gen.GeneratorConfig(impressions=150_000, users=20_000, items=3_000, seed=11)
    generated = gen.generate(spark, truth_config).cache()
    config = job.CrossStatsConfig(pairs=(job.SEG_CAT,), windows_days=(30,))
    aggregate, facts = job.compute(generated, config, cutoff=truth_config.end)
    got = job.pair_features(
        aggregate.frame, job.SEG_CAT, config, priors=facts["priors"]["seg_cat"], cutoff=CUTOFF
    ).toPandas()
    aggregate.unpersist()
    # Truth per pair: the mean top-slot click probability of its impressions in the window.
    recent = generated.filter(F.col("event_timestamp") >= F.lit(CUTOFF - 30 * DAY))
    truth = (
        gen.ground_truth_relevance(truth_config, recent)
        .groupBy("user_segment", "item_category")
        .agg(F.avg("true_relevance").alias("relevance"))
        .withColumn(
            "effect",
            gen.seg_cat_effect(truth_config, F.col("user_segment"), F.col("item_category")),
        )
        .toPandas()
    )
    generated.unpersist()
    merged = got.merge(truth, on=["user_segment", "item_category"])

    assert len(merged) == truth_config.segments * truth_config.categories
    assert merged.seg_cat_dctr_30d.corr(merged.relevance, method="spearman") > 0.9
    assert merged.seg_cat_ctr_30d.corr(merged.effect, method="spearman") > 0.7
    # Debiased CTR is calibrated to the top slot; the raw CTR is pulled down by position bias.
    assert (merged.seg_cat_dctr_30d / merged.relevance).median() == pytest.approx(1.0, abs=0.1)
    assert (merged.seg_cat_ctr_30d < merged.seg_cat_dctr_30d).mean() > 0.95
    for position in (2, 5, 10):
        assert facts["examination"][position] == pytest.approx(position**-0.7, abs=0.05)


def test_an_empty_window_is_flagged_and_gets_the_pairs_rate_not_one_half(
    spark: SparkSession,
) -> None:
    """No impression in the day before ds: the 1-day columns are a constant at the pair's
    7-day rate (a sparse log's 0.5% here, not Jeffreys' 0.5) and flagged as empty windows."""
    config = job.CrossStatsConfig(pairs=(job.SEG_CAT,), windows_days=(1, 7))
    rng = np.random.default_rng(4)
    rows = [
        (k, k % 30, f"s{k % 4}", f"c{k % 5}", 1, T0 - DAY * float(rng.uniform(2, 6.9)),
         int(rng.random() < 0.005))
        for k in range(4_000)
    ]  # fmt: skip
    got, facts = features(spark, rows, config)

    assert facts["empty_windows"] == {"seg_cat": ["seg_cat_ctr_1d", "seg_cat_dctr_1d"]}
    assert "seg_cat_ctr_1d" not in facts["constant_features"].get("seg_cat", [])
    one_day = got["seg_cat"]["seg_cat_ctr_1d"]
    a, b = facts["priors"]["seg_cat"]["ctr_7"]
    rate = sum(r[-1] for r in rows) / len(rows)
    assert one_day.max() - one_day.min() < 1e-12  # a constant column
    assert one_day.iloc[0] == pytest.approx(a / (a + b), rel=1e-9)
    assert one_day.iloc[0] == pytest.approx(rate, rel=0.5) and one_day.iloc[0] < 0.05
    assert (got["seg_cat"]["seg_cat_dctr_1d"] < 0.05).all()
    from jobs.ctr_cross_stats_gate import constant_column_warnings

    assert constant_column_warnings({"empty_windows": facts["empty_windows"]}) == [
        "seg_cat: empty window (no impression in it), constant column seg_cat_ctr_1d",
        "seg_cat: empty window (no impression in it), constant column seg_cat_dctr_1d",
    ]


def test_a_failed_rebuild_removes_the_partitions_ungated_outputs(
    spark: SparkSession, tmp_path: Path
) -> None:
    settings = Settings(home=tmp_path / "home")
    config = job.CrossStatsConfig(pairs=(job.SEG_CAT, job.USER_CAT), windows_days=(1, 7))
    good = tmp_path / "good"
    rows = [(u, u % 3, "s1", f"c{u % 2}", None, 1, T0 - DAY / 2, u % 2) for u in range(1, 9)]
    spark.createDataFrame(rows, SCHEMA).write.parquet(str(good))
    summary = job.run(DS, log_path=good, settings=settings, spark=spark, config=config)
    where = job.CrossLake(Lake(settings.lake_root), "generated")
    built = where.outputs(DS)
    assert len(built) == 4 and all(p.exists() for p in built)  # two pairs, catalogue, summary
    # The gate passed them once; a gated partition is kept by a later failure to start.
    where.gate_report(DS).parent.mkdir(parents=True, exist_ok=True)
    where.gate_report(DS).write_text(json.dumps({"success": True}))
    assert where.remove_ungated(DS) == []

    # A rebuild from a log with nothing in the window is refused after it deleted the verdict.
    stale = tmp_path / "stale"
    old = [(u, 1, "s1", "c1", None, 1, T0 - 30 * DAY, 0) for u in range(1, 4)]
    spark.createDataFrame(old, SCHEMA).write.parquet(str(stale))
    with pytest.raises(job.EmptyBatch):
        job.run(DS, log_path=stale, settings=settings, spark=spark, config=config)

    assert not where.gate_report(DS).exists()
    assert [p for p in built if p.exists()] == [] and where.outputs(DS) == []
    assert Path(summary["quarantine_path"]).exists()  # the refused batch's quarantine stays
