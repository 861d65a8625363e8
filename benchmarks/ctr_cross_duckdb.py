"""The cross statistics job's peer in DuckDB: the same statistics, for ``cascade bench ctr``.

    python -m benchmarks.ctr_cross_duckdb --log LOG_DIR --ds 2026-11-22 --out OUT_DIR \\
        [--threads 2] [--memory-limit 4GB]

The same work as :func:`jobs.ctr_cross_stats.run` on a parquet log in the engine's schema (the
``generated`` source), so the two engines can be timed side by side: the row rules of
:func:`jobs.ctr_log_sources.row_rules` with the same reasons (rows at or after the cut-off
included), the examination per position from clean rows in the longest window
(:func:`jobs.ctr_cross_stats.examination_by_position`), per pair and window ``imp``, ``clk``,
the smoothed ``ctr`` and the debiased ``dctr`` with Beta priors fitted per pair, window and
statistic by :func:`jobs.ctr_cross_stats.beta_from_moments`, recency and the half-life
decayed CTR. Outputs under ``OUT_DIR``: one parquet file per pair
(``<pair>/dt=<ds>/<pair>.parquet``, the job's columns in its order), the item catalogue the
job writes beside them (``catalogue/dt=<ds>/catalogue.parquet``), the quarantine
(``quarantine/dt=<ds>/quarantine.parquet``: ``source``, ``line``, ``reason``) and
``summary.json`` (counts per reason, rows per pair, priors, examination, ``seconds``).

Passes, each streamed from the parquet files: (1) one aggregation for the batch counts and the
examination; (2) per pair one hash aggregation of the clean rows of the longest window into a
temporary table, read twice (the prior moments, then the feature rows written to parquet),
and one aggregation per item for the catalogue; (3) the quarantine, only when pass 1 counted
bad rows. ``memory_limit`` bounds DuckDB's buffers; beyond it the aggregation spills to
``temp_directory`` under ``OUT_DIR``.

A benchmark, never production: nothing outside ``benchmarks/`` imports DuckDB.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import time
from pathlib import Path
from typing import Any

import duckdb

from cascade.lake import check_ds
from jobs import ctr_cross_stats as job
from jobs import ctr_log_sources as sources

SQL_TYPES = {"bigint": "BIGINT", "int": "INTEGER", "string": "VARCHAR", "timestamp": "TIMESTAMPTZ"}
"""DuckDB type of each Spark SQL type of :data:`jobs.ctr_log_sources.LOG_SCHEMA`."""
SOURCE = "generated"


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def double(value: float) -> str:
    """A DOUBLE literal with exactly ``value`` (a bare ``0.1`` is a DECIMAL in DuckDB)."""
    return f"CAST({text(repr(float(value)))} AS DOUBLE)"


def row_rules_sql(key_columns: tuple[str, ...], cutoff_us: int) -> list[tuple[str, str]]:
    """(broken, reason) of :func:`jobs.ctr_log_sources.row_rules` as DuckDB SQL, same order
    and reasons (the equality test runs both engines on bad rows)."""
    rules = [
        ("user_id IS NULL", "user_id is null or not an integer"),
        ("item_id IS NULL", "item_id is null or not an integer"),
        ("event_timestamp IS NULL", "event_timestamp is null or not a timestamp"),
        (f"epoch_us(event_timestamp) >= {cutoff_us}", sources.FUTURE_REASON),
        ("click IS NULL OR click NOT IN (0, 1)", "click is not 0 or 1"),
        ("position < 1", "position < 1"),
    ]
    for name in key_columns:
        if name not in ("user_id", "item_id"):
            rules.append(
                (f"{quote(name)} IS NULL", f"{name} is null but a configured pair uses it")
            )
    return rules


def parquet_files(log: Path) -> list[str]:
    """The data files of a parquet log folder: files and folders named ``_*`` or ``.*`` are
    skipped, as Spark skips them (``_SUCCESS``, the generator's ``_TRUTH``)."""
    if not log.is_dir():
        raise FileNotFoundError(
            f"log {log} does not exist; write one with `cascade ctr impressions --out {log}`"
        )
    files = sorted(
        str(p)
        for p in log.rglob("*.parquet")
        if not any(part.startswith(("_", ".")) for part in p.relative_to(log).parts)
    )
    if not files:
        raise FileNotFoundError(f"log {log} holds no .parquet file")
    return files


def connect(threads: int, memory_limit: str, temp_dir: Path) -> duckdb.DuckDBPyConnection:
    """An in-memory database on ``threads`` threads that spills to ``temp_dir``."""
    temp_dir.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(
        config={
            "threads": threads,
            "memory_limit": memory_limit,
            "temp_directory": str(temp_dir),
            "preserve_insertion_order": False,
        }
    )
    con.execute("SET TimeZone = 'UTC'")
    return con


def create_views(
    con: duckdb.DuckDBPyConnection,
    files: list[str],
    config: job.CrossStatsConfig,
    *,
    cutoff_us: int,
) -> None:
    """Views ``mapped`` (the log in the engine's schema, try-cast like
    :func:`jobs.ctr_log_sources.map_log`, plus the raw row ``_raw``) and ``checked`` (plus
    ``reason``, ``age_us`` and ``position`` clipped at ``max_position``)."""
    file_list = "[" + ", ".join(text(f) for f in files) + "]"
    scan = f"read_parquet({file_list})"
    raw_columns = [row[0] for row in con.execute(f"DESCRIBE SELECT * FROM {scan}").fetchall()]
    selected: list[str] = []
    missing: list[str] = []
    for name, spark_type in sources.LOG_SCHEMA:
        sql_type = SQL_TYPES[spark_type]
        if name in raw_columns:
            selected.append(f"TRY_CAST({quote(name)} AS {sql_type}) AS {quote(name)}")
        else:
            if name in sources.REQUIRED_COLUMNS:
                missing.append(name)
            selected.append(f"CAST(NULL AS {sql_type}) AS {quote(name)}")
    if missing:
        raise ValueError(f"the log has no column for {missing} (it has {raw_columns})")
    raw = "struct_pack(" + ", ".join(f"{quote(c)} := {quote(c)}" for c in raw_columns) + ")"
    con.execute(
        f"CREATE OR REPLACE TEMP VIEW mapped AS SELECT {', '.join(selected)}, "
        f"{raw} AS _raw FROM {scan}"
    )
    reason = (
        "CASE "
        + " ".join(
            f"WHEN {broken} THEN {text(message)}"
            for broken, message in row_rules_sql(config.key_columns, cutoff_us)
        )
        + " END"
    )
    others = [quote(c) for c in sources.LOG_COLUMNS if c != "position"]
    con.execute(
        "CREATE OR REPLACE TEMP VIEW checked AS SELECT "
        f"{', '.join(others)}, LEAST(position, {config.max_position}) AS position, _raw, "
        f"{reason} AS reason, {cutoff_us} - epoch_us(event_timestamp) AS age_us FROM mapped"
    )


def batch_counts(con: duckdb.DuckDBPyConnection, lookback_days: int) -> dict[str, Any]:
    """Pass 1 (:func:`jobs.ctr_cross_stats.batch_counts`), summarized by the job's function."""
    inside = f"reason IS NULL AND age_us <= {lookback_days * job.MICROS_PER_DAY}"
    rows = con.execute(
        "SELECT reason, CASE WHEN reason IS NULL THEN "
        f"age_us <= {lookback_days * job.MICROS_PER_DAY} END AS in_window, "
        f"CASE WHEN {inside} THEN position END AS position, count(*) AS imp, "
        "CAST(sum(CASE WHEN reason IS NULL THEN click END) AS BIGINT) AS clk "
        "FROM checked GROUP BY ALL"
    ).fetchall()
    names = ("reason", "in_window", "position", "imp", "clk")
    return job.summarize_counts([dict(zip(names, row, strict=True)) for row in rows])


def create_clean(
    con: duckdb.DuckDBPyConnection,
    config: job.CrossStatsConfig,
    examination: dict[int, float],
) -> None:
    """``clean``: clean rows of the longest window with ``exam`` and ``decay`` (pass 2 input)."""
    lookback_us = max(config.windows) * job.MICROS_PER_DAY
    decay_per_us = math.log(2.0) / (config.half_life_days * job.MICROS_PER_DAY)
    exam = "CASE " + " ".join(
        f"WHEN position = {p} THEN {double(v)}" for p, v in sorted(examination.items())
    )
    exam = f"{exam} ELSE {double(1.0)} END" if examination else double(1.0)
    columns = list(config.key_columns)
    if "item_category" not in columns:
        columns.append("item_category")  # the catalogue's, even where no pair keys by it
    keys = ", ".join(quote(k) for k in columns)
    con.execute(
        f"CREATE OR REPLACE TEMP VIEW clean AS SELECT {keys}, age_us, click, {exam} AS exam, "
        f"exp(age_us * {double(-decay_per_us)}) AS decay FROM checked "
        f"WHERE reason IS NULL AND age_us > 0 AND age_us <= {lookback_us}"
    )


def aggregate_pair(
    con: duckdb.DuckDBPyConnection, pair: job.CrossPair, config: job.CrossStatsConfig
) -> None:
    """Temporary table ``agg``: per key of ``pair`` the columns of
    :func:`jobs.ctr_cross_stats.cross_aggregate` (``imp_<w>``, ``clk_<w>``, ``exam_<w>``,
    ``last_imp_us``, ``last_click_us``, ``dec_imp``, ``dec_clk``)."""
    sums: list[str] = []
    for w in config.windows:
        inside = f"age_us <= {w * job.MICROS_PER_DAY}"
        sums += [
            f"count(CASE WHEN {inside} THEN 1 END) AS imp_{w}",
            f"CAST(sum(CASE WHEN {inside} THEN click ELSE 0 END) AS BIGINT) AS clk_{w}",
            f"sum(CASE WHEN {inside} THEN exam ELSE {double(0.0)} END) AS exam_{w}",
        ]
    sums += [
        "min(age_us) AS min_age_us",
        "min(CASE WHEN click = 1 THEN age_us END) AS min_click_age_us",
        "sum(decay) AS dec_imp",
        "sum(decay * click) AS dec_clk",
    ]
    keys = ", ".join(quote(k) for k in pair.keys)
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE agg AS SELECT {keys}, {', '.join(sums)} "
        f"FROM clean GROUP BY {keys}"
    )


def fit_priors(
    con: duckdb.DuckDBPyConnection, config: job.CrossStatsConfig
) -> tuple[int, dict[str, tuple[float, float]]]:
    """(rows of ``agg``, prior per ``<statistic>_<window>`` tag) as the job fits them."""
    columns: list[str] = []
    tags: list[str] = []
    targets = [(s, w) for s in job.STATISTICS for w in config.windows] + [("decay", None)]
    for statistic, window in targets:
        trials, clicks = job.trials_and_clicks(statistic, window)
        seen = f"{trials} > 0"
        tags.append(f"{statistic}_{window}")
        columns += [
            f"count(CASE WHEN {seen} THEN 1 END)",
            f"sum(CASE WHEN {seen} THEN {trials} END)",
            f"sum(CASE WHEN {seen} THEN {clicks} END)",
            f"sum(CASE WHEN {seen} THEN {clicks} * {clicks} / {trials} END)",
        ]
    row = con.execute(f"SELECT count(*), {', '.join(columns)} FROM agg").fetchone()
    assert row is not None
    priors: dict[str, tuple[float, float]] = {}
    for index, tag in enumerate(tags):
        keys, trials_sum, clicks_sum, sum_sq = row[1 + 4 * index : 5 + 4 * index]
        priors[tag] = job.beta_from_moments(
            keys=float(keys or 0),
            trials=float(trials_sum or 0),
            clicks=float(clicks_sum or 0),
            sum_sq=float(sum_sq or 0),
            min_strength=config.min_prior_strength,
            max_strength=config.max_prior_strength,
        )
    return int(row[0]), priors


def smoothed(clicks: str, trials: str, prior: tuple[float, float]) -> str:
    a, b = prior
    return f"({clicks} + {double(a)}) / ({trials} + {double(a + b)})"


def debiased(clicks: str, examinations: str, prior: tuple[float, float]) -> str:
    """:func:`jobs.ctr_cross_stats.debiased`: smoothed, capped at 1."""
    return f"least({smoothed(clicks, examinations, prior)}, {double(1.0)})"


def write_pair(
    con: duckdb.DuckDBPyConnection,
    pair: job.CrossPair,
    config: job.CrossStatsConfig,
    *,
    priors: dict[str, tuple[float, float]],
    cutoff_us: int,
    path: Path,
) -> int:
    """Write the pair's feature rows (:func:`jobs.ctr_cross_stats.pair_features`); returns
    their count."""
    name = pair.name
    day = job.MICROS_PER_DAY
    columns = [quote(k) for k in pair.keys]
    columns.append(f"make_timestamptz({cutoff_us}) AS {job.TIMESTAMP}")
    for w in config.windows:
        columns += [
            f"imp_{w} AS {name}_imp_{w}d",
            f"clk_{w} AS {name}_clk_{w}d",
            f"{smoothed(f'clk_{w}', f'imp_{w}', priors[f'ctr_{w}'])} AS {name}_ctr_{w}d",
            f"{debiased(f'clk_{w}', f'exam_{w}', priors[f'dctr_{w}'])} AS {name}_dctr_{w}d",
        ]
    # The job's cutoff - (cutoff - min(age)) in exact integers: min(age).
    columns += [
        f"min_age_us / {day} AS {name}_days_since_imp",
        f"min_click_age_us / {day} AS {name}_days_since_click",
        f"{smoothed('dec_clk', 'dec_imp', priors['decay_None'])} AS {name}_decay_ctr",
    ]
    keyed = " AND ".join(f"{quote(k)} IS NOT NULL" for k in pair.keys)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = con.execute(
        f"COPY (SELECT {', '.join(columns)} FROM agg WHERE {keyed}) "
        f"TO {text(str(path))} (FORMAT parquet, COMPRESSION snappy)"
    ).fetchone()
    return int(written[0]) if written else 0


def write_quarantine(con: duckdb.DuckDBPyConnection, path: Path, *, any_bad: bool) -> None:
    """Rows breaking a rule: ``source``, ``line`` (the raw row as JSON), ``reason``."""
    where = "reason IS NOT NULL" if any_bad else "false"
    path.parent.mkdir(parents=True, exist_ok=True)
    con.execute(
        f"COPY (SELECT {text(SOURCE)} AS source, CAST(to_json(_raw) AS VARCHAR) AS line, reason "
        f"FROM checked WHERE {where}) TO {text(str(path))} (FORMAT parquet, COMPRESSION snappy)"
    )


def write_catalogue(con: duckdb.DuckDBPyConnection, path: Path, *, cutoff_us: int) -> int:
    """The item catalogue of :func:`jobs.ctr_cross_stats.item_catalogue` from ``clean``: per
    item its category at the newest impression, ``impressions`` and ``last_seen``; returns
    the items written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    written = con.execute(
        "COPY (SELECT item_id, arg_min(item_category, age_us) AS item_category, "
        "count(*) AS impressions, "
        f"make_timestamp({cutoff_us} - min(age_us)) AS last_seen FROM clean GROUP BY item_id) "
        f"TO {text(str(path))} (FORMAT parquet, COMPRESSION snappy)"
    ).fetchone()
    return int(written[0]) if written else 0


def catalogue_path(out: Path, ds: str) -> Path:
    return out / "catalogue" / f"dt={ds}" / "catalogue.parquet"


def pair_path(out: Path, pair: job.CrossPair, ds: str) -> Path:
    return out / pair.name / f"dt={ds}" / f"{pair.name}.parquet"


def quarantine_path(out: Path, ds: str) -> Path:
    return out / "quarantine" / f"dt={ds}" / "quarantine.parquet"


def run(
    log: Path,
    out: Path,
    *,
    ds: str,
    config: job.CrossStatsConfig | None = None,
    threads: int = 2,
    memory_limit: str = "4GB",
) -> dict[str, Any]:
    """Compute partition ``ds`` of every configured pair from the parquet log ``log`` into
    ``out``; returns the summary (also ``out/summary.json``). Raises
    :class:`jobs.ctr_cross_stats.EmptyBatch` like the job (bad rows quarantined first)."""
    check_ds(ds)
    config = config or job.CrossStatsConfig()
    started = time.monotonic()
    cutoff = job.ds_midnight(ds)
    cutoff_us = int(cutoff.timestamp()) * 1_000_000
    files = parquet_files(log)
    con = connect(threads, memory_limit, out / "duckdb_tmp")
    try:
        create_views(con, files, config, cutoff_us=cutoff_us)
        lookback = max(config.windows)
        batch = batch_counts(con, lookback)
        if batch["clean_rows_in_window"] == 0:
            write_quarantine(con, quarantine_path(out, ds), any_bad=True)
            raise job.EmptyBatch(
                f"no clean row in the {lookback}-day window before {cutoff.date()} 00:00 UTC: "
                f"{batch['input_rows']:,} input rows, {batch['quarantined_rows']:,} quarantined "
                f"{batch['quarantined_by_reason']}"
            )
        examination = job.examination_by_position(batch["position_counts"])
        create_clean(con, config, examination)
        rows: dict[str, int] = {}
        paths: dict[str, str] = {}
        priors: dict[str, dict[str, tuple[float, float]]] = {}
        aggregate_rows = 0
        for pair in config.pairs:
            aggregate_pair(con, pair, config)
            keys, priors[pair.name] = fit_priors(con, config)
            aggregate_rows += keys
            path = pair_path(out, pair, ds)
            rows[pair.name] = write_pair(
                con, pair, config, priors=priors[pair.name], cutoff_us=cutoff_us, path=path
            )
            paths[pair.name] = str(path)
        con.execute("DROP TABLE IF EXISTS agg")
        catalogue = {
            "items": write_catalogue(con, catalogue_path(out, ds), cutoff_us=cutoff_us),
            "path": str(catalogue_path(out, ds)),
        }
        write_quarantine(con, quarantine_path(out, ds), any_bad=batch["quarantined_rows"] > 0)
    finally:
        con.close()
    summary = {
        "engine": f"duckdb {duckdb.__version__}",
        "ds": ds,
        "source": SOURCE,
        "threads": threads,
        "memory_limit": memory_limit,
        "pairs": [pair.name for pair in config.pairs],
        "input_rows": batch["input_rows"],
        "quarantined_rows": batch["quarantined_rows"],
        "quarantined_by_reason": batch["quarantined_by_reason"],
        "future_rows_quarantined": int(
            batch["quarantined_by_reason"].get(sources.FUTURE_REASON, 0)
        ),
        "clean_rows_in_window": batch["clean_rows_in_window"],
        "clean_rows_before_window": batch["clean_rows_before_window"],
        "aggregate_rows": aggregate_rows,
        "rows": rows,
        "paths": paths,
        "catalogue": catalogue,
        "quarantine_path": str(quarantine_path(out, ds)),
        "windows_days": list(config.windows),
        "examination": {str(k): v for k, v in sorted(examination.items())},
        "priors": {
            pair: {tag: {"a": a, "b": b} for tag, (a, b) in tags.items()}
            for pair, tags in priors.items()
        },
        "constant_features": job.constant_features(priors, config),
        "seconds": time.monotonic() - started,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.ctr_cross_duckdb", description=__doc__
    )
    parser.add_argument(
        "--log", type=Path, required=True, help="parquet log folder (engine schema)"
    )
    parser.add_argument("--ds", required=True, help=job.DS_HELP)
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--threads", type=int, default=2, help="DuckDB threads (Spark's cores)")
    parser.add_argument("--memory-limit", default="4GB", help="DuckDB memory_limit")
    args = parser.parse_args(argv)
    summary = run(
        args.log, args.out, ds=args.ds, threads=args.threads, memory_limit=args.memory_limit
    )
    # Peak resident memory of this process (the peer runs alone in it), for the benchmark.
    summary["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: summary[k] for k in ("rows", "quarantined_rows", "seconds")}))
    return summary


if __name__ == "__main__":
    main()
