"""Serving monitor: feature drift (PSI) against the training data and online AUC from joined
feedback; publishes ``cascade.drift.detected`` and ``cascade.retrain.requested`` when a
threshold is crossed.

    cascade ctr monitor --demo --out monitor-demo     # generated logs, shift on a known day

The daily DAG ``ctr_monitor`` calls :func:`monitor_day` for the serving day. The demo generates
serving logs whose feature distribution and click behaviour change on ``shift_day`` and shows
which day the monitor flags (report JSON + plot per day).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cascade.assets import TOPIC_DRIFT_DETECTED, TOPIC_RETRAIN_REQUESTED
from cascade.config import Settings, load_settings
from cascade.lake import Lake, check_ds
from cascade.tracking_auth import use_tracking_credentials

PSI_EPS = 1e-4
"""Floor for a bin's share: an empty bin would make PSI infinite."""


@dataclass(kw_only=True)
class MonitorConfig:
    """Thresholds of the monitor."""

    model: str = "preranking"
    """Registered model the monitor watches (named in the events it publishes)."""
    numeric_features: tuple[str, ...] | None = None
    """Numeric features compared by PSI over quantile bins of the reference. None: the
    reference's declared numeric fields (:func:`declared_numeric`: the statistics a version
    of the cross-statistics engine trained on), else :data:`LEGACY_NUMERIC`."""
    categorical_features: tuple[str, ...] = ("genre",)
    """Categorical features compared by PSI over categories (the candidate item's genre)."""
    psi_threshold: float = 0.2
    """PSI above this on any feature is drift (0.1 = watch, 0.2 = significant, by convention)."""
    auc_floor: float = 0.6
    """Online AUC below this requests retraining."""
    bins: int = 10
    """Quantile bins for numeric PSI."""
    min_rows: int = 200
    """Fewer joined rows than this in a day: no verdict (too noisy to act on)."""

    def __post_init__(self) -> None:
        if self.psi_threshold <= 0:
            raise ValueError("psi_threshold must be > 0")
        if not 0 < self.auc_floor < 1:
            raise ValueError("auc_floor must be in (0, 1)")
        if self.bins < 2 or self.min_rows < 1:
            raise ValueError("bins must be >= 2 and min_rows >= 1")


def psi_numeric(reference: np.ndarray, current: np.ndarray, *, bins: int = 10) -> float:
    """Population stability index of ``current`` against ``reference`` over the reference's
    quantile bins (open-ended outer bins, so shifted values still land somewhere)."""
    reference = np.asarray(reference, dtype=float)
    current = np.asarray(current, dtype=float)
    reference, current = reference[np.isfinite(reference)], current[np.isfinite(current)]
    if reference.size == 0 or current.size == 0:
        raise ValueError("PSI needs non-empty reference and current samples")
    edges = np.unique(np.quantile(reference, np.linspace(0, 1, bins + 1))[1:-1])
    ref_share = np.bincount(
        np.searchsorted(edges, reference, side="right"), minlength=edges.size + 1
    )
    cur_share = np.bincount(np.searchsorted(edges, current, side="right"), minlength=edges.size + 1)
    return _psi(ref_share / reference.size, cur_share / current.size)


def psi_categorical(reference: Sequence[Any], current: Sequence[Any]) -> float:
    """PSI over categories (a category unseen in training counts as drift, not as an error)."""
    ref = pd.Series(reference).astype(str).value_counts(normalize=True)
    cur = pd.Series(current).astype(str).value_counts(normalize=True)
    categories = ref.index.union(cur.index)
    return _psi(
        ref.reindex(categories, fill_value=0).to_numpy(),
        cur.reindex(categories, fill_value=0).to_numpy(),
    )


def _psi(expected: np.ndarray, actual: np.ndarray) -> float:
    expected = np.clip(expected, PSI_EPS, None)
    actual = np.clip(actual, PSI_EPS, None)
    return float(np.sum((actual - expected) * np.log(actual / expected)))


LEGACY_NUMERIC = ("user_ctr", "item_ctr", "item_impressions")
"""The numeric features of a reference without field declarations (the MovieLens-shaped
contract, and the demo's generated logs)."""
FIELDS_ATTR = "fields"
"""``reference.attrs`` key of the training set's field declarations (``fields.json``)."""


def declared_numeric(reference: pd.DataFrame) -> tuple[str, ...]:
    """The numeric fields the reference's declarations name (``categorical`` false), in their
    order; empty when it has none."""
    fields = reference.attrs.get(FIELDS_ATTR) or ()
    return tuple(
        str(f["name"]) for f in fields if isinstance(f, dict) and f.get("categorical") is False
    )


def numeric_features(reference: pd.DataFrame, config: MonitorConfig) -> tuple[str, ...]:
    """The features :func:`evaluate_day` compares by numeric PSI (see
    ``MonitorConfig.numeric_features``)."""
    if config.numeric_features is not None:
        return config.numeric_features
    return declared_numeric(reference) or LEGACY_NUMERIC


def _has_number(column: pd.Series) -> bool:
    """Whether ``column`` holds a finite number."""
    values = pd.to_numeric(column, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    return bool(np.isfinite(values).any())


def online_auc(scores: np.ndarray, clicks: np.ndarray) -> float | None:
    """ROC AUC by the rank-sum formula (ties share ranks); None if a day has one class only."""
    scores = np.asarray(scores, dtype=float)
    clicks = np.asarray(clicks).astype(bool)
    positives, negatives = int(clicks.sum()), int((~clicks).sum())
    if positives == 0 or negatives == 0:
        return None
    ranks = pd.Series(scores).rank(method="average").to_numpy()
    return float((ranks[clicks].sum() - positives * (positives + 1) / 2) / (positives * negatives))


@dataclass
class DayVerdict:
    """What the monitor concluded for one serving day."""

    ds: str
    rows: int
    psi: dict[str, float] = field(default_factory=dict)
    online_auc: float | None = None
    drifted: dict[str, float] = field(default_factory=dict)
    """Features whose PSI is above the threshold."""
    unchecked: list[str] = field(default_factory=list)
    """Features to compare that the logs or the reference lack (no PSI)."""
    retrain: bool = False
    reasons: list[str] = field(default_factory=list)


def evaluate_day(
    ds: str, reference: pd.DataFrame, serving: pd.DataFrame, config: MonitorConfig
) -> DayVerdict:
    """Compare one day of joined serving logs (features, ``score``, ``click``) with the
    training reference. Pure: no I/O, no events."""
    verdict = DayVerdict(ds=check_ds(ds), rows=len(serving))
    if len(serving) < config.min_rows:
        verdict.reasons.append(f"only {len(serving)} rows (< min_rows={config.min_rows})")
        return verdict
    present = set(reference.columns) & set(serving.columns)
    numeric = numeric_features(reference, config)
    for name in numeric:
        # A column without a number on one side (e.g. a legacy feature that a version of the
        # cross-statistics engine logs as NaN, or does not log) has nothing to compare.
        if name in present and not (_has_number(reference[name]) and _has_number(serving[name])):
            present.discard(name)
    for name in numeric:
        if name in present:
            verdict.psi[name] = psi_numeric(
                reference[name].to_numpy(), serving[name].to_numpy(), bins=config.bins
            )
    for name in config.categorical_features:
        if name in present:
            verdict.psi[name] = psi_categorical(reference[name].tolist(), serving[name].tolist())
    verdict.unchecked = [n for n in numeric + config.categorical_features if n not in present]
    if verdict.unchecked:
        # Not an error: serving may log ids only, and the per-candidate cross fields (user x
        # category, ...) are read per request but not logged; the verdict names them.
        shown = verdict.unchecked[:8]
        more = (
            f" and {len(verdict.unchecked) - len(shown)} more"
            if len(shown) < len(verdict.unchecked)
            else ""
        )
        verdict.reasons.append(f"no PSI for {shown}{more}: missing from the logs or the reference")
    verdict.online_auc = online_auc(serving["score"].to_numpy(), serving["click"].to_numpy())
    verdict.drifted = {k: v for k, v in verdict.psi.items() if v > config.psi_threshold}
    if verdict.drifted:
        verdict.reasons.append(
            f"PSI above {config.psi_threshold}: "
            + ", ".join(f"{k}={v:.3f}" for k, v in sorted(verdict.drifted.items()))
        )
    if verdict.online_auc is not None and verdict.online_auc < config.auc_floor:
        verdict.reasons.append(f"online AUC {verdict.online_auc:.3f} < floor {config.auc_floor}")
    verdict.retrain = bool(verdict.drifted) or (
        verdict.online_auc is not None and verdict.online_auc < config.auc_floor
    )
    return verdict


def verdict_events(verdict: DayVerdict, config: MonitorConfig) -> list[Any]:
    """The events a verdict calls for: drift (if any), then a retrain request naming it."""
    from cascade.events import MAX_TEXT_CHARS, make_event

    reason = "; ".join(verdict.reasons)
    if len(reason) > MAX_TEXT_CHARS:  # many drifted fields: the event carries them all anyway
        reason = reason[: MAX_TEXT_CHARS - 3] + "..."
    events = []
    if verdict.drifted or verdict.retrain:
        drift = make_event(
            TOPIC_DRIFT_DETECTED,
            {
                "model": config.model,
                "partition": verdict.ds,
                "max_psi": max(verdict.psi.values(), default=0.0),
                "psi_threshold": config.psi_threshold,
                "drifted_features": verdict.drifted,
                "online_auc": verdict.online_auc,
                "auc_floor": config.auc_floor,
            },
            source="cascade-monitor",
        )
        events.append(drift)
    if verdict.retrain:
        events.append(
            make_event(
                TOPIC_RETRAIN_REQUESTED,
                {
                    "model": config.model,
                    "reason": reason,
                    "partition": verdict.ds,
                    "caused_by": [e.id for e in events],
                },
                source="cascade-monitor",
            )
        )
    return events


def plot_day(verdict: DayVerdict, config: MonitorConfig, path: Path) -> Path:
    """Bar chart of each feature's PSI against the threshold, titled with the online AUC."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(verdict.psi)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.25 * len(names) + 2), 3.5))
    values = [verdict.psi[n] for n in names]
    ax.bar(names, values, color=["tab:red" if n in verdict.drifted else "tab:blue" for n in names])
    ax.axhline(config.psi_threshold, color="black", linestyle="--", label="PSI threshold")
    if len(names) > 6:
        ax.tick_params(axis="x", rotation=90, labelsize=6)
    auc = "n/a" if verdict.online_auc is None else f"{verdict.online_auc:.3f}"
    ax.set_title(f"{verdict.ds}: PSI per feature, online AUC {auc}")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_series(verdicts: Sequence[DayVerdict], config: MonitorConfig, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    days = [v.ds for v in verdicts]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5), sharex=True)
    names = list(dict.fromkeys(n for v in verdicts for n in v.psi))
    for name in names:
        top.plot(days, [v.psi.get(name, np.nan) for v in verdicts], marker="o", label=name)
    top.axhline(config.psi_threshold, color="black", linestyle="--")
    top.set_ylabel("PSI")
    top.legend(fontsize=7)
    bottom.plot(days, [v.online_auc or np.nan for v in verdicts], marker="o")
    bottom.axhline(config.auc_floor, color="black", linestyle="--")
    bottom.set_ylabel("online AUC")
    bottom.tick_params(axis="x", rotation=45)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def generate_serving_logs(
    *, start: dt.date, days: int, shift_day: dt.date, rows_per_day: int, seed: int = 0
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(reference, serving logs) with a known ground truth. Before ``shift_day`` serving looks
    like training and the served scores rank clicks well; from ``shift_day`` on, new users
    arrive (lower CTRs), the genre mix changes and clicks follow a relation the model does not
    know, so PSI rises and online AUC falls. Any size: rows are drawn, not stored."""
    rng = np.random.default_rng(seed)
    genres = np.array(["Drama", "Comedy", "Action", "Thriller", "Romance", "Sci-Fi"])

    def draw(n: int, shifted: bool) -> pd.DataFrame:
        genre_p = [0.05, 0.1, 0.4, 0.3, 0.05, 0.1] if shifted else [0.3, 0.25, 0.15, 0.1, 0.1, 0.1]
        frame = pd.DataFrame(
            {
                "user_ctr": rng.beta(2, 8 if shifted else 3, n),
                "item_ctr": rng.beta(3, 3, n),
                "item_impressions": rng.lognormal(4.5 if shifted else 3.0, 1.0, n),
                "genre": rng.choice(genres, n, p=genre_p),
            }
        )
        model_logit = 3 * (frame["user_ctr"] - 0.4) + 2 * (frame["item_ctr"] - 0.5)
        # After the shift clicks depend on something else than what the model scores.
        true_logit = (
            -1.5 * (frame["item_ctr"] - 0.5) + 2 * (frame["genre"] == "Action") - 1
            if shifted
            else model_logit
        )
        frame["click"] = (rng.random(n) < 1 / (1 + np.exp(-true_logit))).astype(int)
        frame["score"] = 1 / (1 + np.exp(-model_logit))
        return frame

    reference = draw(rows_per_day * 2, shifted=False)
    logs = []
    for offset in range(days):
        day = start + dt.timedelta(days=offset)
        frame = draw(rows_per_day, shifted=day >= shift_day)
        frame.insert(0, "ds", day.isoformat())
        logs.append(frame)
    return reference, pd.concat(logs, ignore_index=True)


def run_demo(out: Path, *, days: int = 10, shift_offset: int = 6, rows_per_day: int = 2000) -> dict:
    """Monitor generated logs day by day; returns the first flagged day and the shift day."""
    config = MonitorConfig()
    start = dt.date(2026, 11, 1)
    shift_day = start + dt.timedelta(days=shift_offset)
    reference, logs = generate_serving_logs(
        start=start, days=days, shift_day=shift_day, rows_per_day=rows_per_day
    )
    verdicts = [
        evaluate_day(ds, reference, frame, config) for ds, frame in logs.groupby("ds", sort=True)
    ]
    out.mkdir(parents=True, exist_ok=True)
    plot_series(verdicts, config, out / "monitor_series.png")
    flagged = [v.ds for v in verdicts if v.retrain]
    summary = {
        "shift_day": shift_day.isoformat(),
        "first_flagged_day": flagged[0] if flagged else None,
        "flagged_days": flagged,
        "days": [asdict(v) for v in verdicts],
        "config": asdict(config),
        "plot": str(out / "monitor_series.png"),
    }
    (out / "monitor_demo.json").write_text(json.dumps(summary, indent=2))
    return summary


def monitor_day(
    ds: str,
    *,
    settings: Settings | None = None,
    config: MonitorConfig | None = None,
    publish: bool = True,
    request_retrain: bool = True,
) -> dict[str, Any]:
    """The DAG task: evaluate the serving day ``ds`` from the lake's joined feedback against the
    champion's training reference, write report + plot, publish events when a threshold is
    crossed. Idempotent: the report for ``ds`` is overwritten; events carry ids derived from
    nothing random only through the ledger (a rerun may publish again; consumers dedupe by
    coalescing into the same retraining run)."""
    from cascade.broker import publish_many
    from serving.feedback_read import load_joined_feedback, load_reference

    settings = settings or load_settings()
    config = config or MonitorConfig()
    lake = Lake(settings.lake_root)
    serving = load_joined_feedback(ds, settings=settings)
    reference = load_reference(settings=settings)
    verdict = evaluate_day(ds, reference, serving, config)
    events = verdict_events(verdict, config)
    if not request_retrain:
        # Drift is still announced; whether to retrain is left to the scheduled run.
        events = [e for e in events if e.type != TOPIC_RETRAIN_REQUESTED]
    report_dir = lake.reports("monitor", ds)
    plot = plot_day(verdict, config, report_dir / "psi.png") if verdict.psi else None
    report = {
        **asdict(verdict),
        "events": [e.id for e in events],
        "retrain_requested": any(e.type == TOPIC_RETRAIN_REQUESTED for e in events),
        "plot": str(plot) if plot else None,
    }
    if publish and events:
        report["published"] = publish_many(events, settings=settings)
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
    report["mlflow_run_id"] = log_to_mlflow(verdict, report_dir, settings)
    return report


MONITOR_EXPERIMENT = "preranking-monitor"
"""MLflow experiment with one run per monitored serving day (PSI, online AUC, plot, report)."""


def log_to_mlflow(verdict: DayVerdict, report_dir: Path, settings: Settings) -> str:
    """Log the day's figures, its plot and report as run ``monitor-DS``; returns the run id.

    A repeated call for the same day logs into the same run (found by its name)."""
    import mlflow

    from cascade.training.resumable_run import use_experiment

    experiment_id = use_experiment(settings, MONITOR_EXPERIMENT)
    client = mlflow.MlflowClient(tracking_uri=settings.tracking_uri)
    name = f"monitor-{verdict.ds}"
    found = client.search_runs([experiment_id], f"tags.mlflow.runName = '{name}'", max_results=1)
    run_id = (
        found[0].info.run_id
        if found
        else client.create_run(experiment_id, run_name=name, tags={"ds": verdict.ds}).info.run_id
    )
    metrics = {f"psi_{k}": v for k, v in verdict.psi.items()}
    metrics["rows"] = float(verdict.rows)
    metrics["retrain"] = float(verdict.retrain)
    if verdict.online_auc is not None:
        metrics["online_auc"] = verdict.online_auc
    for key, value in metrics.items():
        client.log_metric(run_id, key, float(value))
    for path in sorted(report_dir.iterdir()):
        if path.is_file():
            client.log_artifact(run_id, str(path))
    client.set_terminated(run_id)
    return run_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--demo", action="store_true", help="run on generated logs")
    parser.add_argument("--out", type=Path, default=Path("monitor-demo"))
    parser.add_argument("--ds", help="monitor one serving day from the lake (YYYY-MM-DD)")
    args = parser.parse_args(argv)
    if args.demo:
        summary = run_demo(args.out)
        print(
            json.dumps(
                {k: summary[k] for k in ("shift_day", "first_flagged_day", "plot")}, indent=2
            )
        )
        return 0
    if args.ds:
        use_tracking_credentials(load_settings())
        print(json.dumps(monitor_day(args.ds), indent=2, default=str))
        return 0
    parser.error("give --demo or --ds")
    return 2


if __name__ == "__main__":
    sys.exit(main())
