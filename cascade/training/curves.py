"""Training curves on disk, beside a run's results: what ``dvc plots show`` draws.

A trainer's rank 0 gives :class:`CurveLog` the values it logs to MLflow; each phase gets one CSV,
``OUT/curves/<phase>.csv``, with a ``step`` column and one column per value. A phase resumed from
a checkpoint continues its file: the rows a killed attempt wrote past the step it resumes from
are dropped first, so a resumed run's file is the one an uninterrupted run writes.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from pathlib import Path

CURVES_DIR = "curves"


class CurveLog:
    """Append ``step`` rows per phase under ``out/curves``."""

    def __init__(self, out: Path) -> None:
        self.folder = out / CURVES_DIR
        self._columns: dict[str, list[str]] = {}

    def path(self, phase: str) -> Path:
        return self.folder / f"{phase or 'train'}.csv"

    def add(self, step: int, values: Mapping[str, float], *, phase: str = "") -> None:
        """Record ``values`` at ``step``; the first row of a phase in this process fixes its
        columns (later keys are ignored, missing ones left empty)."""
        path = self.path(phase)
        columns = self._columns.get(phase)
        if columns is None:
            columns = self._start(path, step, sorted(values))
            self._columns[phase] = columns
        row = [str(step)] + [_cell(values.get(c)) for c in columns[1:]]
        with path.open("a", newline="") as handle:
            csv.writer(handle).writerow(row)

    def _start(self, path: Path, step: int, keys: list[str]) -> list[str]:
        """Keep a previous attempt's rows before ``step`` and its columns; else a new file."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if path.is_file():
            with path.open(newline="") as handle:
                rows = list(csv.reader(handle))
            if rows and rows[0] and rows[0][0] == "step":
                kept = [r for r in rows[1:] if r and r[0].isdigit() and int(r[0]) < step]
                with path.open("w", newline="") as handle:
                    csv.writer(handle).writerows([rows[0], *kept])
                return rows[0]
        columns = ["step", *keys]
        with path.open("w", newline="") as handle:
            csv.writer(handle).writerow(columns)
        return columns


def _cell(value: float | None) -> str:
    if value is None or not math.isfinite(float(value)):
        return ""
    return repr(float(value))
