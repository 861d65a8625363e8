"""Borrow the running Spark session or own a new one, for steps and benchmarks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def active_or_new(build: Callable[[], Any]) -> Iterator[Any]:
    """``build()``'s session (a builder's ``getOrCreate``: it returns, and configures, the
    running session when there is one), stopped on exit only when no session was running
    before: a caller's or a test's session is left running."""
    from pyspark.sql import SparkSession

    borrowed = SparkSession.getActiveSession() is not None
    session = build()
    try:
        yield session
    finally:
        if not borrowed:
            session.stop()
