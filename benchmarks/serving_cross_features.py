"""Cross features for ``cascade bench serving``: statistics in the lake, the online store, the
served model's fields, and what the server says it read.

The benchmark's synthetic log (:func:`models.preranking.synthetic_data.synthetic_training_frame`)
is put in the engine's log schema (:data:`jobs.ctr_log_sources.LOG_SCHEMA`: the item's genre is
its ``item_category``; a position drawn per impression; no segment, no context) and the
``user_cat`` pair (user x item category, the pair a request can key: the server knows the user
and each candidate's genre) is computed for partition ``ds`` by the engine's DuckDB peer
(:mod:`benchmarks.ctr_cross_duckdb`: the same columns, priors and rules as
:mod:`jobs.ctr_cross_stats`, seconds instead of a Spark session), written where the engine
writes it (``features/ctr_cross/generated/user_cat/dt=<ds>/``) and loaded into the online store
by the bulk materializer (:func:`cascade.feature_store.materialize_cross`).

The training frame gets the partition's values of :data:`CROSS_FIELDS` joined on
(user, genre), declared as ``cross`` fields (``fields.json`` beside the training parquet, read
by the pipeline's train step; :func:`train_cold_and_promote` for the in-process network), so
the served version reads them and the server fetches them from the online store per request
(:mod:`serving.online_fields`). Like the benchmark's other feature snapshots, the values are
the partition's for every training row (the model is served for its latency, not judged on
them).

What the server read is taken from its ``/metrics``: ``cascade_online_feature_read_seconds``
per view and per worker process (:func:`online_reads_from_metrics`).
"""

from __future__ import annotations

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
from cascade.ctr_schema import LABEL, TIMESTAMP
from cascade.lake import Lake

SOURCE = "generated"
"""The log source whose cross views the online store serves."""
PAIR = "user_cat"
"""The pair the benchmark serves: keyed by the request's user and each candidate's genre."""
CROSS_FIELDS: dict[str, dict[str, Any]] = {
    "user_cat_ctr_7d": {"kind": "cross", "window_days": 7},
    "user_cat_ctr_30d": {"kind": "cross", "window_days": 30},
    "user_cat_decay_ctr": {"kind": "cross"},
}
"""The engine's ``user_cat`` columns the served model reads, as field declarations
(:meth:`models.preranking.fields.FieldSet.from_declarations`)."""
KEYS = ["user_id", "genre"]
"""The training frame's columns behind a ``user_cat`` key (``genre`` is ``item_category``)."""
READ_METRIC = "cascade_online_feature_read_seconds"
PID_METRIC = "cascade_serving_torch_threads"
"""A gauge every worker reports with its ``pid`` label: which process answered ``/metrics``."""


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


def publish_cross_statistics(
    frame: pd.DataFrame, settings: Settings, ds: str, workdir: Path
) -> dict[str, Any]:
    """Compute the ``user_cat`` partition ``ds`` of ``frame``'s log, write it where the engine
    writes it and bulk-load it into the online store; returns what was done and how long it
    took."""
    from benchmarks import ctr_cross_duckdb
    from cascade.feature_store import materialize_cross
    from jobs import ctr_cross_stats as job

    started = time.monotonic()
    log_dir = workdir / "engine-log"
    log_dir.mkdir(parents=True, exist_ok=True)
    pq.write_table(engine_log(frame), log_dir / "part-00000.parquet")
    pair = job.PAIRS_BY_NAME[PAIR]
    scratch = workdir / "cross-stats"
    summary = ctr_cross_duckdb.run(
        log_dir, scratch, ds=ds, config=job.CrossStatsConfig(pairs=(pair,)), threads=1
    )
    target = job.CrossLake(Lake(settings.lake_root), SOURCE).pair(pair, ds)
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ctr_cross_duckdb.pair_path(scratch, pair, ds), target / "part-00000.parquet")
    stats_s = time.monotonic() - started
    loaded = materialize_cross(ds, settings=settings, source=SOURCE, pairs=[PAIR])
    return {
        "pair": PAIR,
        "engine": f"{summary['engine']} (the engine's peer, benchmarks.ctr_cross_duckdb)",
        "rows": summary["rows"][PAIR],
        "statistics_s": stats_s,
        "materialize_engine": loaded["engine"],
        "materialized_rows": loaded["rows"],
        "materialize_s": loaded["seconds"],
        "partition": str(target),
    }


def with_cross_fields(
    frame: pd.DataFrame, settings: Settings, ds: str
) -> tuple[pd.DataFrame, dict[str, dict[str, Any]]]:
    """``frame`` with the partition's :data:`CROSS_FIELDS` joined on (user, genre) (NaN for a
    key the partition lacks), and their declarations (with the key columns, so the field's key
    cardinality is counted)."""
    from jobs import ctr_cross_stats as job

    folder = job.CrossLake(Lake(settings.lake_root), SOURCE).pair(job.PAIRS_BY_NAME[PAIR], ds)
    stats = pq.read_table(folder, columns=["user_id", "item_category", *CROSS_FIELDS]).to_pandas()
    stats = stats.rename(columns={"item_category": "genre"})
    joined = frame.merge(stats, on=KEYS, how="left", validate="many_to_one")
    declarations = {name: {**spec, "keys": KEYS} for name, spec in CROSS_FIELDS.items()}
    return joined, declarations


def write_training_set(
    frame: pd.DataFrame, declarations: dict[str, dict[str, Any]] | None, lake: Lake, ds: str
) -> Path:
    """The training parquet of partition ``ds`` and, with ``declarations``, the ``fields.json``
    beside it that the train step reads (none: the default fields)."""
    from models.preranking.fields import FIELDS_FILE

    data = lake.training_set("preranking", ds) / "data.parquet"
    data.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(data, index=False)
    beside = data.parent / FIELDS_FILE
    if declarations:
        beside.write_text(json.dumps(declarations, indent=2) + "\n")
    else:
        beside.unlink(missing_ok=True)
    return data


def train_cold_and_promote(
    frame: pd.DataFrame,
    settings: Settings,
    ds: str,
    network: dict[str, Any],
    declarations: dict[str, dict[str, Any]] | None,
) -> dict[str, Any]:
    """The FSCD pre-ranker's network (ColdPreRanker, the cascade config's shape) over every field
    of the default set plus ``declarations``, trained in this process (plain Adam, the config's
    batch size, learning rate and epochs; no teacher, no FSCD selection, no compile step),
    logged as the cascade run logs its chosen model, registered and made champion."""
    import mlflow
    import torch

    from cascade.results import write_result
    from cascade.training.resumable_run import use_experiment
    from models.preranking.config_registry import get_cascade_config, with_overrides
    from models.preranking.fields import FieldEncoder, FieldSet
    from models.preranking.fscd_phases import build_network
    from models.preranking.fscd_run import EXPERIMENT
    from models.preranking.inference import (
        COLD_DIR_ARTIFACT,
        log_cold_model,
    )
    from models.preranking.registration import register_and_promote
    from models.preranking.train import evaluate, time_split

    config = with_overrides(
        get_cascade_config(network["training_config"]), epochs=network["epochs"], lr=network["lr"]
    )
    lake = Lake(settings.lake_root)
    write_training_set(frame, declarations, lake, ds)
    fields = FieldSet.from_declarations(declarations or {}, frame)
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
        **register_and_promote(ds, settings=settings),
        "test_auc": test_auc,
        "trainer": "in process, plain Adam, fp32 (the FSCD pre-ranker's network over every "
        "field, no FSCD selection, no compile step)",
    }


def served_fields(settings: Settings, ds: str) -> list[str]:
    """The fields the trained network reads (FSCD's kept ones), as its run's ``result.json``
    names them; empty for a network without a field set (a PreRanker)."""
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
    the bucket bounds holding the median and the 99th percentile, and ``per_request_mean_ms``
    (one read per view per request: the views' means added)."""
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
        "per_request_mean_ms": sum(means) if means else None,
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
