"""Running one Great Expectations suite over an in-memory frame, for the data gates in ``jobs/``.

GX Core 1.x: data source -> dataframe asset -> whole-frame batch -> suite -> validation
definition, run with the frame as batch parameter. Works for pandas and Spark data sources.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class SuiteOutcome:
    """What one suite found on one dataset."""

    success: bool
    checks: list[dict[str, Any]]
    """Per expectation: its label, success, GX result and exception message (if any)."""
    failed: list[str]
    """Labels of the failed expectations."""


def expectation_name(dataset: str, config: Any) -> str:
    """A readable label: ``dataset.expectation_type(columns)``."""
    kwargs = config.kwargs
    columns = [kwargs[k] for k in ("column", "column_A", "column_B") if k in kwargs]
    return f"{dataset}.{config.type}({', '.join(columns)})"


def run_suite(
    context: Any,
    source: Any,
    *,
    suite_name: str,
    dataset: str,
    frame: Any,
    expectations: list[Any],
) -> SuiteOutcome:
    """Validate ``frame`` against ``expectations`` through ``source`` of ``context``."""
    import great_expectations as gx

    batch = source.add_dataframe_asset(name=dataset).add_batch_definition_whole_dataframe(
        name=f"{dataset}_whole"
    )
    # Filled before it is stored: an expectation added to a stored suite is saved to the store
    # one by one (a copy of the whole suite each time; ~1 s a suite on a loaded 2-core machine).
    suite = context.suites.add(gx.ExpectationSuite(name=suite_name, expectations=expectations))
    definition = context.validation_definitions.add(
        gx.ValidationDefinition(name=suite_name, data=batch, suite=suite)
    )
    result = definition.run(batch_parameters={"dataframe": frame})
    checks: list[dict[str, Any]] = []
    failed: list[str] = []
    for outcome in result.results:
        label = expectation_name(dataset, outcome.expectation_config)
        if not outcome.success:
            failed.append(label)
        checks.append(
            {
                "expectation": label,
                "success": bool(outcome.success),
                "result": outcome.result,
                "exception": (outcome.exception_info or {}).get("exception_message"),
            }
        )
    return SuiteOutcome(success=bool(result.success), checks=checks, failed=failed)


DOCS_SITE = "lake"


def build_data_docs(context: Any, folder: Path | None) -> str | None:
    """Render the validation results of ``context`` (every suite the gate ran) as GX Data Docs,
    a static site in ``folder``; returns its ``index.html``. Best effort: a gate's verdict never
    depends on its pages, so a rendering error is printed and gives None."""
    if folder is None:
        return None
    import shutil

    try:
        if folder.exists():
            shutil.rmtree(folder)  # only this run's results, not an earlier run's
        folder.mkdir(parents=True)
        context.add_data_docs_site(
            site_name=DOCS_SITE,
            site_config={
                "class_name": "SiteBuilder",
                "store_backend": {
                    "class_name": "TupleFilesystemStoreBackend",
                    "base_directory": str(folder),
                },
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            },
        )
        context.build_data_docs(site_names=[DOCS_SITE])
    except Exception as exc:  # noqa: BLE001 - the pages are a view, not the gate
        print(f"[gate] no Data Docs in {folder}: {type(exc).__name__}: {exc}")
        return None
    index = folder / "index.html"
    return str(index) if index.is_file() else None


def gate_report(outcomes: list[SuiteOutcome], path: Path, **counts: Any) -> dict[str, Any]:
    """A data gate's report over its suites, written as JSON to ``path``: ``success``,
    ``failed`` labels, the caller's ``counts``, every check and the path."""
    failed = [label for outcome in outcomes for label in outcome.failed]
    report = {
        "success": not failed,
        "failed": failed,
        **counts,
        "checks": [c for outcome in outcomes for c in outcome.checks],
        "path": str(path),
    }
    path.write_text(json.dumps(report, indent=2, default=str))
    return report


class GateFailed(RuntimeError):
    """A data gate refused its input; ``report`` is what :func:`gate_report` wrote."""

    what = "data"

    def __init__(self, report: dict[str, Any]) -> None:
        self.report = report
        super().__init__(
            f"{self.what} gate failed: {', '.join(report['failed'])}; see {report['path']}"
        )
