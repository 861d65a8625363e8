"""Which partition a run works on, and the per-partition seed of generated batches."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from cascade.lake import check_ds


def partition_seed(ds: str) -> int:
    """A stable per-partition seed: every day's generated batch differs from the others."""
    return int.from_bytes(hashlib.sha256(check_ds(ds).encode()).digest()[:4], "little")


def days_before(ds: str, days: int) -> list[str]:
    """The ``days`` partitions before ``ds`` (``ds`` itself excluded), oldest first."""
    end = dt.date.fromisoformat(check_ds(ds))
    return [(end - dt.timedelta(days=n)).isoformat() for n in range(days, 0, -1)]


def resolve_partition(
    event_extras: Iterable[Mapping[str, Any]],
    logical_date: dt.datetime | None,
    run_after: dt.datetime | None,
    *,
    lag_days: int = 0,
) -> str:
    """The partition a run works on.

    A run's claimed events name one partition (the claim step never gives a run the events of
    two: :func:`cascade.event_claims.claim_run_events`), and the run works on it; events naming
    several are refused, never settled by taking one of them. A run without event partitions
    takes its logical date (minus ``lag_days``: a monitor works on the day that just ended); a
    manual run without either takes the day it ran after (minus ``lag_days``).
    """
    partitions = sorted(
        {
            str(extra["payload"]["partition"])
            for extra in event_extras
            if isinstance(extra, Mapping)
            and isinstance(extra.get("payload"), Mapping)
            and extra["payload"].get("partition")
        }
    )
    if len(partitions) > 1:
        raise ValueError(
            f"events of {len(partitions)} partitions {partitions[:5]} in one run: each "
            "partition is built by its own run (claim them with claim_run_events)"
        )
    if partitions:
        return check_ds(partitions[0])
    return own_partition(logical_date, run_after, lag_days=lag_days)


def own_partition(
    logical_date: dt.datetime | None, run_after: dt.datetime | None, *, lag_days: int = 0
) -> str:
    """A run's own partition: its logical date, else the day it ran after, minus ``lag_days``."""
    for moment in (logical_date, run_after):
        if moment is not None:
            return (moment.date() - dt.timedelta(days=lag_days)).isoformat()
    raise ValueError("cannot resolve a partition: no event partition, logical date or run_after")
