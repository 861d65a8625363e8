"""Pipeline modules read no process environment: a step gets its settings, with this run's
knobs applied, from its context (:class:`cascade.step_context.StepContext`), and the functions
the platform calls outside a step get theirs from :func:`cascade.step_context.with_settings`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PIPELINES = Path(__file__).resolve().parents[2] / "pipelines"
FORBIDDEN = {"environ", "getenv", "putenv", "load_settings", "load_group", "scoped_environ"}
"""Names whose use reads (or writes) settings from the process environment."""


def environment_reads(source: str) -> list[str]:
    """``line: name`` for every use of a :data:`FORBIDDEN` name in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and node.id in FORBIDDEN:
            found.append(f"{node.lineno}: {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN:
            found.append(f"{node.lineno}: {node.attr}")
        elif isinstance(node, ast.ImportFrom):
            found += [f"{node.lineno}: {a.name}" for a in node.names if a.name in FORBIDDEN]
    return found


@pytest.mark.parametrize("module", sorted(PIPELINES.glob("*.py")), ids=lambda p: p.name)
def test_a_pipeline_module_reads_no_environment(module: Path) -> None:
    assert environment_reads(module.read_text()) == [], (
        f"{module.name} reads the process environment; take the settings from the step's "
        "context (ctx.settings, ctx.platform) or wrap the function in with_settings"
    )


def test_the_check_finds_each_way_of_reading_the_environment() -> None:
    source = (
        "import os\nfrom cascade.config import load_group\n"
        "a = os.environ['X']\nb = os.getenv('Y')\nc = load_settings()\n"
    )
    assert environment_reads(source) == [
        "2: load_group", "3: environ", "4: getenv", "5: load_settings"
    ]  # fmt: skip
    assert environment_reads("def step(ctx):\n    return ctx.settings.config\n") == []


@pytest.mark.parametrize("module", sorted(PIPELINES.glob("*.py")), ids=lambda p: p.name)
def test_a_pipeline_module_spells_no_lake_path(module: Path) -> None:
    """The lake's layout is written once (:class:`cascade.lake.Lake`); a spec names its data
    in its catalog and the locations follow from there."""
    text = module.read_text()
    assert ".cascade/" not in text and "lake/" not in text, (
        f"{module.name} spells a lake path; declare the dataset in the pipeline's catalog"
    )
