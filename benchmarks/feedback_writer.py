"""The serving feedback writer's CPU per request: features copied onto every candidate's row
beside features logged by reference (the item table as a snapshot, the user's features as one
request row), as the pre-ranking server logs them.

    cascade bench feedback-writer --out FILE
    cascade bench feedback-writer --requests 100 --repeats 1 --out FILE  # smoke

``--requests`` requests of ``--candidates`` candidates drawn from an item table of ``--items``
items with ``--item-fields`` numeric columns and a genre, and ``--user-fields`` numeric user
features, are logged into a fresh :class:`serving.feedback.FeedbackLog` (no writer thread:
the rows are written by the closing flush, inside the timed span) in two layouts:

* ``copied``: every item column gathered onto each candidate's row
  (:class:`serving.feedback_rows.Gathered`) and the user's features repeated on it;
* ``by_reference``: the item table as an :class:`serving.feedback_rows.ItemSnapshot` and the user's
  features as ``request_features`` (what :class:`serving.shadow.ServingObserver` logs).

``cpu_ms_per_request``: the process's CPU time (every thread) from the first ``log`` to the
end of the flush, per request; medians per layout over ``--repeats`` rounds, the order
alternating, every run kept; ``copied_over_by_reference`` the ratio of the medians. Both
layouts' rows are read back joined (:func:`serving.feedback_read.with_item_features`,
:func:`serving.feedback_read.with_request_features`) and compared once (``same_rows``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmarks.provenance import provenance, rotated
from serving.feedback import FeedbackConfig, FeedbackLog
from serving.feedback_read import with_item_features, with_request_features
from serving.feedback_rows import ITEM_SNAPSHOT, Coded, Gathered, ItemSnapshot

LAYOUTS = ("copied", "by_reference")
DAY = 1_795_000_000.0
"""A fixed serving time (2026-11-18 UTC): every row goes to one day's folder."""


def requests_of(
    *, requests: int, candidates: int, items: int, item_fields: int, user_fields: int, seed: int
) -> tuple[ItemSnapshot, list[dict[str, Any]]]:
    """The item table and the requests (ids, rows into the table, scores, user features)."""
    rng = np.random.default_rng(seed)
    genres = tuple(f"genre-{g}" for g in range(18))
    columns: dict[str, Any] = {f"item_stat_{j}": rng.random(items) for j in range(item_fields)}
    columns["genre"] = Coded(rng.integers(-1, len(genres), items), genres)
    table = ItemSnapshot(np.arange(1, items + 1, dtype=np.int64), columns)
    drawn = []
    for n in range(requests):
        rows = rng.integers(0, items, candidates)
        drawn.append(
            {
                "request_id": f"r{n}",
                "user_id": int(rng.integers(1, 1000)),
                "item_ids": rows + 1,
                "rows": rows,
                "scores": rng.random(candidates).astype(np.float32),
                "user": {f"user_stat_{j}": float(rng.random()) for j in range(user_fields)},
            }
        )
    return table, drawn


def log_all(root: Path, layout: str, table: ItemSnapshot, drawn: list[dict[str, Any]]) -> float:
    """Log every request in ``layout`` and flush; CPU milliseconds per request."""
    feedback = FeedbackLog(root, FeedbackConfig(flush_s=1e9), clock=lambda: DAY)
    started = time.process_time()
    for request in drawn:
        common = {
            "request_id": request["request_id"],
            "user_id": request["user_id"],
            "item_ids": request["item_ids"],
            "scores": request["scores"],
            "model_version": "1",
        }
        if layout == "copied":
            features: dict[str, Any] = dict(request["user"])
            for name, column in table.columns.items():
                features[name] = (
                    Gathered(request["rows"], column.codes, column.vocabulary)
                    if isinstance(column, Coded)
                    else Gathered(request["rows"], column)
                )
            feedback.log(**common, features=features)
        else:
            feedback.log(**common, request_features=request["user"], items=table)
    feedback.flush()
    return (time.process_time() - started) * 1e3 / len(drawn)


def joined(root: Path) -> pd.DataFrame:
    """Every candidate row of ``root`` with its request's and its item's features, in request
    order (part files have random names) and each request's candidates in their order; the
    item snapshot's name dropped (only the by-reference layout has one)."""
    parts = sorted((root / "feedback").rglob("part-*.parquet"))
    frame = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
    asked = sorted((root / "feedback_requests").rglob("part-*.parquet"))
    frame = with_request_features(frame, pd.concat([pd.read_parquet(p) for p in asked]))
    frame = with_item_features(frame, root).drop(columns=ITEM_SNAPSHOT)
    order = frame["request_id"].str.removeprefix("r").astype(int)
    return frame.iloc[np.argsort(order.to_numpy(), kind="stable")].reset_index(drop=True)


def bench(
    *,
    requests: int,
    candidates: int,
    items: int,
    item_fields: int,
    user_fields: int,
    repeats: int,
    seed: int = 0,
) -> dict[str, Any]:
    table, drawn = requests_of(
        requests=requests,
        candidates=candidates,
        items=items,
        item_fields=item_fields,
        user_fields=user_fields,
        seed=seed,
    )
    runs: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    same_rows = None
    with tempfile.TemporaryDirectory(prefix="feedback-writer-") as tmp:
        for round_ in range(repeats):
            for layout in rotated(LAYOUTS, round_):
                root = Path(tmp) / f"{layout}-{round_}"
                runs[layout].append(log_all(root, layout, table, drawn))
                print(
                    f"[bench feedback-writer] {layout} round {round_ + 1}/{repeats}: "
                    f"{runs[layout][-1]:.3f} ms CPU per request",
                    flush=True,
                )
        copied, by_reference = (joined(Path(tmp) / f"{layout}-0") for layout in LAYOUTS)
        by_reference = by_reference[copied.columns]
        same_rows = bool(copied.equals(by_reference))
    medians = {layout: statistics.median(values) for layout, values in runs.items()}
    result = {
        "benchmark": "feedback_writer",
        "requests": requests,
        "candidates": candidates,
        "items": items,
        "item_fields": item_fields,
        "user_fields": user_fields,
        "cpu_ms_per_request": medians,
        **{f"{layout}_cpu_ms_per_request_runs": values for layout, values in runs.items()},
        "copied_over_by_reference": medians["copied"] / medians["by_reference"],
        "same_rows": same_rows,
        "cpus": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
    }
    parameters = {
        "requests": requests,
        "candidates": candidates,
        "items": items,
        "item_fields": item_fields,
        "user_fields": user_fields,
        "seed": seed,
    }
    return {
        **result,
        **provenance(result, generators=["benchmarks.feedback_writer"], parameters=parameters),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--candidates", type=int, default=1000)
    parser.add_argument("--items", type=int, default=1682)
    parser.add_argument("--item-fields", type=int, default=15)
    parser.add_argument("--user-fields", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if min(args.requests, args.candidates, args.items, args.repeats) < 1:
        parser.error("--requests, --candidates, --items and --repeats must be >= 1")
    result = bench(
        requests=args.requests,
        candidates=args.candidates,
        items=args.items,
        item_fields=args.item_fields,
        user_fields=args.user_fields,
        repeats=args.repeats,
    )
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    keys = ("cpu_ms_per_request", "copied_over_by_reference", "same_rows")
    print(json.dumps({k: result[k] for k in keys}))
    return result


if __name__ == "__main__":
    main()
