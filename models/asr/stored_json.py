"""The JSON files stored beside an ASR model (vocabulary, n-grams, language identifier) are data:
each is read by :func:`parse_stored_json`, bounded in size, never unpickled."""

from __future__ import annotations

import json
from typing import Any


def parse_stored_json(data: bytes, *, where: str, max_bytes: int | None = None) -> Any:
    """The JSON value of ``data``; ValueError naming ``where`` when it is larger than
    ``max_bytes`` or not UTF-8 JSON."""
    if max_bytes is not None and len(data) > max_bytes:
        raise ValueError(f"{where}: {len(data)} bytes, more than {max_bytes}")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where} is not JSON: {exc}") from None
