"""The two xdist groups of `make test` (tests/conftest.py): every stack test is in the exclusive
group, and every listed multi-process run still names a test (a renamed test would otherwise run
beside a stack unnoticed). Read from the sources: collecting the suite takes minutes."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import EXCLUSIVE, xdist_group_of

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def functions_of(module: Path) -> list[str]:
    tree = ast.parse(module.read_text())
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
    ]


def test_every_stack_test_module_is_in_the_exclusive_group() -> None:
    marked = [
        path.relative_to(ROOT).as_posix()
        for path in TESTS.rglob("test_*.py")
        if path != Path(__file__).resolve()
        if any(m in path.read_text() for m in ("mark.e2e", "mark.faults"))
    ]
    assert marked
    for module in marked:
        assert xdist_group_of(f"{module}::test_x") == "exclusive", module


def test_every_listed_prefix_names_a_test_and_quick_model_tests_stay_shared() -> None:
    for prefix in EXCLUSIVE:
        if prefix.endswith("/"):
            assert (ROOT / prefix).is_dir(), prefix
            continue
        module, _, name = prefix.partition("::")
        names = functions_of(ROOT / module)
        assert any(n.startswith(name) for n in names), prefix
    quick = "tests/models/test_preranking_cascade.py::test_deepspeed_step_is_the_plain_pytorch_step"
    assert xdist_group_of(quick) == "shared"
