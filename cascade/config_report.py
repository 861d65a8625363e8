"""What ``cascade config`` prints: each setting's effective value and its source, and the
settings reference page's variable table (``docs/reference/settings.md``), both rendered from
the settings classes."""

from __future__ import annotations

import json
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cascade.config import (
    REPO_ROOT,
    Settings,
    all_setting_fields,
    load_group,
    load_settings,
    pipeline_settings_classes,
    raw_values,
)
from cascade.settings_fields import SettingField, effective_value, mask, setting_fields

TABLE_START = "<!-- settings-table:start -->"
TABLE_END = "<!-- settings-table:end -->"
SETTINGS_PAGE = REPO_ROOT / "docs" / "reference" / "settings.md"
"""The docs page that holds the variable table between the markers."""


def settings_report(env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """One row per variable: name, group, value (masked where secret), source, default."""
    env = os.environ if env is None else env
    raw = raw_values(env)
    roots: list[tuple[Any, list[SettingField]]] = [(load_settings(env), setting_fields(Settings))]
    seen: set[type] = set()
    for cls in pipeline_settings_classes().values():
        if cls not in seen:
            seen.add(cls)
            roots.append((load_group(cls, env), setting_fields(cls)))
    rows: list[dict[str, Any]] = []
    for root, fields in roots:
        for field in fields:
            value = effective_value(root, field)
            rows.append(
                {
                    "name": field.env,
                    "group": field.group,
                    "value": _jsonable(mask(field, value)),
                    "source": raw[field.env][1] if field.env in raw else "default",
                    "default": _jsonable(mask(field, field.default)),
                    "secret": field.secret,
                    "hook": field.hook,
                }
            )
    order = {group: i for i, group in enumerate(dict.fromkeys(row["group"] for row in rows))}
    return sorted(rows, key=lambda row: order[row["group"]])


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def render_text(rows: list[dict[str, Any]]) -> str:
    width = max(len(row["name"]) for row in rows)
    lines: list[str] = []
    group = None
    for row in rows:
        if row["group"] != group:
            group = row["group"]
            lines.append(f"{'' if not lines else chr(10)}# {group}")
        value = json.dumps(row["value"])
        lines.append(f"{row['name']:<{width}}  {value}  ({row['source']})")
    return "\n".join(lines)


def type_name(annotation: Any) -> str:
    """A short reader's name for a field's type."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is typing.Literal:
        return " \\| ".join(f"`{arg}`" for arg in args)
    if origin in (typing.Union, types.UnionType):
        named = [type_name(arg) for arg in args if arg is not type(None)]
        return " or ".join(named) + (", optional" if type(None) in args else "")
    if origin is tuple:
        return f"list of {type_name(args[0])}"
    if annotation is bool:
        return "`0` \\| `1`"
    if annotation is Path:
        return "path"
    if annotation in (int, float, str):
        return {int: "integer", float: "number", str: "text"}[annotation]
    return getattr(annotation, "__name__", str(annotation))


def _default_text(field: SettingField) -> str:
    value = field.default
    if value is None or value == "" or value == ():
        return "unset"
    if isinstance(value, Path):
        try:
            return f"`{value.relative_to(REPO_ROOT)}` in the repository"
        except ValueError:
            return f"`{value}`"
    if isinstance(value, bool):
        return f"`{int(value)}`"
    if isinstance(value, tuple):
        return "`" + ",".join(str(v) for v in value) + "`"
    return f"`{value}`"


def render_markdown(fields: list[SettingField] | None = None) -> str:
    """The settings page's variable table: one section per group, every variable documented."""
    fields = all_setting_fields() if fields is None else fields
    groups: dict[str, list[SettingField]] = {}
    for field in fields:
        groups.setdefault(field.group, []).append(field)
    parts: list[str] = []
    for group, members in groups.items():
        parts.append(f"**{group}**\n")
        parts.append("| variable | type | default | meaning |")
        parts.append("|---|---|---|---|")
        for field in members:
            meaning = field.description.replace("``", "`").replace("|", "\\|")
            if field.secret:
                meaning += " Secret: masked by `cascade config`."
            kind, default = type_name(field.annotation), _default_text(field)
            parts.append(f"| `{field.env}` | {kind} | {default} | {meaning} |")
        parts.append("")
    return "\n".join(parts).rstrip() + "\n"


def documented_table(page: str) -> str:
    """The part of ``page`` between the settings-table markers."""
    start = page.index(TABLE_START) + len(TABLE_START)
    return page[start : page.index(TABLE_END)].strip("\n") + "\n"


def write_documented_table(path: Path) -> bool:
    """Put the rendered table between the markers of ``path``; True when it changed."""
    text = path.read_text()
    start = text.index(TABLE_START) + len(TABLE_START)
    end = text.index(TABLE_END)
    updated = text[:start] + "\n" + render_markdown() + text[end:]
    if updated != text:
        path.write_text(updated)
    return updated != text


def cmd_config(args: Any) -> int:
    """``cascade config``: every setting with its value and source (``--json``), or the settings
    page's table (``--markdown``; ``--write-docs`` / ``--check-docs`` keep the page equal to it)."""
    page = SETTINGS_PAGE
    if args.markdown:
        print(render_markdown(), end="")
    elif args.write_docs:
        print(f"{page}: {'updated' if write_documented_table(page) else 'already current'}")
    elif args.check_docs:
        if documented_table(page.read_text()) != render_markdown():
            print(f"{page}: settings table differs; run `cascade config --write-docs`")
            return 1
    elif args.json:
        print(json.dumps(settings_report(), indent=2))
    else:
        print(render_text(settings_report()))
    return 0
