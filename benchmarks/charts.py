"""The charts of ``docs/benchmarks.md``: what each benchmark's PNG shows, and drawing it.

    python -m benchmarks.docs --charts      # redraw docs/results/NAME.png from NAME.json

Per benchmark a few panels, planned from the result (:func:`plan`) before anything is drawn:
grouped bars with the variants on one axis and one colour per variant group (fp32 / int8 peers,
MoE / dense, ...), latency against load for the serving benchmark, time against input size for
the CTR job and the corpus job. Bars are medians; whiskers run from min to max where the result
timed a figure more than once (``spread``). A figure missing from the result (an older run, a
peer that did not build) is left out, never drawn as zero. The title names the benchmark, the
subtitle the commit and the machine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.goals import goal

# --- what each chart shows -------------------------------------------------------------------

Group = tuple[str, tuple[tuple[str, str], ...]]
"""A variant group: its name and its ``(label, dotted path)`` variants."""


@dataclass(frozen=True)
class BarSpec:
    title: str
    unit: str
    groups: tuple[Group, ...]
    counts: bool = False
    """Integer counts: each bar carries its value, so that a measured zero reads as zero."""
    log: bool = False
    """A logarithmic value axis, for variants that differ by orders of magnitude."""
    start: float = 0.0
    """Where the bars start: 0.5 for an AUC, the value of guessing, so that the differences
    between models are visible and no bar claims credit for chance."""


@dataclass(frozen=True)
class SizeSpec:
    """Figures of each item of ``result[items]`` against the item's ``size`` key."""

    title: str
    unit: str
    items: str
    size: str
    series: tuple[tuple[str, str], ...]
    """``(label, key in each item)``."""


BARS: dict[str, tuple[BarSpec, ...]] = {
    "compilers": (
        BarSpec(
            "Latency per request (1 user × the request's candidates)",
            "ms",
            (
                (
                    "fp32",
                    (
                        ("eager", "eager_ms"),
                        ("Inductor", "inductor_ms"),
                        ("Inductor tuned", "inductor_tuned_ms"),
                        ("ONNX Runtime", "onnxruntime_ms"),
                        ("Cascade package", "cascade_ms"),
                    ),
                ),
                (
                    "int8",
                    (
                        ("eager dynamic int8", "eager_int8_ms"),
                        ("ONNX Runtime dynamic int8", "onnxruntime_int8_ms"),
                        ("ONNX Runtime static int8", "onnxruntime_static_int8_ms"),
                        ("Inductor PT2E int8", "inductor_pt2e_int8_ms"),
                        ("Cascade int8 package", "cascade_int8_ms"),
                    ),
                ),
                ("bf16", (("Cascade bf16 package", "cascade_bf16_ms"),)),
                (
                    "row by row",
                    (
                        ("eager, row by row", "eager_rows_ms"),
                        ("Cascade, row by row", "cascade_rowwise_ms"),
                    ),
                ),
            ),
        ),
    ),
    "asr": (
        BarSpec(
            "Real-time factor (lower is faster)",
            "seconds of compute per second of audio",
            (
                (
                    "fp32",
                    (
                        ("eager", "rtf_eager"),
                        ("Inductor", "rtf_inductor"),
                        ("Inductor tuned", "rtf_inductor_tuned"),
                        ("ONNX Runtime", "rtf_onnxruntime"),
                        ("Cascade package", "rtf_fp32_artifact"),
                    ),
                ),
                (
                    "int8",
                    (
                        ("eager dynamic int8", "rtf_eager_int8"),
                        ("ONNX Runtime int8", "rtf_onnxruntime_int8"),
                        ("Cascade int8 package", "rtf_int8"),
                    ),
                ),
            ),
        ),
        BarSpec(
            "Character error rate on the test split",
            "CER (fraction of characters)",
            (("fp32", (("fp32", "cer_fp32"),)), ("int8", (("int8", "cer_int8"),))),
        ),
    ),
    "multimodal": (
        BarSpec(
            "Training throughput, same active parameters",
            "steps/s",
            (
                ("MoE", (("MoE", "moe_steps_per_s"),)),
                ("dense", (("dense twin", "dense_steps_per_s"),)),
            ),
        ),
        BarSpec(
            "Recall@1 on the held-out split",
            "recall@1 (fraction)",
            (
                (
                    "MoE",
                    (
                        ("MoE image→text", "recall_at_1_i2t"),
                        ("MoE text→image", "recall_at_1_t2i"),
                        ("MoE, unseen pairings", "recall_at_1_heldout_templates"),
                    ),
                ),
                (
                    "dense",
                    (
                        ("dense image→text", "dense_recall_at_1_i2t"),
                        ("dense text→image", "dense_recall_at_1_t2i"),
                        ("dense, unseen pairings", "dense_recall_at_1_heldout_templates"),
                    ),
                ),
            ),
        ),
    ),
    "preranking": (
        BarSpec(
            "Test AUC",
            "AUC (bars from 0.5, chance)",
            (
                ("teacher", (("teacher (DCN-v2)", "teacher_auc"),)),
                ("FSCD", (("FSCD", "fscd_auc"),)),
                ("two-tower", (("two-tower", "two_tower_auc"),)),
            ),
            start=0.5,
        ),
        BarSpec(
            "Latency per request (1 user × 1,000 candidates, one thread)",
            "ms",
            (
                ("teacher", (("teacher (DCN-v2)", "teacher_request_ms"),)),
                ("FSCD", (("FSCD", "fscd_request_ms"),)),
                ("two-tower", (("two-tower", "two_tower_request_ms"),)),
            ),
        ),
        BarSpec(
            "Training throughput",
            "samples/s",
            (
                ("PyTorch", (("PyTorch, 1 process", "torch_samples_per_s"),)),
                (
                    "DeepSpeed",
                    (
                        ("DeepSpeed, 1 process", "deepspeed_samples_per_s_1proc"),
                        ("DeepSpeed, 2 processes", "deepspeed_samples_per_s_2proc"),
                    ),
                ),
            ),
        ),
        BarSpec(
            "AUC the cross features add",
            "AUC with crosses − AUC without",
            (
                (
                    "lift",
                    (
                        ("position in one arm only", "cross_lift"),
                        ("position in both arms", "cross_lift_same_position"),
                        ("servable crosses only", "cross_lift_servable"),
                    ),
                ),
            ),
        ),
    ),
    "serving": (
        BarSpec(
            "Server CPU per request",
            "ms of CPU",
            (
                ("compiled", (("compiled, 2 workers", "server_cpu_ms_per_request"),)),
                (
                    "compiled, 1 worker",
                    (("compiled, 1 worker", "with_1_workers.server_cpu_ms_per_request"),),
                ),
                ("eager", (("eager, 2 workers", "eager_scorer.server_cpu_ms_per_request"),)),
            ),
        ),
    ),
    "events": (
        BarSpec(
            "Latency from publishing an event",
            "s",
            (
                (
                    "p50",
                    (
                        ("claimed, p50", "latency_p50_s"),
                        ("run started, p50", "run_start_latency_p50_s"),
                        ("work recorded, p50", "work_latency_p50_s"),
                    ),
                ),
                (
                    "p95",
                    (
                        ("claimed, p95", "latency_p95_s"),
                        ("run started, p95", "run_start_latency_p95_s"),
                        ("work recorded, p95", "work_latency_p95_s"),
                    ),
                ),
            ),
        ),
        BarSpec(
            "Throughput",
            "events/s",
            (
                ("accounted for", (("published to work recorded", "events_per_s"),)),
                ("published", (("publishing alone", "publish_events_per_s"),)),
            ),
            log=True,
        ),
        # lost / duplicates are counted from the published event ids against the work records, end
        # to end, and the failed and stalled runs from Airflow: measured, so each keeps its bar
        # with its value written on it (a zero reads as zero, not as a missing bar).
        BarSpec(
            "What happened to the events",
            "count",
            (
                (
                    "expected",
                    (
                        ("partitions published", "partitions_published"),
                        ("runs started", "runs_started"),
                        ("dead-lettered (bad events)", "dead_lettered"),
                        ("unbuildable, dead-lettered", "unbuildable_events_dead_lettered"),
                    ),
                ),
                (
                    "failures",
                    (
                        ("lost", "lost"),
                        ("duplicated", "duplicates"),
                        ("runs failed", "runs_failed"),
                        ("runs stalled", "stalled_runs"),
                        ("lost across broker kills", "lost_across_kills"),
                        ("duplicated across broker kills", "duplicates_across_kills"),
                    ),
                ),
            ),
            counts=True,
        ),
    ),
    "security": (
        BarSpec(
            "Attacks tried",
            "count",
            (
                (
                    "tried",
                    (
                        ("fuzzed requests", "fuzz_requests"),
                        ("fuzzed events", "events_fuzzed"),
                        ("tampered versions", "tampered_versions_tried"),
                    ),
                ),
            ),
            counts=True,
        ),
        # Each of these counts an attack that got through, measured: a zero is the outcome, not
        # a figure zero by design, so it keeps its bar with the value written on it.
        BarSpec(
            "What got through",
            "count",
            (
                (
                    "got through",
                    (
                        ("5xx answers", "fuzz_5xx"),
                        ("events stalling a run", "events_stalling_a_run"),
                        ("tampered artifacts loaded", "tampered_artifacts_loaded"),
                        ("world-readable secrets", "world_readable_secrets"),
                        ("unsigned versions loaded", "unsigned_versions_loaded"),
                        ("registered files changed", "registered_files_changed_by_rerun"),
                        ("services with registry write", "services_with_registry_write"),
                        ("secrets on command lines", "secrets_on_command_lines"),
                        ("runs failed by valid events", "runs_failed_by_valid_events"),
                        ("partitions never built", "partitions_never_built"),
                    ),
                ),
            ),
            counts=True,
        ),
    ),
    "cluster": (
        BarSpec(
            "One partition through the pipeline",
            "s",
            (
                ("cluster profile", (("cluster stack", "run_s"),)),
                ("local profile", (("local stack", "local_run_s"),)),
            ),
        ),
        # `lost` and `duplicates` compare the fault run's landed rows with its training set
        # (`rows_accounted`): both bars are meant to be empty.
        BarSpec(
            "Workers, brokers and faults",
            "count",
            (
                (
                    "used",
                    (
                        ("Spark workers used", "spark_workers_used"),
                        ("Airflow workers used", "airflow_workers_used"),
                        ("Kafka brokers", "kafka_brokers"),
                    ),
                ),
                (
                    "faults",
                    (
                        ("faults survived", "faults_survived"),
                        ("rows lost", "lost"),
                        ("rows duplicated", "duplicates"),
                    ),
                ),
            ),
            counts=True,
        ),
    ),
}
"""Per benchmark: its bar panels."""

SIZES: dict[str, tuple[SizeSpec, ...]] = {
    "ctr": (
        SizeSpec(
            "Time against log size",
            "s",
            "sizes",
            "impressions",
            (
                ("cross statistics job (Spark)", "job_s"),
                ("the same work in DuckDB", "duckdb_s"),
                ("plain scan of the log (Spark)", "scan_s"),
                ("log to online store (pipeline)", "pipeline_s"),
            ),
        ),
        SizeSpec(
            "Peak memory of the job against log size",
            "MB (peak RSS)",
            "sizes",
            "impressions",
            (("cross statistics job (Spark)", "peak_rss_mb"),),
        ),
    ),
    "multimodal-corpus": (
        SizeSpec(
            "Time against corpus size",
            "s",
            "sizes",
            "pairs",
            (("corpus job, wall time", "wall_s"),),
        ),
        SizeSpec(
            "Rate against corpus size",
            "pairs/s",
            "sizes",
            "pairs",
            (("corpus job", "pairs_per_s"),),
        ),
    ),
}
"""Per benchmark: its panels of figures against input size."""

LOADS: tuple[tuple[str, str], ...] = (
    ("compiled, 2 workers", ""),
    ("compiled, 1 worker", "with_1_workers."),
    ("eager, 2 workers", "eager_scorer."),
)
"""The serving benchmark's configurations (label, key prefix), each measured at two loads: the
open loop at a fixed rate below capacity and the closed loop at saturation."""

# --- planning --------------------------------------------------------------------------------


@dataclass
class Bar:
    group: str
    label: str
    path: str
    value: float
    low: float | None = None
    high: float | None = None


@dataclass
class Series:
    label: str
    x: list[float] = field(default_factory=list)
    y: list[float] = field(default_factory=list)
    low: list[float | None] = field(default_factory=list)
    high: list[float | None] = field(default_factory=list)
    points: list[str] = field(default_factory=list)
    """What each point is (a size, or the load it was measured under)."""
    dashed: bool = False


@dataclass
class Panel:
    kind: str
    """``bars`` or ``curve``."""
    title: str
    unit: str
    bars: list[Bar] = field(default_factory=list)
    series: list[Series] = field(default_factory=list)
    x_label: str = ""
    log_x: bool = False
    log_y: bool = False
    """A curve's value axis in log scale (latencies that grow a hundredfold past saturation)."""
    counts: bool = False
    log: bool = False
    start: float = 0.0
    line: tuple[float, str] | None = None
    """A horizontal reference line (a goal) and its label."""


def lookup(result: Any, path: str) -> Any:
    """The value at dotted ``path`` in ``result`` (a digit indexes a list); None if absent."""
    node = result
    for part in path.split("."):
        if isinstance(node, Mapping):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _figure(
    result: Mapping[str, Any], path: str
) -> tuple[float, float | None, float | None] | None:
    """``(median, min, max)`` of a finite figure (min and max when it was timed more than once)."""
    value = lookup(result, path)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    spread = (result.get("spread") or {}).get(path) or {}
    return float(value), spread.get("min"), spread.get("max")


def _bars(result: Mapping[str, Any], spec: BarSpec) -> Panel:
    panel = Panel("bars", spec.title, spec.unit, counts=spec.counts, log=spec.log, start=spec.start)
    for group, variants in spec.groups:
        for label, path in variants:
            found = _figure(result, path)
            if found is not None:
                panel.bars.append(Bar(group, label, path, *found))
    return panel


def _sizes(result: Mapping[str, Any], spec: SizeSpec) -> Panel:
    panel = Panel("curve", spec.title, spec.unit, x_label=spec.size, log_x=True)
    items = result.get(spec.items)
    for label, key in spec.series:
        series = Series(label)
        for index, item in enumerate(items if isinstance(items, list) else []):
            size = item.get(spec.size) if isinstance(item, Mapping) else None
            found = _figure(result, f"{spec.items}.{index}.{key}")
            if isinstance(size, int | float) and found is not None:
                series.x.append(float(size))
                series.y.append(found[0])
                series.low.append(found[1])
                series.high.append(found[2])
                series.points.append(f"{spec.size}={size}")
        if series.x:
            panel.series.append(series)
    return panel


def _load_point(
    result: Mapping[str, Any], prefix: str, rps_key: str, series: Series, what: str, quantile: str
) -> None:
    rps = _figure(result, f"{prefix}{rps_key}")
    latency = _figure(result, f"{prefix}{quantile}")
    if rps is None or latency is None:
        return
    series.x.append(rps[0])
    series.y.append(latency[0])
    series.low.append(latency[1])
    series.high.append(latency[2])
    series.points.append(what)


def serving_load(result: Mapping[str, Any]) -> Panel:
    """Latency against load: each configuration's p50 and p99 at the loads it was measured
    under. A result with ``latency_by_load`` (a list of ``{"achieved_rps" or "rps", "p50_ms",
    "p99_ms"}``, one per load step of the main configuration) is drawn point by point; without
    it each configuration has its two measured points (open loop, closed loop) and no more."""
    p99 = goal("serving", "p99_ms")
    panel = Panel(
        "curve",
        "Latency against load",
        "ms",
        x_label="requests/s answered",
        line=(p99.bound, f"p99 goal ({p99.bound:g} ms)"),
        log_y=True,  # past saturation a step's latency is seconds: milliseconds stay readable
    )
    steps = result.get("latency_by_load")
    for label, prefix in LOADS:
        for quantile, dashed in (("p50_ms", False), ("p99_ms", True)):
            series = Series(f"{label}, {quantile.removesuffix('_ms')}", dashed=dashed)
            if not prefix and isinstance(steps, list) and steps:
                for index, step in enumerate(steps):
                    rps_key = "achieved_rps" if "achieved_rps" in step else "rps"
                    path = f"latency_by_load.{index}."
                    _load_point(result, path, rps_key, series, f"step {index}", quantile)
            else:
                _load_point(
                    result, f"{prefix}open_loop.", "achieved_rps", series, "open loop", quantile
                )
                _load_point(result, prefix, "rps", series, "closed loop", quantile)
            if series.x:
                panel.series.append(series)
    return panel


def plan(result: Mapping[str, Any], name: str) -> list[Panel]:
    """The panels of ``name``'s chart, with the figures ``result`` has (empty panels dropped)."""
    panels = [serving_load(result)] if name == "serving" else []
    panels += [_sizes(result, spec) for spec in SIZES.get(name, ())]
    panels += [_bars(result, spec) for spec in BARS.get(name, ())]
    return [p for p in panels if p.bars or p.series]


# --- drawing ---------------------------------------------------------------------------------

PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")


def subtitle(result: Mapping[str, Any]) -> str:
    """The commit and machine a chart's figures came from."""
    machine = result.get("machine") or {}
    commit = str(result.get("git_commit"))[:12]
    dirty = " (uncommitted changes)" if result.get("git_dirty") else ""
    cpu = machine.get("cpu_model") or machine.get("processor") or "unknown CPU"
    cores = machine.get("usable_cpus") or machine.get("cpus")
    gpu = machine.get("cuda_device") or "no GPU"
    return f"commit {commit}{dirty} · {cpu}, {cores} cores, {gpu}"


def _number(value: float) -> str:
    if float(value).is_integer() or abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _draw_bars(ax: Any, panel: Panel) -> None:
    colours: dict[str, str] = {}
    for bar in panel.bars:
        colours.setdefault(bar.group, PALETTE[len(colours) % len(PALETTE)])
    positions = list(range(len(panel.bars)))[::-1]  # the first variant on top
    values = [b.value for b in panel.bars]
    low = [b.value - b.low if b.low is not None else 0.0 for b in panel.bars]
    high = [b.high - b.value if b.high is not None else 0.0 for b in panel.bars]
    spread = any(b.low is not None or b.high is not None for b in panel.bars)
    drawn = ax.barh(
        positions,
        [v - panel.start for v in values],
        left=panel.start,
        xerr=[[max(0.0, v) for v in low], [max(0.0, v) for v in high]] if spread else None,
        capsize=3,
        color=[colours[b.group] for b in panel.bars],
    )
    if panel.log:
        ax.set_xscale("log")
    ax.set_yticks(positions, [b.label for b in panel.bars], fontsize=8)
    ax.set_xlabel(panel.unit, fontsize=8)
    ax.bar_label(drawn, [_number(v) for v in values], padding=3, fontsize=7)
    ax.margins(x=0.2)
    if panel.start:
        ax.set_xlim(left=panel.start)
    if panel.counts:
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        # Counts that are all zero still get an axis from zero, where their labels read "0".
        ax.set_xlim(0, max(1.0, max(values) * 1.2))
    # A legend only where a group holds several variants: otherwise the labels say it all.
    if len(colours) > 1 and len(colours) < len(panel.bars):
        from matplotlib.patches import Patch

        handles = [Patch(color=c, label=g) for g, c in colours.items()]
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _draw_curve(ax: Any, panel: Panel) -> None:
    colours: dict[str, str] = {}
    for series in panel.series:
        family = series.label.rsplit(", ", 1)[0] if panel.line else series.label
        colour = colours.setdefault(family, PALETTE[len(colours) % len(PALETTE)])
        low = [
            y - lo if lo is not None else 0.0 for y, lo in zip(series.y, series.low, strict=True)
        ]
        high = [
            hi - y if hi is not None else 0.0 for y, hi in zip(series.y, series.high, strict=True)
        ]
        ax.errorbar(
            series.x,
            series.y,
            yerr=[[max(0.0, v) for v in low], [max(0.0, v) for v in high]],
            label=series.label,
            color=colour,
            linestyle="--" if series.dashed else "-",
            marker="o",
            capsize=3,
        )
    if panel.line:
        ax.axhline(panel.line[0], color="grey", linestyle=":", linewidth=1)
        ax.annotate(
            panel.line[1],
            (0.01, panel.line[0]),
            xycoords=("axes fraction", "data"),
            fontsize=7,
            color="grey",
            va="bottom",
        )
    if panel.log_x:
        ax.set_xscale("log")
    ax.set_xlabel(panel.x_label, fontsize=8)
    ax.set_ylabel(panel.unit, fontsize=8)
    if panel.log_y:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)


def draw(result: Mapping[str, Any], name: str, out: Path, panels: list[Panel]) -> Path:
    """``panels`` into one PNG at ``out``, titled with the benchmark, its commit and machine."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 1 if len(panels) == 1 else 2
    rows = math.ceil(len(panels) / columns)
    heights = [
        max(2.6, 0.32 * max(len(p.bars) for p in panels[i * columns : (i + 1) * columns]) + 1.2)
        for i in range(rows)
    ]
    fig, axes = plt.subplots(
        rows,
        columns,
        figsize=(6.4 * columns, sum(heights) + 0.9),
        squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )
    for ax, panel in zip(axes.flat, panels, strict=False):
        (_draw_bars if panel.kind == "bars" else _draw_curve)(ax, panel)
        ax.set_title(panel.title, fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(f"cascade bench {name}\n{subtitle(result)}", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out
