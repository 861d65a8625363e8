"""Result files written atomically: a crash never leaves a half-written result that looks
complete (every step summary, training result and run marker goes through here)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_result(path: Path, result: Any) -> None:
    """Write ``result`` as indented JSON to ``path`` through a temporary file and a rename
    (values JSON does not know, such as paths and dates, as their ``str``)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str))
    os.replace(tmp, path)
