import json

import pytest

from cascade.assets import TOPIC_DATA_LANDED, TOPICS
from cascade.event_trigger import to_asset_event
from cascade.events import InvalidEvent, make_event, parse_event


def test_event_round_trips_with_envelope_fields() -> None:
    event = make_event(TOPIC_DATA_LANDED, {"dataset": "ml100k", "partition": "2026-11-22"})
    parsed = parse_event(event.model_dump_json().encode())
    assert parsed.id == event.id and parsed.type == TOPIC_DATA_LANDED
    assert parsed.schema_version == 1
    assert parsed.time.tzinfo is not None
    assert parsed.source


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"\xff\xfe", "not JSON"),
        (b"{not json", "not JSON"),
        (json.dumps({"type": "cascade.unknown"}).encode(), "unknown event type"),
        (json.dumps({"type": TOPIC_DATA_LANDED, "schema_version": 2}).encode(), "bad envelope"),
        (
            json.dumps(
                {"type": TOPIC_DATA_LANDED, "payload": {"dataset": "x", "partition": "yesterday"}}
            ).encode(),
            "bad cascade.data.landed payload",
        ),
        (json.dumps({"type": TOPIC_DATA_LANDED, "surprise": 1}).encode(), "bad envelope"),
    ],
)
def test_invalid_messages_are_rejected_with_a_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(InvalidEvent, match=reason):
        parse_event(raw)


class FakeMessage:
    """Stands in for confluent_kafka.Message, which cannot be built outside a consumer."""

    def __init__(self, value: bytes) -> None:
        self._value = value

    def value(self) -> bytes:
        return self._value


def test_trigger_apply_function_skips_bad_messages_and_returns_the_event() -> None:
    event = make_event(TOPIC_DATA_LANDED, {"dataset": "ml100k", "partition": "2026-11-22"})
    extra = to_asset_event(FakeMessage(event.model_dump_json().encode()))
    assert extra is not None
    assert extra["id"] == event.id and extra["payload"]["partition"] == "2026-11-22"
    assert to_asset_event(FakeMessage(b"garbage")) is None


def test_make_event_refuses_unknown_types() -> None:
    with pytest.raises(InvalidEvent):
        make_event("cascade.nope", {})
    assert "cascade.dead-letter" in TOPICS
