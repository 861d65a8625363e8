"""The pipelines reference (``docs/reference/pipelines.md``), rendered from the specs: a table of
every pipeline (``cascade pipelines --markdown``) and a section per pipeline from what
``cascade pipelines --json`` prints. ``cascade pipelines --write`` puts both between the page's
markers; a test keeps them equal."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cascade.lake import Lake
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


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _pipeline_section(described: dict[str, Any]) -> list[str]:
    """One pipeline's section, from its ``describe()`` (the JSON of ``cascade pipelines``)."""
    name = described["name"]
    lines = [f"### `{name}`", ""]
    if described.get("description"):
        lines += [described["description"], ""]
    schedule = (described.get("schedule") or {}).get("cron")
    assets = described.get("assets") or {}
    trigger = assets.get("trigger") or {}
    starts = [f"cron `{schedule}` UTC"] if schedule else []
    starts += [f"event `{s}`" for s in trigger.get("selectors", ())]
    starts += [f"an update of `{uri}`" for uri in assets.get("after", ())]
    lines += [f"Starts on: {', '.join(starts) or 'a manual run only'}.", ""]
    for dataset in described.get("datasets", ()):
        formats = ", ".join(f"`{f}`" for f in dataset.get("formats", ())) or "none"
        sources = ", ".join(f"`{s}`" for s in dataset.get("sources", ())) or "none"
        lines += [
            f"Reads the landed dataset `{dataset['name']}`: formats {formats}; "
            f"named sources {sources}.",
            "",
        ]
    lines += [
        "| step | what it does | DVC stage | heavy | timeout (min) | knobs | metrics |",
        "|---|---|---|---|---|---|---|",
    ]
    for step in described.get("steps", ()):
        knobs = ", ".join(f"`{env}`" for env in (step.get("params") or {}).values()) or "-"
        metrics = ", ".join(f"`{m}`" for m in step.get("metrics", ())) or "-"
        timeout = step.get("timeout_minutes")
        lines.append(
            f"| `{step['name']}` | {_cell(step.get('doc') or '')} | `{step.get('dvc_stage')}` | "
            f"{'yes' if step.get('heavy') else 'no'} | "
            f"{'-' if timeout is None else timeout} | {knobs} | {metrics} |"
        )
    lines.append("")
    if described.get("catalog"):
        lines += [
            "| dataset | kind | format | location | written by | read by |",
            "|---|---|---|---|---|---|",
        ]
        for data in described["catalog"]:
            writers = ", ".join(f"`{s}`" for s in data["written_by"]) or "-"
            readers = ", ".join(f"`{s}`" for s in data["read_by"]) or "-"
            lines.append(
                f"| `{data['name']}` | {data['kind']} | {_cell(data['format'])} | "
                f"`{data['location']}` | {writers} | {readers} |"
            )
        lines.append("")
    model = described.get("registered_model")
    if model:
        rule = model.get("promotion") or {}
        better = "higher" if rule.get("higher_is_better") else "lower"
        gate = ", and only after a passed compile gate" if rule.get("requires_compile_gate") else ""
        lines += [
            f"Registers `{model['name']}` and moves its `{model['alias']}` alias by "
            f"`{rule.get('metric')}` ({better} wins, tolerance `{rule.get('tolerance')}`){gate}.",
            "",
        ]
    if assets.get("outlets"):
        outlets = ", ".join(f"`{uri}`" for uri in assets.get("outlets", ()))
        lines += [f"Updates: {outlets}.", ""]
    if described.get("settings"):
        settings = described["settings"]
        lines += [f"Settings class: `{settings}` (see the [settings reference](settings.md)).", ""]
    return lines


def render_reference(specs: Iterable[Pipeline]) -> str:
    """The reference page's generated part: the table, then one section per pipeline."""
    specs = list(specs)
    lines = [render_markdown(specs)]
    for spec in specs:
        # Locations as the default state folder has them, relative to the repository.
        lines += _pipeline_section(spec.describe(lake=Lake(Path(".cascade/lake"))))
    return "\n".join(lines).rstrip("\n") + "\n"


def documented_table(page: str) -> str:
    """The part of ``page`` between the pipelines-table markers."""
    start = page.index(TABLE_START) + len(TABLE_START)
    return page[start : page.index(TABLE_END)].strip("\n") + "\n"


def write_documented_table(path: Path, specs: Iterable[Pipeline]) -> bool:
    """Put the rendered reference between the markers of ``path``; True when it changed."""
    text = path.read_text()
    start = text.index(TABLE_START) + len(TABLE_START)
    updated = text[:start] + "\n" + render_reference(specs) + text[text.index(TABLE_END) :]
    if updated != text:
        path.write_text(updated)
    return updated != text
