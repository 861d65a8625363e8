"""``docs/benchmarks.md``'s figures, rendered from benchmark JSON, and one chart per benchmark.

    python -m benchmarks.docs --results bench-results      # what `make bench` runs last

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
the blocks is kept as written.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.provenance import REPO_ROOT
from benchmarks.registry import benchmark_options

DOCS = REPO_ROOT / "docs" / "benchmarks.md"
DOCS_RESULTS = Path("docs") / "results"
"""Where the JSON the page names is kept (relative to the repository root)."""

BLOCK = re.compile(
    r"<!-- bench (?P<name>[\w-]+): (?P<path>[^ ]+) -->\n.*?<!-- end bench (?P=name) -->",
    re.DOTALL,
)

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
    ),
    "asr": (
        "utterances_per_s",
        "rtf_eager",
        "rtf_fp32_artifact",
        "rtf_int8",
        "rtf_onnxruntime",
        "rtf_inductor",
        "cer_fp32",
        "cer_int8",
        "cer_delta",
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
        ("auc_ratio_goal_met", "`auc_ratio` ≥ 0.98 (median over the seeds)"),
        ("feature_cost_ratio_goal_met", "`feature_cost_ratio` ≤ 0.5"),
        ("pipeline_config_auc_ratio_goal_met", "the pipeline config's `auc_ratio` ≥ 0.98"),
        (
            "pipeline_config_feature_cost_ratio_goal_met",
            "the pipeline config's `feature_cost_ratio` ≤ 0.5",
        ),
        ("cross_lift_same_position_goal_met", "`cross_lift_same_position` ≥ 0.01"),
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
its label): a list as items, a goal as met or not, any other value as it is."""

ITEM_LABELS = ("impressions", "pairs", "utterances", "size")
"""Keys naming a list item in a table (``sizes.0.job_s`` shows as ``job_s [impressions=1000]``)."""


# --- reading a result ------------------------------------------------------------------------


def _lookup(result: Any, parts: list[str]) -> Any:
    node = result
    for part in parts:
        if isinstance(node, Mapping):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def expand(result: Mapping[str, Any], pattern: str) -> list[tuple[str, str, Any]]:
    """``(path, label, value)`` of each figure ``pattern`` names in ``result``."""
    if "*" not in pattern:
        return [(pattern, pattern, _lookup(result, pattern.split(".")))]
    head, tail = pattern.split(".*.", 1)
    items = _lookup(result, head.split("."))
    if not isinstance(items, list):
        return []
    found = []
    for index, item in enumerate(items):
        label = next((f"{k}={item[k]}" for k in ITEM_LABELS if k in item), str(index))
        path = f"{head}.{index}.{tail}"
        found.append((path, f"{tail} [{label}]", _lookup(result, path.split("."))))
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
        value = _lookup(result, key.split("."))
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


def render_block(result: Mapping[str, Any], name: str, path: str, root: Path = REPO_ROOT) -> str:
    """The generated part of the page for one benchmark result (``path``: the JSON it names,
    relative to ``root``; its chart is shown when one lies beside it)."""
    machine = result.get("machine") or {}
    commit = result.get("git_commit")
    dirty = " (with uncommitted changes)" if result.get("git_dirty") else ""
    gpu = machine.get("cuda_device") or "no GPU"
    cores = machine.get("usable_cpus") or machine.get("cpus")
    cpu = machine.get("cpu_model") or machine.get("processor")
    lines = [
        f"<!-- bench {name}: {path} -->",
        "```bash",
        command(result, name),
        "```",
        "",
        f"From [`{path}`]({page_link(path)}): {cpu}, "
        f"{cores} cores, {gpu}; commit `{str(commit)[:12]}`{dirty}; "
        f"inputs {_short(result.get('input_digest'))}, "
        f"model {_short(result.get('model_digest'))}; repeats {result.get('repeats')}.",
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
    chart = Path(path).with_suffix(".png")
    if (root / chart).is_file():
        lines += ["", f"![{name}]({page_link(chart)})"]
    lines.append(f"<!-- end bench {name} -->")
    return "\n".join(lines)


def render_page(page: str, root: Path = REPO_ROOT) -> str:
    """``page`` with every block re-rendered from the JSON its marker names (under ``root``)."""

    def block(match: re.Match[str]) -> str:
        name, path = match["name"], match["path"]
        source = root / path
        if not source.is_file():
            raise FileNotFoundError(f"docs block {name!r} names {path}, which does not exist")
        return render_block(json.loads(source.read_text()), name, path, root)

    return BLOCK.sub(block, page)


def chart(result: Mapping[str, Any], name: str, out: Path) -> Path:
    """One PNG: a panel per figure, bars at the median, whiskers from min to max."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [row for row in figures(result, name) if math.isfinite(float(row["value"]))]
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row["label"].split(" [")[0], []).append(row)
    panels = max(1, len(groups))
    columns = min(3, panels)
    lines = math.ceil(panels / columns)
    fig, axes = plt.subplots(lines, columns, figsize=(4 * columns, 3 * lines), squeeze=False)
    for ax, (figure, members) in zip(axes.flat, groups.items(), strict=False):
        labels = [m["label"].partition(" [")[2].rstrip("]") for m in members]
        values = [float(m["value"]) for m in members]
        pairs = list(zip(values, members, strict=True))
        low = [max(0.0, v - m["spread"]["min"]) if m["spread"] else 0.0 for v, m in pairs]
        high = [max(0.0, m["spread"]["max"] - v) if m["spread"] else 0.0 for v, m in pairs]
        ax.bar(range(len(values)), values, yerr=[low, high], capsize=4, color="#4c72b0")
        ax.set_xticks(range(len(values)), labels, fontsize=7)
        ax.set_title(figure, fontsize=9)
    for ax in list(axes.flat)[len(groups) :]:
        ax.axis("off")
    commit = str(result.get("git_commit"))[:12]
    fig.suptitle(f"cascade bench {name} (commit {commit})", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


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
        shutil.copyfile(source, root / target)
        chart(result, name, source.with_suffix(".png"))
        shutil.copyfile(source.with_suffix(".png"), (root / target).with_suffix(".png"))
        marker = f"<!-- bench {name}: {target.as_posix()} -->\n<!-- end bench {name} -->"
        existing = re.compile(rf"<!-- bench {re.escape(name)}: [^ ]+ -->")
        if existing.search(page):
            page = existing.sub(f"<!-- bench {name}: {target.as_posix()} -->", page)
        else:
            page = page.rstrip("\n") + f"\n\n## `{name}`\n\n{marker}\n"
        published.append(name)
    docs.write_text(render_page(page, root))
    return published


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, help="folder of NAME.json results to publish")
    parser.add_argument("--docs", type=Path, default=DOCS, help="the page to regenerate")
    args = parser.parse_args(argv)
    if args.results is not None:
        names = publish(args.results, args.docs)
        print(f"published {', '.join(names) or 'nothing'} into {args.docs}", file=sys.stderr)
    else:
        args.docs.write_text(render_page(args.docs.read_text()))
        print(f"re-rendered {args.docs}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
