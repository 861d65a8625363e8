"""Monitor of the served pre-ranking model: feature drift (PSI) and online AUC of yesterday's
serving feedback; publishes ``cascade.drift.detected`` and ``cascade.retrain.requested`` (which
``ctr_preranking``'s watcher turns into a retraining run) when a threshold is crossed.

Runs daily at 01:00 UTC for the previous serving day. The same function from the shell::

    python -m cascade.monitor --ds 2026-11-22
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import CronTriggerTimetable, dag, task


@dag(
    dag_id="ctr_monitor",
    schedule=CronTriggerTimetable("0 1 * * *", timezone="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["cascade", "ctr", "monitoring"],
    default_args={"retries": 2, "retry_delay": dt.timedelta(minutes=1)},
    doc_md=__doc__,
)
def ctr_monitor() -> None:
    @task
    def monitor(**context: Any) -> dict[str, Any]:
        from cascade.monitor import monitor_day

        # The run at 01:00 watches the serving day that just ended.
        serving_day = (context["logical_date"] - dt.timedelta(days=1)).date().isoformat()
        return monitor_day(serving_day)

    monitor()


ctr_monitor()
