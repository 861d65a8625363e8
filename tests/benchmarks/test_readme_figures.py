"""Every measured figure in the README names the command that reproduces it.

A paragraph of README.md that states a figure (a number followed by ``ms``, ``×``/``x``, ``%``
or ``/s``) must name a benchmark command in it (:data:`COMMANDS`); the few such numbers that
are settings or thresholds, not measurements, are listed with the reason in
:data:`NOT_MEASURED`. Code blocks and tables (the settings table) are not prose and are skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
FIGURE = re.compile(
    r"(?<![\w.])\d[\d,.]*(?:\s?(?:ms|x)\b|\s?[×%]|\s?[A-Za-z]*/s\b)",
)
COMMANDS = (
    "cascade bench ",  # a benchmark: its JSON keys are named beside the figure
    "cascade step NAME --pipeline asr",  # the ASR training run the CER figures come from
    "cascade asr evaluate ",  # a trained ASR model's CER on a corpus
    "cascade step training_set --pipeline ctr_preranking",  # one partition, step by step
    "cascade ctr train ",  # the pre-ranking cascade trained on one partition's training set
)
NOT_MEASURED = {
    "plain line at each 10%": "progress lines are printed at each tenth of the work",
    "(50% of the teacher's cost)": "the FSCD cost budget, a config value",
    "≥ 95% of held-out utterances": "the ASR compile gate's threshold",
}


def paragraphs(text: str) -> list[str]:
    """The README's prose paragraphs: fenced code blocks and table rows left out."""
    found: list[str] = []
    current: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.lstrip().startswith("|"):
            continue
        if line.strip():
            current.append(line)
        elif current:
            found.append(" ".join(current))
            current = []
    if current:
        found.append(" ".join(current))
    return found


def unsourced(text: str) -> list[str]:
    """Figures of paragraphs that name no command, each with the start of its paragraph."""
    bad: list[str] = []
    for paragraph in paragraphs(text):
        prose = paragraph
        for phrase in NOT_MEASURED:
            prose = prose.replace(phrase, "")
        figures = FIGURE.findall(prose)
        if figures and not any(command in prose for command in COMMANDS):
            bad.append(f"{figures} in: {paragraph[:120]}...")
    return bad


def test_every_readme_figure_names_its_command() -> None:
    text = README.read_text()
    for phrase in NOT_MEASURED:
        assert phrase in text, f"{phrase!r} is no longer in the README: drop it from NOT_MEASURED"
    assert unsourced(text) == []


@pytest.mark.parametrize(
    ("paragraph", "flagged"),
    [
        ("On 2 cores it serves 1,905 requests/s.", True),
        ("An A/B in one process: 1.11 → 1.00 ms.", True),
        ("It ran up to 4x slow, 2.85× Inductor.", True),
        ("CER 2.23% on held-out voices.", True),
        ("The build reaches ~95/s at 10k.", True),
        ("p99 12.7 ms (`cascade bench serving --out FILE`, `p99_ms`).", False),
        ("A window of 15 s, 3 retries, version 0.2.3, a 64 KiB message.", False),
        ("```\n1.2 ms\n```", False),
        ("| `CASCADE_X` | number | `30.0` | 5% of the time |", False),
    ],
)
def test_a_figure_without_a_command_is_found(paragraph: str, flagged: bool) -> None:
    assert bool(unsourced(f"Intro.\n\n{paragraph}\n\nOutro.\n")) is flagged
