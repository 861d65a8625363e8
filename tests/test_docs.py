"""The documentation: the MkDocs site builds strictly, and no figure stands in prose.

The site (``mkdocs.yml``, ``docs/``) is built into a temporary folder with ``--strict``: a broken
link or anchor, a page missing from the navigation or a lost marker fails it. The CLI reference
is rendered from the parser during that build, so it is checked to list every command.

Every measured figure in README.md and the docs pages is rendered from a result file
(``docs/results/``, the blocks of ``docs/benchmarks.md`` and the ``bench-view`` blocks of other
pages that ``benchmarks/docs.py`` writes). A
number with a unit, a decimal (an AUC, a ratio), a count written with thousands separators or an
"N of M" count in prose outside those blocks fails :func:`test_no_figure_in_prose`, unless it
is a non-measurement listed with its reason in :data:`NOT_MEASURED` (a limit, a default, a
threshold). Fenced code, inline code, link targets, HTML comments and generated blocks (the
settings and pipelines reference tables) are not prose.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cascade.config import REPO_ROOT

DOCS = REPO_ROOT / "docs"
PAGES = [REPO_ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]

RENDERED = re.compile(
    r"<!-- bench (?P<name>[\w-]+): [^ ]+ -->.*?<!-- end bench (?P=name) -->", re.DOTALL
)
VIEWED = re.compile(
    r"<!-- bench-view (?P<view>[\w-]+) (?P<name>[\w-]+): [^ ]+ -->.*?"
    r"<!-- end bench-view (?P=view) (?P=name) -->",
    re.DOTALL,
)
GENERATED = re.compile(r"<!-- (?P<name>[\w-]+):start -->.*?<!-- (?P=name):end -->", re.DOTALL)
COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.DOTALL | re.MULTILINE)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK_TARGET = re.compile(r"\]\([^)\s]*\)")
VERSION = re.compile(
    r"\b(?:Python|CPython|Java|torch|PyTorch|Airflow|Spark|PySpark|Kafka|KServe|DeepSpeed|Feast|MLflow|"
    r"DVC|Redis|PostgreSQL|Debian|MkDocs|setuptools|Version)\s+\d+(?:\.\d+)*"
)
"""A product's version is not a figure."""

UNITS = (
    r"ms|µs|us|ns|s|sec|seconds?|min|minutes?|h|hours?|%|×|x|"
    r"GiB|GB|MiB|MB|KiB|kB|KB|TB|TiB|GFLOP|TFLOP|[A-Za-z]+/s|/s"
)
FIGURES = {
    "number with a unit": re.compile(
        rf"(?<![\w.,])\d[\d,]*(?:\.\d+)?(?:e-?\d+)?\s?(?:{UNITS})(?![\w])"
    ),
    "decimal (an AUC, a ratio)": re.compile(r"(?<![\w.,-])\d+\.\d+(?!\w|\.\d)"),
    "count": re.compile(r"(?<![\w.,])\d{1,3}(?:,\d{3})+(?!\w|,\d)"),
    "N of M count": re.compile(r"(?<![\w.,])\d+ of (?:the )?\d+\b"),
}

NOT_MEASURED: dict[str, str] = {
    # Limits the code enforces: documented so that users know what is refused.
    "free text 2,000, lists and maps 256 entries, a message 64 KiB": "the event schema's limits",
    "at most 1 MiB, 256 px on the long side, 10 s": "the SVG rasterizer's limits (CorpusConfig)",
    "a 10 s timeout per file, a 1 MiB cap on the file and a 256 px cap": "the same limits",
    "64 MiB, or whose header declares more than 33.5 million pixels (8,192 x 4,096)": (
        "the image importer's size limits"
    ),
    "over 64 MiB": "the same limit",
    "64 x 64 RGB": "the image-text model's input size",
    "clips of 0.3 to 20 s": "the speech corpus's duration limits (MIN_SECONDS, MAX_SECONDS)",
    "from 0.3 s": "the same minimum",
    "to 20 s.": "the same maximum",
    "0.08-20 s of audio": "the shapes the compiled ASR package is exported for",
    "22.05, 24, 44.1 or 48 kHz": "the sample rates the speech corpus accepts",
    "at most 1 % of the samples": "the speech corpus's clipping limit",
    "more than 1 % of the samples": "the same limit",
    "gives up after 10 s": "the publisher's delivery timeout",
    "within 10 s": "the same timeout, quoted from its error message",
    "1 of 1 records": "an error message's wording",
    "the others are given 10 s": "the training launcher's grace period for a lost node",
    "re-read every 10 s": "the online reader's refresh period",
    "(300 s by default; the test sets 20 s)": "Airflow's heartbeat timeout and the test's value",
    "(1 MiB; the ASR infer route 16 MiB)": "the servers' default body limits",
    # Thresholds and shares that are configuration, not outcomes.
    "plain line at each 10%": "progress lines are printed at each tenth of the work",
    "≥ 95% of held-out utterances": "the ASR compile gate's threshold",
    "about 5 % validation, 5 % test": "the image-text corpus's split shares",
    "the 5 % test": "the same share",
    "about 80 % of the speakers train, 10 % are the dev split and 10 %": (
        "the speech corpus's split shares"
    ),
    "Beta(0.5, 0.5)'s CTR of 0.5": "the uninformative prior the statistics never fall back to",
    "exponent 1.1 by default": "the click-log generator's default Zipf exponent",
}
"""Phrases whose numbers are not measurements, each with the reason it may stand in prose."""

EXEMPT_PAGES = {
    "docs/scaling.md": (
        "the capacity plan on paper: benchmarks/capacity.py computes each of its numbers from the "
        "inputs it states, and tests/benchmarks/test_capacity.py keeps the page equal to the code"
    ),
}
"""Whole pages whose figures are computed and checked elsewhere, with the reason."""


def prose(text: str) -> str:
    """``text`` with everything that is not prose blanked out (see the module docstring)."""
    for pattern in (RENDERED, VIEWED, GENERATED, FENCE, COMMENT):
        text = pattern.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for pattern in (INLINE_CODE, LINK_TARGET, VERSION):
        text = pattern.sub(" ", text)
    for phrase in NOT_MEASURED:
        words = r"\s+".join(re.escape(word) for word in phrase.split())
        text = re.sub(words, lambda m: "\n" * m.group(0).count("\n") or " ", text)
    return text


def figures_in_prose(text: str) -> list[str]:
    """Each figure in the prose of ``text``: ``line N: kind 'figure' in: the line``."""
    found = []
    for number, line in enumerate(prose(text).splitlines(), 1):
        for kind, pattern in FIGURES.items():
            for match in pattern.finditer(line):
                found.append(f"line {number}: {kind} {match.group(0)!r} in: {line.strip()[:100]}")
    return found


def test_no_figure_in_prose() -> None:
    every = " ".join(" ".join(page.read_text().split()) for page in PAGES)
    for phrase in NOT_MEASURED:
        assert phrase in every, f"{phrase!r} is in no page any more: drop it from NOT_MEASURED"
    for page in EXEMPT_PAGES:
        assert (REPO_ROOT / page).is_file(), f"{page} is gone: drop it from EXEMPT_PAGES"
    bad = [
        f"{page.relative_to(REPO_ROOT)}: {figure}"
        for page in PAGES
        if page.relative_to(REPO_ROOT).as_posix() not in EXEMPT_PAGES
        for figure in figures_in_prose(page.read_text())
    ]
    assert not bad, (
        "figures in prose: render them from a result file (docs/benchmarks.md's blocks) or "
        "delete them; a number that is no measurement goes in NOT_MEASURED with its reason:\n"
        + "\n".join(bad)
    )


@pytest.mark.parametrize(
    ("text", "flagged"),
    [
        ("On 2 cores it serves 1,905 requests/s.", True),
        ("An A/B in one process: 1.11 → 1.00 ms.", True),
        ("It ran up to 4x slow, 2.85× Inductor.", True),
        ("CER 2.23% on held-out voices.", True),
        ("teacher AUC 0.660, FSCD 0.588", True),
        ("the training set held 40,112 impressions", True),
        ("names of 128 characters, free text 2,000, lists of 256", True),
        ("a CTR of 0.5.", True),
        ("3 of 3 faults survived", True),
        ("the stack started in 71 s", True),
        ("It runs on Python 3.11 and Airflow 3.3.2 with torch 2.13.", False),
        ("Two server processes on the partition `dt=2026-11-22`, port `28081`.", False),
        ("See `p99_ms` in [the block](../benchmarks.md#serving).", False),
        ("```\n1.2 ms\n```", False),
        ("<!-- bench x: docs/results/x.json -->\n| `p99_ms` | 14.9 |\n<!-- end bench x -->", False),
        ("<!-- settings-table:start -->\n| `X` | 0.005 | 5% |\n<!-- settings-table:end -->", False),
    ],
)
def test_a_figure_in_prose_is_found(text: str, flagged: bool) -> None:
    assert bool(figures_in_prose(f"Intro.\n\n{text}\n\nOutro.\n")) is flagged


def test_the_docs_tell_users_cascade_subcommands_not_python_m() -> None:
    """Every user action is a ``cascade`` subcommand; ``python -m`` is for maintainers' tools."""
    maintainer_tools = ("python -m benchmarks.docs", "python -m benchmarks.capacity")
    lines = [
        f"{page.relative_to(REPO_ROOT)}:{n}: {line.strip()}"
        for page in PAGES
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if "python -m" in line and not any(tool in line for tool in maintainer_tools)
    ]
    assert not lines, "write the cascade subcommand instead:\n" + "\n".join(lines)


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "WARNING" not in result.stderr, result.stderr[-4000:]
    for page in ("index", "quickstart", "reference/settings", "reference/pipelines", "benchmarks"):
        assert (site / f"{page}.html").is_file(), page
    # The CLI page is rendered from the parser: every command of `cascade --help` is on it.
    cli = (site / "reference" / "cli.html").read_text()
    from cascade.cli import build_parser

    parser, _ = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    missing = [name for name in commands if f"cascade {name}" not in cli]
    assert not missing, f"the CLI reference lacks {missing}"
