"""Partition arithmetic of the kernel."""

from __future__ import annotations

import pytest

from cascade.partitions import days_before


def test_days_before_lists_the_earlier_days_oldest_first_across_a_month() -> None:
    assert days_before("2026-03-02", 3) == ["2026-02-27", "2026-02-28", "2026-03-01"]
    assert days_before("2026-03-02", 0) == []
    with pytest.raises(ValueError):
        days_before("2026-3-2", 1)
