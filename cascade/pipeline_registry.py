"""Finds the registered pipelines; the kernel never imports a pipeline by name.

Every installed distribution may register pipelines under the ``cascade.pipelines`` entry-point
group. An entry point names either one :class:`~cascade.pipeline_spec.Pipeline` value, a module
that defines ``PIPELINE``, or a package: then each of its modules that defines ``PIPELINE`` is
one pipeline. The project registers its own ``pipelines`` package that way
(``pyproject.toml``), so a new ``pipelines/<name>.py`` is found with no other edit.

    from cascade.pipeline_registry import registered_pipelines
    registered_pipelines()["asr"].step_names
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
from types import ModuleType
from typing import Any

from cascade.pipeline_spec import Pipeline

ENTRY_POINT_GROUP = "cascade.pipelines"

_cache: dict[str, Pipeline] | None = None


class PipelineRegistryError(RuntimeError):
    """A registered entry point does not lead to a valid pipeline."""


def _from_module(module: ModuleType, found: dict[str, Pipeline], origin: str) -> None:
    spec = getattr(module, "PIPELINE", None)
    if spec is None:
        return
    if not isinstance(spec, Pipeline):
        raise PipelineRegistryError(
            f"{module.__name__}.PIPELINE is a {type(spec).__name__}, not a cascade Pipeline"
        )
    _add(spec, found, f"{origin} ({module.__name__})")


def _add(spec: Pipeline, found: dict[str, Pipeline], origin: str) -> None:
    if spec.name in found and found[spec.name] is not spec:
        raise PipelineRegistryError(f"pipeline {spec.name!r} is registered twice: {origin}")
    found[spec.name] = spec


def _load(value: Any, found: dict[str, Pipeline], origin: str) -> None:
    if isinstance(value, Pipeline):
        _add(value, found, origin)
        return
    if not isinstance(value, ModuleType):
        raise PipelineRegistryError(
            f"entry point {origin} gives a {type(value).__name__}; "
            "it must name a Pipeline, a module defining PIPELINE, or a package of such modules"
        )
    if not hasattr(value, "__path__") and not hasattr(value, "PIPELINE"):
        # E.g. a DAG file of the same name shadowing the package on the DAG processor's path.
        raise PipelineRegistryError(
            f"entry point {origin} resolves to {getattr(value, '__file__', value)!r}, a module "
            "that defines no PIPELINE (is another module of that name earlier on sys.path?)"
        )
    _from_module(value, found, origin)
    if hasattr(value, "__path__"):
        for info in sorted(pkgutil.iter_modules(value.__path__), key=lambda i: i.name):
            if info.name.startswith("_"):
                continue
            _from_module(importlib.import_module(f"{value.__name__}.{info.name}"), found, origin)


def registered_pipelines(*, refresh: bool = False) -> dict[str, Pipeline]:
    """Pipeline name -> spec, over every entry point of the group, sorted by name."""
    global _cache
    if _cache is not None and not refresh:
        return _cache
    found: dict[str, Pipeline] = {}
    seen: set[str] = set()
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        key = f"{entry.name}={entry.value}"
        if key in seen:  # the same distribution found twice on sys.path
            continue
        seen.add(key)
        try:
            value = entry.load()
        except ImportError as exc:
            raise PipelineRegistryError(
                f"entry point {entry.name} = {entry.value!r} of group {ENTRY_POINT_GROUP!r} "
                f"does not import: {exc}"
            ) from exc
        _load(value, found, f"{entry.name} = {entry.value}")
    _cache = dict(sorted(found.items()))
    return _cache


def get_pipeline(name: str) -> Pipeline:
    pipelines = registered_pipelines()
    if name not in pipelines:
        raise KeyError(f"unknown pipeline {name!r}; one of {', '.join(pipelines) or '(none)'}")
    return pipelines[name]


def registered_models() -> dict[str, Pipeline]:
    """Registered model name -> the pipeline that trains it."""
    return {p.model.name: p for p in registered_pipelines().values() if p.model is not None}
