"""Every goal a benchmark tests is the one the docs state: one bound per figure, in one place."""

from __future__ import annotations

import re

import pytest

from benchmarks.goals import GOALS, SIGNS, Goal, goal, goals_of
from benchmarks.provenance import REPO_ROOT

STATED = re.compile(r"`?(?P<figure>\w+)`?\s*(?P<op>>=|≥|<=|≤)\s*(?P<bound>\d+(?:\.\d+)?)\b")
"""A goal written in a page: ``figure >= bound`` or ```figure` ≥ bound``."""


def test_goal_keys_and_figures_are_unique() -> None:
    keys = [g.key for g in GOALS]
    assert len(keys) == len(set(keys))
    assert len({(g.benchmark, g.figure) for g in GOALS}) == len(GOALS)


def test_a_goal_without_a_direction_is_refused() -> None:
    with pytest.raises(ValueError, match="op '>' is not one of"):
        Goal(benchmark="x", figure="y", op=">", bound=1.0, key="y_goal_met", meaning="m")
    with pytest.raises(KeyError, match="no goal for 'p50_ms' .goals: p99_ms."):
        goal("serving", "p50_ms")


def test_the_benchmarks_test_the_goals_stated_here() -> None:
    """Each module's constant is the goal of :data:`GOALS` (no second copy of a bound)."""
    from benchmarks import multimodal_moe, preranking_cross, preranking_models, serving_load

    assert preranking_cross.GOAL_AUC_RATIO == goal("preranking", "pipeline_config_auc_ratio").bound
    assert preranking_cross.GOAL_FEATURE_COST_RATIO == 0.5
    assert preranking_models.GOALS == {g.figure: (g.op, g.bound) for g in goals_of("preranking")}
    assert serving_load.GOAL_P99_MS == goal("serving", "p99_ms").bound == 10.0
    assert serving_load.P99_CROSSING_MS == serving_load.GOAL_P99_MS
    # moe_vs_dense_throughput's goal is 70% of the dense twin's steps/s, as the issue that asked
    # for the benchmark set it; 0.76 meets it, 0.69 does not.
    throughput = goal("multimodal", "moe_vs_dense_throughput")
    assert multimodal_moe.THROUGHPUT_GOAL is throughput and throughput.key == "throughput_goal_met"
    assert throughput.met(0.76) and throughput.met(0.7) and not throughput.met(0.69)
    rtf = goal("asr", "rtf_int8")
    assert rtf.key == "goal_rtf_int8_le_0_05" and rtf.met(0.05) and not rtf.met(0.051)


def test_every_goal_written_in_the_docs_is_the_one_the_code_tests() -> None:
    figures = {g.figure: g for g in GOALS}
    pages = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
    seen, wrong = set(), []
    for page in pages:
        for match in STATED.finditer(page.read_text()):
            stated = figures.get(match["figure"])
            if stated is None:
                continue
            seen.add(stated.figure)
            op = {"≥": ">=", "≤": "<="}.get(match["op"], match["op"])
            if (op, float(match["bound"])) != (stated.op, stated.bound):
                where = page.relative_to(REPO_ROOT)
                wrong.append(f"{where}: {match[0]!r}, the code tests {stated.statement()}")
    assert not wrong, "a page states another goal than the code tests:\n" + "\n".join(wrong)
    # The benchmarks page states every goal whose figure a published result has.
    assert {"auc_ratio", "moe_vs_dense_throughput", "p99_ms", "rtf_int8"} <= seen
    assert set(SIGNS) == {">=", "<="}
