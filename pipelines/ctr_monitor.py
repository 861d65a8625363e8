"""Monitor of the served pre-ranking model: feature drift (PSI) and online AUC of a serving day.

Runs daily at 01:00 UTC for the serving day that just ended (its logical date minus one day),
and whenever a new pre-ranking champion is deployed (the champion asset), for its partition
(each such partition its own run, once); publishes ``cascade.drift.detected`` and
``cascade.retrain.requested`` (which ``ctr_preranking``'s watcher turns into a retraining run)
when a threshold is crossed. The same step from the shell:
``cascade step drift --pipeline ctr_monitor --ds 2026-11-22``.
"""

from __future__ import annotations

from typing import Any

from cascade.assets import ASSET_PRERANKING_CHAMPION
from cascade.pipeline_spec import Pipeline, Step
from cascade.step_context import StepContext


def drift(ctx: StepContext) -> dict[str, Any]:
    from serving.monitor import monitor_day

    # A run a new champion started checks it at once but requests no retraining: a retrained
    # champion must not start its own retraining (a loop); the scheduled run decides that.
    # This DAG has no Kafka trigger, so any asset-triggered run is one a champion started.
    return monitor_day(ctx.ds, request_retrain=not ctx.run.asset_triggered)


PIPELINE = Pipeline(
    name="ctr_monitor",
    description=__doc__ or "",
    cron="0 1 * * *",
    # A new champion is checked at once, on the partition it was trained and deployed for,
    # against its own training reference: the cron run would wait up to a day.
    after=(ASSET_PRERANKING_CHAMPION,),
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
            dvc_deps=("serving/monitor.py", "serving/feedback_read.py", "serving/feedback_rows.py"),
        ),
    ),
)
