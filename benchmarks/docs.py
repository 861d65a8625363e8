"""``docs/benchmarks.md``'s figures, rendered from benchmark JSON, and one chart per benchmark.

    python -m benchmarks.docs --results bench-results      # what `make bench` runs last
    python -m benchmarks.docs --charts                     # redraw docs/results/*.png, re-render

For each ``RESULTS/NAME.json`` (a ``cascade bench NAME`` result) this copies the JSON to
``docs/results/NAME.json``, draws ``NAME.png`` beside both (median bars, min-max whiskers where
the result has repeats) and rewrites the block of ``docs/benchmarks.md`` between

    <!-- bench NAME: docs/results/NAME.json -->
    ...
    <!-- end bench NAME -->

from that JSON: the command that reproduces it, where and from what it ran (machine, commit,
input and model digests, repeats) and a table of its headline figures (median, min-max, runs).
Without ``--results`` every block is re-rendered from the JSON its marker names, so the page
always equals the JSON it names (``tests/benchmarks/test_docs.py`` checks that). Prose outside
the blocks is kept as written. Other docs pages may show one part of a result in a
``bench-view`` block (:data:`VIEW`, :data:`VIEWS`), re-rendered the same way.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks import charts
from benchmarks.goals import goals_of
from benchmarks.provenance import REPO_ROOT
from benchmarks.registry import benchmark_options

DOCS = REPO_ROOT / "docs" / "benchmarks.md"
DOCS_RESULTS = Path("docs") / "results"
"""Where the JSON the page names is kept (relative to the repository root)."""

BLOCK = re.compile(
    r"<!-- bench (?P<name>[\w-]+): (?P<path>[^ ]+) -->\n.*?<!-- end bench (?P=name) -->",
    re.DOTALL,
)

VIEW = re.compile(
    r"<!-- bench-view (?P<view>[\w-]+) (?P<name>[\w-]+): (?P<path>[^ ]+) -->\n.*?"
    r"<!-- end bench-view (?P=view) (?P=name) -->",
    re.DOTALL,
)
"""A block of another docs page showing one part of a result (a view of :data:`VIEWS`):

    <!-- bench-view latency-by-load serving: docs/results/serving.json -->
    ...
    <!-- end bench-view latency-by-load serving -->
"""

COMMITS = re.compile(r"<!-- results-commits:start -->\n.*?<!-- results-commits:end -->", re.DOTALL)
"""The page's line naming the commit of every result, rendered from the blocks' JSON."""

FIGURES: dict[str, tuple[str, ...]] = {
    "ctr": (
        "sizes.*.job_s",
        "sizes.*.duckdb_s",
        "sizes.*.spark_vs_duckdb",
        "sizes.*.scan_s",
        "sizes.*.ratio",
        "sizes.*.ns_per_row",
        "sizes.*.peak_rss_mb",
        "sizes.*.pipeline_s",
        "sizes.*.materialize_rows_per_s",
    ),
    "compilers": (
        "eager_ms",
        "inductor_ms",
        "onnxruntime_ms",
        "cascade_ms",
        "cascade_int8_ms",
        "inductor_tuned_ms",
        "onnxruntime_int8_ms",
        "eager_int8_ms",
        "inductor_pt2e_int8_ms",
        "onnxruntime_static_int8_ms",
        "speedup_vs_eager",
        "speedup_vs_inductor",
        "speedup_vs_inductor_tuned",
        "speedup_vs_onnxruntime",
        "speedup_vs_best_fp32_peer",
        "int8_speedup_vs_onnxruntime_int8",
        "int8_speedup_vs_eager_int8",
        "speedup_vs_best_int8_peer",
        "auc_delta",
        "cer_delta",
    ),
    "serving": (
        "p50_ms",
        "p90_ms",
        "p99_ms",
        "rps",
        "errors",
        "server_cpu_ms_per_request",
        "open_loop.rate_rps",
        "open_loop.achieved_rps",
        "open_loop.p50_ms",
        "open_loop.p99_ms",
        "stage_cpu_ms.in_handler",
        "cpu_outside_stages_ms_per_request",
        "binary_vs_json.binary.p99_ms",
        "binary_vs_json.binary.server_cpu_ms_per_request",
    ),
    "asr": (
        "utterances_per_s",
        "rtf_eager",
        "rtf_fp32_artifact",
        "rtf_int8",
        "rtf_onnxruntime",
        "rtf_inductor",
        "cer_fp32",
        "cer_fp32_greedy",
        "cer_int8",
        "cer_delta",
        "cer_seen_speakers_median",
        "cer_seen_speakers_greedy_by_language.cs",
        "cer_en",
        "pocketsphinx_cer_en",
        "cer_en_over_pocketsphinx",
        "cer_fp32_detected",
        "language_id_accuracy",
        "language_id_accuracy_by_part.tuxpaint",
        "rtf_int8_end_to_end",
        "rtf_pocketsphinx_en",
    ),
    "multimodal": (
        "moe_steps_per_s",
        "dense_steps_per_s",
        "moe_vs_dense_throughput",
        "recall_at_1_i2t",
        "recall_at_1_t2i",
        "dense_recall_at_1",
        "expert_load_cv",
    ),
    "multimodal-corpus": (
        "sizes.*.pairs_per_s",
        "sizes.*.wall_s",
        "quarantined",
        "duplicates_removed",
    ),
    "events": (
        "events_per_s",
        "latency_p50_s",
        "latency_p95_s",
        "work_latency_p50_s",
        "lost",
        "duplicates",
        "dead_lettered",
        "partitions_published",
        "runs_started",
        "runs_failed",
        "stalled_runs",
        "unbuildable_events_dead_lettered",
        "broker_kills",
        "lost_across_kills",
        "duplicates_across_kills",
    ),
    "preranking": (
        "torch_samples_per_s",
        "deepspeed_samples_per_s_1proc",
        "ds_vs_torch_throughput",
        "fscd_auc",
        "two_tower_auc",
        "auc_ratio",
        "cost_ratio",
        "feature_cost_ratio",
        "pipeline_config_auc_ratio",
        "pipeline_config_feature_cost_ratio",
        "teacher_request_ms",
        "fscd_request_ms",
        "two_tower_request_ms",
        "latency_ratio_fscd_vs_teacher",
        "flops_ratio_fscd_vs_teacher",
        "auc_with_cross",
        "auc_without_cross",
        "cross_lift",
        "auc_without_cross_same_position",
        "cross_lift_same_position",
        "auc_servable_cross",
        "cross_lift_servable",
        "learned_cross_rare_pair_spearman",
        "explicit_rare_pair_spearman",
        "blend_rare_pair_spearman",
        "cross_lift_by_pair.seg_cat",
        "cross_lift_by_pair.user_cat",
        "cross_lift_by_pair.seg_item",
        "cross_lift_by_pair.ctx_item",
        "cross_lift_by_pair.item_pos",
        "ml100k_auc_with_cross",
        "ml100k_auc_without_cross",
        "ml100k_cross_lift",
        "additive_rare_pair_spearman",
    ),
    "security": (
        "fuzz_requests",
        "fuzz_5xx",
        "fuzz_infer_2xx",
        "oversize_rss_growth_mb",
        "events_fuzzed",
        "events_stalling_a_run",
        "events_through_broker",
        "runs_failed_by_valid_events",
        "partitions_never_built",
        "tampered_artifacts_loaded",
        "world_readable_secrets",
        "unsigned_versions_loaded",
        "registered_files_changed_by_rerun",
        "services_with_registry_write",
        "secrets_on_command_lines",
        "slow_body_slots_held_s",
        "requests_served_during_slow_body_attack",
    ),
    "cluster": (
        "run_s",
        "local_run_s",
        "cluster_vs_local",
        "spark_workers_used",
        "airflow_workers_used",
        "kafka_brokers",
        "online_store",
        "ledger",
        "materialize_rows_per_s",
        "faults_survived",
        "lost",
        "duplicates",
    ),
}
"""Per benchmark: the figures its table shows (dotted paths; ``*`` is every item of a list)."""

NOTES: dict[str, tuple[tuple[str, str], ...]] = {
    "preranking": (
        ("cross_setup.planted", "Effects the generator planted in the log the lifts come from"),
    ),
    "compilers": (
        ("best_fp32_peer", "Best fp32 peer"),
        ("best_int8_peer", "Best int8 peer"),
        (
            "inductor_tuned_options.chose",
            "Tuned Inductor, chosen on a trial",
        ),
        ("peers_failed", "Peers that did not build on this machine"),
    ),
}
"""Per benchmark: what is written under its table when the result has it (a dotted path and
its label): a list as items, a goal as met or not, any other value as it is. The goals of
:data:`benchmarks.goals.GOALS` follow them (:func:`goal_lines`)."""

ITEM_LABELS = ("impressions", "pairs", "utterances", "size")
"""Keys naming a list item in a table (``sizes.0.job_s`` shows as ``job_s [impressions=1000]``)."""


# --- reading a result ------------------------------------------------------------------------


def expand(result: Mapping[str, Any], pattern: str) -> list[tuple[str, str, Any]]:
    """``(path, label, value)`` of each figure ``pattern`` names in ``result``."""
    if "*" not in pattern:
        return [(pattern, pattern, charts.lookup(result, pattern))]
    head, tail = pattern.split(".*.", 1)
    items = charts.lookup(result, head)
    if not isinstance(items, list):
        return []
    found = []
    for index, item in enumerate(items):
        label = next((f"{k}={item[k]}" for k in ITEM_LABELS if k in item), str(index))
        path = f"{head}.{index}.{tail}"
        found.append((path, f"{tail} [{label}]", charts.lookup(result, path)))
    return found


def figures(result: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
    """The numeric figures of ``FIGURES[name]`` present in ``result``, each with its spread."""
    spreads = result.get("spread") or {}
    rows = []
    for pattern in FIGURES.get(name, ()):
        for path, label, value in expand(result, pattern):
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            rows.append({"path": path, "label": label, "value": value, "spread": spreads.get(path)})
    return rows


# --- rendering -------------------------------------------------------------------------------


def number(value: float) -> str:
    """Four significant digits (integers as they are)."""
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return str(value)
    if value == 0 or 1e-3 <= abs(value) < 1e6:
        return f"{value:.4g}"
    return f"{value:.3e}"


def command(result: Mapping[str, Any], name: str) -> str:
    """The command line that reruns ``result``: its options, the other benchmark settings it
    ran under as environment variables, and ``--quick`` when it was quick."""
    parameters = dict((result.get("inputs") or {}).get("parameters") or {})
    option_of = {env: option for option, env in benchmark_options(name).items()}
    env = []
    args = [f"cascade bench {name}"]
    for key, value in sorted(parameters.items()):
        if key == "quick":
            continue
        if key in option_of:
            args.append(f"--{option_of[key]} {value}")
        else:
            env.append(f"{key}={value}")
    if parameters.get("quick") or result.get("quick"):
        args.append("--quick")
    args.append(f"--out bench-results/{name}.json")
    return " ".join([*env, *args])


def page_link(path: str | Path) -> str:
    """``path`` (relative to the repository root) as a link from ``docs/benchmarks.md``: the page
    and its results both live under ``docs/``, so the link stays inside the docs site."""
    target = Path(path)
    if target.parts[:1] == ("docs",):
        return target.relative_to("docs").as_posix()
    return f"../{target.as_posix()}"


def _short(digest: Any) -> str:
    return f"`{str(digest).removeprefix('sha256:')[:12]}`" if digest else "none"


def notes(result: Mapping[str, Any], name: str) -> list[str]:
    """The lines of ``NOTES[name]`` that ``result`` has (none: nothing, not even a blank)."""
    lines: list[str] = []
    for key, label in NOTES.get(name, ()):
        value = charts.lookup(result, key)
        if value is None or value == [] or value == {}:
            continue
        if isinstance(value, bool):
            lines.append(f"- Goal {label}: {'met' if value else 'not met'} (`{key}`).")
        elif isinstance(value, list):
            lines.append(f"- {label} (`{key}`): " + "; ".join(str(item) for item in value) + ".")
        elif isinstance(value, Mapping):
            items = "; ".join(f"{k}: {v}" for k, v in value.items())
            lines.append(f"- {label} (`{key}`): {items}.")
        else:
            lines.append(f"- {label} (`{key}`): {value}.")
    return ["", *lines] if lines else []


def goal_lines(result: Mapping[str, Any], name: str) -> list[str]:
    """One line per goal of ``name`` whose figure ``result`` has: the goal as
    :data:`benchmarks.goals.GOALS` states it, and whether the figure meets it. A result whose own
    ``*_goal_met`` key says otherwise was tested against another bound when it ran: the line
    says so rather than repeat it."""
    lines = []
    for stated in goals_of(name):
        value = charts.lookup(result, stated.figure)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        held = stated.met(value)
        verdict = "met" if held else "not met"
        line = f"- Goal {stated.statement()} ({stated.meaning}): {verdict}"
        recorded = result.get(stated.key)
        if isinstance(recorded, bool):
            line += f" (`{stated.key}`)"
            if recorded != held:
                said = "met" if recorded else "not met"
                line += f"; the result's own key says {said}, tested against another bound"
        lines.append(line + ".")
    return lines


def cpu_and_cores(result: Mapping[str, Any]) -> tuple[Any, Any]:
    """The CPU model and the cores a result's ``machine`` names (usable ones first)."""
    machine = result.get("machine") or {}
    cpu = machine.get("cpu_model") or machine.get("processor")
    return cpu, machine.get("usable_cpus") or machine.get("cpus")


def load_note(result: Mapping[str, Any]) -> str:
    """``; load average M (max X) on N cores`` from the result's ``machine_load``, or nothing
    for a result from before it was recorded."""
    load = result.get("machine_load")
    if not isinstance(load, Mapping) or "load_average_mean" not in load:
        return ""
    mean, top = load["load_average_mean"], load.get("load_average_max")
    cores = load.get("usable_cpus")
    return f"; load average {number(mean)} (max {number(top)}) on {cores} cores"


def render_block(result: Mapping[str, Any], name: str, path: str, root: Path = REPO_ROOT) -> str:
    """The generated part of the page for one benchmark result (``path``: the JSON it names,
    relative to ``root``; its chart is shown when one lies beside it)."""
    commit = result.get("git_commit")
    dirty = " (with uncommitted changes)" if result.get("git_dirty") else ""
    gpu = (result.get("machine") or {}).get("cuda_device") or "no GPU"
    cpu, cores = cpu_and_cores(result)
    lines = [
        f"<!-- bench {name}: {path} -->",
        "```bash",
        command(result, name),
        "```",
        "",
        f"From [`{path}`]({page_link(path)}): {cpu}, "
        f"{cores} cores, {gpu}; commit `{str(commit)[:12]}`{dirty}; "
        f"inputs {_short(result.get('input_digest'))}, "
        f"model {_short(result.get('model_digest'))}; repeats {result.get('repeats')}"
        f"{load_note(result)}.",
        "",
        "| figure | median | min–max | runs |",
        "|---|---|---|---|",
    ]
    for row in figures(result, name):
        spread = row["spread"]
        if spread:
            span = f"{number(spread['min'])}–{number(spread['max'])}"
            lines.append(f"| `{row['label']}` | {number(row['value'])} | {span} | {spread['n']} |")
        else:
            lines.append(f"| `{row['label']}` | {number(row['value'])} | — | 1 |")
    lines += notes(result, name)
    goals = goal_lines(result, name)
    if goals:
        lines += goals if lines[-1].startswith("- ") else ["", *goals]
    chart = Path(path).with_suffix(".png")
    if (root / chart).is_file():
        lines += ["", f"![{name}]({page_link(chart)})"]
    lines.append(f"<!-- end bench {name} -->")
    return "\n".join(lines)


def commits_line(results: list[tuple[str, Mapping[str, Any]]]) -> str:
    """Which commit each of ``results`` (``(benchmark, result)``, in page order) came from, the
    commits with most results first, each result from a tree with uncommitted changes marked;
    flagged when they are not one set (one commit, clean trees)."""
    by_commit: dict[str, list[str]] = {}
    dirty = []
    for name, result in results:
        commit = str(result.get("git_commit") or "unknown")[:12]
        if result.get("git_dirty"):
            dirty.append(name)
            name = f"{name} (uncommitted changes)"
        by_commit.setdefault(commit, []).append(name)
    ordered = sorted(by_commit.items(), key=lambda item: -len(item[1]))
    listed = "; ".join(f"`{commit}` {', '.join(names)}" for commit, names in ordered)
    if len(by_commit) == 1 and not dirty:
        return f"Results by commit: {listed}. One published set: one commit, a clean tree."
    flags = [f"{len(by_commit)} commits"] if len(by_commit) > 1 else []
    if dirty:
        flags.append(f"{len(dirty)} from a tree with uncommitted changes ({', '.join(dirty)})")
    return (
        f"Results by commit: {listed}. **Not one published set**: {' and '.join(flags)}; "
        "`make bench` at one clean commit makes them one."
    )


def _read_block(root: Path, name: str, path: str) -> dict[str, Any]:
    source = root / path
    if not source.is_file():
        raise FileNotFoundError(f"docs block {name!r} names {path}, which does not exist")
    return json.loads(source.read_text())


def render_page(page: str, root: Path = REPO_ROOT) -> str:
    """``page`` with every block re-rendered from the JSON its marker names (under ``root``), and
    its line of commits (between ``<!-- results-commits:start -->`` and ``:end -->``) from the
    same JSON."""
    results = [(m["name"], _read_block(root, m["name"], m["path"])) for m in BLOCK.finditer(page)]

    def block(match: re.Match[str]) -> str:
        name, path = match["name"], match["path"]
        return render_block(_read_block(root, name, path), name, path, root)

    page = BLOCK.sub(block, page)
    line = commits_line(results) if results else "No results yet."
    replacement = f"<!-- results-commits:start -->\n{line}\n<!-- results-commits:end -->"
    return COMMITS.sub(lambda _match: replacement, page)


def latency_by_load_view(result: Mapping[str, Any], link: str) -> list[str]:
    """The open-loop steps of a ``serving`` result as a table, and where their p99 crosses the
    benchmark's p99 mark (``p99_crossing``)."""
    steps = result.get("latency_by_load")
    source = source_line(result, link)
    if not isinstance(steps, list) or not steps:
        return [
            source,
            "",
            "This result has no open-loop steps (`latency_by_load`): it predates them. The next "
            "published `cascade bench serving` run fills this table.",
        ]

    def cell(value: Any) -> str:
        return "—" if value is None else number(value)

    lines = [
        source,
        "",
        "| offered requests/s | answered requests/s | p50 ms | p99 ms | errors "
        "| server CPU ms per request | load generator CPU ms per request |",
        "|---|---|---|---|---|---|---|",
    ]
    for step in steps:
        keys = (
            "offered_rps",
            "achieved_rps",
            "p50_ms",
            "p99_ms",
            "errors",
            "server_cpu_ms_per_request",
            "load_generator_cpu_ms_per_request",
        )
        lines.append("| " + " | ".join(cell(step.get(k)) for k in keys) + " |")
    crossing = result.get("p99_crossing") or {}
    goal = crossing.get("p99_ms")
    within, over = crossing.get("within_up_to_rps"), crossing.get("over_from_rps")
    at = crossing.get("crossing_rps")
    if goal is None:
        return lines
    bound = f"{number(goal)} ms"
    if over is None:
        said = f"p99 stays within {bound} at every step, up to {cell(within)} requests/s."
    elif within is None:
        said = f"p99 is over {bound} (or requests failed) from the lowest step on"
        said += f" ({cell(over)} requests/s)."
    else:
        said = (
            f"p99 stays within {bound} up to {cell(within)} requests/s and is over it at "
            f"{cell(over)} requests/s"
        )
        said += f"; the line between those steps crosses {bound} at {cell(at)} requests/s."
        if at is None:
            said = said.split(";")[0] + "."
    return [*lines, "", said]


HEADLINES: dict[str, tuple[str, ...]] = {
    "preranking": (
        "cross_lift_same_position",
        "ml100k_cross_lift",
        "auc_ratio",
        "feature_cost_ratio",
        "pipeline_config_auc_ratio",
        "latency_ratio_fscd_vs_teacher",
    ),
    "compilers": ("speedup_vs_best_fp32_peer", "speedup_vs_best_int8_peer", "auc_delta"),
    "serving": ("p99_ms", "rps", "server_cpu_ms_per_request"),
    "asr": (
        "cer_seen_speakers_median",
        "cer_en",
        "cer_en_over_pocketsphinx",
        "cer_fp32_detected",
        "language_id_accuracy",
        "language_id_accuracy_by_part.tuxpaint",
        "cer_delta",
        "rtf_int8_end_to_end",
    ),
    "events": ("lost", "duplicates", "latency_p50_s"),
}
"""The figures a ``headline`` view shows per benchmark (those the result has)."""


def source_line(result: Mapping[str, Any], link: str) -> str:
    """Where a view's figures come from: the JSON, the machine and the commit."""
    cpu, cores = cpu_and_cores(result)
    dirty = " (with uncommitted changes)" if result.get("git_dirty") else ""
    return (
        f"From [`{link.rsplit('/', 1)[-1]}`]({link}): {cpu}, {cores} cores; commit "
        f"`{str(result.get('git_commit'))[:12]}`{dirty}."
    )


def headline_view(result: Mapping[str, Any], link: str) -> list[str]:
    """A result's :data:`HEADLINES` figures as a table, each with the goal the docs state for
    it and whether it held; a figure the result lacks is named as missing."""
    name = str(result.get("benchmark"))
    stated = {g.figure: g for g in goals_of(name)}
    lines = [source_line(result, link), "", "| figure | value | goal |", "|---|---|---|"]
    missing = []
    for key in HEADLINES.get(name, ()):
        value = charts.lookup(result, key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            missing.append(f"`{key}`")
            continue
        goal = stated.get(key)
        verdict = "—"
        if goal is not None:
            verdict = f"{goal.statement()}: {'met' if goal.met(float(value)) else 'not met'}"
        lines.append(f"| `{key}` | {number(value)} | {verdict} |")
    if missing:
        lines += ["", f"Not in this result (it predates them): {', '.join(missing)}."]
    return lines


VIEWS = {"latency-by-load": latency_by_load_view, "headline": headline_view}
"""The views a ``bench-view`` block may show: ``(result, link to its JSON) -> lines``."""


def render_views(page: str, page_path: Path, root: Path = REPO_ROOT) -> str:
    """``page`` (at ``page_path`` under ``root``) with each ``bench-view`` block re-rendered
    from the JSON its marker names."""

    def block(match: re.Match[str]) -> str:
        view, name, path = match["view"], match["name"], match["path"]
        if view not in VIEWS:
            raise ValueError(f"{page_path}: unknown bench-view {view!r}; one of {sorted(VIEWS)}")
        link = Path(os.path.relpath(root / path, (root / page_path).parent)).as_posix()
        lines = VIEWS[view](_read_block(root, name, path), link)
        head = f"<!-- bench-view {view} {name}: {path} -->"
        return "\n".join([head, *lines, f"<!-- end bench-view {view} {name} -->"])

    return VIEW.sub(block, page)


def view_pages(root: Path = REPO_ROOT) -> list[Path]:
    """The README and docs pages (relative to ``root``) that hold a ``bench-view`` block."""
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    return [
        page.relative_to(root)
        for page in pages
        if page.is_file() and "<!-- bench-view " in page.read_text()
    ]


def rerender_views(root: Path = REPO_ROOT) -> list[Path]:
    """Re-render every page of :func:`view_pages` in place; the pages that changed."""
    changed = []
    for page in view_pages(root):
        text = (root / page).read_text()
        rendered = render_views(text, page, root)
        if rendered != text:
            (root / page).write_text(rendered)
            changed.append(page)
    return changed


def chart(result: Mapping[str, Any], name: str, out: Path) -> Path:
    """``name``'s PNG (:mod:`benchmarks.charts`); a benchmark it has no panels for gets a bar
    panel per figure of its table."""
    panels = charts.plan(result, name)
    if not panels:
        by_figure: dict[str, charts.Panel] = {}
        for row in figures(result, name):
            if not math.isfinite(float(row["value"])):
                continue
            figure, _, item = row["label"].partition(" [")
            panel = by_figure.setdefault(figure, charts.Panel("bars", figure, figure))
            spread = row["spread"] or {}
            label = item.rstrip("]") or figure
            value = float(row["value"])
            bar = charts.Bar("", label, row["path"], value, spread.get("min"), spread.get("max"))
            panel.bars.append(bar)
        panels = list(by_figure.values())
    return charts.draw(result, name, out, panels)


def redraw_charts(page: str, root: Path = REPO_ROOT) -> list[Path]:
    """Redraw the chart beside the JSON each block of ``page`` names, from that JSON."""
    drawn = []
    for match in BLOCK.finditer(page):
        result = _read_block(root, match["name"], match["path"])
        drawn.append(chart(result, match["name"], (root / match["path"]).with_suffix(".png")))
    return drawn


def publish(results: Path, docs: Path = DOCS, root: Path = REPO_ROOT) -> list[str]:
    """Copy every ``results/NAME.json`` to ``docs/results``, chart it beside both copies, point
    its block at the copy (a new block is appended for a benchmark the page lacks) and
    re-render the page. Returns the benchmark names published."""
    page = docs.read_text() if docs.is_file() else "# Benchmarks\n"
    published = []
    for source in sorted(results.glob("*.json")):
        result = json.loads(source.read_text())
        name = str(result.get("benchmark") or source.stem)
        target = DOCS_RESULTS / f"{name}.json"
        (root / DOCS_RESULTS).mkdir(parents=True, exist_ok=True)
        chart(result, name, source.with_suffix(".png"))
        if source.resolve() != (root / target).resolve():  # publishing docs/results itself
            shutil.copyfile(source, root / target)
            shutil.copyfile(source.with_suffix(".png"), (root / target).with_suffix(".png"))
        marker = f"<!-- bench {name}: {target.as_posix()} -->\n<!-- end bench {name} -->"
        existing = re.compile(rf"<!-- bench {re.escape(name)}: [^ ]+ -->")
        if existing.search(page):
            page = existing.sub(f"<!-- bench {name}: {target.as_posix()} -->", page)
        else:
            page = page.rstrip("\n") + f"\n\n## `{name}`\n\n{marker}\n"
        published.append(name)
    docs.write_text(render_page(page, root))
    rerender_views(root)
    return published


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, help="folder of NAME.json results to publish")
    parser.add_argument("--docs", type=Path, default=DOCS, help="the page to regenerate")
    parser.add_argument(
        "--charts", action="store_true", help="also redraw each block's chart from its JSON"
    )
    args = parser.parse_args(argv)
    if args.charts:
        for path in redraw_charts(args.docs.read_text()):
            print(f"drew {path}", file=sys.stderr)
    if args.results is not None:
        names = publish(args.results, args.docs)
        print(f"published {', '.join(names) or 'nothing'} into {args.docs}", file=sys.stderr)
    else:
        args.docs.write_text(render_page(args.docs.read_text()))
        print(f"re-rendered {args.docs}", file=sys.stderr)
        for page in rerender_views():
            print(f"re-rendered {page}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
