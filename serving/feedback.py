"""Serving feedback in the lake: what was scored (and by which version), and the clicks joined
later; the monitor reads both.

    lake/feedback/preranking/dt=YYYY-MM-DD/part-*.parquet   one row per scored candidate
    lake/clicks/preranking/dt=YYYY-MM-DD/part-*.parquet     (request_id, item_id, click)

The server calls :meth:`FeedbackLog.log` per request; rows are buffered and written as one
parquet part per flush (never rewritten), so a crash loses at most one unflushed buffer and
readers never see half a file (write to a temporary name, then rename).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cascade.config import Settings, load_settings
from cascade.lake import check_ds

MODEL = "preranking"


@dataclass(kw_only=True)
class FeedbackConfig:
    """Buffering of the feedback writer."""

    flush_rows: int = 2000
    """Write a part file once this many candidate rows are buffered."""
    flush_s: float = 10.0
    """...or once the oldest buffered row is this old (checked on each log call)."""

    def __post_init__(self) -> None:
        if self.flush_rows < 1 or self.flush_s <= 0:
            raise ValueError("flush_rows must be >= 1 and flush_s > 0")


def feedback_dir(root: Path, kind: str, ds: str) -> Path:
    if kind not in ("feedback", "clicks"):
        raise ValueError(f"unknown feedback kind {kind!r}")
    return root / kind / MODEL / f"dt={check_ds(ds)}"


def _write_part(folder: Path, frame: pd.DataFrame) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    name = f"part-{uuid.uuid4().hex}.parquet"
    tmp = folder / f".{name}.tmp"
    frame.to_parquet(tmp, index=False)
    tmp.replace(folder / name)
    return folder / name


class FeedbackLog:
    """Thread-safe buffered writer of scored candidates."""

    def __init__(
        self, lake_root: Path, config: FeedbackConfig | None = None, *, clock: Any = time.time
    ) -> None:
        self.lake_root = lake_root
        self.config = config or FeedbackConfig()
        self._clock = clock
        self._rows: list[dict[str, Any]] = []
        self._oldest: float | None = None
        self._lock = threading.Lock()

    def log(
        self,
        *,
        request_id: str,
        user_id: int,
        item_ids: Sequence[int] | np.ndarray,
        scores: Sequence[float] | np.ndarray,
        model_version: str,
        features: Mapping[str, Sequence[Any]] | None = None,
        shadow_version: str | None = None,
        shadow_scores: Sequence[float] | np.ndarray | None = None,
    ) -> None:
        now = self._clock()
        ts = dt.datetime.fromtimestamp(now, dt.UTC)
        rows = []
        for i, (item, score) in enumerate(zip(item_ids, scores, strict=True)):
            row: dict[str, Any] = {
                "ts": ts,
                "request_id": request_id,
                "user_id": int(user_id),
                "item_id": int(item),
                "score": float(score),
                "model_version": model_version,
                "shadow_version": shadow_version,
                "shadow_score": None if shadow_scores is None else float(shadow_scores[i]),
            }
            for name, values in (features or {}).items():
                row[name] = values[i]
            rows.append(row)
        with self._lock:
            self._rows.extend(rows)
            self._oldest = self._oldest if self._oldest is not None else now
            due = (
                len(self._rows) >= self.config.flush_rows
                or now - self._oldest >= self.config.flush_s
            )
        if due:
            self.flush()

    def flush(self) -> list[Path]:
        """Write buffered rows, one part per serving day; returns the files written."""
        with self._lock:
            rows, self._rows, self._oldest = self._rows, [], None
        if not rows:
            return []
        frame = pd.DataFrame(rows)
        written = []
        for ds, part in frame.groupby(frame["ts"].dt.strftime("%Y-%m-%d")):
            written.append(
                _write_part(
                    feedback_dir(self.lake_root, "feedback", str(ds)), part.reset_index(drop=True)
                )
            )
        return written


def log_clicks(ds: str, clicks: pd.DataFrame, *, settings: Settings | None = None) -> Path:
    """Append the clicks observed for serving day ``ds`` (columns request_id, item_id, click)."""
    missing = {"request_id", "item_id", "click"} - set(clicks.columns)
    if missing:
        raise ValueError(f"clicks frame lacks columns {sorted(missing)}")
    settings = settings or load_settings()
    return _write_part(
        feedback_dir(settings.lake_root, "clicks", ds), clicks.reset_index(drop=True)
    )


def _read_folder(folder: Path) -> pd.DataFrame:
    parts = sorted(folder.glob("part-*.parquet"))
    if not parts:
        return pd.DataFrame()
    return pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)


def load_joined_feedback(ds: str, *, settings: Settings | None = None) -> pd.DataFrame:
    """Scored candidates of day ``ds`` with their click (0 when none was reported)."""
    settings = settings or load_settings()
    scored = _read_folder(feedback_dir(settings.lake_root, "feedback", ds))
    if scored.empty:
        return scored
    clicks = _read_folder(feedback_dir(settings.lake_root, "clicks", ds))
    if clicks.empty:
        scored["click"] = 0
        return scored
    clicks = clicks.groupby(["request_id", "item_id"], as_index=False)["click"].max()
    joined = scored.merge(clicks, on=["request_id", "item_id"], how="left")
    joined["click"] = joined["click"].fillna(0).astype(int)
    return joined


def load_reference(*, settings: Settings | None = None) -> pd.DataFrame:
    """The newest training set of the model: the distribution the champion learned from."""
    settings = settings or load_settings()
    root = settings.lake_root / "training" / MODEL
    partitions = sorted(root.glob("dt=*"))
    if not partitions:
        raise FileNotFoundError(
            f"no training set under {root}; run `cascade step training_set --ds DS` first"
        )
    return pd.read_parquet(partitions[-1])
