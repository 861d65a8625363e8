"""A pickle that leaves a trace: the registry trust tests plant it where a loader might read."""

from __future__ import annotations

import pickle
from pathlib import Path


class Planted:
    """Unpickling it writes ``marker``: the proof that something unpickled it."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (Path.write_text, (Path(self.marker), "unpickled"))


def planted_pickle(marker: Path) -> bytes:
    return pickle.dumps(Planted(str(marker)))
