"""What a step function receives: its partition, its settings with this run's knobs applied,
and the run it belongs to.

    def train(ctx: StepContext) -> dict[str, Any]:
        corpus, out = ctx.inputs["corpus"].path, ctx.outputs["training"].path
        return train_model(ctx.platform, ctx.settings.config, corpus, out)

The step runner (:func:`cascade.step_runner.run_step`, behind the Airflow task, the DVC stage
and ``cascade step``) builds the context with :meth:`StepContext.build`. A knob given for the
run (``--param knob=VALUE``, a DVC parameter) becomes a field value of the pipeline's settings
object (and of the platform's, when it names a platform setting) through the settings class's
own validation; the process environment is read, never written with a knob. A step therefore
reads no environment: what a process it starts must be given is :attr:`StepContext.environ`.
What a step returns is recorded by the runner and is what the steps after it read
(:meth:`StepContext.result_of`): one result channel.

Functions of a pipeline that are no steps but that the platform calls (a landing source, a
trigger's check, ``cascade score``) get their settings the same way through
:func:`with_settings`.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cascade.config import Settings, load_group, load_settings
from cascade.lake import Lake, check_ds
from cascade.pipeline_spec import Data, Pipeline, Step

RUN_VARIABLES = {
    "pipeline": "CASCADE_RUN_PIPELINE",
    "step": "CASCADE_RUN_STEP",
    "ds": "CASCADE_RUN_DS",
}
"""What the processes a step starts (trainings) are told of the step: the MLflow runs they open
are named and tagged with it (:mod:`cascade.training.resumable_run`)."""


def knob_values(step: Step, params: Mapping[str, str]) -> dict[str, str]:
    """The ``CASCADE_*`` values that ``--param knob=VALUE`` values give ``step``. An empty
    value sets nothing; ``true``/``false`` (how DVC writes a YAML boolean) become ``1``/``0``.
    An unknown knob is a ValueError naming the step's knobs."""
    unknown = sorted(set(params) - set(step.params))
    if unknown:
        known = ", ".join(sorted(step.params)) or "none"
        raise ValueError(f"step {step.name!r} has no knob {', '.join(unknown)} (knobs: {known})")
    words = {"true": "1", "false": "0"}
    return {
        step.params[knob]: words.get(value.strip().lower(), value.strip())
        for knob, value in params.items()
        if value.strip()
    }


@dataclass(frozen=True, kw_only=True)
class RunInfo:
    """The run a step belongs to: an Airflow DAG run, or none (``cascade step``, DVC)."""

    dag_run_id: str | None = None
    """The Airflow DAG run's id; None outside Airflow."""
    try_number: int = 1
    """The task's try (1 outside Airflow)."""
    links: Mapping[str, str] = field(default_factory=dict)
    """Where to look at the run (the task instance in the Airflow UI); empty outside Airflow."""

    @property
    def asset_triggered(self) -> bool:
        """The run was started by an asset (an event or another pipeline's data)."""
        return (self.dag_run_id or "").startswith("asset_triggered__")


@dataclass(frozen=True)
class DataHandle:
    """One partition of a catalog dataset, where the step reads or writes it."""

    data: Data
    path: Path
    """The partition's folder (or file, for a dataset that is one file) in the lake."""

    @property
    def name(self) -> str:
        return self.data.name

    def exists(self) -> bool:
        return self.path.exists()


class StepResultMissing(FileNotFoundError):
    """A step asked for the result of a step that has not run for the partition."""


@dataclass(frozen=True, kw_only=True)
class StepContext:
    """The one argument of a step function."""

    ds: str
    """The partition ``YYYY-MM-DD``."""
    pipeline: Pipeline
    step: Step
    settings: Any
    """The pipeline's settings object (:attr:`Pipeline.settings`) with this run's knobs
    applied; None for a pipeline without a settings class."""
    platform: Settings
    """The platform's settings (lake, tracking server, ports), knobs applied too."""
    run: RunInfo = field(default_factory=RunInfo)
    knobs: Mapping[str, str] = field(default_factory=dict)
    """The ``CASCADE_*`` values this run's knobs set (what :attr:`environ` passes on)."""

    @property
    def lake(self) -> Lake:
        return Lake(self.platform.lake_root)

    def _handles(self, names: tuple[str, ...]) -> dict[str, DataHandle]:
        data = [self.pipeline.data(name) for name in names]
        return {d.name: DataHandle(d, d.location(self.lake, self.ds)) for d in data}

    @property
    def inputs(self) -> dict[str, DataHandle]:
        """The step's declared inputs (:attr:`Step.inputs`) for this partition, by name."""
        return self._handles(self.step.inputs)

    @property
    def outputs(self) -> dict[str, DataHandle]:
        """The step's declared outputs (:attr:`Step.outputs`) for this partition, by name."""
        return self._handles(self.step.outputs)

    def result_of(self, step: str) -> dict[str, Any]:
        """What step ``step`` of this pipeline returned for this partition (the summary the
        runner recorded): the previous step's, or one the step declares in ``reads``."""
        allowed = self.pipeline.reads_of(self.step)
        if step not in allowed:
            raise ValueError(
                f"step {self.step.name!r} of {self.pipeline.name} reads the results of "
                f"{', '.join(allowed) or 'no step'}, not {step!r}; add it to the step's reads"
            )
        path = self.lake.step_summary(self.pipeline.dvc_prefix + step, self.ds)
        if not path.is_file():
            raise StepResultMissing(
                f"no result of step {step!r} for ds={self.ds} ({path}); run step {step!r} "
                f"first: `cascade step {step} --pipeline {self.pipeline.name} --ds {self.ds}`"
            )
        return dict(json.loads(path.read_text()))

    @property
    def environ(self) -> dict[str, str]:
        """Variables a process the step starts must see besides the inherited environment:
        the knobs of this run and which step it is (:data:`RUN_VARIABLES`)."""
        names = {"pipeline": self.pipeline.name, "step": self.step.name, "ds": self.ds}
        return {**self.knobs, **{RUN_VARIABLES[key]: names[key] for key in RUN_VARIABLES}}

    @classmethod
    def build(
        cls,
        spec: Pipeline,
        step: str,
        ds: str,
        *,
        params: Mapping[str, str] | None = None,
        platform: Settings | None = None,
        run: RunInfo | None = None,
    ) -> StepContext:
        """The context of ``step`` of ``spec`` for ``ds`` with the knobs ``params``; the
        settings come from the environment, the settings file and the defaults (``platform``
        given: those platform settings as they are)."""
        chosen = spec.step(step)
        knobs = knob_values(chosen, params or {})
        env = {**os.environ, **knobs}
        if platform is None:
            platform = load_settings(env)
        settings = None if spec.settings is None else load_group(spec.settings, env)
        return cls(
            ds=check_ds(ds),
            pipeline=spec,
            step=chosen,
            settings=settings,
            platform=platform,
            run=run or RunInfo(),
            knobs=knobs,
        )


def with_settings(cls: type | None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A function the platform calls outside a step (a landing source, a trigger's check, a
    model's ``score``), given the platform's settings (``platform=``) and the pipeline's
    (``settings=``, an instance of ``cls``) as keyword arguments when it is called without
    them."""

    def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            if "platform" not in kwargs:
                kwargs["platform"] = load_settings()
            if cls is not None and "settings" not in kwargs:
                kwargs["settings"] = load_group(cls)
            return function(*args, **kwargs)

        return call

    return wrap
