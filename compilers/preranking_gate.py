"""The pipeline's compile step: compile the model trained for a partition, gate it, record it.

    cascade step compile --pipeline ctr_preranking --ds 2026-11-22

Runs after ``train`` and before ``register``: builds the request-shaped AOTInductor artifact of
the trained FSCD pre-ranker (ColdPreRanker), runs :func:`compilers.gate.compile_cold_gate` on
held-out requests of the partition's training set (the rows the model was not trained on),
logs the artifact and the gate report to the training's MLflow run
(``compiled/preranking.pt2``, ``compiled/gate.json``: the server downloads and scores with a
passed package, built under the server's per-process thread count
``CASCADE_SERVING_TORCH_THREADS``), and writes
``Lake.reports("compile", ds) / "result.json"``. A failed gate does not fail the task: the
registry reads the report and keeps the champion, stating the gate's reasons
(:mod:`cascade.registry`), so the run shows what was blocked and why.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from cascade.artifacts import sha256_file
from cascade.config import Settings, load_settings
from cascade.lake import Lake, check_ds
from compilers.export import torch_threads

MAX_USERS = 300
"""Held-out users (one request each) the gate scores: enough for a stable AUC, bounded time."""


def cold_gate_sample(frame: Any, encoder: Any, *, max_users: int = MAX_USERS) -> list[Any]:
    """Held-out requests of the ``max_users`` users with the most held-out impressions, for the
    FSCD pre-ranker: ``((user_codes [1, F], candidate_codes [N, F]), labels [N])`` per user,
    the user's fields as of its first held-out row; deterministic for a given frame."""
    from domains.ctr.schema import LABEL

    counts = frame.groupby("user_id").size().sort_values(ascending=False, kind="stable")
    chosen = frame[frame["user_id"].isin(set(counts.index[:max_users].tolist()))]
    codes = encoder.encode(chosen)
    labels = chosen[LABEL].to_numpy()
    sample = []
    for positions in chosen.reset_index(drop=True).groupby("user_id", sort=True).indices.values():
        user_codes = codes[positions]
        sample.append(((user_codes[:1], user_codes), labels[positions]))
    return sample


def compile_and_gate(ds: str, *, settings: Settings | None = None) -> dict[str, Any]:
    """Compile and gate the model trained for ``ds``; returns and writes the gate's report."""
    import mlflow

    from compilers.gate import compile_cold_gate
    from models.preranking.inference import (
        COMPILED_DIR,
        COMPILED_PACKAGE,
        load_trained,
    )
    from models.preranking.model import ColdPreRanker
    from models.preranking.registration import held_out_rows
    from models.preranking.training_set import read_complete_result

    check_ds(ds)
    settings = settings or load_settings()
    lake = Lake(settings.lake_root)
    trained_dir = lake.reports("train", ds)
    trained = read_complete_result(trained_dir / "result.json", ds)
    if trained is None:
        raise FileNotFoundError(
            f"no complete training result in {trained_dir}; run the train step for ds={ds}"
        )
    loaded = load_trained(trained_dir)
    if not isinstance(loaded.model, ColdPreRanker):
        raise ValueError(
            f"the model trained for ds={ds} in {trained_dir} is a {type(loaded.model).__name__}, "
            "which the pipeline neither compiles nor serves; run the train step again (it "
            "trains the FSCD pre-ranker)"
        )
    rows = held_out_rows(lake, ds, loaded.test_fraction)
    out = lake.reports("compile", ds)
    out.mkdir(parents=True, exist_ok=True)
    cache = settings.home / "compile-cache"
    # The server loads this package and runs it on one thread per process: build it (the
    # thread count is baked into its kernels) and time it against eager the same way.
    sample = cold_gate_sample(rows, loaded.encoder)
    with torch_threads(settings.serving.torch_threads):
        report = compile_cold_gate(loaded.model, sample, out_dir=out, cache_dir=cache)
    report = {
        # NaN (AUC undefined) and inf (broken parity) as null: the report travels as JSON.
        **{
            k: None if isinstance(v, float) and not math.isfinite(v) else v
            for k, v in report.items()
        },
        "ds": ds,
        "run_id": trained["run_id"],
        "requests": len(sample),
        # The package this gate ran, as registration must copy it from the run (then signed).
        "tested": {f"{COMPILED_DIR}/{COMPILED_PACKAGE}": sha256_file(report["artifact"])},
    }

    client = mlflow.MlflowClient(tracking_uri=settings.tracking_uri)
    client.log_artifact(trained["run_id"], report["artifact"], artifact_path="compiled")
    client.log_text(
        trained["run_id"], json.dumps(report, indent=2, default=str), "compiled/gate.json"
    )
    for key in ("speedup_vs_eager", "auc_delta", "max_abs_diff"):
        value = report.get(key)
        if value is not None:
            client.log_metric(trained["run_id"], f"compile_{key}", float(value))
    client.set_tag(trained["run_id"], "compile_gate", "passed" if report["passed"] else "failed")
    _write(out / "result.json", report)
    if not report["passed"]:
        print(f"[compile] ds={ds}: gate FAILED: " + "; ".join(report["reasons"]), flush=True)
    else:
        print(
            f"[compile] ds={ds}: gate passed: {report['speedup_vs_eager']:.2f}x eager, "
            f"max |diff| {report['max_abs_diff']:.2g}, AUC delta {report['auc_delta']}",
            flush=True,
        )
    return report


def _write(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=2, default=str))
    os.replace(tmp, path)
