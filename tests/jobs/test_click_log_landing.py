"""``cascade land impressions``: CSV, Parquet and JSON lines with string keys hashed to ids, null
keys quarantined whatever the mapping, and a zero-byte file, a log without its key columns and a
log of nothing but bad rows each refused in one line, landing and publishing nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import SparkSession

from cascade import cli
from cascade.lake import Lake
from cascade.landing import LANDED_FILE, SUCCESS_MARKER, get_dataset, land, landing_dir
from jobs import ctr_log_sources as sources
from jobs.click_log_landing import ID_MASK, QUARANTINE_DIR
from tests.pipelines.standard_layouts import clicks

pytestmark = pytest.mark.spark

DS = "2026-11-22"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark: SparkSession) -> Path:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _land(
    home: Path, path: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, dict, Path]:
    args = ["land", "impressions", str(path), "--ds", DS, "--no-publish", "--json", *extra]
    code = cli.main(args)
    out = capsys.readouterr()
    record = json.loads(out.out[out.out.index("{") :]) if code == 0 else {"error": out.err}
    return code, record, landing_dir(Lake(home / "lake"), "impressions", DS)


def _hashed(spark: SparkSession, key: str) -> int:
    return int(spark.sql(f"SELECT xxhash64('{key}') & {ID_MASK} AS id").first()["id"])


def _check_hashed(landed: Path, log: pd.DataFrame) -> pd.DataFrame:
    written = pd.read_parquet(landed)
    # The schema's columns that the log has, no more: the optional ones it lacks stay absent.
    assert list(written.columns) == [c for c in sources.LOG_COLUMNS if c in log.columns]
    assert (landed / SUCCESS_MARKER).is_file()
    assert (landed / sources.SOURCE_MARKER).read_text().strip() == "landed"
    # One id per key, the same for every row of it, non-negative, and the 63-bit xxhash64.
    ids = dict(zip(log.user_id, written.user_id, strict=True))
    assert len(set(ids.values())) == 3 and all(0 <= v <= ID_MASK for v in ids.values())
    assert written.user_id.nunique() == 3 and written.item_id.nunique() == 4
    assert written.click.tolist() == log.click.tolist()
    return written


def test_a_csv_log_with_string_keys_lands_with_hashed_ids(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], spark: SparkSession
) -> None:
    log = clicks()
    log.to_csv(tmp_path / "clicks.csv", index=False)

    code, record, landed = _land(home, tmp_path / "clicks.csv", capsys)

    assert code == 0 and record["format"] == "csv"
    assert record["counts"] == {
        "rows": 12, "quarantined": 0, "user_id_collisions": 0, "item_id_collisions": 0,
    }  # fmt: skip
    written = _check_hashed(landed, log)
    assert written.user_id.iloc[0] == _hashed(spark, "user-0")
    assert json.loads((landed / LANDED_FILE).read_text())["counts"]["rows"] == 12


def test_a_parquet_log_with_string_keys_lands_with_the_same_ids(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], spark: SparkSession
) -> None:
    log = clicks()
    (tmp_path / "export").mkdir()
    for part, rows in enumerate((log.iloc[:6], log.iloc[6:])):
        rows.to_parquet(tmp_path / "export" / f"part-{part}.parquet", coerce_timestamps="us")

    code, record, landed = _land(home, tmp_path / "export", capsys)

    assert code == 0 and record["format"] == "parquet" and record["counts"]["rows"] == 12
    written = _check_hashed(landed, log).sort_values("event_timestamp")
    # Deterministic: a key gets the same id from any format and batch.
    assert written.user_id.iloc[0] == _hashed(spark, "user-0")
    assert written.item_id.iloc[1] == _hashed(spark, "sku-1")


def test_a_json_lines_log_with_string_keys_lands_and_quarantines_a_bad_line(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = clicks()
    lines = [
        json.dumps({**row, "event_timestamp": row["event_timestamp"].isoformat()})
        for row in log.to_dict("records")
    ]
    (tmp_path / "clicks.jsonl").write_text("\n".join([*lines, "{not json"]) + "\n")

    code, record, landed = _land(home, tmp_path / "clicks.jsonl", capsys)

    assert code == 0 and record["format"] == "jsonl"
    assert (record["counts"]["rows"], record["counts"]["quarantined"]) == (12, 1)
    _check_hashed(landed, log)
    bad = pd.read_parquet(landed / QUARANTINE_DIR)
    assert bad.reason.tolist() == ["not a JSON object"]


SELF_HASHING = """
[sources.hashed_export]
format = "csv"
options = { header = "true" }
columns = { user_id = "xxhash64(uid)", item_id = "sku", event_timestamp = "ts" }
"""


def test_null_keys_are_quarantined_whatever_the_mapping(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    log = clicks(8)
    log.loc[[1, 5], "user_id"] = None
    log.loc[2, "item_id"] = None
    log.to_csv(tmp_path / "clicks.csv", index=False)

    code, record, landed = _land(home, tmp_path / "clicks.csv", capsys)
    assert code == 0 and record["counts"]["quarantined"] == 3 and record["counts"]["rows"] == 5
    bad = pd.read_parquet(landed / QUARANTINE_DIR)
    assert sorted(bad.reason) == [
        "item_id is null or not an integer",
        "user_id is null or not an integer",
        "user_id is null or not an integer",
    ]

    # A registered source whose mapping hashes the key itself: xxhash64(NULL) is 42, and a
    # null user still is a bad row, not user 42.
    sources_file = tmp_path / "sources.toml"
    sources_file.write_text(SELF_HASHING)
    monkeypatch.setenv("CASCADE_CROSS_SOURCES_FILE", str(sources_file))
    export = log.rename(columns={"user_id": "uid", "item_id": "sku", "event_timestamp": "ts"})
    export["sku"] = range(len(export))
    export.to_csv(tmp_path / "export.csv", index=False)
    code, record, landed = _land(
        home, tmp_path / "export.csv", capsys, "--source", "hashed_export", "--replace"
    )
    assert code == 0 and record["source"] == "hashed_export"
    assert (record["counts"]["rows"], record["counts"]["quarantined"]) == (6, 2)
    assert 42 not in set(pd.read_parquet(landed).user_id)


def test_a_zero_byte_file_is_one_error_naming_it(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "export").mkdir()
    clicks().to_csv(tmp_path / "export" / "day-1.csv", index=False)
    (tmp_path / "export" / "day-2.csv").write_bytes(b"")

    code, record, landed = _land(home, tmp_path / "export", capsys)

    assert code == cli.EXIT_FAILED
    error = record["error"].strip()
    assert error.count("\n") == 0
    assert f"{tmp_path / 'export' / 'day-2.csv'} is empty (0 bytes)" in error
    assert "UNABLE_TO_INFER_SCHEMA" not in error
    assert not landed.exists()  # nothing landed, no staging folder left
    assert not any(landed.parent.iterdir())


def test_a_log_without_its_key_columns_or_with_only_bad_rows_lands_and_publishes_nothing(
    home: Path, tmp_path: Path
) -> None:
    lake, published = Lake(home / "lake"), []
    impressions = get_dataset("impressions")
    renamed = clicks(6).rename(columns={"user_id": "customer", "item_id": "sku"})
    renamed.to_csv(tmp_path / "renamed.csv", index=False)
    with pytest.raises(ValueError) as refused:
        land(lake, impressions, DS, path=tmp_path / "renamed.csv", publish=published.append)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(
        f"{tmp_path / 'renamed.csv'}: the log has no column for ['user_id', 'item_id'] (its "
        "columns: ['customer', 'sku', 'event_timestamp', 'click'])"
    )
    assert message.endswith("land with --source NAME")

    keyless = clicks(6)
    keyless["user_id"] = None
    keyless.loc[2, "user_id"] = " "  # blank is no key either
    keyless.to_csv(tmp_path / "keyless.csv", index=False)
    with pytest.raises(ValueError) as refused:
        land(lake, impressions, DS, path=tmp_path / "keyless.csv", publish=published.append)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        f"{tmp_path / 'keyless.csv'}: every one of its 6 rows is bad "
        "({'user_id is null or not an integer': 6}); nothing landed"
    )
    assert published == []
    final = landing_dir(lake, "impressions", DS)
    assert not final.exists() and not any(final.parent.iterdir())
