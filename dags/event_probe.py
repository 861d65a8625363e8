"""Event accounting probe: a trivial DAG on ``cascade.data.landed`` events of dataset ``probe``.

Fault tests and ``cascade bench events --events 1000 --out FILE`` publish probe events and check
that every event id ends up in exactly one run's work record. It goes through the same watcher
(shared consumer, dead-lettering, claim ledger, coalescing, one run per partition, dead letters
for a partition in the future) as the pipelines but does no pipeline work, so a thousand events
take seconds, not hours.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import dag, task

from cascade.assets import ASSET_EVENT_PROBE, PROBE_EVENT_SELECTORS
from cascade.dag_factory import next_partitions_task, watched_asset
from cascade.event_claims import release_failed_run

probe_events = watched_asset(
    ASSET_EVENT_PROBE, watcher="event_probe_watcher", selectors=PROBE_EVENT_SELECTORS
)


@dag(
    dag_id="event_probe",
    schedule=[probe_events],
    catchup=False,
    max_active_runs=1,
    on_failure_callback=release_failed_run,
    tags=["cascade", "events", "test"],
    default_args={
        "retries": 2,
        "retry_delay": dt.timedelta(seconds=5),
        "on_failure_callback": release_failed_run,
    },
    doc_md=__doc__,
)
def event_probe() -> None:
    @task(inlets=[probe_events])
    def claim(**context: Any) -> list[str]:
        from cascade.event_claims import claim_for_run

        return [str(event["id"]) for event in claim_for_run(context, probe_events).events]

    @task
    def record(event_ids: list[str], **context: Any) -> str:
        from cascade.event_ledger import record_work

        dag_run = context["dag_run"]
        return str(record_work(dag_run.dag_id, dag_run.run_id, event_ids))

    claimed = claim()
    record(claimed)
    claimed >> next_partitions_task(probe_events, claim_task="claim")


event_probe()
