"""Trainings a long benchmark keeps, so that a run cut short resumes from those it finished.

``cascade bench preranking --keep DIR`` (``CASCADE_BENCH_KEEP``) trains each network in a folder
under ``DIR`` and writes ``kept.json`` into it: the commit the code ran from, the training's
inputs (config, seed, processes, digests of the rows and fields it read) and what the benchmark
took from it (its result and the networks' digest). A later run at the same commit, from a
clean tree, with the same inputs, takes that instead of training again; anything else
(another commit, a tree with uncommitted changes, other inputs, a folder without a result)
trains afresh. Timed figures (throughput, scoring latency) are never kept: every run measures
them itself. The result names the folder and how many trainings it reused (``kept_trainings``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.provenance import git_state
from cascade.config import load_settings

MARKER = "kept.json"


def keep_root() -> Path | None:
    """The keep folder of this run (``--keep``), None when trainings are not kept."""
    return load_settings().bench.keep


class KeptTrainings:
    """The trainings of one benchmark run under a keep folder (or none): :meth:`run` reuses
    or trains, and counts which."""

    def __init__(self, root: Path | None, *, state: dict[str, Any] | None = None) -> None:
        self.root = root
        self.state = state if state is not None else git_state()
        self.reused: list[str] = []
        self.trained: list[str] = []

    @property
    def reusable(self) -> bool:
        """Whether kept results may be read: a commit, and no uncommitted change."""
        return bool(self.state.get("git_commit")) and self.state.get("git_dirty") is False

    def marker(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"git_commit": self.state.get("git_commit"), "inputs": inputs}

    def run(
        self, run_dir: Path, inputs: dict[str, Any], train: Callable[[], dict[str, Any]]
    ) -> dict[str, Any]:
        """``run_dir``'s kept result when it was trained at this commit from ``inputs``,
        else ``train()`` (which trains into ``run_dir``, emptied first) with its marker
        written after it."""
        path = run_dir / MARKER
        if self.root is not None and self.reusable and path.exists():
            try:
                kept = json.loads(path.read_text())
            except (OSError, ValueError):
                kept = None
            if (
                isinstance(kept, dict)
                and {k: kept.get(k) for k in ("git_commit", "inputs")} == self.marker(inputs)
                and isinstance(kept.get("result"), dict)
            ):
                print(f"[bench] reusing the training kept in {run_dir}", flush=True)
                self.reused.append(str(run_dir))
                return dict(kept["result"])
        shutil.rmtree(run_dir, ignore_errors=True)
        result = train()
        self.trained.append(str(run_dir))
        if self.root is not None:
            marker = {**self.marker(inputs), "result": result}
            path.write_text(json.dumps(marker, sort_keys=True, default=str))
        return result

    def summary(self) -> dict[str, Any]:
        """``kept_trainings``: the folder, and the trainings reused and trained."""
        return {
            "dir": None if self.root is None else str(self.root),
            "reused": len(self.reused),
            "trained": len(self.trained),
            "reusable": self.root is not None and self.reusable,
            "git_commit": self.state.get("git_commit"),
        }
