"""The layers of docs/concepts/architecture.md hold: import-linter's contracts in pyproject.toml
pass (imports inside functions count), and the DAG files, which are not a package, import only
the kernel."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from cascade.config import REPO_ROOT

LINT_IMPORTS = str(Path(sys.executable).parent / "lint-imports")
PROJECT_PACKAGES = set(
    "cascade domains features jobs models serving compilers infra pipelines".split()
)


def test_import_contracts_pass() -> None:
    result = subprocess.run(
        [LINT_IMPORTS, "--no-cache"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def imported_packages(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & (PROJECT_PACKAGES | {"benchmarks"})


def test_dag_files_import_only_the_kernel() -> None:
    for path in sorted((REPO_ROOT / "dags").glob("*.py")):
        assert imported_packages(path) <= {"cascade"}, path.name


def test_no_dag_file_shadows_a_package() -> None:
    # The DAG processor puts dags/ first on sys.path: a dags/pipelines.py would be imported in
    # place of the pipelines package and the registry would find no pipeline.
    shadowing = {p.stem for p in (REPO_ROOT / "dags").glob("*.py")} & (
        PROJECT_PACKAGES | {"benchmarks", "features", "dags", "tests"}
    )
    assert not shadowing
