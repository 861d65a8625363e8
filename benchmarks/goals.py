"""The goals the docs state for benchmark figures, in one place.

Each benchmark that reports whether a goal held (a ``*_goal_met`` key, or the older
``meets_goal`` / ``goal_rtf_int8_le_0_05``) tests its figure against the bound here, and
``benchmarks/docs.py`` states the same bound in the benchmark's block of ``docs/benchmarks.md``,
so code and page cannot disagree.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any

SIGNS = {">=": "≥", "<=": "≤"}


@dataclass(frozen=True, kw_only=True)
class Goal:
    benchmark: str
    """The benchmark whose result holds the figure (``cascade bench NAME``)."""
    figure: str
    """The figure's key in that result."""
    op: str
    """``>=`` (at least the bound) or ``<=`` (at most)."""
    bound: float
    key: str
    """The result key that records whether the goal held."""
    meaning: str
    """What meeting it means, in words (rendered beside the goal)."""

    def __post_init__(self) -> None:
        if self.op not in SIGNS:
            raise ValueError(f"goal {self.key}: op {self.op!r} is not one of {sorted(SIGNS)}")

    def met(self, value: float) -> bool:
        return value >= self.bound if self.op == ">=" else value <= self.bound

    def statement(self) -> str:
        """``figure ≥ bound`` as the docs write it (markdown)."""
        return f"`{self.figure}` {SIGNS[self.op]} {self.bound:g}"


_ROWS: tuple[tuple[str, str, str, float, str, str], ...] = (
    # benchmark, figure, op, bound, key, meaning
    ("preranking", "auc_ratio", ">=", 0.98, "auc_ratio_goal_met",
     "FSCD's test AUC over its teacher's, median over the seeds"),
    ("preranking", "feature_cost_ratio", "<=", 0.5, "feature_cost_ratio_goal_met",
     "FSCD's field-weight sum over the teacher's"),
    ("preranking", "pipeline_config_auc_ratio", ">=", 0.98, "pipeline_config_auc_ratio_goal_met",
     "the deployed pipeline config held to the benchmark config's goal"),
    ("preranking", "pipeline_config_feature_cost_ratio", "<=", 0.5,
     "pipeline_config_feature_cost_ratio_goal_met",
     "the deployed pipeline config's field-weight sum"),
    ("preranking", "cross_lift_same_position", ">=", 0.01, "cross_lift_same_position_goal_met",
     "the crosses' AUC beyond position, both arms seeing position"),
    ("multimodal", "moe_vs_dense_throughput", ">=", 0.7, "throughput_goal_met",
     "the MoE's training steps/s over its dense twin's, same active parameters"),
    ("serving", "p99_ms", "<=", 10.0, "meets_goal",
     "the closed loop's p99 latency at 1 user x 1,000 candidates, 8 clients, median of the "
     "windows"),
    ("serving", "server_cpu_ms_per_request", "<=", 0.6, "server_cpu_goal_met",
     "the server's CPU per answered request in the closed loop"),
    ("serving", "rps", ">=", 2000.0, "rps_goal_met",
     "requests answered per second in the closed loop"),
    ("asr", "rtf_int8", "<=", 0.05, "goal_rtf_int8_le_0_05",
     "the int8 package's real-time factor"),
    ("asr", "cer_seen_speakers_median", "<=", 0.3, "cer_seen_speakers_goal_met",
     "held-out sentences of recorded speakers heard in training: the median of the languages' "
     "CERs over those with at least 60 training minutes"),
    ("asr", "cer_en_over_pocketsphinx", "<=", 1.5, "cer_en_goal_met",
     "the model's CER on the English test clips over PocketSphinx's on the same clips"),
    ("asr", "cer_fp32_detected", "<=", 0.08, "cer_synthetic_goal_met",
     "unseen synthetic voices, each decoded in the language the identifier detected"),
    ("asr", "cer_delta", "<=", 0.5, "cer_delta_goal_met",
     "the int8 package's CER minus the fp32 model's, in points"),
    ("asr", "language_id_accuracy", ">=", 0.95, "language_id_goal_met",
     "test utterances whose language the identifier names right"),
)  # fmt: skip

GOALS: tuple[Goal, ...] = tuple(
    Goal(benchmark=b, figure=f, op=op, bound=x, key=k, meaning=m) for b, f, op, x, k, m in _ROWS
)
"""Every goal a benchmark tests, with the bound the docs state."""


def goals_of(benchmark: str) -> tuple[Goal, ...]:
    """The goals of one benchmark (none: an empty tuple)."""
    return tuple(g for g in GOALS if g.benchmark == benchmark)


def goals_met(
    benchmark: str, figures: Mapping[str, Any], *, skip: Container[str] = ()
) -> dict[str, bool | None]:
    """Each goal of ``benchmark`` (its ``*_goal_met`` key) tested on its figure in ``figures``:
    null where the figure is not a number (a quick run, a missing peer). Keys in ``skip`` (one
    the benchmark tests itself) are left out."""
    met: dict[str, bool | None] = {}
    for stated in goals_of(benchmark):
        if stated.key in skip:
            continue
        value = figures.get(stated.figure)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        met[stated.key] = stated.met(value) if number else None
    return met


def goal(benchmark: str, figure: str) -> Goal:
    """The goal of ``figure`` in ``benchmark``'s result."""
    for candidate in goals_of(benchmark):
        if candidate.figure == figure:
            return candidate
    known = ", ".join(g.figure for g in goals_of(benchmark)) or "none"
    raise KeyError(f"benchmark {benchmark!r} has no goal for {figure!r} (goals: {known})")
