"""The ``cascade`` CLI's contract: exit 0 done, 1 failed, 2 usage, 3 not ready; every handled
error is one line on stderr (no traceback) naming the fix; ``--debug`` shows the traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cascade.cli import exit_code, main
from cascade.errors import NotReady, UsageError
from cascade.ports import free_ports


@pytest.fixture
def no_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state folder of its own and every service port pointing where nothing listens."""
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    for name, port in zip(
        ("BROKER", "AIRFLOW", "MLFLOW", "SERVING", "ASR_SERVING"), free_ports(5), strict=True
    ):
        monkeypatch.setenv(f"CASCADE_{name}_PORT", str(port))
    return tmp_path


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_usage_errors_exit_2_with_the_choices(
    no_stack: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["step", "stats", "--pipeline", "ctr_cross", "--ds", "2026-13-40"]) == 2
    assert "YYYY-MM-DD" in error_line(capsys)
    assert main(["step", "train", "--pipeline", "ctr_cross", "--ds", "2026-11-22"]) == 2
    assert "choose one of log, stats, validate, feast" in error_line(capsys)
    assert main(["score", "--model", "preranking"]) == 2
    assert "--model preranking needs --user and --items" in error_line(capsys)
    assert main(["score", "--model", "asr", "--user", "1"]) == 2
    assert "--model asr needs --audio" in error_line(capsys)
    with pytest.raises(SystemExit) as parsed:
        main(["bench", "no-such-bench", "--out", "x.json"])
    assert parsed.value.code == 2
    assert "choose from" in capsys.readouterr().err


def test_a_step_before_its_input_exists_is_not_ready(
    no_stack: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # No log landed or generated for the partition yet.
    assert main(["step", "stats", "--pipeline", "ctr_cross", "--ds", "2026-11-22"]) == 3
    assert "run the pipeline's `log` step" in error_line(capsys)
    # The gate never ran for this partition: publishing to Feast must wait for it.
    assert main(["step", "feast", "--pipeline", "ctr_cross", "--ds", "2026-11-22"]) == 3
    assert "run step 'validate' for ds=2026-11-22" in error_line(capsys)


def test_a_step_needs_its_pipeline_named_only_when_several_pipelines_have_it(
    no_stack: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `feast` is a ctr_cross step only: that pipeline runs it (not ready: its gate never ran).
    assert main(["step", "feast", "--ds", "2026-11-22"]) == 3
    assert "run step 'validate' for ds=2026-11-22" in error_line(capsys)
    assert main(["step", "compile", "--ds", "2026-11-22"]) == 2
    assert "asr, ctr_preranking each have a step 'compile'; pass --pipeline" in error_line(capsys)
    assert main(["step", "nope", "--ds", "2026-11-22"]) == 2
    assert "no pipeline has a step 'nope'" in error_line(capsys)
    for command in (["score"], ["rollback"]):  # no model is the default one
        with pytest.raises(SystemExit) as parsed:
            main(command)
        assert parsed.value.code == 2
        assert "--model" in capsys.readouterr().err


def test_no_server_is_not_ready_and_says_how_to_start_the_stack(
    no_stack: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["score", "--model", "preranking", "--user", "1", "--items", "2", "3"]) == 3
    line = error_line(capsys)
    assert "ConnectionError" in line and "`cascade up` starts them" in line


def test_debug_shows_the_traceback(no_stack: Path) -> None:
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        main(["--debug", "step", "stats", "--pipeline", "ctr_cross", "--ds", "2026-13-40"])


def test_exit_codes_by_error_kind() -> None:
    assert exit_code(UsageError("x")) == 2
    assert exit_code(NotReady("x")) == exit_code(FileNotFoundError("x")) == 3
    assert exit_code(ConnectionRefusedError()) == exit_code(TimeoutError()) == 3
    assert exit_code(RuntimeError("gate failed")) == exit_code(ValueError("bad row")) == 1


def test_version_lists_the_stack(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version", "--json"]) == 0
    versions = json.loads(capsys.readouterr().out)
    assert versions["cascade"] != "not installed" and versions["torch"].startswith("2.")


def test_rollback_and_score_know_every_registered_model_and_data_commands_print_json(
    no_stack: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cascade.pipeline_registry import registered_models

    models = registered_models()
    for command in (["rollback"], ["score", "--user", "1", "--items", "2"]):
        with pytest.raises(SystemExit) as parsed:
            main([*command, "--model", "no-such-model"])
        assert parsed.value.code == 2
        err = capsys.readouterr().err
        assert "'preranking'" in err and "'asr'" in err, err
    assert {"preranking", "asr"} <= set(models)
    # Everything whose output is data has --json.
    for command in (["version"], ["pipelines"], ["config"]):
        assert main([*command, "--json"]) == 0, command
        json.loads(capsys.readouterr().out)
    # Nothing runs in this state folder: status still prints its JSON, and exits "not ready".
    assert main(["status", "--json"]) == 3
    printed = capsys.readouterr()
    assert "not healthy: " in printed.err and "cascade up" in printed.err
    shown = json.loads(printed.out)
    assert {s["name"] for s in shown["services"]} >= {"broker", "airflow", "mlflow"}
    assert all(s["state"] == "down" and s["pid"] is None for s in shown["services"])
    assert shown["password_files"] == {"airflow": None, "mlflow": None}
    # The event bus by name and version: the stack's own Apache Kafka.
    assert shown["broker"]["name"] == "Apache Kafka" and shown["broker"]["version"] == "4.4.0"
    assert shown["broker"]["nodes"] == 1


def test_every_command_prints_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    """``--help`` renders for the CLI and each command, registered ones included (argparse
    formats help strings with ``%``: a bare ``70%`` in one used to crash ``cascade bench -h``)."""
    import argparse

    from cascade.cli import build_parser

    parser, _ = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert {"bench", "step", "version"} <= set(sub.choices)
    for name in ["", *sub.choices]:
        if name and not sub.choices[name].add_help:
            continue  # a module run as a process prints its own help (test_cli_tools)
        with pytest.raises(SystemExit) as exited:
            main([name, "--help"] if name else ["--help"])
        assert exited.value.code == 0, name
        assert "usage:" in capsys.readouterr().out, name
