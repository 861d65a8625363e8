"""Progress of long work: a bar on a terminal, plain lines at each 10% or every N seconds in a
log, nothing when turned off or on a rank other than 0."""

from __future__ import annotations

import io

import pytest

from cascade.progress import Progress, track


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_a_line_per_tenth_and_one_at_the_end() -> None:
    log = io.StringIO()
    clock = Clock()
    seen = []
    for item in track(range(20), desc="asr train", unit="epoch", stream=log, clock=clock):
        clock.now += 1.0
        seen.append(item)
    assert seen == list(range(20))
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    # 10%, 20%, ... 90% while it runs (each once), then the end.
    assert [line.split("] ")[1].split()[0] for line in lines] == [
        f"{p}%" for p in range(10, 100, 10)
    ] + ["100%"]
    assert lines[0] == "[asr train] 10% 2/20 epoch 2s eta 18s (1 epoch/s)"
    assert lines[-1] == "[asr train] 100% 20/20 epoch 20s done (1 epoch/s)"


def test_slow_work_gets_a_line_every_n_seconds_and_an_unknown_total_counts() -> None:
    log = io.StringIO()
    clock = Clock()
    with Progress(desc="online rows", unit="row", stream=log, every_s=30, clock=clock) as rows:
        for _ in range(7):
            clock.now += 10.0
            rows.update(1000)
    lines = log.getvalue().splitlines()
    assert lines == [
        "[online rows] 3000 row 30s (100 row/s)",
        "[online rows] 6000 row 1m00s (100 row/s)",
        "[online rows] 7000 row 1m10s done (100 row/s)",
    ]


def test_a_loop_left_early_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASCADE_PROGRESS", "lines")
    log = io.StringIO()
    for item in track([1, 2, 3, 4], desc="bench", stream=log, clock=Clock()):
        if item == 2:
            break
    assert log.getvalue().splitlines()[-1].endswith("stopped")


def test_a_terminal_gets_a_bar_and_off_or_another_rank_gets_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    terminal = Terminal()
    assert list(track(range(3), desc="corpus", unit="clip", stream=terminal)) == [0, 1, 2]
    assert "3/3" in terminal.getvalue() and "\r" in terminal.getvalue()  # tqdm's bar

    quiet = io.StringIO()
    assert list(track(range(3), desc="train", stream=quiet, enabled=False)) == [0, 1, 2]
    monkeypatch.setenv("CASCADE_PROGRESS", "off")
    assert list(track(range(3), desc="train", stream=quiet)) == [0, 1, 2]
    assert quiet.getvalue() == ""
    # The setting wins over the stream: a forced bar in a log, forced lines on a terminal.
    monkeypatch.setenv("CASCADE_PROGRESS", "lines")
    forced = Terminal()
    list(track(range(2), desc="bench", stream=forced))
    assert forced.getvalue().startswith("[bench]") and "\r" not in forced.getvalue()
