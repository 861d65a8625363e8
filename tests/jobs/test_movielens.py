"""The ML-100k source adapter: typed output, and every bad raw row quarantined with a reason."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from pyspark.sql import Row, SparkSession
from pyspark.testing import assertDataFrameEqual

from jobs import movielens

pytestmark = pytest.mark.spark

UTC = dt.UTC

INTER = [
    "user_id:token\titem_id:token\trating:float\ttimestamp:float",
    "1\t10\t4\t100",
    "2\t11\t3\t200.5",
    "x\t10\t4\t100",  # user id not an integer
    "1\t\t4\t100",  # item id missing
    "1\t10\t7\t100",  # rating above 5
    "1\t10\t0\t100",  # rating below 1
    "1\t10\t4\t",  # timestamp missing
    "1\t10\t4",  # a field short
    "",  # blank lines are not rows
]
USERS = [
    "user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token",
    "1\t24\tM\ttechnician\t85711",
    "2\tabc\tF\tother\t94043",  # age unparseable: kept, age null
    "\t30\tM\twriter\t32067",  # no id
    "1\t25\tM\ttechnician\t85711",  # duplicate id: the first line (by text) wins
]
ITEMS = [
    "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq",
    "10\tToy Story\t1995\tAnimation Children's Comedy",
    "11\tunkonwn\tunkonwn\t",  # like ML-100k item 267, with no genre at all
    "x\tBroken\t1990\tDrama",
]


def write_source(folder: Path) -> Path:
    for name, lines in (("inter", INTER), ("user", USERS), ("item", ITEMS)):
        (folder / f"ml-100k.{name}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def test_good_rows_are_typed(spark: SparkSession, tmp_path: Path) -> None:
    tables = movielens.read_ml100k(spark, write_source(tmp_path))

    assertDataFrameEqual(
        tables.impressions,
        [
            Row(user_id=1, item_id=10, event_timestamp=dt.datetime(1970, 1, 1, 0, 1, 40), click=1),
            Row(
                user_id=2,
                item_id=11,
                event_timestamp=dt.datetime(1970, 1, 1, 0, 3, 20, 500000),
                click=0,
            ),
        ],
    )
    assert dict(tables.impressions.dtypes) == {
        "user_id": "bigint",
        "item_id": "bigint",
        "event_timestamp": "timestamp",
        "click": "int",
    }
    assertDataFrameEqual(tables.users, [Row(user_id=1, age=24), Row(user_id=2, age=None)])
    assertDataFrameEqual(
        tables.items,
        [
            Row(item_id=10, release_year=1995, genre="Animation"),
            Row(item_id=11, release_year=None, genre="unknown"),
        ],
    )


def test_bad_rows_are_quarantined_with_reasons(spark: SparkSession, tmp_path: Path) -> None:
    tables = movielens.read_ml100k(spark, write_source(tmp_path))

    got = sorted((r.source, r.line, r.reason) for r in tables.quarantine.collect())
    assert got == sorted(
        [
            ("ml-100k.inter", "x\t10\t4\t100", "user_id is null or not an integer"),
            ("ml-100k.inter", "1\t\t4\t100", "item_id is null or not an integer"),
            ("ml-100k.inter", "1\t10\t7\t100", "rating outside 1..5"),
            ("ml-100k.inter", "1\t10\t0\t100", "rating outside 1..5"),
            ("ml-100k.inter", "1\t10\t4\t", "timestamp is missing or not a number"),
            ("ml-100k.inter", "1\t10\t4", "expected 4 tab-separated fields"),
            ("ml-100k.user", "\t30\tM\twriter\t32067", "user_id is null or not an integer"),
            ("ml-100k.user", "1\t25\tM\ttechnician\t85711", "duplicate user_id"),
            ("ml-100k.item", "x\tBroken\t1990\tDrama", "item_id is null or not an integer"),
        ]
    )


def test_columns_are_found_by_header_not_position(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "reordered.inter"
    path.write_text("timestamp:float\trating:float\titem_id:token\tuser_id:token\n9\t5\t3\t7\n")

    frame = movielens.read_atomic(spark, path, ("user_id", "item_id", "rating", "timestamp"))

    assert [
        tuple(r) for r in frame.select("user_id", "item_id", "rating", "timestamp").collect()
    ] == [("7", "3", "5", "9")]


def test_header_missing_a_column_names_the_file(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "short.inter"
    path.write_text("user_id:token\titem_id:token\n1\t2\n")

    with pytest.raises(ValueError, match=r"short\.inter.*lacks columns \['rating'\]"):
        movielens.read_atomic(spark, path, ("user_id", "item_id", "rating"))


def test_real_ml100k_is_clean_and_complete(spark: SparkSession) -> None:
    tables = movielens.read_ml100k(spark)

    assert tables.impressions.count() == 100_000
    assert tables.users.count() == 943
    assert tables.items.count() == 1682
    assert tables.quarantine.count() == 0
    # ML-100k's item 267 has release year "unkonwn": kept, with a null year.
    assert tables.items.filter("item_id = 267").first().release_year is None
