"""Shared fixtures for the Spark job tests (their Spark session, ``spark``, is the suite's:
tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def one_partition_of_cross_statistics(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ctr_cross`` runs here build the partition a test names, not the week before it (the
    production default, ``CASCADE_CROSS_HISTORY_DAYS=7``); a test of the history sets its own."""
    monkeypatch.setenv("CASCADE_CROSS_HISTORY_DAYS", "0")
