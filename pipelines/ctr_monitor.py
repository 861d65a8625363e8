"""Monitor of the served pre-ranking model: feature drift (PSI) and online AUC of a serving day.

Runs daily at 01:00 UTC for the serving day that just ended (its logical date minus one day);
publishes ``cascade.drift.detected`` and ``cascade.retrain.requested`` (which ``ctr_preranking``'s
watcher turns into a retraining run) when a threshold is crossed. The same step from the shell:
``cascade step drift --pipeline ctr_monitor --ds 2026-11-22``.
"""

from __future__ import annotations

from typing import Any

from cascade.pipeline_spec import Pipeline, Step


def drift(ds: str) -> dict[str, Any]:
    from serving.monitor import monitor_day

    return monitor_day(ds)


PIPELINE = Pipeline(
    name="ctr_monitor",
    description=__doc__ or "",
    cron="0 1 * * *",
    tags=("ctr", "monitoring"),
    partition_lag_days=1,
    retry_delay_s=60,
    dvc_prefix="monitor_",
    steps=(
        Step(
            name="drift",
            run=drift,
            doc="PSI of the served features and online AUC of the day's joined feedback against "
            "the champion's training reference; events when a threshold is crossed",
            timeout_minutes=30,
            dvc_deps=("serving/monitor.py", "serving/feedback.py"),
        ),
    ),
)
