"""Materialization into the local SQLite online store: the packed layout (one row per key,
:mod:`domains.ctr.online_packed`) beside Feast's layout (one row per key and feature), both
written by the bulk engine from the same pair partition.

    cascade bench online-sqlite --rows 1000000 --repeats 3 --out FILE

A ``user_cat`` partition of ``--rows`` keys in the cross-statistics job's schema (15 features,
~15% of the values missing, ``--files`` parquet files; :func:`benchmarks.online_materialize.
write_pair_partition`) is loaded into a fresh store of each layout in turn, ``--repeats``
rounds, the order alternating. ``rows_per_s``: feature rows written per second of writing
(:func:`jobs.ctr_cross_features.materialize_cross`'s ``rows / write_s``, Feast's apply excluded);
medians per layout, every run kept, ``packed_over_feast`` the ratio of the medians.
``store_mb``: the store file's size after the load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.online_materialize import DS, PAIR, write_pair_partition
from benchmarks.provenance import provenance
from cascade.config import Settings
from cascade.lake import Lake
from features.ctr import cross_views
from jobs import ctr_cross_features as cf

LAYOUTS = ("packed", "feast")


def load(home: Path, layout: str) -> dict[str, Any]:
    """One load of the partition in ``home``'s lake into a fresh store of ``layout``."""
    shutil.rmtree(home / "feast", ignore_errors=True)
    settings = Settings(home=home)
    cross = cross_views
    chosen = cross.ONLINE_LAYOUT
    cross.ONLINE_LAYOUT = layout
    try:
        result = cf.materialize_cross(DS, settings=settings, pairs=[PAIR], engine="bulk")
    finally:
        cross.ONLINE_LAYOUT = chosen
    result["store_mb"] = (home / "feast" / "online_store.db").stat().st_size / 2**20
    return result


def bench(rows: int, repeats: int, files: int) -> dict[str, Any]:
    runs: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    sizes: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="online-sqlite-") as tmp:
        home = Path(tmp) / "home"
        write_pair_partition(Lake(Settings(home=home).lake_root), rows, files)
        for round_ in range(repeats):
            for layout in LAYOUTS if round_ % 2 == 0 else reversed(LAYOUTS):
                result = load(home, layout)
                if result["rows"] != rows:
                    raise RuntimeError(f"{layout} wrote {result['rows']} of {rows} rows")
                runs[layout].append(result["rows_per_s"])
                sizes[layout] = result["store_mb"]
                print(
                    f"[bench online-sqlite] {layout}: {result['rows_per_s']:,.0f} rows/s",
                    flush=True,
                )
    medians = {layout: statistics.median(values) for layout, values in runs.items()}
    result = {
        "benchmark": "online_sqlite",
        "pair": PAIR,
        "rows": rows,
        "files": files,
        "cpus": os.cpu_count(),
        "repeats": repeats,
        "rows_per_s": medians,
        **{f"{layout}_rows_per_s_runs": values for layout, values in runs.items()},
        "packed_over_feast": medians["packed"] / medians["feast"],
        "store_mb": sizes,
        "load_average_1m": os.getloadavg()[0],
    }
    return {
        **result,
        **provenance(
            result,
            generators=["benchmarks.online_materialize"],
            parameters={"rows": rows, "files": files},
        ),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    result = bench(args.rows, args.repeats, args.files)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("rows", "rows_per_s", "packed_over_feast")}))
    return result


if __name__ == "__main__":
    main()
