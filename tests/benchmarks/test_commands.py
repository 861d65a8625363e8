"""``cascade bench``: the command the benchmarks register parses every option and runs one."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import pytest

from benchmarks import registry
from benchmarks.commands import BENCH_OPTIONS, register
from infra.services import StackError


def echo_benchmark(out: Path, quick: bool) -> dict[str, Any]:
    from cascade.config import load_settings

    return {
        "quick": quick,
        "events": os.environ.get("CASCADE_BENCH_EVENTS"),
        # What the events benchmark reads: the partitions a burst's events name.
        "partitions": load_settings().bench.event_partitions,
    }


def test_bench_command_runs_the_named_benchmark_with_its_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(registry.BENCHMARKS, "events", f"{__name__}:echo_benchmark")
    monkeypatch.delenv("CASCADE_BENCH_EVENTS", raising=False)
    monkeypatch.delenv("CASCADE_BENCH_EVENT_PARTITIONS", raising=False)
    parser = argparse.ArgumentParser()
    assert register(parser.add_subparsers(dest="command")) == (StackError,)
    out = tmp_path / "events.json"
    command = ["bench", "events", "--out", str(out), "--events", "7", "--partitions", "3"]
    args = parser.parse_args([*command, "--quick"])
    assert set(BENCH_OPTIONS) <= set(vars(args))
    assert args.func(args) == 0
    assert json.loads(out.read_text())["events"] == "7"
    assert json.loads(out.read_text())["partitions"] == 3
    printed = capsys.readouterr()
    assert json.loads(printed.out)["events"] == "7"  # stdout is one JSON document
    assert f"written to {out}" in printed.err


def test_bench_command_takes_the_aliases_the_readme_uses() -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "ctr-features", "--out", "x.json", "--repeats", "3"])
    assert (args.name, args.repeats) == ("ctr-features", "3")
    assert registry.ALIASES["ctr-features"] == "ctr"


def test_every_benchmark_option_is_an_option_of_the_bench_command() -> None:
    from benchmarks.registry import COMMON_OPTIONS, OPTIONS

    for name, options in OPTIONS.items():
        assert set(options) <= set(BENCH_OPTIONS), name
    assert set(COMMON_OPTIONS) <= set(BENCH_OPTIONS)
