"""Only the settings module reads ``CASCADE_*`` variables; everything else asks the settings."""

from __future__ import annotations

import ast
import re

from cascade.config import REPO_ROOT

PACKAGES = (
    "cascade",
    "domains",
    "jobs",
    "models",
    "serving",
    "compilers",
    "infra",
    "pipelines",
    "features",
    "dags",
    "benchmarks",
)
SETTINGS_MODULES = {"cascade/config.py"}
NAME = re.compile(r"^CASCADE_[A-Z0-9_]+$")
ALLOWED: set[tuple[str, str]] = set()
"""(file, variable) pairs that may read a variable directly: none today. Modules that set
variables for child processes (``infra/stack.py``, ``infra/services.py``,
``benchmarks/serving_load.py``, ``benchmarks/registry.py``, ``benchmarks/event_delivery.py``,
``domains/ctr/feature_store.py``) only write them, which this scan allows."""


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "CASCADE_..."`` assignments."""
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    found[target.id] = node.value.value
    return found


def _variable(node: ast.AST | None, constants: dict[str, str]) -> str | None:
    value = None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        value = node.value
    elif isinstance(node, ast.Name):
        value = constants.get(node.id)
    return value if value and NAME.match(value) else None


def direct_reads(source: str) -> list[tuple[int, str]]:
    """``(line, variable)`` for each ``X.get(VAR)``, ``getenv(VAR)``, ``X[VAR]`` read and
    ``VAR in X`` of a ``CASCADE_*`` name."""
    tree = ast.parse(source)
    constants = _constants(tree)
    reads: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("get", "getenv"):
                name = _variable(node.args[0], constants)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            name = _variable(node.slice, constants)
        elif isinstance(node, ast.Compare) and any(
            isinstance(op, ast.In | ast.NotIn) for op in node.ops
        ):
            name = _variable(node.left, constants)
        if name:
            reads.append((node.lineno, name))
    return reads


def test_the_scan_finds_each_kind_of_read() -> None:
    source = (
        'import os\nVAR = "CASCADE_X"\n'
        'a = os.environ.get("CASCADE_A")\nb = os.environ[VAR]\nc = "CASCADE_C" in os.environ\n'
        'd = os.getenv("CASCADE_D")\nos.environ["CASCADE_E"] = "1"\nenv = {"CASCADE_F": "1"}\n'
    )
    assert direct_reads(source) == [
        (3, "CASCADE_A"),
        (4, "CASCADE_X"),
        (5, "CASCADE_C"),
        (6, "CASCADE_D"),
    ]


def test_no_module_reads_cascade_variables_outside_the_settings() -> None:
    found: list[str] = []
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            relative = path.relative_to(REPO_ROOT).as_posix()
            if relative in SETTINGS_MODULES:
                continue
            for line, name in direct_reads(path.read_text()):
                if (relative, name) not in ALLOWED:
                    found.append(f"{relative}:{line} reads {name}")
    assert not found, "read these through cascade.config.load_settings():\n" + "\n".join(found)


def test_every_variable_the_code_names_is_a_setting() -> None:
    from cascade.config import all_setting_fields

    known = {field.env for field in all_setting_fields()}
    named: set[str] = set()
    for package in PACKAGES:
        for path in (REPO_ROOT / package).rglob("*.py"):
            if path.relative_to(REPO_ROOT).as_posix() in SETTINGS_MODULES:
                continue  # its docs write CASCADE_X for any variable
            named |= set(re.findall(r"\b(CASCADE_[A-Z0-9_]*[A-Z0-9])\b", path.read_text()))
    not_settings = {"CASCADE_CONFIGS", "CASCADE_KAFKA"}  # a dict's name, an Airflow connection
    assert sorted(named - known - not_settings) == []
