"""The README's pipeline table, rendered from the specs (``cascade pipelines --markdown``;
``cascade pipelines --write`` puts it between the README's markers, a test keeps them equal)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from cascade.pipeline_spec import Pipeline

TABLE_START = "<!-- pipelines-table:start -->"
TABLE_END = "<!-- pipelines-table:end -->"


def render_markdown(specs: Iterable[Pipeline]) -> str:
    rows = [
        "| pipeline | starts on | steps | registers | DVC stages |",
        "|---|---|---|---|---|",
    ]
    for spec in specs:
        starts = []
        if spec.cron:
            starts.append(f"`{spec.cron}` UTC")
        if spec.trigger:
            starts.append(", ".join(f"`{s}`" for s in spec.trigger.selectors))
        if spec.after:
            starts.append(", ".join(f"`{uri}` (updated)" for uri in spec.after))
        model = "-"
        if spec.model is not None:
            rule = spec.model.promotion
            better = "higher" if rule.higher_is_better else "lower"
            gate = "; compile gate required" if rule.requires_compile_gate else ""
            model = f"`{spec.model.name}@{spec.model.alias}` ({rule.metric}, {better} wins{gate})"
        rows.append(
            f"| `{spec.name}` | {' or '.join(starts)} | {' → '.join(spec.step_names)} | "
            f"{model} | `{spec.dvc_prefix}*` |"
            if spec.dvc_prefix
            else f"| `{spec.name}` | {' or '.join(starts)} | {' → '.join(spec.step_names)} | "
            f"{model} | step names |"
        )
    return "\n".join(rows) + "\n"


def readme_table(readme: str) -> str:
    start = readme.index(TABLE_START) + len(TABLE_START)
    return readme[start : readme.index(TABLE_END)].strip("\n") + "\n"


def write_readme_table(path: Path, specs: Iterable[Pipeline]) -> bool:
    """Put the table between the markers of ``path``; True when it changed."""
    text = path.read_text()
    start = text.index(TABLE_START) + len(TABLE_START)
    updated = text[:start] + "\n" + render_markdown(specs) + text[text.index(TABLE_END) :]
    if updated != text:
        path.write_text(updated)
    return updated != text
