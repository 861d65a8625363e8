"""``cascade ctr|asr|multimodal|ui-check`` run their modules as a process with the options given
(their exit status is the command's); script benchmarks run under ``cascade bench``; ``cascade
events publish`` refuses a landed dataset that no pipeline listens to."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cascade.cli import TOOLS, listened_datasets, main


class Ran:
    """Records the command a tool would run and answers with a chosen exit status."""

    def __init__(self, returncode: int) -> None:
        self.returncode = returncode
        self.commands: list[list[str]] = []

    def __call__(self, command: list[str], check: bool = False) -> Any:
        self.commands.append(command)
        return subprocess.CompletedProcess(command, self.returncode)


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> Ran:
    recorder = Ran(0)
    monkeypatch.setattr(subprocess, "run", recorder)
    return recorder


def test_every_tool_names_a_module_that_exists() -> None:
    for group, (_, actions) in TOOLS.items():
        for action, (arguments, _) in actions.items():
            modules = [arguments[0]] + [
                arguments[i + 1] for i, arg in enumerate(arguments) if arg == "-m"
            ]
            for module in modules:
                assert importlib.util.find_spec(module) is not None, (group, action, module)


def test_a_tool_forwards_every_option_and_returns_its_exit_status(
    ran: Ran, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["asr", "evaluate", "--model", "M", "--corpus", "C", "--beam", "8"]
    assert main(argv) == 0
    assert ran.commands == [
        [
            sys.executable,
            "-m",
            "models.asr.evaluate",
            "--model",
            "M",
            "--corpus",
            "C",
            "--beam",
            "8",
        ]
    ]
    ran.returncode = 2  # the module's own usage error
    assert main(["asr", "synthesize", "--count", "8", "--landing", "L"]) == 2
    assert ran.commands[-1][2:] == ["jobs.audio_corpus", "land", "--count", "8", "--landing", "L"]
    assert main(["ui-check", "--dag", "asr", "--out", "ui.png"]) == 2
    assert ran.commands[-1][2:] == ["infra.ui_check", "--dag", "asr", "--out", "ui.png"]
    # --help is the module's own.
    ran.returncode = 0
    assert main(["multimodal", "train", "--help"]) == 0
    assert ran.commands[-1][2:] == ["models.multimodal.train", "--help"]


def test_a_tool_group_needs_an_action_and_other_commands_take_no_extra_options(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as parsed:
        main(["asr", "no-such-action"])
    assert parsed.value.code == 2
    assert "choose from" in capsys.readouterr().err
    with pytest.raises(SystemExit) as parsed:
        main(["version", "--no-such-option"])
    assert parsed.value.code == 2
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err


def test_a_tools_help_runs_the_real_module(capsys: pytest.CaptureFixture[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cascade.cli", "ui-check", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "--dag" in result.stdout and "--out" in result.stdout


def test_script_benchmarks_run_with_their_own_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks import commands

    ran = Ran(0)
    # A script benchmark runs as a process of its own that a stop signal is passed on to.
    monkeypatch.setattr(commands, "run_script", lambda command, what: ran(command).returncode)
    out = tmp_path / "r.json"
    argv = ["bench", "online-sqlite", "--out", str(out), "--repeats", "1", "--rows", "10"]
    assert main(argv) == 0
    assert ran.commands == [
        [sys.executable, "-m", "benchmarks.online_sqlite", "--out", str(out), "--repeats", "1"]
        + ["--rows", "10"]
    ]


def test_a_registered_benchmark_refuses_options_it_does_not_take(
    ran: Ran, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "events", "--out", str(tmp_path / "r.json"), "--rows", "10"]) == 2
    err = capsys.readouterr().err
    assert "benchmark 'events' takes no --rows 10" in err and ran.commands == []


def test_publish_refuses_a_landed_dataset_no_pipeline_listens_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    published: list[Any] = []
    monkeypatch.setattr("cascade.broker.publish", published.append)
    argv = ["events", "publish", "cascade.data.landed", "--dataset", "ml100k"]
    assert main([*argv, "--partition", "2026-11-22"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "dataset 'ml100k'" in err
    for dataset in ("impressions", "speech", "images"):
        assert dataset in err
    assert published == []
    assert listened_datasets() == {
        "images": ["multimodal"],
        "impressions": ["ctr_cross"],
        "speech": ["asr"],
    }


def test_publish_passes_a_landed_dataset_a_pipeline_listens_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    published: list[Any] = []
    monkeypatch.setattr("cascade.broker.publish", lambda event: published.append(event) or {})
    argv = ["events", "publish", "cascade.data.landed", "--dataset", "speech"]
    assert main([*argv, "--partition", "2026-11-22"]) == 0
    assert [event.payload["dataset"] for event in published] == ["speech"]
    # Other event types are not datasets' and pass as before.
    assert (
        main(
            [
                "events",
                "publish",
                "cascade.retrain.requested",
                "--payload",
                '{"model": "asr", "reason": "manual"}',
            ]
        )
        == 0
    )
    assert len(published) == 2


def test_help_lists_every_command_in_its_place(capsys: pytest.CaptureFixture[str]) -> None:
    from cascade.cli import HELP_ORDER

    with pytest.raises(SystemExit):
        main(["--help"])
    listed = [
        line.split()[0]
        for line in capsys.readouterr().out.split("positional arguments:")[1].splitlines()
        if line.startswith("    ") and not line.startswith("     ")
    ]
    assert listed == list(HELP_ORDER)


def test_a_tool_gets_its_arguments_in_the_order_given(ran: Ran) -> None:
    assert main(["--debug", "asr", "corpus", "X", "--landing", "L", "Y", "--debug"]) == 0
    assert ran.commands[-1][3:] == ["build", "X", "--landing", "L", "Y", "--debug"]


def test_rollback_needs_the_model(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as parsed:
        main(["rollback", "--reason", "bad release"])
    assert parsed.value.code == 2
    assert "the following arguments are required: --model" in capsys.readouterr().err
