"""The pipeline spec: one typed value says everything the platform needs to know of a pipeline.

A pipeline module (``pipelines/<name>.py``, or any installed package registered under the
``cascade.pipelines`` entry-point group) defines its step functions and one :class:`Pipeline`
named ``PIPELINE``. From that value alone come the Airflow DAG (:mod:`cascade.dag_factory`), the
DVC stages (:mod:`cascade.dvc_stages`), the CLI choices (``cascade step``, ``cascade score
--model``, ``cascade rollback --model``, ``cascade pipelines``) and the pipeline table of the
docs. Nothing here imports a pipeline: :mod:`cascade.pipeline_registry` finds them.

Specs are built at DAG-parse time, so a pipeline module keeps its heavy imports (torch, Spark,
Feast, MLflow) inside its step functions.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

StepFunction = Callable[[Any], Mapping[str, Any]]
"""A step: takes its :class:`cascade.step_context.StepContext` (the partition, the settings
with this run's knobs applied, the run), returns a JSON-able summary."""

Importer = Callable[..., Mapping[str, int]]
"""A landing format's importer, ``(source: Path, dest: Path, *, ds: str) -> counts``: reads
the data at ``source`` where it is, checks it, and writes the canonical landed layout the
pipeline's first step reads into ``dest`` (a fresh folder); returns counts such as
``{"rows": n, "quarantined": k}``. Bad input raises a one-line error naming the file."""
Producer = Callable[..., Mapping[str, int]]
"""A named source that makes its batch itself (generated, synthesized data),
``(dest: Path, *, ds: str) -> counts``: chosen explicitly, never run for want of data."""

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_QUEUE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
DEFAULT_QUEUE = "default"
"""Airflow's default queue (``[operators] default_queue``): the cluster profile's ordinary
Celery workers consume it and nothing else."""
PROMOTION_QUEUE = "promotion"
"""The queue of the steps that act as the MLflow promoter (register versions, move
``challenger`` and ``champion``, sign releases): in the cluster profile only the promotion
worker consumes it, and only that worker holds the promoter's credential and the release
signing key (``docs/operations/security.md``)."""


def _check_name(kind: str, name: str) -> None:
    if not _NAME.match(name):
        raise ValueError(
            f"{kind} name {name!r} must be lower-case letters, digits and '_' "
            "(it becomes a DAG id, a task id and a DVC stage name)"
        )


@dataclass(frozen=True, kw_only=True)
class Data:
    """A dataset of a pipeline's catalog: what it is and where it lives in the lake.

    The location is the lake's layout (:meth:`cascade.lake.Lake.partition`) for ``kind`` and
    ``key``, one folder per partition; steps name the dataset (:attr:`Step.inputs`,
    :attr:`Step.outputs`), and the DVC deps and outs, the asset outlets, the lineage in the run
    report and ``cascade pipelines --json`` follow from those names."""

    name: str
    """The name steps use (``ctx.inputs[name]``); unique in the pipeline."""
    kind: str
    """Which part of the lake: one of :data:`cascade.lake.LAYOUT` (``landing``, ``corpus``,
    ``features``, ``training_set``, ``report``, ``quarantine``)."""
    key: str
    """The folder under the kind's root, e.g. ``speech`` or ``ctr_cross/generated/user``."""
    format: str = "parquet"
    """How the partition's files are written (``parquet``, ``shards``, ``wav+jsonl``, ``json``,
    ...)."""
    contract: str = ""
    """The schema or the suite that guards it (a GX suite, a manifest schema); empty: none."""
    description: str = ""
    persist: bool = False
    """Data that may have landed from elsewhere, or that a retried step resumes from: DVC must
    not delete it before the stage runs."""
    cache: bool = True
    """DVC keeps a copy of each version; False for working folders (curves, checkpoints) that
    DVC only hashes."""
    asset: str = ""
    """The asset URI consumers schedule on when a step writes it (the step's Airflow outlet)."""
    file: str = ""
    """One file of the partition's folder is the dataset (e.g. another pipeline's step
    summary); empty: the whole folder."""

    def location(self, lake: Any, ds: str) -> Any:
        """The partition ``ds`` of the dataset in ``lake`` (a :class:`cascade.lake.Lake`)."""
        folder = lake.partition(self.kind, self.key, ds)
        return folder / self.file if self.file else folder

    def __post_init__(self) -> None:
        _check_name("dataset", self.name)
        from cascade.lake import LAYOUT

        if self.kind not in LAYOUT:
            raise ValueError(
                f"dataset {self.name!r}: kind {self.kind!r} is not one of {', '.join(LAYOUT)}"
            )
        parts = self.key.split("/")
        if not all(_NAME.match(part) for part in parts):
            raise ValueError(
                f"dataset {self.name!r}: key {self.key!r} must be '/'-separated names of "
                "lower-case letters, digits and '_'"
            )


@dataclass(frozen=True, kw_only=True)
class Plot:
    """A file a step writes that ``dvc plots show`` draws (CSV, TSV or JSON rows)."""

    output: str = ""
    """The step's output dataset the file lies in (a catalog name)."""
    file: str = ""
    """The file (or folder: each of its files is drawn) inside the output's partition."""
    path: str = ""
    """Instead of ``output`` and ``file``: a repository-relative path; ``${ds}`` stands for the
    partition."""
    x: str
    """The column on the x axis."""
    y: str
    """The column on the y axis."""
    title: str = ""


@dataclass(frozen=True, kw_only=True)
class Step:
    """One task of the DAG, one DVC stage, one ``cascade step`` choice."""

    name: str
    """Task id and step name; the DVC stage is the pipeline's ``dvc_prefix`` + this."""
    run: StepFunction
    """The function the task, the DVC stage and ``cascade step`` call with the step's context."""
    doc: str = ""
    """One line on what the step does (task ``doc_md``, ``cascade pipelines``)."""
    timeout_minutes: float | None = None
    """Airflow ``execution_timeout``; None leaves the task unbounded."""
    inputs: tuple[str, ...] = ()
    """Catalog datasets the step reads (:attr:`Pipeline.catalog` names; ``ctx.inputs``)."""
    outputs: tuple[str, ...] = ()
    """Catalog datasets the step writes (``ctx.outputs``): DVC outs, and the assets of those
    that have one are the step's outlets."""
    reads: tuple[str, ...] = ()
    """Earlier steps of the pipeline whose results (returned summaries) this one reads
    (``ctx.result_of(name)``); the previous step's is always readable."""
    outlets: tuple[str, ...] = ()
    """Asset URIs the step updates besides its outputs' (Airflow ``outlets``): consumers
    schedule on them."""
    dvc_deps: tuple[str, ...] = ()
    """Code paths the DVC stage depends on, beside its inputs and the summaries it reads."""
    params: Mapping[str, str] = field(default_factory=dict)
    """Knobs of the step: name -> the ``CASCADE_*`` setting it sets. Each is the DVC parameter
    ``<pipeline>.<name>`` in ``params.yaml`` (``dvc exp run -S``), given to the step as
    ``cascade step ... --param name=VALUE``; the step sees the value as a field of its
    context's settings."""
    metrics: tuple[str, ...] = ()
    """Numeric keys of the step's summary that are its metrics: the step runner writes them to
    ``metrics.json`` beside the summary, a DVC metrics file (``dvc metrics diff``)."""
    plots: tuple[Plot, ...] = ()
    """Files the step writes that DVC draws (``dvc plots show``): training curves, trade-offs."""
    heavy: bool = False
    """The step saturates the machine without Spark (a DeepSpeed training, a compile); a Spark
    step (:attr:`spark`) is heavy by that alone. Heavy steps run in the Airflow pool
    :data:`HEAVY_POOL`, whose slots bound how many run at once across all pipelines
    (``CASCADE_AIRFLOW_HEAVY_SLOTS``): see :attr:`in_heavy_pool`."""
    data_docs: bool = False
    """The step is a GX gate that renders its results as Data Docs in
    :meth:`cascade.lake.Lake.data_docs` (pipeline, step, ds): its task gets a "Data Docs" link,
    which works when the gate fails too."""
    spark: bool = False
    """The step runs Spark jobs: the cluster profile submits it as a spark-operator
    ``SparkApplication`` (``infra/k8s/spark-applications.yaml``, made from the specs)."""
    queue: str = DEFAULT_QUEUE
    """The Celery queue the step's task waits in (Airflow ``queue``): the cluster profile's
    workers each consume one queue and hold only the credentials of the steps queued there.
    Steps that register versions and move aliases (the promotion gate, which acts as the
    MLflow promoter) name :data:`PROMOTION_QUEUE`; the local profile's executor ignores it."""

    @property
    def in_heavy_pool(self) -> bool:
        """Whether the step's task runs in :data:`HEAVY_POOL`: Spark steps and heavy ones."""
        return self.heavy or self.spark

    def __post_init__(self) -> None:
        _check_name("step", self.name)
        for knob, variable in self.params.items():
            _check_name("knob", knob)
            if knob == "ds":
                raise ValueError(f"step {self.name!r}: 'ds' is the partition, not a knob name")
            if not variable.startswith("CASCADE_"):
                raise ValueError(
                    f"step {self.name!r}: knob {knob!r} must name a CASCADE_* setting, "
                    f"got {variable!r}"
                )
        if not _QUEUE.match(self.queue):
            raise ValueError(
                f"step {self.name!r}: queue {self.queue!r} must be lower-case letters, digits, "
                f"'_' and '-' (e.g. {PROMOTION_QUEUE!r}; {DEFAULT_QUEUE!r} for Airflow's default)"
            )
        if not callable(self.run):
            raise TypeError(f"step {self.name!r}: run must be a function of the step's context")
        if self.timeout_minutes is not None and self.timeout_minutes <= 0:
            raise ValueError(f"step {self.name!r}: timeout_minutes must be > 0")
        in_lake = [path for path in self.dvc_deps if path.startswith(".cascade")]
        if in_lake:
            raise ValueError(
                f"step {self.name!r}: dvc_deps {in_lake} are lake paths; declare the data in "
                "the pipeline's catalog and name it in the step's inputs"
            )


def deferred(target: str) -> Callable[..., Any]:
    """The function ``"package.module:function"``, imported on its first call: a spec names
    its importers without importing Spark or audio libraries at DAG-parse time."""
    module, _, name = target.partition(":")
    if not module or not name:
        raise ValueError(f"deferred({target!r}): name it as 'package.module:function'")

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__, call.__qualname__ = name, f"deferred({target})"
    return call


@dataclass(frozen=True, kw_only=True)
class Dataset:
    """A dataset a pipeline's first step reads from ``<lake>/landing/<name>/dt=<ds>/``, and how
    ``cascade land`` (and a ``cascade.data.landed`` event naming a ``path``) puts a batch
    there."""

    name: str
    """The landing folder's name and the ``dataset`` of its ``cascade.data.landed`` events."""
    description: str = ""
    formats: Mapping[str, Importer] = field(default_factory=dict)
    """Format name -> :data:`Importer` (``cascade land DATASET PATH --format NAME``)."""
    sources: Mapping[str, Producer] = field(default_factory=dict)
    """Source name -> :data:`Producer`: batches made without a path
    (``cascade land DATASET --source NAME``), e.g. ``generated`` or ``synthetic``."""
    source_importer: Callable[[str], Importer] | None = None
    """An importer of a path in the shape of a named source the dataset registers elsewhere
    (``cascade land DATASET PATH --source NAME``, e.g. a registered click-log source); raises
    ValueError naming the known sources for an unknown one."""

    def __post_init__(self) -> None:
        _check_name("dataset", self.name)
        for kind, names in (("format", self.formats), ("source", self.sources)):
            for name in names:
                _check_name(f"dataset {self.name!r} {kind}", name)
                if not callable(names[name]):
                    raise TypeError(f"dataset {self.name!r}: {kind} {name!r} is not a function")
        if not self.formats and not self.sources and self.source_importer is None:
            raise ValueError(f"dataset {self.name!r} has no landing format and no source")


@dataclass(frozen=True, kw_only=True)
class Trigger:
    """The Kafka-watched asset that starts a pipeline: events matching ``selectors``
    (``TYPE`` or ``TYPE:payload_field=value``) on the shared watcher stream."""

    asset: str
    """Asset URI (``kafka://cascade/<topic>/<name>``)."""
    watcher: str
    """The ``AssetWatcher`` name (unique across pipelines)."""
    selectors: tuple[str, ...]
    dead_letter: bool = False
    """Exactly one watcher dead-letters bad messages, so each is recorded once."""
    unbuildable: Callable[[str], str | None] | None = None
    """``ds -> reason``: why partition ``ds`` cannot be built (nothing landed for it, checked
    the way the first step checks), or None when it can. The claim step dead-letters an event
    naming such a partition with that reason instead of starting a run that would fail on it;
    a partition in the future is refused without asking. None: every partition can be built."""

    def __post_init__(self) -> None:
        if not self.selectors:
            raise ValueError(f"trigger {self.watcher!r} needs at least one event selector")
        if self.unbuildable is not None and not callable(self.unbuildable):
            raise TypeError(f"trigger {self.watcher!r}: unbuildable must be a function of ds")


@dataclass(frozen=True, kw_only=True)
class Promotion:
    """How a challenger becomes champion (:mod:`cascade.promotion` applies it).

    The spec's values are the rule. A pipeline may let a run change the metric or the
    tolerance only through a documented field of its settings class, named here
    (``metric_setting``, ``tolerance_setting``): unset (None), the spec's value applies.
    :meth:`Pipeline.promotion` gives the rule in force, which ``cascade pipelines --json``
    prints and the register step applies."""

    metric: str
    """The held-out metric both versions are scored on (e.g. ``auc``, ``cer``)."""
    higher_is_better: bool
    tolerance: float = 0.0
    """How much worse than the champion a challenger may be and still be promoted."""
    requires_compile_gate: bool = False
    """The pipeline has a compile step: no promotion without its passed report."""
    metrics: Mapping[str, bool] = field(default_factory=dict)
    """The metrics ``metric_setting`` may choose, each with whether higher is better (the
    spec's ``metric`` among them)."""
    metric_setting: str = ""
    """The field of the pipeline's settings class that replaces ``metric`` when set."""
    tolerance_setting: str = ""
    """The field of the pipeline's settings class that replaces ``tolerance`` when set."""

    def __post_init__(self) -> None:
        if not 0 <= self.tolerance < 1:
            raise ValueError(f"promotion tolerance must be in [0, 1), got {self.tolerance}")
        if self.metric_setting and self.metrics.get(self.metric) != self.higher_is_better:
            raise ValueError(
                f"promotion metric_setting {self.metric_setting!r} needs `metrics` to list "
                f"{self.metric!r} with higher_is_better={self.higher_is_better}"
            )

    @property
    def settings_fields(self) -> dict[str, str]:
        """Rule attribute -> the settings field that may replace it."""
        return {
            name: value
            for name, value in (
                ("metric", self.metric_setting),
                ("tolerance", self.tolerance_setting),
            )
            if value
        }

    def applied(self, knobs: Any) -> Promotion:
        """The rule with the overrides that ``knobs`` (the pipeline's settings) set."""
        rule = self
        if self.tolerance_setting:
            tolerance = getattr(knobs, self.tolerance_setting)
            if tolerance is not None:
                rule = replace(rule, tolerance=float(tolerance))
        if self.metric_setting:
            metric = getattr(knobs, self.metric_setting)
            if metric is not None:
                if metric not in self.metrics:
                    raise ValueError(
                        f"promotion metric {metric!r} is not one of {sorted(self.metrics)}"
                    )
                rule = replace(rule, metric=metric, higher_is_better=self.metrics[metric])
        return rule


@dataclass(frozen=True, kw_only=True)
class RegisteredModel:
    """The MLflow registered model a pipeline trains, and what the CLI can do with it."""

    name: str
    promotion: Promotion
    score: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
    """``cascade score --model NAME``: takes the request fields, returns the served answer."""
    score_needs: tuple[str, ...] = ()
    """The request fields ``cascade score`` must be given for this model (of ``user``,
    ``items``, ``audio``: its ``--user``, ``--items``, ``--audio``)."""
    alias: str = "champion"


HEAVY_POOL = "cascade_heavy"
"""The Airflow pool of the heavy steps (:attr:`Step.heavy`); the stack creates it when Airflow
starts (:func:`infra.stack.ensure_heavy_pool`)."""
MAX_RETRY_DELAY_S = 1800.0
"""The longest wait between two tries of a task."""
DEFAULT_STEP_MINUTES = 60.0
"""What a step without ``timeout_minutes`` counts for in the DAG run's timeout."""


@dataclass(frozen=True, kw_only=True)
class Pipeline:
    """A pipeline: its steps in order, what starts it, what it registers."""

    name: str
    """DAG id, ``cascade step --pipeline`` value."""
    description: str
    """The DAG's ``doc_md`` and the docs' pipeline table."""
    steps: tuple[Step, ...]
    cron: str | None = None
    """A five-field cron in UTC; with a trigger, the DAG runs on either."""
    trigger: Trigger | None = None
    after: tuple[str, ...] = ()
    """Data assets other pipelines publish (their steps' ``outlets``) that start this one when
    updated: chaining by data instead of by clock. Each partition the producing runs worked on
    (the asset event carries its ``ds``) is built by its own run, once
    (:func:`cascade.event_claims.upstream_events`)."""
    tags: tuple[str, ...] = ()
    settings: type | None = None
    """The pipeline's settings class (read from ``CASCADE_*`` variables; ``cascade config``)."""
    model: RegisteredModel | None = None
    dvc_prefix: str = ""
    """DVC stage name = prefix + step name (all pipelines share one ``dvc.yaml``)."""
    partition_lag_days: int = 0
    """A scheduled run works on its logical date minus this many days (1 for a monitor of the
    day that just ended)."""
    retries: int = 2
    retry_delay_s: float = 30.0
    """The first retry's delay; each later one doubles it (Airflow's exponential back-off),
    up to :data:`MAX_RETRY_DELAY_S`."""
    owner: str = "cascade"
    """The DAG's owner in the Airflow UI (its tasks' ``owner``)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Free-form metadata shown by ``cascade pipelines``."""
    datasets: tuple[Dataset, ...] = ()
    catalog: tuple[Data, ...] = ()
    """The datasets the steps read and write, each declared once."""
    """The landed datasets the pipeline reads (its first step), with their landing formats
    (``cascade land``)."""

    def __post_init__(self) -> None:
        _check_name("pipeline", self.name)
        datasets = [d.name for d in self.datasets]
        if len(set(datasets)) != len(datasets):
            raise ValueError(f"pipeline {self.name!r} declares a dataset twice: {datasets}")
        if not self.steps:
            raise ValueError(f"pipeline {self.name!r} has no steps")
        names = [step.name for step in self.steps]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ValueError(f"pipeline {self.name!r} repeats steps {duplicated}")
        for reserved in ("resolve_partition", "next_partitions"):
            if reserved in names:
                raise ValueError(f"{reserved!r} is a task of every triggered DAG; rename the step")
        if self.cron is None and self.trigger is None and not self.after:
            raise ValueError(f"pipeline {self.name!r} needs a cron, a trigger or an upstream asset")
        self._check_catalog()
        own = {uri for step in self.steps for uri in self.step_outlets(step)}
        if set(self.after) & own:
            raise ValueError(f"pipeline {self.name!r} cannot start on its own outlets")
        if self.cron is not None and len(self.cron.split()) != 5:
            raise ValueError(f"pipeline {self.name!r}: cron {self.cron!r} needs five fields")
        if self.dvc_prefix and not _NAME.match(self.dvc_prefix.rstrip("_") or "x"):
            raise ValueError(f"pipeline {self.name!r}: bad dvc_prefix {self.dvc_prefix!r}")
        if self.retries < 2:
            raise ValueError(f"pipeline {self.name!r}: retries must be >= 2")
        if self.partition_lag_days < 0:
            raise ValueError(f"pipeline {self.name!r}: partition_lag_days must be >= 0")
        self._check_promotion_settings()
        knobs: dict[str, str] = {}
        for step in self.steps:
            for knob, variable in step.params.items():
                if knobs.setdefault(knob, variable) != variable:
                    raise ValueError(
                        f"pipeline {self.name!r}: knob {knob!r} sets {knobs[knob]} in one step "
                        f"and {variable} in step {step.name!r}; one knob, one setting"
                    )

    def _check_catalog(self) -> None:
        """Every dataset is declared once, every name a step uses is declared, and a step
        reads only the results of steps before it."""
        names = [d.name for d in self.catalog]
        if len(set(names)) != len(names):
            raise ValueError(f"pipeline {self.name!r} declares a catalog dataset twice: {names}")
        before: list[str] = []
        for step in self.steps:
            for role in ("inputs", "outputs"):
                unknown = [n for n in getattr(step, role) if n not in names]
                if unknown:
                    raise ValueError(
                        f"pipeline {self.name!r}: step {step.name!r} {role} {unknown} are not in "
                        f"the catalog ({', '.join(names) or 'empty'}); declare them there"
                    )
            later = [n for n in step.reads if n not in before]
            if later:
                raise ValueError(
                    f"pipeline {self.name!r}: step {step.name!r} reads the results of {later}, "
                    f"which are no earlier steps ({', '.join(before) or 'none'})"
                )
            for plot in step.plots:
                if not plot.path and plot.output not in step.outputs:
                    raise ValueError(
                        f"pipeline {self.name!r}: step {step.name!r} plots {plot.file!r} of "
                        f"{plot.output!r}, which is not one of its outputs"
                    )
            before.append(step.name)

    def data(self, name: str) -> Data:
        """The catalog dataset ``name``."""
        for entry in self.catalog:
            if entry.name == name:
                return entry
        raise KeyError(f"pipeline {self.name!r} has no dataset {name!r} in its catalog")

    def step_outlets(self, step: Step) -> tuple[str, ...]:
        """The asset URIs ``step`` updates: its outputs' assets, then its own outlets."""
        found = [self.data(name).asset for name in step.outputs if self.data(name).asset]
        return tuple(dict.fromkeys([*found, *step.outlets]))

    def reads_of(self, step: Step) -> tuple[str, ...]:
        """The steps whose results ``step`` may read: the previous one and its ``reads``."""
        index = self.step_names.index(step.name)
        previous = (self.steps[index - 1].name,) if index else ()
        return tuple(dict.fromkeys([*step.reads, *previous]))

    def _check_promotion_settings(self) -> None:
        """Each promotion override names a documented field of the settings class."""
        if self.model is None:
            return
        for attribute, name in self.model.promotion.settings_fields.items():
            fields = getattr(self.settings, "__pydantic_fields__", {})
            if name not in fields:
                raise ValueError(
                    f"pipeline {self.name!r}: the promotion {attribute} comes from settings "
                    f"field {name!r}, which its settings class "
                    f"{getattr(self.settings, '__name__', None)} lacks; add it or drop the override"
                )
            if not (fields[name].description or "").strip():
                raise ValueError(
                    f"pipeline {self.name!r}: settings field {name!r} overrides the promotion "
                    f"{attribute} without a docstring; document it"
                )

    def promotion(self, knobs: Any | None = None) -> Promotion | None:
        """The promotion rule in force: the spec's, with what the pipeline's settings
        (``knobs``; default: loaded from the ``CASCADE_*`` variables) override. None for a
        pipeline that registers no model."""
        if self.model is None:
            return None
        rule = self.model.promotion
        if not rule.settings_fields:
            return rule
        if knobs is None:
            from cascade.config import load_group

            assert self.settings is not None
            knobs = load_group(self.settings)
        return rule.applied(knobs)

    def promotion_variables(self) -> dict[str, str]:
        """Rule attribute -> the ``CASCADE_*`` variable that overrides it."""
        if self.model is None or self.settings is None:
            return {}
        from cascade.settings_fields import setting_fields

        by_field = {field.path[-1]: field.env for field in setting_fields(self.settings)}
        return {
            attribute: by_field[name]
            for attribute, name in self.model.promotion.settings_fields.items()
        }

    @property
    def knobs(self) -> dict[str, str]:
        """Every step's knobs: name -> the ``CASCADE_*`` setting (DVC parameter
        ``<pipeline>.<name>``)."""
        return {knob: var for step in self.steps for knob, var in step.params.items()}

    @property
    def run_timeout_minutes(self) -> float:
        """A whole run's bound (Airflow ``dagrun_timeout``): every step's timeout, each tried
        ``retries + 1`` times, plus the waits between tries; a run past it is failed."""
        steps = sum(step.timeout_minutes or DEFAULT_STEP_MINUTES for step in self.steps)
        delays = (self.retry_delay_s * 2**attempt for attempt in range(self.retries))
        waits = sum(min(delay, MAX_RETRY_DELAY_S) for delay in delays)
        return steps * (self.retries + 1) + len(self.steps) * waits / 60.0

    def step(self, name: str) -> Step:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(f"unknown {self.name} step {name!r}; one of {', '.join(self.step_names)}")

    @property
    def step_names(self) -> tuple[str, ...]:
        return tuple(step.name for step in self.steps)

    def _describe_model(self, knobs: Any | None) -> dict[str, Any]:
        assert self.model is not None
        rule = self.promotion(knobs)
        assert rule is not None
        return {
            "name": self.model.name,
            "alias": self.model.alias,
            "promotion": {
                "metric": rule.metric,
                "higher_is_better": rule.higher_is_better,
                "tolerance": rule.tolerance,
                "requires_compile_gate": rule.requires_compile_gate,
                # Where a run may change the rule (unset: the values above are the spec's).
                "overridden_by": self.promotion_variables(),
            },
            "scorable": self.model.score is not None,
        }

    def _describe_data(self, name: str, lake: Any) -> dict[str, Any]:
        data = self.data(name)
        return {
            "name": name,
            "kind": data.kind,
            "format": data.format,
            "location": str(data.location(lake, "${ds}")),
            **({"contract": data.contract} if data.contract else {}),
        }

    def describe(self, knobs: Any | None = None, lake: Any | None = None) -> dict[str, Any]:
        """The JSON shape of ``cascade pipelines --json``; ``registered_model.promotion`` is
        the rule in force (:meth:`promotion`, with ``knobs`` or the loaded settings), and each
        step's inputs and outputs are located in ``lake`` (default: the settings' lake)."""
        if lake is None:
            from cascade.lake import lake_from_settings

            lake = lake_from_settings()
        return {
            "name": self.name,
            "description": self.description.strip().splitlines()[0] if self.description else "",
            "steps": [
                {
                    "name": step.name,
                    "doc": step.doc,
                    "timeout_minutes": step.timeout_minutes,
                    "heavy": step.in_heavy_pool,
                    "queue": step.queue,
                    "data_docs": step.data_docs,
                    "outlets": list(self.step_outlets(step)),
                    "inputs": [self._describe_data(name, lake) for name in step.inputs],
                    "outputs": [self._describe_data(name, lake) for name in step.outputs],
                    **({"reads": list(self.reads_of(step))} if self.reads_of(step) else {}),
                    "dvc_stage": self.dvc_prefix + step.name,
                    **(
                        {"params": {f"{self.name}.{k}": v for k, v in step.params.items()}}
                        if step.params
                        else {}
                    ),
                    **({"metrics": list(step.metrics)} if step.metrics else {}),
                }
                for step in self.steps
            ],
            "schedule": {"cron": self.cron, "timezone": "UTC"},
            "assets": {
                "trigger": None
                if self.trigger is None
                else {
                    "asset": self.trigger.asset,
                    "watcher": self.trigger.watcher,
                    "selectors": list(self.trigger.selectors),
                },
                "after": list(self.after),
                "outlets": sorted({uri for step in self.steps for uri in self.step_outlets(step)}),
            },
            "catalog": [
                {
                    **self._describe_data(data.name, lake),
                    "written_by": [s.name for s in self.steps if data.name in s.outputs],
                    "read_by": [s.name for s in self.steps if data.name in s.inputs],
                }
                for data in self.catalog
            ],
            "registered_model": None if self.model is None else self._describe_model(knobs),
            "settings": None if self.settings is None else self.settings.__name__,
            "dvc_prefix": self.dvc_prefix,
            "tags": list(self.tags),
            **(
                {
                    "datasets": [
                        {"name": d.name, "formats": sorted(d.formats), "sources": sorted(d.sources)}
                        for d in self.datasets
                    ]
                }
                if self.datasets
                else {}
            ),
            **({"extra": dict(self.extra)} if self.extra else {}),
        }
