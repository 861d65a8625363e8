"""The KRaft cluster id: never one a command line would read as an option."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from cascade.config import load_settings
from infra import kafka_broker


def test_a_cluster_id_never_starts_with_a_dash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    # 0xf8 encodes to "-" first in base64url: drawn again.
    draws = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=b"\x10" + bytes(15))])
    monkeypatch.setattr(kafka_broker.uuid, "uuid4", lambda: next(draws))
    settings = load_settings()
    first = kafka_broker.cluster_id(settings)
    assert not first.startswith("-") and first.startswith("E")
    assert kafka_broker.cluster_id(settings) == first  # made once, kept
