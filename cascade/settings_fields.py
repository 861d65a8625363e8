"""How a settings class is declared and read field by field: the pydantic config every
settings class uses (:data:`SETTINGS_CONFIG`), the :func:`setting` field with its variable
name, docs heading and secrecy, the value forms written in variables (:data:`Flag`,
:data:`Sizes`, :data:`Seeds`, :data:`Names`), and each class flattened into its variables
(:func:`setting_fields`) with how ``cascade config`` shows a value (:func:`mask`,
:func:`effective_value`). The kernel's settings and their loading are :mod:`cascade.config`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass as plain_dataclass
from typing import Annotated, Any

from pydantic import BeforeValidator, ConfigDict, Field

SETTINGS_CONFIG = ConfigDict(use_attribute_docstrings=True, extra="forbid")
"""Config of every settings class: field docs come from the attribute docstrings."""


def _zero_or_one(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if str(value).strip() in ("0", "1"):
        return str(value).strip() == "1"
    raise ValueError("must be 0 or 1")


def comma_list(value: Any) -> Any:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


Flag = Annotated[bool, BeforeValidator(_zero_or_one)]
"""A switch written ``0`` or ``1``."""
Sizes = Annotated[tuple[Annotated[int, Field(ge=1)], ...], BeforeValidator(comma_list)]
"""Positive integers written ``1000,10000``."""
Seeds = Annotated[
    tuple[Annotated[int, Field(ge=0)], ...], BeforeValidator(comma_list), Field(min_length=1)
]
"""Integers >= 0 written ``0,1,2``."""
Names = Annotated[tuple[str, ...], BeforeValidator(comma_list)]
"""Names written ``a.example,b.example``."""


def setting(
    default: Any = None,
    *,
    env: str | None = None,
    group: str | None = None,
    secret: bool = False,
    hook: bool = False,
    shape: str | None = None,
    default_factory: Any = None,
    **constraints: Any,
) -> Any:
    """A settings field: ``env`` overrides the group's variable name, ``group`` its heading in
    the docs, ``secret`` masks the value in ``cascade config``, ``hook`` marks a test or
    fault-injection hook, ``shape`` describes the form a ``pattern`` asks for."""
    extra: dict[str, Any] = {
        "env": env,
        "group": group,
        "secret": secret,
        "hook": hook,
        "shape": shape,
    }
    if default_factory is not None:
        return Field(default_factory=default_factory, json_schema_extra=extra, **constraints)
    return Field(default=default, json_schema_extra=extra, **constraints)


@plain_dataclass(frozen=True)
class SettingField:
    """One variable: where it lives in its settings class and how it is documented."""

    env: str
    path: tuple[str, ...]
    group: str
    annotation: Any
    default: Any
    description: str
    secret: bool
    hook: bool
    shape: str | None = None


def is_settings_class(value: Any) -> bool:
    return (
        isinstance(value, type)
        and hasattr(value, "__pydantic_fields__")
        and (hasattr(value, "env_pattern"))
    )


def setting_fields(cls: type, path: tuple[str, ...] = ()) -> list[SettingField]:
    """Every variable of a settings class and its nested groups, in declaration order."""
    found: list[SettingField] = []
    pattern: str = cls.env_pattern  # type: ignore[attr-defined]
    for name, info in cls.__pydantic_fields__.items():  # type: ignore[attr-defined]
        if is_settings_class(info.annotation):
            found.extend(setting_fields(info.annotation, (*path, name)))
            continue
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        default = info.default_factory() if info.default_factory else info.default  # type: ignore[call-arg]
        found.append(
            SettingField(
                env=str(extra.get("env") or pattern.format(name.upper())),
                path=(*path, name),
                group=str(extra.get("group") or cls.title),  # type: ignore[attr-defined]
                annotation=info.annotation,
                default=default,
                description=" ".join((info.description or "").split()),
                secret=bool(extra.get("secret")),
                hook=bool(extra.get("hook")),
                shape=str(extra["shape"]) if extra.get("shape") else None,
            )
        )
    return found


def mask(field: SettingField, value: Any) -> Any:
    """``value`` as ``cascade config`` shows it: secrets and URL passwords hidden."""
    if value in (None, ""):
        return value
    if field.secret:
        return "********"
    if isinstance(value, str) and "://" in value and "@" in value.split("://", 1)[1]:
        scheme, rest = value.split("://", 1)
        userinfo, host = rest.rsplit("@", 1)
        if ":" in userinfo:
            return f"{scheme}://{userinfo.split(':', 1)[0]}:********@{host}"
    return value


def effective_value(root: Any, field: SettingField) -> Any:
    value = root
    for part in field.path:
        value = getattr(value, part)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
