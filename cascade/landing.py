"""Landing a batch of data in the lake: ``cascade land`` and the ``path`` of a data-landed event.

    cascade land impressions clicks.csv --ds 2026-11-22
    cascade land speech --source synthetic --ds 2026-11-22
    cascade land images ./my-batch --ds 2026-11-22 --format jsonl --replace

A pipeline declares the datasets its first step reads (:class:`~cascade.pipeline_spec.Dataset`,
found through :mod:`cascade.pipeline_registry`), each with its landing formats (format name ->
importer) and its named sources (batches made without a path: generated, synthesized). Landing
runs the importer into a staging folder beside the partition (``.dt=DS.staging-*``, which no
reader lists), writes the markers, and only then renames it to ``landing/<dataset>/dt=DS``:

* ``_SUCCESS``: the batch is complete;
* ``_LANDED.json``: dataset, partition, format or source, where it came from, the importer's
  counts and when.

Re-landing a partition is explicit (``replace=True``): the old batch stays in place, readable,
until the new one is complete; then the two are swapped and the old one removed. A failed
import removes its staging folder and leaves the partition as it was. After landing,
``cascade.data.landed`` is published with the partition, the landed folder, the format (or
source) and the counts.

A ``cascade.data.landed`` event whose ``path`` is not the landed partition itself names a batch
elsewhere: :func:`land_event_path` lands it through the same importer (the event's ``format``,
else guessed from the files), so a producer may announce data where it is.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cascade.errors import NotReady, UsageError
from cascade.lake import Lake, check_ds
from cascade.pipeline_spec import Dataset, Importer

SUCCESS_MARKER = "_SUCCESS"
LANDED_FILE = "_LANDED.json"
"""The landing record in a landed partition's folder (see the module docstring)."""
STAGING_PREFIX = "."
"""Staging and replaced folders start with a dot: ``dt=*`` globs never see them."""

FORMAT_SUFFIXES = {
    "jsonl": ("jsonl", "json", "ndjson"),
    "parquet": ("parquet",),
    "csv": ("csv",),
    "common_voice": ("tsv",),
    "image_folder": ("jsonl",),
    "coco": ("json",),
    "webdataset": ("tar",),
}
"""File suffixes that name a format when ``--format`` is not given (the files directly in the
folder, or the file itself)."""


class LandingError(RuntimeError):
    """A batch could not be landed (the importer refused it); the message names the fix."""


@dataclass(frozen=True)
class DeclaredDataset:
    dataset: Dataset
    pipelines: tuple[str, ...]
    """The pipelines whose first step reads it."""


def registered_datasets() -> dict[str, DeclaredDataset]:
    """Dataset name -> its declaration and the pipelines reading it, over every registered
    pipeline; two pipelines may read one dataset only when they declare the same value."""
    from cascade.pipeline_registry import registered_pipelines

    found: dict[str, DeclaredDataset] = {}
    for name, spec in registered_pipelines().items():
        for dataset in spec.datasets:
            known = found.get(dataset.name)
            if known is not None and known.dataset is not dataset:
                raise ValueError(
                    f"dataset {dataset.name!r} is declared by pipelines {known.pipelines[0]!r} "
                    f"and {name!r}; declare it once and import it in the other"
                )
            pipelines = (*known.pipelines, name) if known else (name,)
            found[dataset.name] = DeclaredDataset(dataset, pipelines)
    return dict(sorted(found.items()))


def get_dataset(name: str) -> Dataset:
    datasets = registered_datasets()
    if name not in datasets:
        raise UsageError(
            f"unknown dataset {name!r}; one of {', '.join(datasets) or '(none registered)'}"
        )
    return datasets[name].dataset


def landing_dir(lake: Lake, dataset: str, ds: str) -> Path:
    """Where partition ``ds`` of ``dataset`` lands (what the pipeline's first step reads)."""
    return lake.root / "landing" / dataset / f"dt={check_ds(ds)}"


def is_landed(folder: Path) -> bool:
    """Whether ``folder`` holds a complete landed batch."""
    return (folder / SUCCESS_MARKER).is_file()


def landing_record(folder: Path) -> dict[str, Any] | None:
    """The ``_LANDED.json`` of a landed folder (None for a batch landed by other means)."""
    path = folder / LANDED_FILE
    if not path.is_file():
        return None
    value = json.loads(path.read_text())
    return value if isinstance(value, dict) else None


def landed_from(record: Mapping[str, Any]) -> str:
    """What a landing record says the batch came from: its source or format (``unrecorded``
    for a batch landed by other means)."""
    return str(record.get("source") or record.get("format") or "unrecorded")


def guess_format(dataset: Dataset, path: Path) -> str:
    """The format of the batch at ``path``: the only one the dataset has, or the one its files'
    suffix names; a :class:`UsageError` listing the formats otherwise."""
    names = sorted(dataset.formats)
    if len(names) == 1:
        return names[0]
    files = [path] if path.is_file() else [p for p in path.iterdir() if p.is_file()]
    suffixes = {p.suffix.lower().lstrip(".") for p in files if not p.name.startswith((".", "_"))}
    matches = {
        name for name in names if suffixes and suffixes <= {name, *FORMAT_SUFFIXES.get(name, ())}
    }
    if len(matches) == 1:
        return matches.pop()
    raise UsageError(
        f"cannot tell the format of {path} for dataset {dataset.name!r}; pass --format with "
        f"one of {', '.join(names) or '(none)'}"
    )


def _importer(
    dataset: Dataset, path: Path | None, fmt: str | None, source: str | None
) -> tuple[Callable[[Path], Mapping[str, int]], dict[str, Any]]:
    """The function filling a staging folder, and what the landing record says of it."""
    if path is None:
        if source is None:
            raise UsageError(
                f"land {dataset.name!r} from a PATH, or choose one of its sources with --source "
                f"({', '.join(sorted(dataset.sources)) or 'none'})"
            )
        if fmt is not None:
            raise UsageError("--format reads a PATH; a --source without one makes its own batch")
        if source not in dataset.sources:
            raise UsageError(
                f"dataset {dataset.name!r} has no source {source!r} that makes its own batch; "
                f"one of {', '.join(sorted(dataset.sources)) or '(none)'}, or give a PATH"
            )
        producer = dataset.sources[source]
        return (lambda dest, ds: producer(dest, ds=ds)), {"source": source, "format": None}
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; give the file or folder to land")
    if source is not None:
        if fmt is not None:
            raise UsageError("give --source or --format, not both: a source knows its format")
        if dataset.source_importer is None:
            raise UsageError(
                f"dataset {dataset.name!r} reads no named source from a path; pass --format "
                f"with one of {', '.join(sorted(dataset.formats))}"
            )
        try:
            importer: Importer = dataset.source_importer(source)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        chosen = {"source": source, "format": None}
    else:
        fmt = fmt or guess_format(dataset, path)
        if fmt not in dataset.formats:
            raise UsageError(
                f"dataset {dataset.name!r} has no format {fmt!r}; one of "
                f"{', '.join(sorted(dataset.formats))}"
            )
        importer = dataset.formats[fmt]
        chosen = {"source": None, "format": fmt}
    source_path = path.resolve()
    return (lambda dest, ds: importer(source_path, dest, ds=ds)), {
        **chosen,
        "path": str(source_path),
    }


def _checked_counts(counts: Any, what: str) -> dict[str, int]:
    if not isinstance(counts, Mapping) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
        for k, v in counts.items()
    ):
        raise TypeError(f"the importer of {what} returned {counts!r}, not counts (name -> int)")
    return dict(counts)


def land(
    lake: Lake,
    dataset: Dataset,
    ds: str,
    *,
    path: Path | None = None,
    fmt: str | None = None,
    source: str | None = None,
    replace: bool = False,
    publish: Callable[[Any], Any] | None = None,
) -> dict[str, Any]:
    """Land one partition of ``dataset`` (see the module docstring); returns the landing record
    (with ``published``: where the event went, when ``publish`` is given)."""
    check_ds(ds)
    final = landing_dir(lake, dataset.name, ds)
    fill, record = _importer(dataset, path, fmt, source)
    if final.exists() and not replace:
        raise UsageError(
            f"partition {ds} of {dataset.name!r} has already landed at {final}; pass --replace "
            "to land it again (the old batch stays readable until the new one is complete)"
        )
    final.parent.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex[:12]
    staging = final.with_name(f"{STAGING_PREFIX}{final.name}.staging-{token}")
    what = f"{dataset.name} dt={ds}"
    try:
        staging.mkdir()
        counts = _checked_counts(fill(staging, ds), what)
        record = {
            "dataset": dataset.name,
            "partition": ds,
            **record,
            "counts": counts,
            "landed_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        }
        (staging / LANDED_FILE).write_text(json.dumps(record, indent=2))
        (staging / SUCCESS_MARKER).write_text("")
        _swap_in(staging, final, token)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    record["landed"] = str(final)
    print(f"[land] {what}: {_describe(record)} -> {final}", file=sys.stderr, flush=True)
    if publish is not None:
        event = landed_event(record, final)
        try:
            record["published"] = publish(event)
        except Exception as exc:  # the batch is in place: say so, and how to announce it
            raise NotReady(
                f"{what} landed at {final}, but {event.type} could not be published "
                f"({type(exc).__name__}: {str(exc)[:200]}); once the broker is up (`cascade up`) "
                f"run `cascade events publish {event.type} --dataset {dataset.name} --partition "
                f'{ds} --payload \'{{"path": "{final}"}}\'`'
            ) from exc
    return record


def _swap_in(staging: Path, final: Path, token: str) -> None:
    """Put the complete ``staging`` batch at ``final``; an older batch there is moved aside
    first and removed after."""
    old = final.with_name(f"{STAGING_PREFIX}{final.name}.replaced-{token}")
    if final.exists():
        final.rename(old)
    try:
        staging.rename(final)
    except OSError:
        if old.exists() and not final.exists():
            old.rename(final)  # the old batch back where readers look
        raise
    shutil.rmtree(old, ignore_errors=True)


def _describe(record: Mapping[str, Any]) -> str:
    counts = ", ".join(f"{k} {v:,}" for k, v in record["counts"].items())
    how = f"format {record['format']}" if record.get("format") else f"source {record['source']}"
    return f"{how}; {counts or 'no counts'}"


def landed_event(record: Mapping[str, Any], final: Path) -> Any:
    """The ``cascade.data.landed`` event of a landing record."""
    from cascade.assets import TOPIC_DATA_LANDED
    from cascade.events import make_event

    payload = {
        "dataset": record["dataset"],
        "partition": record["partition"],
        "path": str(final),
        **{key: record[key] for key in ("format", "source") if record.get(key)},
        "counts": dict(record["counts"]),
    }
    return make_event(TOPIC_DATA_LANDED, payload, source="cascade-land")


def land_event_path(lake: Lake, payload: Mapping[str, Any]) -> dict[str, Any] | None:
    """Land the batch a ``cascade.data.landed`` payload names by ``path``, unless that path is
    the landed partition itself (what ``cascade land`` publishes) or the partition has landed
    already; returns the landing record, or None when there was nothing to do."""
    where = payload.get("path")
    if not where:
        return None
    ds = str(payload["partition"])
    dataset = get_dataset(str(payload["dataset"]))
    final = landing_dir(lake, dataset.name, ds)
    source = Path(str(where))
    if source.resolve() == final.resolve() or is_landed(final):
        return None
    return land(lake, dataset, ds, path=source, fmt=payload.get("format"))


def land_event_paths(
    lake: Lake, events: Iterable[Mapping[str, Any]], ds: str, datasets: Iterable[str]
) -> list[dict[str, Any]]:
    """Land what the run's ``cascade.data.landed`` events for partition ``ds`` of ``datasets``
    name by ``path`` (:func:`land_event_path`; the first step of a pipeline calls this before
    it reads its landing folder); events are validated again first, an invalid one is left to
    the claim's refusal. Returns the landing records of the batches landed now."""
    from cascade.assets import TOPIC_DATA_LANDED
    from cascade.event_claims import checked_events

    wanted = set(datasets)
    valid, _refused = checked_events(events)
    landed = []
    for event in valid:
        payload = event.get("payload") or {}
        if (
            event.get("type") != TOPIC_DATA_LANDED
            or payload.get("dataset") not in wanted
            or payload.get("partition") != ds
        ):
            continue
        record = land_event_path(lake, payload)
        if record is not None:
            landed.append(record)
    return landed


def describe_datasets() -> str:
    """``cascade land --help``'s list: each dataset, its pipelines, formats and sources."""
    lines = []
    for name, declared in registered_datasets().items():
        dataset = declared.dataset
        lines.append(f"  {name} (read by {', '.join(declared.pipelines)})")
        lines.append(f"      formats: {', '.join(sorted(dataset.formats)) or '(none)'}")
        named = sorted(dataset.sources)
        if dataset.source_importer is not None:
            named.append("a registered source's name, with PATH")
        if named:
            lines.append(f"      sources: {', '.join(named)}")
        if dataset.description:
            lines.append(
                textwrap.fill(
                    dataset.description, 92, initial_indent=" " * 6, subsequent_indent=" " * 6
                )
            )
    return "\n".join(lines)
