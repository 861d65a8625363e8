"""The events part of ``cascade bench security``: hypothesis-generated messages a watcher may
read (raw bytes and text, any JSON, envelopes of every event type with hostile fields) routed as
a watcher routes them, each one that fires claimed by a run and its partition resolved, each one
refused dead-lettered with its reason (:func:`fuzz_events`); and the issue's bad event classes
(:func:`bad_event_classes`). The rest of the benchmark is :mod:`benchmarks.security`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _event_strategies() -> Any:
    """Messages a watcher may read: raw bytes and text, any JSON, and envelopes of every event
    type whose fields are hostile (wrong types, non-canonical or far dates, huge strings)."""
    from hypothesis import strategies as st

    from cascade.assets import TOPICS

    text = st.text(st.characters(exclude_categories=()), max_size=40)
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | text,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
        max_leaves=20,
    )
    days = st.dates()
    partitions = st.one_of(
        st.dates(dt.date(1999, 12, 1), dt.date.today() + dt.timedelta(days=30)).map(
            dt.date.isoformat
        ),
        days.map(dt.date.isoformat),
        days.map(lambda d: d.strftime("%Y%m%d")),
        days.map(lambda d: "{}-W{:02d}-{}".format(*d.isocalendar())),
        days.map(lambda d: f"{d.isoformat()}T00:00:00"),
        st.integers(),
        st.floats(),
        text,
        st.none(),
    )
    names = st.one_of(st.sampled_from(["ml100k", "preranking", "asr"]), st.text(max_size=300))
    scores = st.one_of(st.floats(), st.integers(), st.booleans(), text)
    payloads = {
        "cascade.data.landed": st.fixed_dictionaries(
            {"dataset": names, "partition": partitions},
            optional={"path": st.one_of(st.none(), st.text(max_size=80))},
        ),
        "cascade.retrain.requested": st.fixed_dictionaries(
            {"model": names, "reason": names},
            optional={"partition": partitions, "caused_by": st.lists(text, max_size=300)},
        ),
        "cascade.drift.detected": st.fixed_dictionaries(
            {"model": names, "partition": partitions, "max_psi": scores, "psi_threshold": scores}
        ),
        "cascade.model.deployed": st.fixed_dictionaries(
            {"model": names, "alias": names, "version": names}
        ),
    }
    # Envelope fields: mostly well-formed (so payloads get checked), sometimes hostile.
    fields = {
        "id": st.one_of(
            st.uuids().map(lambda u: u.hex),
            st.uuids().map(lambda u: u.hex),
            st.text(max_size=300),
            st.integers(),
        ),
        "time": st.one_of(
            st.just(dt.datetime.now(dt.UTC).isoformat()),
            st.datetimes().map(dt.datetime.isoformat),
            st.integers(),
            text,
        ),
        "source": st.one_of(st.just("bench"), st.just("bench"), st.text(max_size=300)),
    }
    optional = {"schema_version": st.one_of(st.just(1), st.integers(), st.text(max_size=3))}
    typed = st.sampled_from(sorted(payloads)).flatmap(
        lambda kind: st.fixed_dictionaries(
            {"type": st.just(kind), "payload": payloads[kind], **fields}, optional=optional
        )
    )
    untyped = st.fixed_dictionaries(
        {"type": st.one_of(st.sampled_from(TOPICS), text), "payload": json_values},
        optional={**fields, **optional, "extra": json_values},
    )
    envelopes = st.one_of(typed, typed, untyped)
    return st.one_of(
        st.binary(max_size=300),
        st.text(max_size=300),
        json_values.map(json.dumps),
        envelopes.map(lambda e: json.dumps(e).encode()),
        envelopes.map(json.dumps),
    )


def bad_event_classes() -> dict[str, bytes]:
    """The issue's bad events, one per class."""
    from cascade.events import MAX_EVENT_BYTES, MAX_NAME_CHARS

    def landed(partition: Any, **more: Any) -> bytes:
        payload = {"dataset": "ml100k", "partition": partition, **more}
        envelope = {
            "id": "bad",
            "type": "cascade.data.landed",
            "time": "2026-11-22T10:00:00+00:00",
            "source": "bench",
            "payload": payload,
        }
        return json.dumps(envelope).encode()

    return {
        "integer partition": landed(2999980800),
        "far-future partition": landed("9999-12-31"),
        "partition before the lake": landed("1970-01-01"),
        "basic date": landed("20261122"),
        "week date": landed("2026-W47-1"),
        "oversized field": landed("2026-11-22", path=None).replace(
            b'"ml100k"', json.dumps("d" * (MAX_NAME_CHARS + 1)).encode()
        ),
        "oversized message": landed("2026-11-22", path="p" * MAX_EVENT_BYTES),
        "not JSON": b"\xff{not json",
        "unknown type": json.dumps({"type": "cascade.nope", "payload": {}}).encode(),
    }


class EventRun:
    """Watcher routing, dead-letter records and run claims for a stream of messages."""

    def __init__(self, ledger_path: Path) -> None:
        from cascade.event_ledger import EventLedger

        self.ledger = EventLedger(ledger_path)
        self.routed: Counter[str] = Counter()
        self.dead_letter_kinds: Counter[str] = Counter()
        self.stalls: list[str] = []
        self.claimed = 0
        self.refused_at_claim = 0
        self.runs = 0
        self._pending: list[dict[str, Any]] = []

    def route(self, raw: Any) -> tuple[str, str | None, str | None]:
        """``(action, dead-letter kind, reason)`` of one message; a failure is counted."""
        from cascade.assets import CTR_EVENT_SELECTORS
        from cascade.event_trigger import dead_letter_record, route_message
        from cascade.events import parse_event

        try:
            route = route_message(raw, CTR_EVENT_SELECTORS)
        except Exception as exc:  # the watcher would die on it: the stream stalls
            self.stalls.append(f"routing raised {type(exc).__name__}: {str(exc)[:200]}")
            return "raised", None, None
        self.routed[route.action] += 1
        if route.action == "dead-letter":
            try:
                record = parse_event(dead_letter_record(raw).model_dump_json())
                kind, reason = record.payload["kind"], record.payload["reason"]
                if not kind or not reason:
                    raise ValueError("dead-letter record without kind or reason")
            except Exception as exc:
                self.stalls.append(f"no readable dead-letter record: {type(exc).__name__}: {exc}")
                return "dead-letter", None, None
            self.dead_letter_kinds[kind] += 1
            return "dead-letter", kind, reason
        if route.action == "fire":
            assert route.event is not None
            self._pending.append(json.loads(route.event.model_dump_json()))
        # Stored asset events are claimed again by runs, whatever the watcher did: a
        # generated envelope goes in raw too, as one stored before the watcher was this strict.
        with contextlib.suppress(Exception):
            data = json.loads(raw)
            if isinstance(data, dict):
                self._pending.append(data)
        if len(self._pending) >= 25:
            self.claim()
        return route.action, None, None

    def claim(self) -> None:
        """One run claims the pending events and resolves its partition, as a DAG's first task
        does; anything raised would fail (and, re-claimed, stall) the run."""
        from cascade.event_claims import CoalesceConfig, claim_run_events
        from cascade.lake import check_ds
        from cascade.partitions import resolve_partition

        if not self._pending:
            return
        extras = [{"from_trigger": True, "payload": e} for e in self._pending]
        self._pending = []
        self.runs += 1
        try:
            claim = claim_run_events(
                dag_id="ctr_preranking",
                run_id=f"run-{self.runs}",
                triggering_extras=extras,
                recent=None,
                ledger=self.ledger,
                config=CoalesceConfig(window_s=0),
            )
            partition = resolve_partition(
                claim.events, dt.datetime(2026, 11, 24, tzinfo=dt.UTC), None
            )
            check_ds(partition)
            self.claimed += len(claim.new)
            self.refused_at_claim += len(claim.refused)
        except Exception as exc:
            self.stalls.append(f"run-{self.runs} failed: {type(exc).__name__}: {str(exc)[:200]}")


def each_message(examples: int, handle: Callable[[Any], None]) -> None:
    """``handle`` each of ``examples`` messages of :func:`_event_strategies` (derandomized: the
    same messages on every run, but for the envelopes' "now")."""
    from hypothesis import HealthCheck, given
    from hypothesis import settings as hsettings

    @given(_event_strategies())
    @hsettings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def feed(raw: Any) -> None:
        handle(raw)

    feed()


def fuzz_events(workdir: Path, *, examples: int) -> dict[str, Any]:
    run = EventRun(workdir / "ledger.sqlite")
    count = 0

    def feed(raw: Any) -> None:
        nonlocal count
        count += 1
        run.route(raw)

    started = time.monotonic()
    each_message(examples, feed)
    run.claim()
    bad: dict[str, dict[str, Any]] = {}
    for name, raw in bad_event_classes().items():
        count += 1
        action, kind, reason = run.route(raw)
        bad[name] = {"action": action, "kind": kind, "reason": (reason or "")[:160]}
        if action != "dead-letter":
            run.stalls.append(f"bad class {name!r} was not dead-lettered ({action})")
    run.claim()
    return {
        "events_fuzzed": count,
        "events_stalling_a_run": len(run.stalls),
        "events_routed": dict(run.routed),
        "events_dead_letter_kinds": dict(run.dead_letter_kinds),
        "events_claimed_by_runs": run.claimed,
        "events_refused_at_claim": run.refused_at_claim,
        "event_runs": run.runs,
        "event_stalls": run.stalls[:5],
        "bad_classes": bad,
        "events_s": round(time.monotonic() - started, 1),
    }


# --- through the running broker and trigger -----------------------------------------------------

RUN_ENDED = ("success", "failed")


def generated_messages(examples: int) -> list[bytes]:
    """The fuzzer's messages (:func:`each_message`) as the bytes a producer sends; text that
    UTF-8 cannot hold goes as it is (lone surrogates kept)."""
    messages: list[bytes] = []

    def collect(raw: Any) -> None:
        messages.append(raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass"))

    each_message(examples, collect)
    return messages


def ledger_accounting(
    ledger: Any, dag_id: str, valid: list[Any], run_states: dict[str, str]
) -> dict[str, Any]:
    """What the ledger says became of ``valid`` events (each naming a ``partition``): the runs
    that claimed them, the partitions and events no run did work for. ``run_states`` (run id
    -> Airflow state) holds every run of ``dag_id`` since the events were published: only a
    valid event starts one (the watcher dead-letters the rest), so a failed one among them,
    whether or not it claimed one of ``valid``, counts in ``runs_failed_by_valid_events``."""
    owners = ledger.owners(dag_id)
    worked = {event_id for ids in ledger.work_records(dag_id).values() for event_id in ids}
    partitions = {event.payload["partition"] for event in valid}
    built = {event.payload["partition"] for event in valid if event.id in worked}
    runs = sorted({owners[event.id] for event in valid if event.id in owners})
    failed = {run for run, state in run_states.items() if state == "failed"}
    return {
        "valid_events_published": len(valid),
        "valid_partitions": len(partitions),
        "partitions_never_built": len(partitions - built),
        "partitions_not_built": sorted(partitions - built),
        "valid_events_without_work": sum(event.id not in worked for event in valid),
        "runs_for_valid_events": len(runs),
        "runs_failed_by_valid_events": len(failed),
        "runs_failed": sorted(failed),
        "runs_not_ended": sum(run_states.get(run) not in RUN_ENDED for run in runs),
    }


def dead_letter_growth(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    """Dead letters by kind written between two :func:`cascade.broker.dead_letter_summary`."""
    return {
        kind: count - before["by_kind"].get(kind, 0)
        for kind, count in after["by_kind"].items()
        if count > before["by_kind"].get(kind, 0)
    }


def through_broker(
    settings: Any, *, examples: int, valid: int, partitions: int, timeout_s: float = 600
) -> dict[str, Any]:
    """Publish the fuzzer's messages, the bad event classes, ``valid`` probe events over
    ``partitions`` days and one valid but unbuildable event through the running broker, to
    the running trigger (DAG ``event_probe``, unpaused), and count from the ledger."""
    from benchmarks.event_delivery import (
        PROBE_DAG,
        account,
        probe_events,
        settle_runs,
        unbuildable_probe_event,
    )
    from cascade.airflow_client import AirflowClient
    from cascade.assets import TOPIC_DATA_LANDED
    from cascade.broker import dead_letter_summary, publish_many, publish_raw
    from cascade.event_claims import DEAD_LETTER_UNBUILDABLE
    from cascade.event_ledger import ClaimLedger

    started = time.monotonic()
    dead_before = dead_letter_summary(settings)
    fuzzed = generated_messages(examples)
    bad = list(bad_event_classes().values())
    batch = probe_events(valid, partitions=partitions)
    since = dt.datetime.now(dt.UTC)
    raw = [(TOPIC_DATA_LANDED, None, message) for message in [*fuzzed, *bad]]
    publish_raw(raw, settings=settings, timeout_s=120)
    publish_many([*batch, unbuildable_probe_event()], settings=settings, timeout_s=60)
    accounted = account([event.id for event in batch], settings, timeout_s=timeout_s)
    settled = settle_runs(settings, since, timeout_s=timeout_s)
    runs = AirflowClient(settings).get(
        f"/dags/{PROBE_DAG}/dagRuns", run_after_gte=since.isoformat(), limit=1000
    )["dag_runs"]
    states = {run["dag_run_id"]: run["state"] for run in runs}
    ledger = ledger_accounting(ClaimLedger.for_settings(settings), PROBE_DAG, batch, states)
    dead = dead_letter_summary(settings)
    kinds = dead_letter_growth(dead_before, dead)
    return {
        "events_through_broker": len(raw) + len(batch) + 1,
        **ledger,
        "fuzzed_through_broker": len(fuzzed),
        "bad_classes_through_broker": len(bad),
        "unbuildable_published": 1,
        "unbuildable_events_dead_lettered": kinds.get(DEAD_LETTER_UNBUILDABLE, 0),
        "dead_lettered": dead["distinct"] - dead_before["distinct"],
        "dead_letters_by_kind": kinds,
        "duplicates": len(accounted["duplicates"]),
        "probe_runs_failed": settled["runs_failed"],
        "probe_runs_stalled": settled["stalled_runs"],
        "broker_events_s": round(time.monotonic() - started, 1),
    }


def broker_run(workdir: Path, *, quick: bool) -> dict[str, Any]:
    """:func:`through_broker` on a private stack of its own (the broker and Airflow, whose
    triggerer runs the watcher), after one probe event went through untimed."""
    from benchmarks.event_delivery import wait_for_probe_dag, warm_up
    from infra.stack import private_stack

    env = {
        "CASCADE_COALESCE_WINDOW_S": "3",
        "CASCADE_COALESCE_MAX_WAIT_S": "600",
        "CASCADE_AIRFLOW_SCHEDULES": "0",  # only the probe DAG works
    }
    services = ("broker", "airflow")
    with private_stack(workdir / "events-state", services=services, env=env) as settings:
        wait_for_probe_dag(settings)
        warm_up_s = warm_up(settings)
        result = through_broker(
            settings,
            examples=30 if quick else 1000,
            valid=12 if quick else 200,
            partitions=3 if quick else 7,
        )
    return {**result, "broker_warm_up_s": round(warm_up_s, 1)}
