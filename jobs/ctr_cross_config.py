"""The cross statistics engine's configuration: the pairs of key columns it counts
(:class:`CrossPair`, the built-in ones and which a source gets), its knobs
(:class:`CrossStatsConfig`), the windows of a partition (:func:`window_text`,
:func:`ds_midnight`) and the feature columns a pair writes (:func:`feature_columns`).
The job is :mod:`jobs.ctr_cross_stats`."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field

from cascade.lake import check_ds
from jobs import ctr_log_sources as sources

MICROS_PER_DAY = 86_400_000_000
TIMESTAMP = "event_timestamp"


class EmptyBatch(RuntimeError):
    """No clean row of the log falls in the longest window: there is nothing to publish."""


@dataclass(frozen=True, kw_only=True)
class CrossPair:
    """One explicit cross: the key columns it groups by and the prefix of its feature columns."""

    name: str
    """Prefix of the output columns and the lake folder (letters, digits, underscores)."""
    keys: tuple[str, ...]
    """Key columns from the input schema, e.g. ``("user_segment", "item_category")``."""

    def __post_init__(self) -> None:
        if not self.name.replace("_", "").isalnum():
            raise ValueError(f"pair name {self.name!r} must be letters, digits and underscores")
        unknown = [k for k in self.keys if k not in sources.LOG_COLUMNS or k == TIMESTAMP]
        if not self.keys or unknown or "click" in self.keys:
            raise ValueError(
                f"pair {self.name!r}: keys {self.keys} must be columns of the input schema "
                f"{sources.LOG_COLUMNS} other than click and {TIMESTAMP}"
            )


USER = CrossPair(name="user", keys=("user_id",))
"""The user's own statistics: the one-key pair on ``user_id`` (a user-side field)."""
ITEM = CrossPair(name="item", keys=("item_id",))
"""The item's own statistics: the one-key pair on ``item_id`` (an item-side field)."""
SEG_CAT = CrossPair(name="seg_cat", keys=("user_segment", "item_category"))
USER_CAT = CrossPair(name="user_cat", keys=("user_id", "item_category"))
SEG_ITEM = CrossPair(name="seg_item", keys=("user_segment", "item_id"))
CTX_ITEM = CrossPair(name="ctx_item", keys=("context", "item_id"))
ITEM_POS = CrossPair(name="item_pos", keys=("item_id", "position"))
CROSSES = (SEG_CAT, USER_CAT, SEG_ITEM, CTX_ITEM, ITEM_POS)
"""The two-key pairs."""
GENERATED_PAIRS = (USER, ITEM, *CROSSES)
"""Every built-in pair: the user's and the item's own statistics, then the crosses (what a
generated log, which fills every column, gets)."""
ML100K_PAIRS = (USER, ITEM, SEG_CAT, USER_CAT, SEG_ITEM)
"""ML-100k has no positions and no contexts, so only user/item attribute crosses."""
PAIRS_BY_NAME = {pair.name: pair for pair in GENERATED_PAIRS}


def pairs_for(source: sources.LogSource, provided: Sequence[str]) -> tuple[CrossPair, ...]:
    """The pairs a source gets: the ones it names, else every built-in pair whose keys the log
    provides (a log without positions gets no ``item_pos``)."""
    if source.pairs is not None:
        unknown = [name for name in source.pairs if name not in PAIRS_BY_NAME]
        if unknown:
            raise ValueError(
                f"source {source.name!r} names pairs {unknown}; known: {sorted(PAIRS_BY_NAME)}"
            )
        return tuple(PAIRS_BY_NAME[name] for name in source.pairs)
    usable = tuple(p for p in GENERATED_PAIRS if set(p.keys) <= set(provided))
    if not usable:
        raise ValueError(
            f"source {source.name!r} provides {list(provided)}: no built-in pair can be keyed "
            f"({[(p.name, p.keys) for p in GENERATED_PAIRS]}); map more columns"
        )
    return usable


def window_text(ds: str, windows: Sequence[int]) -> str:
    """What the windows of partition ``ds`` cover, in words (ds itself is never inside)."""
    end = dt.date.fromisoformat(check_ds(ds))
    last = end - dt.timedelta(days=1)
    spans = [f"{w}d = {end - dt.timedelta(days=w)} .. {last}" for w in windows]
    return f"windows end at {ds} 00:00 UTC, exclusive ({'; '.join(spans)})"


@dataclass(kw_only=True)
class CrossStatsConfig:
    """Knobs of the cross statistics engine."""

    pairs: tuple[CrossPair, ...] = GENERATED_PAIRS
    """The crosses to compute; each needs a distinct name and a distinct key set."""
    windows_days: tuple[int, ...] = (1, 7, 30)
    """Window lengths in days, all ending at ds midnight (exclusive)."""
    half_life_days: float = 7.0
    """Half-life of the time-decayed CTR (weight 2 ** (-age / half_life))."""
    max_position: int = 10
    """Positions above this share one examination estimate (and one ``item_pos`` key)."""
    min_prior_strength: float = 1.0
    """Lower clamp on a + b of a fitted prior (keys vary more than a Beta can express)."""
    max_prior_strength: float = 1e6
    """Upper clamp on a + b: used when the data shows no spread between keys at all."""
    output_files: int = 2
    """Parquet files per pair and partition."""
    max_quarantine_fraction: float = 0.01
    """The gate fails the batch when more than this share of input rows is quarantined."""
    row_count_tolerance: float = 0.5
    """The gate fails when a pair's row count moves more than this fraction from the
    previous partition's."""
    aggregate_partitions: int = 200
    """Shuffle partitions of the cross aggregation before AQE coalesces them: an upper bound,
    so large inputs get many small final hash maps (no spill)."""
    aggregate_partition_bytes: int = 16 << 20
    """AQE target of one coalesced reduce partition of the cross aggregation (shuffle bytes)."""
    partial_aggregation: bool = True
    """Aggregate each map task's rows before the shuffle (Spark's partial aggregation). Pays
    when keys repeat within a task, as the one-key and coarse pairs' do; off, every exploded
    row is shuffled (see the module docstring for the measurements)."""
    write_threads: int = 4
    """Pair outputs and the item catalogue written at once (concurrent Spark jobs), so a small
    pair's two-task write does not leave a core idle; 1 writes them one after another."""
    windows: tuple[int, ...] = field(init=False)
    """``windows_days`` sorted and deduplicated (derived; not an argument)."""

    def __post_init__(self) -> None:
        if not self.pairs:
            raise ValueError("CrossStatsConfig.pairs is empty; configure at least one CrossPair")
        names = [p.name for p in self.pairs]
        key_sets = [frozenset(p.keys) for p in self.pairs]
        if len(set(names)) != len(names) or len(set(key_sets)) != len(key_sets):
            raise ValueError(f"pairs need distinct names and key sets, got {self.pairs}")
        if not self.windows_days or min(self.windows_days) < 1:
            raise ValueError(f"windows_days must be >= 1 day each, got {self.windows_days}")
        if self.half_life_days <= 0 or self.max_position < 1:
            raise ValueError("half_life_days must be > 0 and max_position >= 1")
        if not 0 < self.min_prior_strength <= self.max_prior_strength:
            raise ValueError("need 0 < min_prior_strength <= max_prior_strength")
        if self.output_files < 1 or not 0 <= self.max_quarantine_fraction <= 1:
            raise ValueError("output_files must be >= 1, max_quarantine_fraction in [0, 1]")
        if self.row_count_tolerance < 0:
            raise ValueError("row_count_tolerance must be >= 0")
        if self.write_threads < 1:
            raise ValueError("write_threads must be >= 1")
        if self.aggregate_partitions < 1 or self.aggregate_partition_bytes < 1 << 20:
            raise ValueError(
                "aggregate_partitions must be >= 1 and aggregate_partition_bytes >= 1 MiB"
            )
        self.windows = tuple(sorted(set(self.windows_days)))

    @property
    def key_columns(self) -> tuple[str, ...]:
        """Every column some pair groups by, in schema order."""
        used = {k for pair in self.pairs for k in pair.keys}
        return tuple(c for c in sources.LOG_COLUMNS if c in used)


def ds_midnight(ds: str) -> dt.datetime:
    return dt.datetime.combine(dt.date.fromisoformat(check_ds(ds)), dt.time(), dt.UTC)


def feature_columns(pair: CrossPair, windows: Sequence[int]) -> list[str]:
    """The feature columns of one pair, in output order (after the keys and event_timestamp)."""
    per_window = [f"{pair.name}_{s}_{w}d" for w in windows for s in ("imp", "clk", "ctr", "dctr")]
    recency = [f"{pair.name}_days_since_imp", f"{pair.name}_days_since_click"]
    return [*per_window, *recency, f"{pair.name}_decay_ctr"]
