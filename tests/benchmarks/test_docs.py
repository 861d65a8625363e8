"""docs/benchmarks.md shows what the JSON it names holds, and `make bench` regenerates it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import docs
from benchmarks.goals import GOALS, Goal
from benchmarks.provenance import REPO_ROOT

FIXTURE = {
    "benchmark": "ctr",
    "quick": False,
    "sizes": [
        {"impressions": 1000000, "job_s": 16.0, "job_s_runs": [15.9, 16.0, 19.8], "ratio": 14.0}
    ],
    "machine": {"cpu_model": "Test CPU 9000", "usable_cpus": 2, "cuda_device": None},
    "git_commit": "0123456789abcdef0123456789abcdef01234567",
    "git_dirty": False,
    "input_digest": "sha256:feedfacecafe00",
    "inputs": {
        "parameters": {
            "quick": False,
            "CASCADE_BENCH_CTR_SIZES": "1000000",
            "CASCADE_BENCH_CTR_REPEATS": "3",
        }
    },
    "model_digest": None,
    "repeats": 3,
    "spread": {"sizes.0.job_s": {"min": 15.9, "median": 16.0, "max": 19.8, "n": 3}},
}


def test_a_block_shows_the_command_provenance_and_every_figure() -> None:
    block = docs.render_block(FIXTURE, "ctr", "docs/results/ctr.json")
    assert block.startswith("<!-- bench ctr: docs/results/ctr.json -->")
    assert block.endswith("<!-- end bench ctr -->")
    assert (
        "cascade bench ctr --repeats 3 --impressions 1000000 --out bench-results/ctr.json" in block
    )
    assert "Test CPU 9000, 2 cores, no GPU; commit `0123456789ab`" in block
    assert "inputs `feedfacecafe`" in block and "model none" in block
    assert "| `job_s [impressions=1000000]` | 16 | 15.9–19.8 | 3 |" in block
    assert "| `ratio [impressions=1000000]` | 14 | — | 1 |" in block


def test_publish_copies_charts_and_renders_and_a_stale_page_is_caught(tmp_path: Path) -> None:
    results = tmp_path / "bench-results"
    results.mkdir()
    (results / "ctr.json").write_text(json.dumps(FIXTURE))
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n\nProse kept as written.\n")
    assert docs.publish(results, page, root=tmp_path) == ["ctr"]
    text = page.read_text()
    assert "Prose kept as written." in text
    assert "<!-- bench ctr: docs/results/ctr.json -->" in text
    assert "| `job_s [impressions=1000000]` | 16 | 15.9–19.8 | 3 |" in text
    assert (results / "ctr.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "docs" / "results" / "ctr.png").is_file()
    assert "![ctr](results/ctr.png)" in text  # a link inside the docs site
    assert docs.render_page(text, tmp_path) == text  # rendering again changes nothing

    # The JSON changes: the page no longer equals what it names.
    changed = dict(FIXTURE, sizes=[dict(FIXTURE["sizes"][0], job_s=17.5)])  # type: ignore[arg-type]
    (tmp_path / "docs" / "results" / "ctr.json").write_text(json.dumps(changed))
    assert docs.render_page(text, tmp_path) != text

    with pytest.raises(FileNotFoundError, match="names docs/results/gone.json"):
        docs.render_page("<!-- bench gone: docs/results/gone.json -->\n<!-- end bench gone -->")


def test_the_committed_page_equals_the_json_it_names() -> None:
    page = (REPO_ROOT / "docs" / "benchmarks.md").read_text()
    blocks = list(docs.BLOCK.finditer(page))
    assert blocks, "docs/benchmarks.md has no generated block"
    for block in blocks:
        assert (REPO_ROOT / block["path"]).is_file(), f"{block['path']} is not in the repository"
    assert docs.render_page(page) == page, "run: python -m benchmarks.docs"


def test_the_committed_view_blocks_equal_the_json_they_name() -> None:
    pages = docs.view_pages()
    assert pages, "no docs page shows a bench-view block"
    for page in pages:
        text = (REPO_ROOT / page).read_text()
        assert docs.render_views(text, page) == text, "run: python -m benchmarks.docs"


def test_the_latency_by_load_view_shows_each_step_and_where_p99_crosses_the_goal(
    tmp_path: Path,
) -> None:
    steps = [
        {"offered_rps": 300.0, "achieved_rps": 299.5, "p50_ms": 2.0, "p99_ms": 4.5, "errors": 0},
        {"offered_rps": 900.0, "achieved_rps": 880.0, "p50_ms": 6.0, "p99_ms": 16.0, "errors": 0},
    ]
    result = dict(
        FIXTURE,
        benchmark="serving",
        latency_by_load=steps,
        p99_crossing={
            "p99_ms": 10.0,
            "within_up_to_rps": 299.5,
            "over_from_rps": 880.0,
            "crossing_rps": 618.9,
        },
    )
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "serving.json").write_text(json.dumps(result))
    page = Path("docs") / "operations" / "serving.md"
    (tmp_path / page.parent).mkdir()
    marker = "<!-- bench-view latency-by-load serving: docs/results/serving.json -->"
    end = "<!-- end bench-view latency-by-load serving -->"
    (tmp_path / page).write_text(f"# Serving\n\nProse.\n\n{marker}\nstale\n{end}\n")
    assert docs.rerender_views(tmp_path) == [page]
    text = (tmp_path / page).read_text()
    assert "stale" not in text and "Prose." in text
    assert "[`serving.json`](../results/serving.json)" in text  # a link from the page's folder
    assert "| 300 | 299.5 | 2 | 4.5 | 0 | — | — |" in text
    assert "p99 stays within 10 ms up to 299.5 requests/s and is over it at 880 requests/s" in text
    assert "crosses 10 ms at 618.9 requests/s." in text
    assert docs.rerender_views(tmp_path) == []  # rendering again changes nothing
    # A result from before the steps says so instead of a table.
    (tmp_path / "docs" / "results" / "serving.json").write_text(json.dumps(FIXTURE))
    docs.rerender_views(tmp_path)
    assert "no open-loop steps (`latency_by_load`)" in (tmp_path / page).read_text()


def test_the_readme_headline_view_shows_figures_with_their_goals_and_names_missing_ones(
    tmp_path: Path,
) -> None:
    result = dict(
        FIXTURE,
        benchmark="preranking",
        cross_lift_same_position=0.004,
        auc_ratio=0.991,
        ml100k_cross_lift=0.02,
    )
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "preranking.json").write_text(json.dumps(result))
    marker = "<!-- bench-view headline preranking: docs/results/preranking.json -->"
    end = "<!-- end bench-view headline preranking -->"
    (tmp_path / "README.md").write_text(f"# Project\n\n{marker}\nstale\n{end}\n")
    assert docs.rerender_views(tmp_path) == [Path("README.md")]
    text = (tmp_path / "README.md").read_text()
    assert "stale" not in text and "[`preranking.json`](docs/results/preranking.json)" in text
    assert (
        "| `cross_lift_same_position` | 0.004 | `cross_lift_same_position` ≥ 0.01: not met |"
        in (text)
    )
    assert "| `auc_ratio` | 0.991 | `auc_ratio` ≥ 0.98: met |" in text
    assert "| `ml100k_cross_lift` | 0.02 | — |" in text
    assert "Not in this result (it predates them): `feature_cost_ratio`" in text
    assert docs.rerender_views(tmp_path) == []


def test_a_block_notes_the_planted_effects_goals_and_failed_peers_it_has() -> None:
    result = {
        "cross_lift": 0.12,
        "cross_lift_same_position": 0.004,
        "cross_setup": {"planted": ["position: P(click) = position^-0.7", "user x genre"]},
        "auc_ratio": 0.99,
        "auc_ratio_goal_met": True,
        "cross_lift_same_position_goal_met": False,
    }
    block = docs.render_block(result, "preranking", "docs/results/preranking.json")
    assert "| `cross_lift_same_position` | 0.004 | — | 1 |" in block
    assert "position^-0.7; user x genre." in block
    assert "- Goal `auc_ratio` ≥ 0.98 (FSCD's test AUC over its teacher's, median over" in block
    assert "median over the seeds): met (`auc_ratio_goal_met`)." in block
    assert "`cross_lift_same_position` ≥ 0.01 (" in block and "not met (`cross_lift" in block
    assert "feature_cost_ratio" not in block  # absent from the result: no line
    compiled = docs.render_block(
        {"best_int8_peer": "onnxruntime_static_int8", "peers_failed": {"x": "no AVX-512"}},
        "compilers",
        "docs/results/compilers.json",
    )
    assert "Best int8 peer (`best_int8_peer`): onnxruntime_static_int8." in compiled
    assert "(`peers_failed`): x: no AVX-512." in compiled
    assert docs.notes({}, "compilers") == []


@pytest.mark.parametrize("stated", GOALS, ids=lambda g: g.key)
def test_each_block_states_its_goal_and_tests_the_figure_against_it(stated: Goal) -> None:
    """The page states the bound of :data:`benchmarks.goals.GOALS` and judges the figure by it;
    a result whose own key was computed against another bound is called out, not repeated."""
    step = abs(stated.bound) * 0.01 or 0.01
    inside = stated.bound + (step if stated.op == ">=" else -step)
    outside = stated.bound - (step if stated.op == ">=" else -step)
    assert stated.met(stated.bound) and stated.met(inside) and not stated.met(outside)
    path = f"docs/results/{stated.benchmark}.json"
    agreeing = docs.render_block({stated.figure: inside, stated.key: True}, stated.benchmark, path)
    assert f"- Goal {stated.statement()} ({stated.meaning}): met (`{stated.key}`)." in agreeing
    stale = docs.render_block({stated.figure: outside, stated.key: True}, stated.benchmark, path)
    assert f"not met (`{stated.key}`); the result's own key says met" in stale


def test_the_page_names_each_result_s_commit_and_flags_a_mixed_set() -> None:
    clean = {"git_commit": "a" * 40, "git_dirty": False}
    same = docs.commits_line([("ctr", clean), ("serving", clean)])
    assert same == (
        "Results by commit: `aaaaaaaaaaaa` ctr, serving. "
        "One published set: one commit, a clean tree."
    )
    mixed = docs.commits_line(
        [("ctr", clean), ("serving", {"git_commit": "b" * 40, "git_dirty": True}), ("asr", clean)]
    )
    assert mixed.startswith(
        "Results by commit: `aaaaaaaaaaaa` ctr, asr; `bbbbbbbbbbbb` serving (uncommitted changes)."
    )
    flag = "**Not one published set**: 2 commits and 1 from a tree with uncommitted changes"
    assert flag in mixed
    page = (
        "# B\n\n<!-- results-commits:start -->\nstale\n<!-- results-commits:end -->\n\n"
        "<!-- bench ctr: docs/results/ctr.json -->\n<!-- end bench ctr -->\n"
    )
    rendered = docs.render_page(page)
    assert "stale" not in rendered
    committed = json.loads((REPO_ROOT / "docs/results/ctr.json").read_text())
    assert f"Results by commit: `{committed['git_commit'][:12]}` ctr." in rendered


def test_a_block_says_how_busy_the_machine_was_when_the_result_has_it() -> None:
    load = {"load_average_mean": 3.21, "load_average_max": 5.5, "usable_cpus": 2}
    text = docs.render_block(dict(FIXTURE, machine_load=load), "ctr", "docs/results/ctr.json")
    assert "repeats 3; load average 3.21 (max 5.5) on 2 cores." in text
    assert "load average" not in docs.render_block(FIXTURE, "ctr", "docs/results/ctr.json")
