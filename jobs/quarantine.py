"""What the corpus jobs share about quarantined input: the counting key of a reason, and the
landed files Spark's binary reader never shows.

A quarantine reason reads ``AREA: KIND[: detail | (detail)]`` (``audio: truncated: the data
chunk holds ...``, ``image: too small (8x8 < 16 px)``) or ``KIND ...`` (``audio missing``,
``speaking rate 41.0 chars/s out of range``); :func:`reason_key` keeps ``AREA:KIND`` so that a
summary counts each distinct problem once, whatever its numbers.

The importers (:mod:`jobs.speech_landing`, :mod:`jobs.image_landing`) collect what they refuse
in a :class:`LandingQuarantine`: one reason per item, written as ``quarantine.jsonl`` beside the
landed batch (one ``{"item": ..., "reason": ...}`` object per line), and the one error a batch
with nothing good in it ends with.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

QUARANTINE_FILE = "quarantine.jsonl"
"""What an importer refused, beside the batch it landed: one JSON object per item."""

REASON_KEY = re.compile(r"^(?:(?P<area>[a-z]+): )?(?P<kind>[^:(\[0-9'\"]+)")


def reason_key(reason: str) -> str:
    """``audio: truncated: the data chunk holds 3 of 9 frames`` -> ``audio:truncated``."""
    match = REASON_KEY.match(reason)
    if match is None or not match["kind"].strip():
        return reason.split(":")[0].strip() or "unknown"
    kind = match["kind"].strip()
    return f"{match['area']}:{kind}" if match["area"] else kind


def count_reasons(reasons: Iterable[tuple[str, int]]) -> dict[str, int]:
    """``{reason_key: count}`` from ``(reason, count)`` pairs, most frequent first."""
    counts: Counter[str] = Counter()
    for reason, count in reasons:
        counts[reason_key(reason)] += count
    return dict(counts.most_common())


def empty_files(folder: Path, pattern: str = "*") -> list[Path]:
    """The 0-byte files matching ``pattern`` in ``folder``: Spark's ``binaryFile`` source skips
    them, so a job lists them itself to quarantine them as empty rather than lose them."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob(pattern) if p.is_file() and p.stat().st_size == 0)


class LandingQuarantine:
    """The items an importer refused, each with its reason, in the order they were met."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def add(self, item: str, reason: str) -> None:
        # One line each: library messages (libsndfile's, Pillow's) may span several.
        self.items.append((item, " ".join(reason.split())))

    def __len__(self) -> int:
        return len(self.items)

    def by_reason(self) -> dict[str, int]:
        """``{reason_key: count}``, most frequent first."""
        return count_reasons((reason, 1) for _, reason in self.items)

    def write(self, dest: Path) -> None:
        """``dest/quarantine.jsonl`` (also when empty, so a landed batch always says it)."""
        lines = (
            json.dumps({"item": item, "reason": reason}, ensure_ascii=False) + "\n"
            for item, reason in self.items
        )
        (dest / QUARANTINE_FILE).write_text("".join(lines), encoding="utf-8")

    def nothing_landed(self, source: Path, what: str, fix: str) -> ValueError:
        """The one-line error of a batch whose every item was refused."""
        first = self.items[0] if self.items else None
        example = f"; first: {first[0]}: {first[1]}" if first else ""
        return ValueError(
            f"{source}: nothing landed, all {len(self.items)} {what} quarantined "
            f"{self.by_reason()}{example}: {fix}"
        )
