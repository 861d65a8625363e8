"""Engine features for the serving benchmarks: the cross-statistics engine's partitions of a
synthetic log in the lake, the online store, a training set joined from them, the served model,
and what the server says it read.

The benchmark's synthetic log (:func:`models.preranking.synthetic_data.synthetic_training_frame`)
is put in the engine's log schema (:data:`jobs.ctr_log_sources.LOG_SCHEMA`: the item's genre is
its ``item_category``; a position drawn per impression; no segment, no context). The pairs a
pre-ranking server keys from a request alone (:data:`jobs.ctr_training_set.SERVED_PAIRS`:
``user``, ``item``, ``user_cat``) are computed for partition ``ds`` and for each of the
:data:`TRAIN_DAYS` days before it by the engine's DuckDB peer (:mod:`benchmarks.ctr_cross_duckdb`:
the same columns, priors and rules as :mod:`jobs.ctr_cross_stats`, seconds instead of a Spark
session), written where the engine writes them (``features/ctr_cross/generated/<pair>/dt=<day>/``)
with each day's item catalogue (:mod:`domains.ctr.catalogue`) and a gate verdict that says it
was written by this setup (the Spark gate is not run), and partition ``ds`` is loaded into the
online store by the bulk materializer (:func:`jobs.ctr_cross_features.materialize_cross`).

The training set is the pipeline's (:func:`jobs.ctr_training_set.write_training_set`): each
impression of the training days joined with its own day's partition, ``fields.json`` (the id
fields and every statistic as a candidate field) and ``training.json`` naming the source beside
it, so the trained version is served from the engine (:mod:`serving.preranking`: the catalogue's
items, item-keyed fields read once per version load, user-keyed ones per request). Without
cross features only the id fields are declared.

What the server read is taken from its ``/metrics``: ``cascade_online_feature_read_seconds``
per view and per worker process (:func:`scrape_online_reads`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from cascade.config import Settings
from cascade.lake import TRAINING_PROVENANCE, Lake
from domains.ctr.schema import LABEL, TIMESTAMP

SOURCE = "generated"
"""The log source whose engine partitions the benchmarks write and serve."""
TRAIN_DAYS = 3
"""Days before ``ds`` whose impressions the served model trains on (each with its partition)."""
WINDOWS = (1, 7, 30)
"""The statistics' windows (the pipeline's)."""
ID_FIELDS = ("user_id", "item_id", "genre")
"""The categorical fields every training set declares (what ``--no-cross-features`` keeps)."""
READ_METRIC = "cascade_online_feature_read_seconds"
PID_METRIC = "cascade_serving_torch_threads"
"""A gauge every worker reports with its ``pid`` label: which process answered ``/metrics``."""
SETUP_VERDICT = (
    "benchmark setup (benchmarks.serving_cross_features): statistics from the engine's DuckDB "
    "peer, the Spark gate not run"
)


def engine_log(frame: pd.DataFrame, *, seed: int = 7) -> pa.Table:
    """The synthetic log in the engine's schema: the genre as ``item_category``, a position
    1-10 drawn per impression, no segment or context (null)."""
    positions = np.random.default_rng(seed).integers(1, 11, len(frame))
    n = len(frame)
    return pa.table(
        {
            "user_id": pa.array(frame["user_id"].astype("int64"), pa.int64()),
            "item_id": pa.array(frame["item_id"].astype("int64"), pa.int64()),
            "user_segment": pa.nulls(n, pa.string()),
            "item_category": pa.array(frame["genre"].astype(object), pa.string()),
            "context": pa.nulls(n, pa.string()),
            "position": pa.array(positions.astype(np.int32), pa.int32()),
            TIMESTAMP: pa.array(frame[TIMESTAMP].dt.as_unit("us"), pa.timestamp("us", tz="UTC")),
            "click": pa.array(frame[LABEL].astype(np.int32), pa.int32()),
        }
    )


def item_catalogue(log: pd.DataFrame, ds: str, lookback_days: int) -> pd.DataFrame:
    """The engine's catalogue of partition ``ds`` (:func:`jobs.ctr_cross_stats.item_catalogue`)
    of a clean log: one row per item impressed in the ``lookback_days`` before ``ds``, its
    category at its newest impression, its impressions and when it was last seen."""
    from jobs import ctr_cross_stats as job

    cutoff = pd.Timestamp(job.ds_midnight(ds))
    stamps = pd.to_datetime(log[TIMESTAMP], utc=True)
    window = log[(stamps < cutoff) & (stamps >= cutoff - pd.Timedelta(days=lookback_days))]
    window = window.sort_values(TIMESTAMP, kind="stable")
    grouped = window.groupby("item_id", sort=True)
    return pd.DataFrame(
        {
            "item_id": grouped["item_category"].last().index.astype("int64"),
            "item_category": grouped["item_category"].last().to_numpy(),
            "impressions": grouped.size().to_numpy(np.int64),
            "last_seen": grouped[TIMESTAMP].max().to_numpy(),
        }
    )


def publish_engine_partitions(
    log: pa.Table,
    settings: Settings,
    ds: str,
    workdir: Path,
    *,
    train_days: int = TRAIN_DAYS,
) -> dict[str, Any]:
    """Compute the served pairs' partitions of ``ds`` and of the ``train_days`` days before it
    from the engine-schema ``log`` (:func:`engine_log`), write them, each day's catalogue and
    verdict where the engine does,
    and bulk-load partition ``ds`` into the online store; returns what was done and how long
    it took."""
    from benchmarks import ctr_cross_duckdb
    from cascade.partitions import days_before
    from jobs import ctr_cross_stats as job
    from jobs.ctr_cross_features import materialize_cross
    from jobs.ctr_training_set import SERVED_PAIRS

    started = time.monotonic()
    log_dir = workdir / "engine-log"
    log_dir.mkdir(parents=True, exist_ok=True)
    pq.write_table(log, log_dir / "part-00000.parquet")
    rows_of_log = log.to_pandas()
    lake = Lake(settings.lake_root)
    where = job.CrossLake(lake, SOURCE)
    config = job.CrossStatsConfig(pairs=SERVED_PAIRS, windows_days=WINDOWS)
    days = [*days_before(ds, train_days), ds]
    rows: dict[str, int] = {}
    engine_name = ""
    for day in days:
        scratch = workdir / "cross-stats" / day
        summary = ctr_cross_duckdb.run(log_dir, scratch, ds=day, config=config, threads=1)
        engine_name = summary["engine"]
        for pair in SERVED_PAIRS:
            target = where.pair(pair, day)
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(
                ctr_cross_duckdb.pair_path(scratch, pair, day), target / "part-00000.parquet"
            )
            if day == ds:
                rows[pair.name] = int(summary["rows"][pair.name])
        catalogue = lake.ctr_catalogue(SOURCE, day)
        catalogue.mkdir(parents=True, exist_ok=True)
        item_catalogue(rows_of_log, day, max(WINDOWS)).to_parquet(
            catalogue / "part-00000.parquet", index=False
        )
        verdict = lake.ctr_cross_gate_report(SOURCE, day)
        verdict.parent.mkdir(parents=True, exist_ok=True)
        verdict.write_text(json.dumps({"success": True, "by": SETUP_VERDICT}) + "\n")
    stats_s = time.monotonic() - started
    pairs = [pair.name for pair in SERVED_PAIRS]
    loaded = materialize_cross(ds, settings=settings, source=SOURCE, pairs=pairs)
    return {
        "pairs": pairs,
        "days": days,
        "engine": f"{engine_name} (the engine's peer, benchmarks.ctr_cross_duckdb)",
        "rows": rows,
        "statistics_s": stats_s,
        "gate": SETUP_VERDICT,
        "materialize_engine": loaded["engine"],
        "materialized_rows": loaded["rows"],
        "materialize_s": loaded["seconds"],
    }


def write_engine_training_set(
    log: pa.Table,
    settings: Settings,
    ds: str,
    *,
    cross_features: bool = True,
    train_days: int = TRAIN_DAYS,
) -> tuple[pd.DataFrame, Path]:
    """The training set of partition ``ds`` as the pipeline's ``training_set`` step writes it
    (``data.parquet``, ``fields.json``, ``training.json`` naming the source) from the
    engine-schema ``log`` and the partitions :func:`publish_engine_partitions` wrote from it;
    without ``cross_features`` ``fields.json`` declares the id fields only. Returns the frame
    and its folder."""
    from cascade.partitions import days_before
    from jobs.ctr_training_set import (
        FIELDS_FILE,
        SERVED_PAIRS,
        impression_days,
        published_partitions,
        write_training_set,
    )

    days = days_before(ds, train_days)
    impressions = log.to_pandas()
    chosen = impressions[impression_days(impressions[TIMESTAMP]).isin(days)]
    chosen = chosen.sort_values(TIMESTAMP, kind="stable").reset_index(drop=True)
    if chosen.empty:
        raise ValueError(f"the benchmark log has no impression on the training days {days}")
    partitions = published_partitions(
        settings.lake_root, source=SOURCE, pairs=SERVED_PAIRS, days=days, require_gate=True
    )
    out = Lake(settings.lake_root).training_set("preranking", ds)
    written = write_training_set(
        out, chosen, partitions, pairs=SERVED_PAIRS, windows=WINDOWS, learned=False
    )
    if not cross_features:
        fields_file = out / FIELDS_FILE
        declared = json.loads(fields_file.read_text())
        declared["fields"] = [f for f in declared["fields"] if f["name"] in ID_FIELDS]
        fields_file.write_text(json.dumps(declared, indent=2) + "\n")
    provenance = {**written, "ds": ds, "source": SOURCE, "days": days}
    (out / TRAINING_PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n")
    return pd.read_parquet(out / "data.parquet"), out


def train_cold_and_promote(settings: Settings, ds: str, network: dict[str, Any]) -> dict[str, Any]:
    """The FSCD pre-ranker's network (ColdPreRanker, the cascade config's shape) over every field
    of the training set :func:`write_engine_training_set` wrote, trained in this process (plain
    Adam, the config's batch size, learning rate and epochs; no teacher, no FSCD selection, no
    compile step), logged as the cascade run logs its chosen model (with the set's source, so
    the server reads its fields from the engine), registered and made champion."""
    import mlflow
    import torch

    from cascade.results import write_result
    from cascade.training.resumable_run import use_experiment
    from models.preranking.config_registry import get_cascade_config, with_overrides
    from models.preranking.fields import FieldEncoder, FieldSet
    from models.preranking.fscd_phases import build_network
    from models.preranking.fscd_run import EXPERIMENT
    from models.preranking.inference import COLD_DIR_ARTIFACT, CROSS_SOURCE_PARAM, log_cold_model
    from models.preranking.registration import register_and_promote
    from models.preranking.training_set import evaluate, time_split
    from pipelines.ctr_preranking import PIPELINE

    config = with_overrides(
        get_cascade_config(network["training_config"]), epochs=network["epochs"], lr=network["lr"]
    )
    spec_rule = PIPELINE.promotion()
    assert spec_rule is not None
    # No compile step here: the pipeline's metric and tolerance, without its compile gate.
    rule = dataclasses.replace(spec_rule, requires_compile_gate=False)
    lake = Lake(settings.lake_root)
    folder = lake.training_set("preranking", ds)
    frame = pd.read_parquet(folder / "data.parquet")
    fields = FieldSet.beside(folder)
    fields.require_columns(frame, "the training set")
    train, test = time_split(frame, config.test_fraction)
    encoder = FieldEncoder(fields, bins=config.bins).fit(train)
    codes = encoder.encode(train)
    label = torch.from_numpy(train[LABEL].to_numpy(np.float32))
    torch.manual_seed(config.seed)
    model = build_network("fscd", config, encoder.cardinalities(), field_set=fields)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    model.train()
    for epoch in range(config.epochs):
        order = torch.randperm(len(label), generator=torch.Generator().manual_seed(epoch))
        for start in range(0, len(order), config.batch_size):
            idx = order[start : start + config.batch_size]
            loss = loss_fn(model(codes[idx]), label[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    model.eval()
    test_auc = evaluate(model, test, encoder)["auc"]
    out = lake.reports("train", ds)
    out.mkdir(parents=True, exist_ok=True)
    experiment_id = use_experiment(settings, EXPERIMENT)
    with mlflow.start_run(experiment_id=experiment_id, run_name=f"{config.name}-cold-{ds}") as run:
        mlflow.log_metric("test_auc", test_auc)
        mlflow.log_param(CROSS_SOURCE_PARAM, SOURCE)
        example = test[list(fields.names)].head(5).reset_index(drop=True)
        info = log_cold_model(out / COLD_DIR_ARTIFACT, model, config, encoder, example)
        result = {
            "run_id": run.info.run_id,
            "test_auc": test_auc,
            "model_uri": info.model_uri,
            "model_kind": "fscd",
            "config": config.name,
            "ds": ds,
            "fscd_fields": list(fields.names),
        }
    write_result(out / "result.json", result)
    return {
        **register_and_promote(ds, settings=settings, promotion=rule),
        "test_auc": test_auc,
        "trainer": "in process, plain Adam, fp32 (the FSCD pre-ranker's network over every "
        "field, no FSCD selection, no compile step)",
    }


def served_fields(settings: Settings, ds: str) -> list[str]:
    """The fields the trained network reads (FSCD's kept ones), as its run's ``result.json``
    names them."""
    path = Lake(settings.lake_root).reports("train", ds) / "result.json"
    result = json.loads(path.read_text()) if path.is_file() else {}
    return [str(name) for name in result.get("fscd_fields") or ()]


def _labels(text: str) -> dict[str, str]:
    out = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        if key:
            out[key.strip()] = value.strip().strip('"')
    return out


def parse_online_reads(text: str) -> tuple[str | None, dict[str, dict[str, Any]]]:
    """``(pid, {view: {"count", "sum_s", "buckets": {le: cumulative count}}})`` of one
    Prometheus exposition: the answering worker's pid (from :data:`PID_METRIC`) and its
    :data:`READ_METRIC` histogram per view."""
    pid = None
    views: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        if line.startswith("#") or "{" not in line:
            continue
        name, _, rest = line.partition("{")
        labels_text, _, value_text = rest.rpartition("}")
        labels = _labels(labels_text)
        if name == PID_METRIC and "pid" in labels:
            pid = labels["pid"]
        if not name.startswith(READ_METRIC) or "view" not in labels:
            continue
        view = views.setdefault(labels["view"], {"count": 0.0, "sum_s": 0.0, "buckets": {}})
        value = float(value_text.split()[0])
        if name == READ_METRIC + "_count":
            view["count"] = value
        elif name == READ_METRIC + "_sum":
            view["sum_s"] = value
        elif name == READ_METRIC + "_bucket":
            view["buckets"][labels["le"]] = value
    return pid, views


def _quantile_bound_ms(buckets: dict[str, float], count: float, q: float) -> float | None:
    """The upper bound (ms) of the histogram bucket holding quantile ``q``."""
    if count <= 0:
        return None
    for le, cumulative in sorted(buckets.items(), key=lambda kv: float(kv[0])):
        if cumulative >= q * count:
            bound = float(le)
            return None if math.isinf(bound) else bound * 1000.0
    return None


def summarize_online_reads(per_worker: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The workers' :data:`READ_METRIC` histograms summed per view: reads, mean ms per read,
    the bucket bounds holding the median and the 99th percentile, and ``one_read_per_view_ms``
    (the views' means added: what reading each view once costs)."""
    totals: dict[str, dict[str, Any]] = {}
    for views in per_worker.values():
        for view, h in views.items():
            total = totals.setdefault(view, {"count": 0.0, "sum_s": 0.0, "buckets": {}})
            total["count"] += h["count"]
            total["sum_s"] += h["sum_s"]
            for le, c in h["buckets"].items():
                total["buckets"][le] = total["buckets"].get(le, 0.0) + c
    by_view = {}
    for view, t in sorted(totals.items()):
        count = int(t["count"])
        by_view[view] = {
            "reads": count,
            "mean_ms": t["sum_s"] * 1000.0 / count if count else None,
            "p50_le_ms": _quantile_bound_ms(t["buckets"], t["count"], 0.5),
            "p99_le_ms": _quantile_bound_ms(t["buckets"], t["count"], 0.99),
        }
    means = [v["mean_ms"] for v in by_view.values() if v["mean_ms"] is not None]
    return {
        "metric": READ_METRIC,
        "workers_scraped": sorted(per_worker),
        "reads": sum(v["reads"] for v in by_view.values()),
        "one_read_per_view_ms": sum(means) if means else None,
        "by_view": by_view,
        "includes": "every request the workers answered: warm-ups and probes included",
    }


def scrape_online_reads(
    url: str, headers: dict[str, str], workers: int, tries: int = 60
) -> dict[str, Any]:
    """:func:`summarize_online_reads` over every worker: each ``/metrics`` probe is a new
    connection answered by whichever worker accepts it, so probe until ``workers`` processes
    have answered (fewer if some never did)."""
    import urllib.request

    seen: dict[str, dict[str, dict[str, Any]]] = {}
    for _ in range(tries):
        request = urllib.request.Request(f"{url}/metrics", headers=headers)
        with urllib.request.urlopen(request, timeout=10) as answer:
            pid, views = parse_online_reads(answer.read().decode())
        if pid is not None:
            seen[pid] = views
        if len(seen) >= workers:
            break
    return summarize_online_reads(seen)


def cross_fields_read(plan_log: str, fields: Iterable[str]) -> list[str]:
    """Those of ``fields`` the server's log says it reads from the online store per request."""
    marker = "fields read from the online store per request:"
    lines = [line for line in plan_log.splitlines() if marker in line]
    said = " ".join(line.split(marker, 1)[1] for line in lines)
    return [f for f in fields if f in said]


def today_ds() -> str:
    """Today's date (UTC): the partition a request today reads (the cross views' ttl is two
    days, so an older partition would be served as missing)."""
    return dt.datetime.now(dt.UTC).date().isoformat()
