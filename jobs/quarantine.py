"""What the corpus jobs share about quarantined input: the counting key of a reason, and the
landed files Spark's binary reader never shows.

A quarantine reason reads ``AREA: KIND[: detail | (detail)]`` (``audio: truncated: the data
chunk holds ...``, ``image: too small (8x8 < 16 px)``) or ``KIND ...`` (``audio missing``,
``speaking rate 41.0 chars/s out of range``); :func:`reason_key` keeps ``AREA:KIND`` so that a
summary counts each distinct problem once, whatever its numbers.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

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
