"""One page per partition: what every pipeline's steps did for ``ds``, in one place.

    cascade report --ds 2026-11-22 --out report/

Reads what the steps leave in the lake, so it works for Airflow runs, ``cascade step`` and
``dvc repro`` alike:

- each step's summary (``reports/step_<stage>/dt=DS/summary.json``) and its timing record
  (``timing.json`` beside it: seconds, ok or failed with the error's first line);
- gate verdicts: a summary with a boolean ``success`` (failed checks and warnings listed);
- figures the steps drew (any ``*.png`` under ``reports/*/dt=DS/``: the pre-ranker's
  trade-off, the monitor's drift);
- training curves: every metric with several steps in the MLflow runs the summaries name
  (``run_id``), when the tracking server answers; otherwise the page says why they are missing.

Writes ``index.html``, ``report.json``, the step timings and training curves (SVG, drawn here)
and copies of the steps' PNGs into the output folder. Everything read is
data: JSON is parsed, never executed, and every value shown is escaped.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cascade.config import Settings
from cascade.errors import NotReady
from cascade.lake import Lake, check_ds
from cascade.pipeline_registry import registered_pipelines
from cascade.pipeline_spec import Pipeline

TIMING_FILE = "timing.json"
"""Written by the step runner beside a step's summary (``cascade.step_runner.TIMING_FILE``)."""
MAX_FIGURES = 40
MAX_CURVES = 12
"""Metrics drawn per run (the ones with the most points first)."""
MAX_SHOWN_FIELDS = 16
TIMINGS_FIGURE = "timings.svg"
_OK, _FAILED = "#2e86c1", "#c0392b"


@dataclass
class StepReport:
    pipeline: str
    step: str
    stage: str
    status: str
    """``ok``, ``failed``, ``skipped`` (nothing landed for the partition: ``error`` says so) or
    ``not run``."""
    seconds: float | None = None
    error: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    inputs: list[dict[str, Any]] = field(default_factory=list)
    """Lineage: the catalog datasets the step reads, each ``name``, ``location`` and whether
    the partition ``exists``."""
    outputs: list[dict[str, Any]] = field(default_factory=list)
    """Lineage: the catalog datasets the step writes, as :attr:`inputs`."""

    @property
    def gate(self) -> dict[str, Any] | None:
        """The verdict of a gate step: ``success``, failed checks and warnings."""
        if not isinstance(self.summary.get("success"), bool):
            return None
        return {
            "success": self.summary["success"],
            "failed": list(self.summary.get("failed") or [])[:50],
            "warnings": len(self.summary.get("warnings") or []),
        }


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def collect_steps(lake: Lake, ds: str, pipelines: list[str] | None = None) -> list[StepReport]:
    """Every registered step's record for ``ds`` (``not run`` where it left none)."""
    specs = registered_pipelines()
    names = pipelines or sorted(specs)
    unknown = sorted(set(names) - set(specs))
    if unknown:
        raise ValueError(f"unknown pipelines {unknown}; one of {', '.join(sorted(specs))}")
    steps = []
    for name in names:
        spec = specs[name]
        for step in spec.steps:
            stage = spec.dvc_prefix + step.name
            folder = lake.reports(f"step_{stage}", ds)
            summary = _read_json(folder / "summary.json")
            timing = _read_json(folder / TIMING_FILE)
            if timing.get("status") in ("failed", "skipped"):
                status = str(timing["status"])
            elif summary or timing.get("status") == "ok":
                status = "ok"
            else:
                status = "not run"
            seconds = timing.get("seconds")
            steps.append(
                StepReport(
                    pipeline=name,
                    step=step.name,
                    stage=stage,
                    status=status,
                    seconds=float(seconds) if isinstance(seconds, int | float) else None,
                    error=str(timing["error"])[:300] if timing.get("error") else None,
                    summary=summary,
                    inputs=_lineage(spec, step.inputs, lake, ds),
                    outputs=_lineage(spec, step.outputs, lake, ds),
                )
            )
    return steps


def _lineage(spec: Pipeline, names: tuple[str, ...], lake: Lake, ds: str) -> list[dict[str, Any]]:
    found = []
    for name in names:
        location = spec.data(name).location(lake, ds)
        found.append({"name": name, "location": str(location), "exists": location.exists()})
    return found


def _figures(lake: Lake, ds: str, out: Path) -> list[dict[str, str]]:
    """Copies of the PNGs the steps drew for ``ds`` into ``out/figures``."""
    root = lake.root / "reports"
    found = sorted(
        path
        for path in (root.glob(f"*/dt={ds}/**/*.png") if root.is_dir() else [])
        if "data_docs" not in path.relative_to(root).parts  # GX's logos, not a step's figure
    )
    figures = []
    (out / "figures").mkdir(parents=True, exist_ok=True)
    for path in found[:MAX_FIGURES]:
        kind = path.relative_to(root).parts[0]
        name = f"{kind}-{path.name}"
        shutil.copyfile(path, out / "figures" / name)
        figures.append({"kind": kind, "file": f"figures/{name}", "source": str(path)})
    return figures


def _svg(width: float, height: float, body: list[str]) -> str:
    """A standalone SVG document (what the page's ``<img>`` shows; drawn here, no plot library
    in the kernel)."""
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width:.0f}' height='{height:.0f}' "
        f"viewBox='0 0 {width:.0f} {height:.0f}' font-family='sans-serif'>"
        "<rect width='100%' height='100%' fill='white'/>" + "".join(body) + "</svg>\n"
    )


def _bar_chart(bars: list[tuple[str, float, str]], title: str, unit: str) -> str:
    """Horizontal bars (label, value, colour), top to bottom, on one linear axis from zero."""
    e = html.escape
    label_w, bar_w, row_h, top = 260.0, 460.0, 20.0, 34.0
    largest = max((value for _, value, _ in bars), default=0.0) or 1.0
    body = [f"<text x='{label_w}' y='20' font-size='14'>{e(title)}</text>"]
    for i, (label, value, colour) in enumerate(bars):
        y = top + i * row_h
        width = bar_w * value / largest
        body += [
            f"<text x='{label_w - 6}' y='{y + 13:.1f}' font-size='11' text-anchor='end'>"
            f"{e(label)}</text>",
            f"<rect x='{label_w}' y='{y + 2:.1f}' width='{width:.1f}' height='{row_h - 5}' "
            f"fill='{colour}'/>",
            f"<text x='{label_w + width + 4:.1f}' y='{y + 13:.1f}' font-size='10'>"
            f"{value:.1f} {e(unit)}</text>",
        ]
    return _svg(label_w + bar_w + 80, top + row_h * len(bars) + 10, body)


def _line_panels(panels: list[tuple[str, list[tuple[float, float]]]], title: str) -> str:
    """One small line chart per (metric, points), three to a row, each scaled to its own
    range, with its first and last step and its lowest and highest value written on it."""
    e = html.escape
    cols = min(3, len(panels)) or 1
    pw, ph, pad, top = 300.0, 170.0, 34.0, 30.0
    rows = (len(panels) + cols - 1) // cols
    body = [f"<text x='10' y='20' font-size='14'>{e(title)}</text>"]
    for i, (name, points) in enumerate(panels):
        x0 = (i % cols) * pw + pad
        y0 = top + (i // cols) * ph + 18
        w, h = pw - pad - 12, ph - 54
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        x_lo, x_hi, y_lo, y_hi = min(xs), max(xs), min(ys), max(ys)
        x_span, y_span = (x_hi - x_lo) or 1.0, (y_hi - y_lo) or 1.0
        line = " ".join(
            f"{x0 + w * (x - x_lo) / x_span:.1f},{y0 + h - h * (y - y_lo) / y_span:.1f}"
            for x, y in points
        )
        body += [
            f"<text x='{x0}' y='{y0 - 6:.1f}' font-size='12'>{e(name)}</text>",
            f"<rect x='{x0}' y='{y0}' width='{w:.1f}' height='{h:.1f}' fill='none' stroke='#ccc'/>",
            f"<polyline points='{line}' fill='none' stroke='#2e86c1' stroke-width='1.2'/>",
            f"<text x='{x0 - 3}' y='{y0 + 9:.1f}' font-size='9' text-anchor='end'>"
            f"{y_hi:.4g}</text>",
            f"<text x='{x0 - 3}' y='{y0 + h:.1f}' font-size='9' text-anchor='end'>"
            f"{y_lo:.4g}</text>",
            f"<text x='{x0}' y='{y0 + h + 12:.1f}' font-size='9'>step {x_lo:.0f}</text>",
            f"<text x='{x0 + w:.1f}' y='{y0 + h + 12:.1f}' font-size='9' text-anchor='end'>"
            f"step {x_hi:.0f}</text>",
        ]
    return _svg(cols * pw + 10, top + rows * ph, body)


def _timings_figure(steps: list[StepReport], out: Path) -> str | None:
    timed = [s for s in steps if s.seconds is not None]
    if not timed:
        return None
    bars = [
        (
            f"{s.pipeline} · {s.step}",
            float(s.seconds or 0.0),
            _FAILED if s.status == "failed" else _OK,
        )
        for s in timed
    ]
    (out / TIMINGS_FIGURE).write_text(_bar_chart(bars, "Step wall time (red: failed)", "s"))
    return TIMINGS_FIGURE


def _curves(settings: Settings, steps: list[StepReport], out: Path) -> tuple[list[dict], str]:
    """Training curves of the MLflow runs the summaries name, and a note on what was skipped."""
    runs = {}
    for s in steps:
        run_id = s.summary.get("run_id")
        if isinstance(run_id, str) and run_id.isalnum() and len(run_id) <= 64:
            runs.setdefault(run_id, f"{s.pipeline} · {s.step}")
    if not runs:
        return [], "no step names an MLflow run"
    from cascade.training.resumable_run import tracking_answers

    if not tracking_answers(settings.tracking_uri):
        return [], (
            f"MLflow at {settings.tracking_uri} does not answer: no training curves "
            "(`cascade up` starts it)"
        )
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=settings.tracking_uri)
    curves, missing = [], []
    for run_id, label in runs.items():
        try:
            keys = sorted(client.get_run(run_id).data.metrics)
            histories = {key: client.get_metric_history(run_id, key) for key in keys}
        except MlflowException:
            missing.append(run_id)
            continue
        drawn = sorted(
            ((k, h) for k, h in histories.items() if len(h) >= 3), key=lambda kh: -len(kh[1])
        )[:MAX_CURVES]
        if not drawn:
            continue
        panels = [(key, sorted((m.step, m.value) for m in history)) for key, history in drawn]
        name = f"curves-{run_id[:12]}.svg"
        (out / name).write_text(_line_panels(panels, f"{label} — run {run_id[:8]}"))
        curves.append(
            {"run_id": run_id, "label": label, "file": name, "metrics": [k for k, _ in drawn]}
        )
    note = f"runs not found in MLflow: {', '.join(missing)}" if missing else ""
    return curves, note


def _scalar_fields(summary: dict[str, Any]) -> list[tuple[str, str]]:
    shown = []
    for key, value in summary.items():
        if isinstance(value, bool | int | float | str) and len(str(value)) <= 120:
            if isinstance(value, float):
                value = f"{value:.4g}"
            shown.append((key, str(value)))
        if len(shown) >= MAX_SHOWN_FIELDS:
            break
    return shown


def _html(report: dict[str, Any], steps: list[StepReport]) -> str:
    e = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>Cascade report {e(report['ds'])}</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:1100px}"
        "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;"
        "padding:3px 8px;font-size:13px;text-align:left;vertical-align:top}"
        ".ok{color:#1e8449}.failed{color:#c0392b;font-weight:bold}.notrun{color:#888}"
        ".skipped{color:#b9770e}"
        "img{max-width:100%;border:1px solid #ddd;margin:.4em 0}</style></head><body>",
        f"<h1>Partition {e(report['ds'])}</h1>",
        f"<p>Generated {e(report['generated_at'])} from {e(report['lake'])}. "
        f"{report['counts']['ok']} steps ok, {report['counts']['failed']} failed, "
        f"{report['counts']['skipped']} skipped, {report['counts']['not run']} not run.</p>",
    ]
    if report["timings"]:
        parts.append(f"<h2>Timings</h2><img src='{e(report['timings'])}' alt='step timings'>")
    for pipeline in report["pipelines"]:
        parts.append(
            f"<h2>{e(pipeline)}</h2><table><tr><th>step</th><th>status</th>"
            "<th>seconds</th><th>gate</th><th>reads → writes</th><th>summary</th></tr>"
        )
        for s in (s for s in steps if s.pipeline == pipeline):
            css = s.status.replace(" ", "")
            gate = s.gate
            verdict = ""
            if gate is not None:
                verdict = ("passed" if gate["success"] else "FAILED") + (
                    f"; {gate['warnings']} warnings" if gate["warnings"] else ""
                )
                if gate["failed"]:
                    verdict += "<br>" + "<br>".join(e(str(f)) for f in gate["failed"][:10])
            fields = "<br>".join(f"{e(k)}: {e(v)}" for k, v in _scalar_fields(s.summary))
            if s.error:
                kind = "skipped" if s.status == "skipped" else "failed"
                fields = f"<span class='{kind}'>{e(s.error)}</span><br>{fields}"
            seconds = "" if s.seconds is None else f"{s.seconds:.1f}"
            lineage = " → ".join(
                ", ".join(e(d["name"]) for d in side) or "-" for side in (s.inputs, s.outputs)
            )
            parts.append(
                f"<tr><td>{e(s.step)}</td><td class='{css}'>{e(s.status)}</td>"
                f"<td>{seconds}</td><td>{verdict}</td><td>{lineage}</td><td>{fields}</td></tr>"
            )
        parts.append("</table>")
        for curve in (c for c in report["curves"] if c["label"].startswith(f"{pipeline} ·")):
            parts.append(
                f"<h3>Training curves: {e(curve['label'])}</h3>"
                f"<img src='{e(curve['file'])}' alt='training curves'>"
            )
    if report["curves_note"]:
        parts.append(f"<p><em>{e(report['curves_note'])}</em></p>")
    if report["figures"]:
        parts.append("<h2>Figures</h2>")
        for figure in report["figures"]:
            parts.append(
                f"<h3>{e(figure['kind'])}</h3><img src='{e(figure['file'])}' "
                f"alt='{e(figure['kind'])}'>"
            )
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(
    settings: Settings, ds: str, out: Path, pipelines: list[str] | None = None
) -> dict[str, Any]:
    """Write ``index.html``, ``report.json`` and the figures for partition ``ds`` into ``out``.

    :class:`NotReady` when no step has left anything for ``ds``.
    """
    ds = check_ds(ds)
    lake = Lake(settings.lake_root)
    steps = collect_steps(lake, ds, pipelines)
    if all(s.status == "not run" for s in steps):
        raise NotReady(
            f"no step has run for ds={ds} under {lake.root}; trigger a DAG or run "
            f"`cascade step NAME --pipeline P --ds {ds}` first"
        )
    out.mkdir(parents=True, exist_ok=True)
    curves, note = _curves(settings, steps, out)
    counts = {
        status: sum(s.status == status for s in steps)
        for status in ("ok", "failed", "skipped", "not run")
    }
    report = {
        "ds": ds,
        "generated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "lake": str(lake.root),
        "pipelines": sorted({s.pipeline for s in steps}),
        "counts": counts,
        "steps": [
            {
                "pipeline": s.pipeline,
                "step": s.step,
                "stage": s.stage,
                "status": s.status,
                "seconds": s.seconds,
                "error": s.error,
                "gate": s.gate,
                "inputs": s.inputs,
                "outputs": s.outputs,
            }
            for s in steps
        ],
        "timings": _timings_figure(steps, out),
        "figures": _figures(lake, ds, out),
        "curves": curves,
        "curves_note": note,
    }
    (out / "index.html").write_text(_html(report, steps))
    (out / "report.json").write_text(json.dumps(report, indent=2))
    report["index"] = str(out / "index.html")
    return report


RUN_REPORT_EXPERIMENT = "pipeline-reports"
"""The MLflow experiment of the per-run reports: one small run per pipeline run."""
REPORT_ARTIFACTS = "report"
"""Where a report run keeps ``index.html``, ``report.json`` and the figures."""
RUN_REPORT_KIND = "run_report"


def run_report_dir(lake: Lake, pipeline: str, ds: str) -> Path:
    """Where the run report of ``pipeline`` for ``ds`` is kept in the lake (outside
    ``reports/``, so a report never shows another report's figures)."""
    return lake.root / "run_reports" / pipeline / f"dt={check_ds(ds)}"


def report_url(tracking_uri: str, experiment_id: str, run_id: str, index: Path) -> str:
    """The page that shows the report: its artifact view in the MLflow UI, or the local file
    when the tracking store is not a web server."""
    if tracking_uri.startswith(("http://", "https://")):
        base = tracking_uri.rstrip("/")
        return (
            f"{base}/#/experiments/{experiment_id}/runs/{run_id}/artifactPath/"
            f"{REPORT_ARTIFACTS}/index.html"
        )
    return index.resolve().as_uri()


def _quotable(value: str) -> bool:
    return "'" not in value and "\\" not in value


def log_run_report(
    settings: Settings, pipeline: str, ds: str, context: dict[str, str] | None = None
) -> dict[str, Any]:
    """Write the report of ``pipeline``'s steps for ``ds`` (what ``cascade report --ds DS
    --pipeline P`` writes) into :func:`run_report_dir` and log it as the artifacts
    (``report/``) of a run of :data:`RUN_REPORT_EXPERIMENT`, named ``P/DS/report`` and tagged
    with the pipeline, ``ds`` and the Airflow ``dag_id``/``run_id``/``try_number`` (from
    ``context``, default: the task's environment). A retry of the same Airflow run logs into
    the same MLflow run. Returns the index path, the MLflow run and the report's URL."""
    import mlflow

    from cascade.training.resumable_run import run_context, use_experiment

    ds = check_ds(ds)
    out = run_report_dir(Lake(settings.lake_root), pipeline, ds)
    if out.exists():
        shutil.rmtree(out)  # figures of an earlier try are not this one's
    report = write_report(settings, ds, out, [pipeline])
    context = dict(run_context() if context is None else context)
    tags = {
        **{k: v for k, v in context.items() if k in ("dag_id", "run_id", "try_number")},
        "pipeline": pipeline,
        "ds": ds,
        "cascade.kind": RUN_REPORT_KIND,
    }
    experiment_id = use_experiment(settings, RUN_REPORT_EXPERIMENT)
    client = mlflow.MlflowClient(tracking_uri=settings.tracking_uri)
    run_id = None
    if tags.get("dag_id") and tags.get("run_id") and _quotable(tags["dag_id"] + tags["run_id"]):
        found = client.search_runs(
            [experiment_id],
            filter_string=f"tags.dag_id = '{tags['dag_id']}' and tags.run_id = '{tags['run_id']}'",
            max_results=1,
        )
        run_id = found[0].info.run_id if found else None
    if run_id is None:
        run_id = client.create_run(
            experiment_id, run_name=f"{pipeline}/{ds}/report", tags=tags
        ).info.run_id
    else:
        for key, value in tags.items():
            client.set_tag(run_id, key, value)
    for status, count in report["counts"].items():
        client.log_metric(run_id, f"steps_{status.replace(' ', '_')}", count)
    client.log_artifacts(run_id, str(out), artifact_path=REPORT_ARTIFACTS)
    client.set_terminated(run_id)
    index = out / "index.html"
    return {
        "index": str(index),
        "run_id": run_id,
        "experiment_id": experiment_id,
        "url": report_url(settings.tracking_uri, experiment_id, run_id, index),
        "counts": report["counts"],
    }
