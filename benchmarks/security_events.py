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


def fuzz_events(workdir: Path, *, examples: int) -> dict[str, Any]:
    from hypothesis import HealthCheck, given
    from hypothesis import settings as hsettings

    run = EventRun(workdir / "ledger.sqlite")
    count = 0

    @given(_event_strategies())
    @hsettings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def feed(raw: Any) -> None:
        nonlocal count
        count += 1
        run.route(raw)

    started = time.monotonic()
    feed()
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
