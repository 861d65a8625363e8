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


def test_the_exclusive_unit_goes_first_and_shared_units_keep_their_fixtures_together() -> None:
    from tests.conftest import ordered_units, work_unit_of

    nodeids = [
        "tests/cascade/test_config.py::test_a",
        "tests/compilers/test_asr.py::test_b",
        "tests/e2e/test_stack.py::test_c",
        "tests/cascade/test_config.py::test_d",
        "tests/serving/test_asr.py::test_e",
        "tests/models/test_asr_train.py::test_two_process_f",
        "tests/jobs/test_audio_corpus.py::test_g",
        "tests/jobs/test_multimodal_corpus.py::test_h",
    ]
    units = ordered_units(nodeids)
    assert list(units) == [
        "exclusive",
        "tests/cascade/test_config.py",
        "serving+asr",
        "tests/jobs/",
    ]
    assert list(units["exclusive"]) == [nodeids[2], nodeids[5]]
    assert list(units["serving+asr"]) == [nodeids[4], nodeids[1]]  # by SHARED_UNITS prefix
    assert work_unit_of("tests/test_layers.py::test_x") == "tests/test_layers.py"
    # The Spark session's owners (tests/jobs/) run before the modules that borrow it.
    borrowing = [
        "tests/benchmarks/test_ctr_cross_stats.py::test_i",
        "tests/jobs/test_ctr_cross_stats.py::test_j",
        "tests/benchmarks/test_ctr_cross_duckdb.py::test_k",
        "tests/jobs/test_audio_corpus.py::test_l",
    ]
    spark = ordered_units(borrowing)
    assert list(spark) == ["tests/jobs/"]
    assert list(spark["tests/jobs/"]) == [borrowing[i] for i in (1, 3, 2, 0)]
    assert "exclusive" not in ordered_units(nodeids[:2])


def test_every_module_on_the_compiled_asr_fixture_shares_one_unit() -> None:
    """``compiled_asr_dir`` is a session fixture: a worker builds its own copy (an AOTInductor
    C++ build, about a minute), so every module that uses it is in the same unit."""
    from tests.conftest import work_unit_of

    users = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("test_*.py")
        if path.name != "test_suite_groups.py" and "compiled_asr_dir" in path.read_text()
    )
    assert len(users) >= 3, users
    assert {work_unit_of(f"{module}::test_x") for module in users} == {"serving+asr"}, users
