"""The Kafka broker's jars come only at pinned versions and recorded digests, and npm runs no
package's install scripts."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from cascade.config import REPO_ROOT

INSTALL = (REPO_ROOT / "infra" / "install.sh").read_text()


def test_the_broker_jars_are_installed_pinned_and_checked() -> None:
    from infra import kafka_broker

    pom = (REPO_ROOT / "infra" / "kafka" / "pom.xml").read_text()
    # Every version in the POM is exact (no ranges, no LATEST), the plugin's too.
    versions = re.findall(r"<version>([^<]+)</version>", pom)
    assert versions and all(re.fullmatch(r"[\w.\-]+", v) for v in versions), versions
    assert "<artifactId>kafka_2.13</artifactId>" in pom
    assert '-m infra.kafka_broker install "$VENV"' in INSTALL
    digests = kafka_broker.recorded_digests()
    assert len(digests) > 20 and all(re.fullmatch(r"[0-9a-f]{64}", d) for d in digests.values())
    assert kafka_broker.version() == "4.4.0"
    # What `make venv` installed is exactly the recorded set.
    jars = kafka_broker.verify(kafka_broker.libs_dir())
    assert {p.name for p in jars} == set(digests)


def test_a_changed_missing_or_extra_jar_stops_the_broker(tmp_path: Path) -> None:
    from infra import kafka_broker

    digests = {"a.jar": hashlib.sha256(b"a").hexdigest(), "b.jar": hashlib.sha256(b"b").hexdigest()}
    (tmp_path / "a.jar").write_bytes(b"a")
    (tmp_path / "b.jar").write_bytes(b"b")
    assert [p.name for p in kafka_broker.verify(tmp_path, digests)] == ["a.jar", "b.jar"]
    (tmp_path / "b.jar").write_bytes(b"B")
    (tmp_path / "evil.jar").write_bytes(b"x")
    (tmp_path / "a.jar").unlink()
    with pytest.raises(kafka_broker.KafkaInstallError) as err:
        kafka_broker.verify(tmp_path, digests)
    message = str(err.value)
    assert "missing a.jar" in message and "unlisted evil.jar" in message
    assert "changed b.jar" in message and "make venv" in message


def test_npm_runs_no_install_scripts() -> None:
    installs = [line for line in INSTALL.splitlines() if "npm install" in line]
    assert installs and all("--ignore-scripts" in line for line in installs)
