"""Events as a trust boundary: any input is either a valid, normalised event or an
:class:`InvalidEvent` that is dead-lettered with its reason; a bad event never reaches a run."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cascade.assets import CROSS_EVENT_SELECTORS, TOPIC_DATA_LANDED, TOPICS
from cascade.event_claims import CoalesceConfig, checked_events, claim_run_events
from cascade.event_ledger import EventLedger
from cascade.event_trigger import route_message
from cascade.events import (
    MAX_EVENT_BYTES,
    MAX_NAME_CHARS,
    PARTITION_MIN,
    Event,
    InvalidEvent,
    dead_letter_event,
    make_event,
    parse_event,
    partition_max,
)
from cascade.lake import check_ds
from cascade.partitions import resolve_partition
from tests.events.memory_stream import run_stream

FUZZ = settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


def envelope(payload: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {
        "id": "e1",
        "type": TOPIC_DATA_LANDED,
        "time": "2026-11-22T10:00:00+00:00",
        "source": "test",
        "payload": payload,
        **fields,
    }


def landed_raw(partition: Any, **payload: Any) -> bytes:
    return json.dumps(
        envelope({"dataset": "impressions", "partition": partition, **payload})
    ).encode()


# --- Property: no input makes parsing raise anything but InvalidEvent --------------------------

# Any code point, lone surrogates included (json.dumps writes them as "\\ud800" escapes).
any_text = st.text(st.characters(exclude_categories=()), max_size=40)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | any_text
    | st.dates().map(dt.date.isoformat),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(any_text, children, max_size=5)
    ),
    max_leaves=25,
)
partitions = st.one_of(
    st.dates(dt.date(1999, 12, 1), dt.date.today() + dt.timedelta(days=30)).map(dt.date.isoformat),
    st.dates().map(dt.date.isoformat),
    st.dates().map(lambda d: d.strftime("%Y%m%d")),
    st.dates().map(lambda d: f"{d.isocalendar()[0]}-W{d.isocalendar()[1]:02d}-1"),
    st.dates().map(lambda d: d.isoformat() + "T00:00:00"),
    st.integers(),
    st.floats(),
    st.text(max_size=12),
    st.none(),
)
names = st.one_of(
    st.sampled_from(["impressions", "preranking", "champion", "3"]),
    st.text(max_size=150),
    any_text,
)
scores = st.one_of(st.floats(), st.integers(-2, 2), st.booleans(), st.text(max_size=3))
typed_payloads = {
    "cascade.data.landed": st.fixed_dictionaries(
        {"dataset": names, "partition": partitions},
        optional={"path": st.one_of(st.none(), st.text(max_size=50))},
    ),
    "cascade.retrain.requested": st.fixed_dictionaries(
        {"model": names, "reason": names},
        optional={
            "partition": partitions,
            "caused_by": st.lists(st.one_of(st.uuids().map(str), st.text()), max_size=4),
        },
    ),
    "cascade.drift.detected": st.fixed_dictionaries(
        {"model": names, "partition": partitions, "max_psi": scores, "psi_threshold": scores},
        optional={
            "drifted_features": st.dictionaries(names, scores, max_size=3),
            "online_auc": st.one_of(st.none(), scores),
        },
    ),
    "cascade.model.deployed": st.fixed_dictionaries(
        {"model": names, "alias": names, "version": names},
        optional={
            "previous_version": st.one_of(st.none(), names),
            "reason": st.sampled_from(["promotion", "rollback", "other"]),
        },
    ),
}
ids = st.one_of(st.uuids().map(lambda u: u.hex), st.text(max_size=200), st.integers())
envelope_fields = {
    "id": ids,
    "schema_version": st.one_of(st.just(1), st.integers(), st.booleans(), st.text(max_size=3)),
    "time": st.one_of(st.datetimes().map(dt.datetime.isoformat), st.integers(), st.text()),
    "source": st.one_of(st.text(max_size=200), any_text),
    "extra": json_values,
}
typed_envelopes = st.sampled_from(sorted(typed_payloads)).flatmap(
    lambda event_type: st.fixed_dictionaries(
        {"type": st.just(event_type), "payload": typed_payloads[event_type]},
        optional=envelope_fields,
    )
)
envelopes = st.one_of(
    typed_envelopes,
    st.fixed_dictionaries(
        {
            "type": st.one_of(st.sampled_from(TOPICS), st.text(max_size=20), st.integers()),
            "payload": json_values,
        },
        optional=envelope_fields,
    ),
)
messages = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=300),
    json_values.map(json.dumps),
    envelopes.map(json.dumps),
    envelopes.map(lambda e: json.dumps(e).encode()),
    st.none(),
    st.integers(),
)


def _check_accepted(event: Event) -> None:
    high = partition_max()
    partition = event.payload.get("partition")
    if partition is not None:
        assert isinstance(partition, str) and check_ds(partition) == partition
        assert PARTITION_MIN <= dt.date.fromisoformat(partition) <= high
    # What travels is already normal: reading it again gives the same event.
    text = event.model_dump_json()
    assert len(text.encode()) <= MAX_EVENT_BYTES
    assert parse_event(text) == event


@FUZZ
@given(messages)
def test_parsing_accepts_only_valid_events_and_raises_only_invalid_event(raw: Any) -> None:
    try:
        event = parse_event(raw)
    except InvalidEvent as exc:
        assert exc.kind and str(exc)
        # Its dead-letter record is itself a valid event, readable by the DLQ's readers.
        record = dead_letter_event(raw, exc, consumer="fuzz")
        again = parse_event(record.model_dump_json())
        assert again.payload["kind"] == exc.kind and again.payload["reason"]
        assert route_message(raw, CROSS_EVENT_SELECTORS).action == "dead-letter"
        return
    _check_accepted(event)
    assert route_message(raw, CROSS_EVENT_SELECTORS).action in ("fire", "skip")


@FUZZ
@given(envelopes)
def test_a_run_claims_only_valid_events(data: dict[str, Any]) -> None:
    """The claim step checks stored asset events again: nothing invalid is claimed, so no
    stored event can fail the run that claims it (or every later run)."""
    valid, refused = checked_events([data])
    assert len(valid) + len(refused) == 1
    for event in valid:
        _check_accepted(parse_event(json.dumps(event)))
        if event["type"] == TOPIC_DATA_LANDED:
            assert resolve_partition([event], None, None) == event["payload"]["partition"]


near_range = st.dates(dt.date(1999, 12, 1), dt.date.today() + dt.timedelta(days=30))


@FUZZ
@given(
    st.one_of(near_range, st.dates()),
    st.text(min_size=1, max_size=MAX_NAME_CHARS + 20),
    st.sampled_from(["iso", "basic", "week", "datetime", "int"]),
)
def test_a_landed_event_is_accepted_exactly_when_its_date_is_canonical_and_in_range(
    day: dt.date, dataset: str, spelling: str
) -> None:
    partition: Any = {
        "iso": day.isoformat(),
        "basic": day.strftime("%Y%m%d"),
        "week": "{}-W{:02d}-{}".format(*day.isocalendar()),
        "datetime": f"{day.isoformat()}T00:00:00",
        "int": int(dt.datetime.combine(day, dt.time(), dt.UTC).timestamp()),
    }[spelling]
    raw = json.dumps(envelope({"dataset": dataset, "partition": partition}))
    expected = (
        spelling == "iso"
        and PARTITION_MIN <= day <= partition_max()
        and len(dataset) <= MAX_NAME_CHARS
        and not any(0xD800 <= ord(c) <= 0xDFFF for c in dataset)
    )
    try:
        event = parse_event(raw)
    except InvalidEvent as exc:
        assert not expected, exc
        return
    assert expected and event.payload["partition"] == day.isoformat()
    _check_accepted(event)


# --- Each bad class lands in the dead-letter path with its reason ------------------------------

BAD = {
    "wrong-type": (landed_raw(2999980800), "bad-payload", "partition"),
    "out-of-range-future": (landed_raw("9999-12-31"), "bad-payload", "outside"),
    "out-of-range-past": (landed_raw("1970-01-01"), "bad-payload", "outside"),
    "non-canonical-basic": (landed_raw("20261122"), "bad-payload", "not YYYY-MM-DD"),
    "non-canonical-week": (landed_raw("2026-W47-1"), "bad-payload", "not YYYY-MM-DD"),
    "oversized-field": (
        json.dumps(envelope({"dataset": "d" * (MAX_NAME_CHARS + 1), "partition": "2026-11-22"})),
        "bad-payload",
        "dataset",
    ),
    "oversized-list": (
        json.dumps(
            envelope(
                {"model": "m", "reason": "r", "caused_by": ["e"] * 300},
                type="cascade.retrain.requested",
            )
        ),
        "bad-payload",
        "caused_by",
    ),
    "oversized-message": (
        landed_raw("2026-11-22", path="p" * MAX_EVENT_BYTES),
        "too-large",
        "byte limit",
    ),
    "not-json": (b"\xff{not json", "not-json", "not JSON"),
    "unknown-type": (json.dumps(envelope({}, type="cascade.nope")), "unknown-type", "nope"),
    "wrong-envelope-type": (
        json.dumps(envelope({}, schema_version="1")),
        "bad-envelope",
        "schema_version",
    ),
}


@pytest.mark.parametrize("name", list(BAD))
def test_each_bad_class_is_rejected_with_its_reason(name: str) -> None:
    raw, kind, words = BAD[name]
    with pytest.raises(InvalidEvent, match=words) as caught:
        parse_event(raw)
    assert caught.value.kind == kind


def test_every_bad_class_is_dead_lettered_with_its_reason_and_committed() -> None:
    values = [raw.encode() if isinstance(raw, str) else raw for raw, _kind, _words in BAD.values()]
    run = run_stream(values, selectors=CROSS_EVENT_SELECTORS)
    assert run.error is None and run.fired == []
    kinds = [r["payload"]["kind"] for r in run.dead_letters]
    assert kinds == [kind for _raw, kind, _words in BAD.values()]
    for record, (_raw, _kind, words) in zip(run.dead_letters, BAD.values(), strict=True):
        assert words in record["payload"]["reason"]
        assert len(record["payload"]["raw"]) <= 4096
    assert run.commits[-1] >= len(values)


# --- The partition-int event of the stall no longer stalls anything ----------------------------


def test_the_integer_partition_event_is_dead_lettered_not_fired() -> None:
    good = make_event(TOPIC_DATA_LANDED, {"dataset": "impressions", "partition": "2026-11-22"})
    run = run_stream(
        [landed_raw(2999980800), good.model_dump_json().encode()], selectors=CROSS_EVENT_SELECTORS
    )
    assert [e["id"] for e in run.fired] == [good.id]
    assert [r["payload"]["kind"] for r in run.dead_letters] == ["bad-payload"]
    assert "partition" in run.dead_letters[0]["payload"]["reason"]
    # What fired is the normalised event: the partition a run reads is a canonical date.
    assert run.fired[0]["payload"] == {
        "dataset": "impressions",
        "partition": "2026-11-22",
        "path": None,
        "format": None,
        "source": None,
        "counts": {},
    }


def test_stored_bad_events_are_never_claimed_so_no_run_fails_on_them(tmp_path: Path) -> None:
    """Asset events stored before the watcher checked as strictly (the raw dict with an integer
    partition, a far-future date) are refused at claim time: the burst's run works on the valid
    event's partition, and the next (cron) run finds nothing to fail on."""
    ledger = EventLedger(tmp_path / "ledger.sqlite")
    integer = envelope({"dataset": "impressions", "partition": 2999980800}, id="int-partition")
    future = envelope({"dataset": "impressions", "partition": "9999-12-31"}, id="far-future")
    valid = json.loads(
        make_event(
            TOPIC_DATA_LANDED, {"dataset": "impressions", "partition": "2026-11-21"}
        ).model_dump_json()
    )
    now = dt.datetime.now(dt.UTC)
    stored = [
        (now - dt.timedelta(minutes=5), {"from_trigger": True, "payload": e})
        for e in (integer, valid, future)
    ]

    def claim(run_id: str, triggering: list[dict[str, Any]]) -> Any:
        return claim_run_events(
            dag_id="ctr_preranking",
            run_id=run_id,
            triggering_extras=[{"from_trigger": True, "payload": e} for e in triggering],
            recent=lambda since: stored,
            ledger=ledger,
            config=CoalesceConfig(window_s=0),
        )

    first = claim("asset-run", [integer])
    assert [e["id"] for e in first.new] == [valid["id"]]
    assert set(first.refused) == {"int-partition", "far-future"}
    assert "partition" in first.refused["int-partition"]
    assert resolve_partition(first.events, None, None) == "2026-11-21"
    cron = claim("scheduled-run", [])
    assert not cron.has_work and set(cron.refused) == {"int-partition", "far-future"}
    logical = dt.datetime(2026, 11, 24, tzinfo=dt.UTC)
    assert resolve_partition(cron.events, logical, None) == "2026-11-24"
    assert set(ledger.owners("ctr_preranking")) == {valid["id"]}


@pytest.mark.parametrize(
    "ds",
    ["20261122", "2026-W47-1", "2026-11-22T00:00", " 2026-11-22", "2026-02-30", "２０２６-11-22"],
)
def test_check_ds_accepts_only_canonical_dates(ds: str) -> None:
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        check_ds(ds)


def test_check_ds_refuses_non_strings_and_keeps_canonical_dates() -> None:
    assert check_ds("2026-11-22") == "2026-11-22"
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        check_ds(2999980800)  # type: ignore[arg-type]
