"""How a DAG run gets its events exactly once: burst coalescing (wait until the asset's
events go quiet), one partition per run out of the events (and the partitions upstream
pipelines published), dead letters for events that can never be built, and the Airflow
callables that claim a run's events and give a failed run's back. The ledger they are claimed
in is :mod:`cascade.event_ledger`."""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cascade.assets import TOPIC_DATA_LANDED
from cascade.config import Settings, load_settings
from cascade.event_ledger import Claim, ClaimLedger, event_body, unique_events
from cascade.events import MAX_NAME_CHARS, Event, InvalidEvent, dead_letter_event, parse_event

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class CoalesceConfig:
    """How a run gathers the events it works on."""

    window_s: float = 15.0
    """A run starts work once the asset has had no new event for this long (the burst window)."""
    max_wait_s: float = 300.0
    """Upper bound on that wait, so an endless trickle still gets processed."""
    lookback_s: float = 24 * 3600.0
    """How far back a run re-reads the asset for unclaimed events (drains events no run took
    yet); events a failed run gave back come from the ledger, whatever their age."""
    poll_s: float = 2.0
    """How often the asset's events are re-read while waiting."""
    max_releases: int = 3
    """How many failed runs may give an event back; the next claim dead-letters it instead
    (``CASCADE_COALESCE_MAX_RELEASES``)."""

    def __post_init__(self) -> None:
        if self.window_s < 0 or self.max_wait_s < 0:
            raise ValueError("window_s and max_wait_s must be >= 0 (CASCADE_COALESCE_WINDOW_S)")
        if self.lookback_s <= 0 or self.poll_s <= 0:
            raise ValueError("lookback_s and poll_s must be > 0")
        if self.max_releases < 1:
            raise ValueError("max_releases must be >= 1 (CASCADE_COALESCE_MAX_RELEASES)")


def coalesce_config_from_env(env: Mapping[str, str] | None = None) -> CoalesceConfig:
    """The defaults, with the window and the wait of the settings (``CASCADE_COALESCE_*``)."""
    events = load_settings(env).events
    return CoalesceConfig(
        window_s=events.window_s, max_wait_s=events.max_wait_s, max_releases=events.max_releases
    )


def checked_events(
    events: Iterable[Mapping[str, Any]],
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Each event validated again and normalised as the watcher does (:func:`parse_event`);
    returns (valid events, event id -> reason for the others)."""
    valid: list[dict[str, Any]] = []
    refused: dict[str, str] = {}
    for event in events:
        try:
            text = json.dumps(event, default=str)
            valid.append(json.loads(parse_event(text).model_dump_json()))
        except (InvalidEvent, TypeError, ValueError, RecursionError) as exc:
            event_id = str(event.get("id"))[:MAX_NAME_CHARS] if isinstance(event, Mapping) else "?"
            refused[event_id] = str(exc)[:500]
    return valid, refused


def event_from_extra(extra: Any) -> dict[str, Any] | None:
    """The Cascade event inside an asset event's extra (``{"payload": event}`` from the
    trigger), or the event itself; None for asset events that carry no Cascade event."""
    if not isinstance(extra, Mapping):
        return None
    candidate = extra.get("payload") if "from_trigger" in extra else extra
    if isinstance(candidate, str):
        try:
            candidate = json.loads(candidate)
        except json.JSONDecodeError:
            return None
    if isinstance(candidate, Mapping) and candidate.get("id") and candidate.get("type"):
        return dict(candidate)
    return None


REREAD_S = 120.0
"""How far behind the newest seen event a claiming run re-reads the asset's events."""

RecentEvents = Callable[[dt.datetime], list[tuple[dt.datetime, Any]]]
"""``since -> [(asset event timestamp, extra)]``: the asset's events stored after ``since``."""


def wait_until_quiet(
    recent: RecentEvents,
    config: CoalesceConfig,
    *,
    clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    sleep: Callable[[float], None] = time.sleep,
) -> list[tuple[dt.datetime, Any]]:
    """Re-read the asset's recent events until none arrived for ``window_s`` (or ``max_wait_s``
    passed); returns the last read.

    "None arrived" must hold twice: the newest event's timestamp is ``window_s`` old, and no new
    event became visible during the last ``window_s`` of watching. The second rule matters
    because the triggerer stamps an event before its transaction commits: on a loaded machine
    events appear seconds after their timestamps, and timestamps alone would call a burst
    quiet in the middle of it."""
    started = clock()
    since = started - dt.timedelta(seconds=config.lookback_s)
    seen: int | None = None
    last_change = started
    while True:
        events = recent(since)
        now = clock()
        if len(events) != seen:
            seen, last_change = len(events), now
        newest = max((ts for ts, _ in events), default=None)
        quiet_for = min(
            (now - newest).total_seconds() if newest else float("inf"),
            (now - last_change).total_seconds(),
        )
        waited = (now - started).total_seconds()
        if quiet_for >= config.window_s or waited >= config.max_wait_s:
            return events
        sleep(min(config.poll_s, config.window_s - quiet_for, config.max_wait_s - waited))


Unbuildable = Callable[[str], str | None]
"""``ds -> reason``: why partition ``ds`` cannot be built now (nothing landed for it), or None
when it can; a pipeline's :attr:`~cascade.pipeline_spec.Trigger.unbuildable`."""
DeadLetterSink = Callable[[Sequence[Event]], None]
"""Sends dead-letter records where the watchers send theirs; raises when they were not
acknowledged (the events then stay unclaimed, and a later claim tries again)."""
DEAD_LETTER_UNBUILDABLE = "unbuildable"
"""Dead-letter kind of an event whose partition cannot be built (in the future, nothing
landed)."""
DEAD_LETTER_RETRIES = "retries-exhausted"
"""Dead-letter kind of an event that :attr:`CoalesceConfig.max_releases` failed runs gave back."""
PENDING_XCOM_KEY = "pending_partitions"
"""XCom key under which the claiming task leaves the partitions still waiting for a run."""


def event_partition(event: Mapping[str, Any]) -> str | None:
    """The partition an event names (None: it names none, e.g. a retrain request)."""
    payload = event.get("payload")
    partition = payload.get("partition") if isinstance(payload, Mapping) else None
    return str(partition) if partition else None


def named_path(event: Mapping[str, Any]) -> str | None:
    """The batch location a data-landed event names by ``path`` (None when it names none)."""
    payload = event.get("payload")
    where = payload.get("path") if isinstance(payload, Mapping) else None
    return str(where) if where else None


UPSTREAM_ID_PREFIX = "after:"
"""Id prefix of the event standing for an upstream partition (:func:`upstream_events`)."""


def upstream_events(asset_events: Iterable[Any], after: Collection[str]) -> list[dict[str, Any]]:
    """One event per distinct partition that the asset events of ``after`` (other pipelines'
    published data: :attr:`~cascade.pipeline_spec.Pipeline.after`) name in their ``ds``, so
    the claim step deals them out one partition per run as it deals Kafka events.

    Each is a ``cascade.data.landed`` event (dataset: the asset's URI, source: the pipeline
    that published it) with the id ``after:DS``: an id per partition, not per asset event, so
    an upstream that publishes a partition again finds it claimed by the run that built it and
    starts no second build. Asset events of other assets, or without a valid ``ds``, give none.
    """
    found: dict[str, dict[str, Any]] = {}
    for asset_event in asset_events:
        uri = getattr(getattr(asset_event, "asset", None), "uri", None)
        extra = getattr(asset_event, "extra", None) or {}
        ds = extra.get("ds") if isinstance(extra, Mapping) else None
        if uri not in after or not isinstance(ds, str) or UPSTREAM_ID_PREFIX + ds in found:
            continue
        source = extra.get("pipeline")
        try:
            event = Event(
                id=UPSTREAM_ID_PREFIX + ds,
                type=TOPIC_DATA_LANDED,
                time=getattr(asset_event, "timestamp", None) or dt.datetime.now(dt.UTC),
                source=source if isinstance(source, str) and source else "airflow",
                payload={"dataset": uri, "partition": ds},
            )
            found[event.id] = json.loads(parse_event(event.model_dump_json()).model_dump_json())
        except (InvalidEvent, ValueError) as exc:  # pydantic's errors are ValueErrors
            log.warning("asset event of %s names no partition to build (%s): ignored", uri, exc)
    return list(found.values())


def future_partition(ds: str, today: dt.date) -> str | None:
    """Why ``ds`` cannot be built yet because its day lies ahead (None when it does not)."""
    if dt.date.fromisoformat(ds) <= today:
        return None
    return (
        f"partition {ds} is in the future (today is {today} UTC): nothing can have landed for "
        "it yet; publish the event once its data has landed"
    )


def _dead_letter(
    ledger: ClaimLedger,
    dag_id: str,
    doomed: Sequence[tuple[dict[str, Any], str, str]],
    sink: DeadLetterSink | None,
) -> dict[str, str]:
    """Dead-letter ``(event, kind, reason)``: the records go to ``sink`` first, then the ledger
    marks the events so no run claims them; returns event id -> reason of those marked. A sink
    that fails leaves the events unclaimed (logged), never the run failed."""
    if not doomed:
        return {}
    consumer = f"claim:{dag_id}"[:MAX_NAME_CHARS]
    records = [
        dead_letter_event(event_body(event), InvalidEvent(reason, kind=kind), consumer=consumer)
        for event, kind, reason in doomed
    ]
    try:
        if sink is not None:
            sink(records)
    except Exception as exc:  # the broker client raises its own errors
        log.warning(
            "could not dead-letter %d event(s) (%s); they stay unclaimed and the next claim "
            "tries again",
            len(records),
            exc,
        )
        return {}
    marked = set(ledger.dead_letter(dag_id, [event for event, _, _ in doomed]))
    reasons = {str(event["id"]): reason for event, _, reason in doomed if event["id"] in marked}
    for event_id, reason in reasons.items():
        log.warning("dead-lettered event %s: %s", event_id, reason)
    return reasons


def claim_run_events(
    *,
    dag_id: str,
    run_id: str,
    triggering_extras: Iterable[Any],
    recent: RecentEvents | None,
    ledger: ClaimLedger,
    config: CoalesceConfig,
    partition: str | None = None,
    default_partition: str | None = None,
    unbuildable: Unbuildable | None = None,
    dead_letter: DeadLetterSink | None = None,
    upstream: Sequence[Mapping[str, Any]] = (),
    today: dt.date | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Claim:
    """Claim the events of one partition for the run, out of its triggering events, every
    unclaimed event the asset received (after the burst went quiet) and every event the ledger
    keeps (failed runs gave them back, or earlier runs kept them; however old). ``recent=None``
    skips the coalescing wait.

    - ``upstream`` (:func:`upstream_events`: the partitions other pipelines published) are kept
      in the ledger first (:meth:`ClaimLedger.keep`), since no asset re-reads them: those this
      run does not take wait there for the runs :attr:`Claim.pending` queues. One whose
      partition a run of this DAG built (or is building) is taken, never built again.

    - Events that are not valid today are not claimed (:attr:`Claim.refused` says why).
    - An event without a partition counts as ``default_partition`` (the run's own date).
    - An event whose partition cannot be built (after ``today``, or ``unbuildable`` gives a
      reason), and one that :attr:`CoalesceConfig.max_releases` failed runs gave back, is
      dead-lettered through ``dead_letter`` with its reason and never claimed.
    - A run with a fixed ``partition`` (a scheduled run's date, a backfill's ``ds``, an
      upstream pipeline's partition) claims only that partition's events. Any other run keeps
      the partition it claimed on an earlier try, or takes the oldest partition waiting (those
      no failed run gave back first, so retries never hold up new data).
    - :attr:`Claim.pending` lists the other partitions still waiting, each another run's work.
    """
    events = [e for e in map(event_from_extra, triggering_extras) if e is not None]
    if upstream:
        kept = ledger.keep(dag_id=dag_id, run_id=run_id, events=upstream)
        log.info("upstream partitions kept for a run: %s", sorted(kept))
        events.extend(dict(event) for event in upstream)
    if recent is not None:
        for _ts, extra in wait_until_quiet(recent, config, sleep=sleep):
            event = event_from_extra(extra)
            if event is not None:
                events.append(event)
    retries = ledger.released(dag_id)
    events.extend(released.event for released in retries.values())
    valid, refused = checked_events(events)
    for event_id, why in refused.items():
        log.warning("not claiming event %s: %s", event_id, why)
    unique = unique_events(valid)
    owners = ledger.owners(dag_id)
    own = ledger.run_events(dag_id, run_id)
    result = Claim(run_id=run_id, refused=refused)
    result.taken = {i: owners[i] for i in unique if owners.get(i, run_id) != run_id}

    def partition_of(event: Mapping[str, Any]) -> str | None:
        return event_partition(event) or default_partition

    groups: dict[str | None, list[dict[str, Any]]] = {}
    for event_id, event in unique.items():
        if event_id not in owners:
            groups.setdefault(partition_of(event), []).append(event)
    today = today or dt.datetime.now(dt.UTC).date()
    doomed: list[tuple[dict[str, Any], str, str]] = []
    for ds in list(groups):
        reason: str | None = None if ds is None else future_partition(ds, today)
        named = [where for event in groups[ds] if (where := named_path(event))]
        if ds is not None and reason is None and named:
            # The batch is elsewhere: the first step lands it from there (cascade.landing).
            if not any(Path(where).exists() for where in named):
                reason = (
                    f"nothing to land for ds={ds}: {named[0]} does not exist; publish the "
                    "event once the batch is there"
                )
        elif ds is not None and reason is None and unbuildable is not None:
            try:
                reason = unbuildable(ds)
            except Exception as exc:  # a check that cannot look decides nothing
                log.warning("cannot check partition %s (%s); its events wait", ds, exc)
                del groups[ds]
                continue
        if reason is not None:
            doomed += [(event, DEAD_LETTER_UNBUILDABLE, reason) for event in groups.pop(ds)]
            continue
        for event in list(groups[ds]):
            released = retries.get(str(event["id"]))
            if released is not None and released.releases >= config.max_releases:
                groups[ds].remove(event)
                doomed.append(
                    (
                        event,
                        DEAD_LETTER_RETRIES,
                        f"{released.releases} runs failed on partition {ds} (the last "
                        f"{released.last_run_id}); see that run's logs, fix the cause and "
                        "publish the event again",
                    )
                )
        if not groups[ds]:
            del groups[ds]
    result.dead_lettered = _dead_letter(ledger, dag_id, doomed, dead_letter)

    def retried(ds: str | None) -> int:
        return max(
            (retries[str(e["id"])].releases for e in groups[ds] if str(e["id"]) in retries),
            default=0,
        )

    if own:
        candidates: list[str | None] = [partition_of(own[0])]
        result.reclaimed = own
    elif partition is not None:
        candidates = [partition]
    else:
        candidates = sorted(groups, key=lambda ds: (retried(ds), ds or ""))
    for ds in candidates:
        claimed = ledger.claim(dag_id=dag_id, run_id=run_id, events=groups.get(ds, []))
        result.taken.update(claimed.taken)
        result.new = claimed.new
        if claimed.new or own or partition is not None:
            result.partition = ds
            break
    result.pending = sorted(ds for ds in groups if ds is not None and ds != result.partition)
    return result


def _publish_dead_letters(settings: Settings) -> DeadLetterSink:
    def sink(records: Sequence[Event]) -> None:
        from cascade.broker import publish_many

        publish_many(list(records), settings=settings, timeout_s=10.0)

    return sink


def run_partition(dag_run: Any, *, lag_days: int = 0) -> str:
    """A DAG run's own partition (:func:`cascade.partitions.own_partition`)."""
    from cascade.partitions import own_partition

    return own_partition(
        getattr(dag_run, "logical_date", None),
        getattr(dag_run, "run_after", None),
        lag_days=lag_days,
    )


def claim_for_run(
    context: Mapping[str, Any],
    asset: Any,
    *,
    partition: str | None = None,
    lag_days: int = 0,
    unbuildable: Unbuildable | None = None,
    after: Collection[str] = (),
    coalesce: bool = True,
    settings: Settings | None = None,
    config: CoalesceConfig | None = None,
) -> Claim:
    """Claim the events of one partition for the running Airflow task's DAG run (``asset``
    must be an inlet): ``partition`` when the run has one of its own, else the oldest waiting
    (:func:`claim_run_events`). The partitions that the triggering events of the ``after``
    assets name count as events too (:func:`upstream_events`). ``coalesce`` waits for the
    asset's burst to go quiet (an asset no watcher feeds has no burst). Events whose partition
    cannot be built are dead-lettered on the broker's dead-letter topic, as the watchers' are.
    The partitions still waiting are left in the task's XCom :data:`PENDING_XCOM_KEY` for the
    task that queues the next run.

    Raises Airflow's skip exception when an asset-triggered run has nothing left to claim: its
    events were redelivered copies or were coalesced into another run, so its work is done."""
    from airflow.sdk.exceptions import AirflowSkipException

    settings = settings or load_settings()
    config = config or coalesce_config_from_env()
    dag_run = context["dag_run"]
    triggering = context.get("triggering_asset_events") or {}
    asset_events = [event for batch in triggering.values() for event in batch]
    extras = [event.extra for event in asset_events]

    # The first read covers the lookback; later reads only the last REREAD_S (events can commit
    # a little after their timestamp), merged by asset event id: re-reading thousands of
    # events every poll through the one API server slowed it down for every task.
    seen: dict[Any, tuple[dt.datetime, Any]] = {}
    newest: list[dt.datetime] = []

    def recent(since: dt.datetime) -> list[tuple[dt.datetime, Any]]:
        start = max(since, newest[0] - dt.timedelta(seconds=REREAD_S)) if newest else since
        for event in context["inlet_events"][asset].after(start.isoformat()):
            key = getattr(event, "id", None) or (
                event.timestamp,
                json.dumps(event.extra, default=str),
            )
            seen[key] = (event.timestamp, event.extra)
        if seen:
            newest[:] = [max(ts for ts, _ in seen.values())]
        return list(seen.values())

    claim = claim_run_events(
        dag_id=dag_run.dag_id,
        run_id=dag_run.run_id,
        triggering_extras=extras,
        recent=recent if coalesce else None,
        ledger=ClaimLedger.for_settings(settings),
        config=config,
        partition=partition,
        default_partition=run_partition(dag_run, lag_days=lag_days),
        unbuildable=unbuildable,
        dead_letter=_publish_dead_letters(settings),
        upstream=upstream_events(asset_events, after),
    )
    log.info(
        "run %s claimed %d new event(s), %d from an earlier try, of partition %s; %d owned by "
        "other runs; %d invalid, not claimed; %d dead-lettered; partitions waiting: %s",
        dag_run.run_id,
        len(claim.new),
        len(claim.reclaimed),
        claim.partition,
        len(claim.taken),
        len(claim.refused),
        len(claim.dead_lettered),
        claim.pending,
    )
    ti = context.get("ti")
    if ti is not None:
        ti.xcom_push(key=PENDING_XCOM_KEY, value=claim.pending)
    if not claim.has_work and str(dag_run.run_type) in (
        "asset_triggered",
        "DagRunType.ASSET_TRIGGERED",
    ):
        owners = sorted(set(claim.taken.values()))
        raise AirflowSkipException(
            f"nothing to do: {len(claim.taken)} triggering event(s) already claimed by "
            f"{owners[:5]} (redelivered, coalesced, or their partition built by that run), "
            f"{len(claim.refused)} invalid, "
            f"{len(claim.dead_lettered)} dead-lettered (their partition cannot be built)"
        )
    return claim


def release_failed_run(context: Mapping[str, Any]) -> None:
    """DAG and task ``on_failure_callback``: a failed run gives its events back. The ledger
    keeps them (with their bodies and how many runs gave them back), so a later run of the DAG
    retries them however old they are; :attr:`CoalesceConfig.max_releases` releases and the
    next claim dead-letters them instead. A run that failed after partly working redoes that
    work, which the idempotent tasks allow. Releasing when a task fails for good (not only when
    the run is marked failed) lets the run already queued after this one see them."""
    dag_run = context["dag_run"]
    released = ClaimLedger.for_settings().release(dag_id=dag_run.dag_id, run_id=dag_run.run_id)
    if released:
        log.warning("run %s failed: released %d event(s) for a later run", dag_run.run_id, released)
