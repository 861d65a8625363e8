"""What the importers (:mod:`jobs.speech_landing`, :mod:`jobs.image_landing`) share: the checks
on the landing folder and on item names, and the reading of JSON lines with a reason for each
line that is not a JSON object."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cascade.lake import check_ds
from jobs.quarantine import LandingQuarantine


def check_landing(dest: Path, ds: str) -> None:
    """ValueError unless ``ds`` is a partition date and ``dest`` an existing empty folder."""
    check_ds(ds)
    if not dest.is_dir():
        raise ValueError(f"{dest}: the landing folder does not exist: create it first")
    if any(dest.iterdir()):
        raise ValueError(f"{dest}: the landing folder is not empty: land into an empty folder")


def file_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a file in a landed folder (None when it can)."""
    if not name or name != name.strip():
        return "empty or padded with spaces"
    if "/" in name or "\\" in name or "\0" in name:
        return "holds a path separator"
    if name.startswith("."):
        return "starts with a dot"
    return None


def text_lines(path: Path) -> list[str]:
    """The lines of the UTF-8 text file ``path``; a one-line ValueError naming it otherwise."""
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}): save it as UTF-8"
        ) from None


def json_records(
    path: Path, quarantine: LandingQuarantine, area: str
) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, object)`` for each JSON object line of ``path`` (``where`` is ``NAME line N``);
    any other non-blank line is quarantined as ``AREA: bad line (...)``."""
    for number, line in enumerate(text_lines(path), 1):
        if not line.strip():
            continue
        where = f"{path.name} line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            quarantine.add(where, f"{area}: bad line (not JSON: {exc.msg})")
            continue
        if not isinstance(record, dict):
            quarantine.add(where, f"{area}: bad line (not a JSON object)")
            continue
        yield where, record
