"""MkDocs hook: the CLI reference page (``reference/cli.md``) rendered from the ``cascade``
parser when the site builds, so the page lists every command and option the code has.

The page's ``<!-- cli-reference -->`` marker becomes one section per command, in the order
``cascade --help`` lists them: its one-line help and its ``--help`` text. Commands that run a
domain's tool as its own process (``cascade ctr ACTION``, ...) list their actions; each action's
options are its own ``--help``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

MARKER = "<!-- cli-reference -->"
PAGE = "reference/cli.md"
WIDTH = "100"
"""Columns of the rendered help text (argparse reads ``COLUMNS``), fixed so the page is the same
on every terminal."""


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, Any]]:
    """(name, one-line help, parser) of each subcommand, in the order the parser lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            names = list(helps) + [n for n in action.choices if n not in helps]
            return [(name, helps.get(name, ""), action.choices[name]) for name in names]
    return []


def _has_help(parser: argparse.ArgumentParser) -> bool:
    return any(isinstance(action, argparse._HelpAction) for action in parser._actions)


def _section(parser: argparse.ArgumentParser, summary: str, depth: int) -> list[str]:
    lines = [f"{'#' * depth} `{parser.prog}`", ""]
    if summary:
        text = (summary[0].upper() + summary[1:]).replace("*", "\\*")
        lines += [text + ".", ""]
    if _has_help(parser):
        lines += ["```text", parser.format_help().rstrip(), "```", ""]
    else:
        lines += [f"Runs as its own process: `{parser.prog} --help` prints its options.", ""]
    for name, help_text, child in _subcommands(parser):
        if name != "help":
            lines += _section(child, help_text, min(depth + 1, 4))
    return lines


def render() -> str:
    """The reference: one section per ``cascade`` command, nested commands below their parent."""
    from cascade.cli import build_parser

    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        parser, _ = build_parser()
        lines = []
        for _name, help_text, child in _subcommands(parser):
            lines += _section(child, help_text, 2)
        return "\n".join(lines).rstrip() + "\n"
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"{PAGE} lost its {MARKER} marker; put it back where the commands go")
    return markdown.replace(MARKER, render())
