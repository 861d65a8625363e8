"""Train the ranking cascade on DeepSpeed: teacher, FSCD pre-ranker sweep, two-tower baseline.

Run it with 2 processes (gloo on CPU, NCCL on GPU)::

    DS_ACCELERATOR=cpu python -m torch.distributed.run --nproc_per_node 2 \\
        -m models.preranking.cascade_train --config ml100k --out /tmp/cascade-ml100k

Configs (``models.preranking.config_registry.CASCADE_CONFIGS``): ``debug`` (seconds),
``ml100k`` (MovieLens-100k, point-in-time features), ``generated`` (synthetic logs, 200k rows).
From Python, :func:`launch_cascade` builds that command. The pipeline's train step runs it on
a partition's training set (``--data PATH --ds DS``) through :func:`launch_pipeline`::

    python -c "from models.preranking.cascade_train import launch_pipeline as l; l('2026-01-31')"

Phases, in order, each trained with the same DeepSpeed loop: ``teacher`` (DCN-v2 over every
field), ``two_tower``, then for every regularizer strength λ ``select_λ`` (the gated COLD-style
pre-ranker over every field; FSCD's loss adds λ · Σ_j keep_prob_j · cost_j / mean cost, the
expected negative log of a Bernoulli prior whose keep probability sigmoid(-cost_j / mean cost)
falls with the field's cost) and ``fscd_λ`` (the kept fields fine-tuned, ungated).

Every ``checkpoint_every`` steps each phase saves a DeepSpeed checkpoint under
``OUT/checkpoints/PHASE``; a finished phase leaves ``OUT/phases/PHASE/model.pt``. Started again
with the same ``--out``, a run skips finished phases and resumes the current one from its last
checkpoint. Data order and gate noise are functions of (seed, epoch, step, rank), so a resumed
run ends with the same weights and metrics as an uninterrupted one.

Fields: the networks read a :class:`~models.preranking.fields.FieldSet`, by default the 11
MovieLens-shaped fields. A training set with more columns (e.g. the cross statistics
``ctr_user_x_item_genre_7d``) declares them in a ``fields.json`` beside its parquet, ``{name:
{"kind": "cross", "categorical": false, "window_days": 7}}`` (extending the default set), or the
run names a file (``--fields PATH``, ``CascadeTrainConfig.fields``) or passes the declarations
inline (``CascadeTrainConfig.fields={...}``). Every field is an FSCD candidate with its cost
(:func:`~models.preranking.fields.field_cost`); the set is written as ``fields.json`` beside
every saved model and read back by the compiler and the server.

The data is split in time: the networks train on the oldest rows, the end of the training
period (``validation_fraction`` of it) is the validation split and the latest ``test_fraction``
is the test split. Rank 0 evaluates all models on both (AUC, GAUC, recall@k of each model's top-k
against the teacher's per user, feature cost), chooses λ on validation only (best validation AUC
within ``cost_budget``) and reports that model's test figures. The run fails rather than deploy
a model over the budget, one whose scores are constant (their spread under 1% of their mean),
or one whose validation AUC does not beat item popularity's (each item's training clicks) on
the same rows; ``popularity_validation_auc`` and ``popularity_auc`` are in the result beside
the model's figures. It writes
``OUT/evaluation.json`` (both tables), ``OUT/metrics.json`` (DVC metrics), ``OUT/tradeoff.png``
(AUC vs cost across λ, validation and test) and ``OUT/result.json``; all of it, the per-step
losses, the selected fields and the chosen FSCD model (with its signature) go to the MLflow
experiment ``preranking-cascade``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
from typing import Any

import torch.distributed as dist

from cascade.config import Settings, load_settings
from cascade.training.checkpoints import CHECKPOINTS, data_fingerprint, keep_only_run
from cascade.training.curves import CURVES_DIR
from cascade.training.launch import init_distributed, launch_for_result, run_torchrun
from cascade.training.resumable_run import RUN_MARKER, TrackingUnavailable, reachable_tracking
from models.preranking.config_registry import (
    CASCADE_CONFIGS,
    CascadeTrainConfig,
    get_cascade_config,
    override_args,
    with_overrides,
)
from models.preranking.fields import FIELDS_FILE
from models.preranking.fscd_data import check_training_set
from models.preranking.fscd_run import train_cascade
from models.preranking.fscd_throughput import measure_throughput
from models.preranking.training_set import RESULT_KEYS, partition_training_set

# --- command line and launcher ------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, choices=sorted(CASCADE_CONFIGS))
    parser.add_argument("--out", required=True, type=Path, help="run folder (resumes if present)")
    parser.add_argument(
        "--data", default=None, help="training parquet, in place of the config's data source"
    )
    parser.add_argument("--ds", default="", help="partition date of --data (recorded)")
    parser.add_argument(
        "--fields",
        default=None,
        help="fields JSON file (a field list or declarations extending the default fields); "
        "default: fields.json beside --data when there is one, else the 11 default fields",
    )
    parser.add_argument(
        "--throughput-steps",
        type=int,
        default=0,
        help="benchmark mode: time this many teacher steps, write OUT/throughput.json, no run",
    )
    parser.add_argument(
        "--zero-stage",
        type=int,
        choices=(0, 1, 2, 3),
        default=None,
        help="override the config's DeepSpeed ZeRO stage",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        help="override the config's checkpoint interval (steps)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="override the config's seed (initialization, data order, gate noise)",
    )
    parser.add_argument(
        "--epochs", type=int, default=None, help="override the config's epochs per phase"
    )
    parser.add_argument(
        "--lr", type=float, default=None, help="override the config's learning rate"
    )
    parser.add_argument(
        "--validation-fraction",
        type=float,
        default=None,
        help="override the config's validation_fraction (the share of the training period "
        "that chooses the FSCD strength)",
    )
    parser.add_argument(
        "--cost-budget",
        type=float,
        default=None,
        help="override the config's cost_budget (the serving cost, as a share of the "
        "teacher's, the chosen FSCD model must stay within; 1 sets none)",
    )
    parser.add_argument(
        "--require-tracking",
        action="store_true",
        help="fail at once when the MLflow server does not answer (the pipeline's runs must "
        "reach the registry); without it such a run logs to OUT/mlflow.db and says so",
    )
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    try:
        settings = reachable_tracking(
            load_settings(),
            args.out,
            fallback=not args.require_tracking,
            who="cascade_train" if os.environ.get("RANK", "0") == "0" else "cascade_train rank",
        )
    except TrackingUnavailable as exc:
        raise SystemExit(str(exc)) from None
    # Every load_settings() of this process (the trainer reads its own) sees the chosen store.
    os.environ["CASCADE_MLFLOW_URI"] = settings.tracking_uri
    init_distributed()
    config = get_cascade_config(args.config)
    if args.zero_stage is not None:
        config = dataclasses.replace(config, zero_stage=args.zero_stage)
    if args.data is not None:
        config = dataclasses.replace(config, data=str(args.data))
    if args.fields is not None:
        config = dataclasses.replace(config, fields=str(args.fields))
    if args.checkpoint_every is not None:
        config = dataclasses.replace(config, checkpoint_every=args.checkpoint_every)
    if args.seed is not None:
        config = dataclasses.replace(config, seed=args.seed)
    config = with_overrides(config, epochs=args.epochs, lr=args.lr)
    if args.validation_fraction is not None:
        config = dataclasses.replace(config, validation_fraction=args.validation_fraction)
    if args.cost_budget is not None:
        config = dataclasses.replace(config, cost_budget=args.cost_budget)
    if args.throughput_steps:
        measure_throughput(config, args.out, args.throughput_steps)
    else:
        train_cascade(config, args.out, ds=args.ds)
    dist.barrier()
    dist.destroy_process_group()


def launch_cascade(
    config: str,
    out: Path,
    *,
    processes: int = 2,
    nodes: int | None = None,
    settings: Settings | None = None,
    extra_env: dict[str, str] | None = None,
    extra_args: list[str] | None = None,
) -> tuple[int, str]:
    """Run ``cascade_train`` under torchrun, ``processes`` on each of ``nodes`` node ranks
    (default: the settings' ``train_nodes``); returns ``(exit code, log tail)``.

    The caller reads ``OUT/result.json`` (or ``throughput.json``): a rank that crashes at exit
    after writing it (seen with DeepSpeed on CPU) must not hide a finished run.
    """
    get_cascade_config(config)
    return run_torchrun(
        "models.preranking.cascade_train",
        ["--config", config, "--out", str(out), *(extra_args or [])],
        processes=processes,
        nodes=nodes,
        settings=settings or load_settings(),
        log_path=out / "train.log",
        append=True,
        extra_env=extra_env,
    )


STALE_ON_NEW_DATA = ("phases", CHECKPOINTS, RUN_MARKER, CURVES_DIR)
"""What a run folder keeps to resume; it belongs to one config, data file and partition."""
CHECKPOINT_EVERY_ENV = "CASCADE_PRERANKING_CHECKPOINT_EVERY"
"""Overrides the pipeline config's checkpoint interval (steps); the fault tests set it so a
phase checkpoints well before it ends."""


def checkpoint_every_override(env: dict[str, str] | None = None) -> int | None:
    """The interval from :data:`CHECKPOINT_EVERY_ENV`, or None when unset."""
    return load_settings(env).runtime.preranking_checkpoint_every


def pipeline_fingerprint(config: CascadeTrainConfig, data: Path, ds: str) -> str:
    """What a run folder's finished phases and checkpoints must match to be reused (the
    field declarations beside the data included, when there are any)."""
    described = config.to_dict()
    declared = Path(data).parent / FIELDS_FILE
    if declared.is_file():
        described["fields_file"] = declared.read_text()
    return data_fingerprint(described, data, ds)


def launch_pipeline(
    ds: str,
    *,
    config: str = "pipeline",
    settings: Settings | None = None,
    epochs: int | None = None,
    lr: float | None = None,
    validation_fraction: float | None = None,
    cost_budget: float | None = None,
) -> dict[str, Any]:
    """The ``ctr_preranking`` train step: the cascade (teacher, FSCD selection, ColdPreRanker)
    on ``Lake.training_set("preranking", ds)`` with ``settings.train_processes`` processes,
    into ``Lake.reports("train", ds)``; returns the run's ``result.json``.

    Before any process starts, the training set's validation split (``validation_fraction``,
    else the config's) must hold the clicks FSCD needs
    (:func:`~models.preranking.fscd_data.check_training_set`): a sparse log is refused in one
    line (:class:`~models.preranking.fscd_data.DegenerateData`), not after the start-up.

    Retried for the same partition, data and config, it resumes (finished phases, the last
    checkpoint, the same MLflow run); phases and checkpoints left by other data or another
    config are removed first. :data:`CHECKPOINT_EVERY_ENV` overrides the config's checkpoint
    interval; ``epochs``, ``lr`` and ``cost_budget`` override the config's (the pipeline's
    knobs).
    """
    from cascade.lake import Lake, check_ds

    check_ds(ds)
    cascade = get_cascade_config(config)  # fail fast on a bad name, before starting processes
    checkpoint_every = checkpoint_every_override()
    extra_args: list[str] = []
    if checkpoint_every is not None:
        cascade = dataclasses.replace(cascade, checkpoint_every=checkpoint_every)
        extra_args = ["--checkpoint-every", str(checkpoint_every)]
    cascade = with_overrides(cascade, epochs=epochs, lr=lr)
    extra_args += override_args(epochs=epochs, lr=lr)
    if validation_fraction is not None:
        cascade = dataclasses.replace(cascade, validation_fraction=validation_fraction)
        extra_args += ["--validation-fraction", repr(validation_fraction)]
    if cost_budget is not None:
        cascade = dataclasses.replace(cascade, cost_budget=cost_budget)
        extra_args += ["--cost-budget", repr(cost_budget)]
    settings = settings or load_settings()
    lake = Lake(settings.lake_root)
    data = partition_training_set(lake, ds)
    counts = check_training_set(cascade, data)
    print(
        f"[train] ds={ds}: validation split {counts['validation_rows']:,} rows, "
        f"{counts['validation_clicks']:,} clicks (needs {cascade.min_validation_clicks})",
        flush=True,
    )
    # Fail in one line before starting processes, not after MLflow's client retried for minutes.
    reachable_tracking(settings, lake.reports("train", ds), fallback=False, who="train")
    out = lake.reports("train", ds)
    out.mkdir(parents=True, exist_ok=True)
    keep_only_run(
        out,
        pipeline_fingerprint(dataclasses.replace(cascade, data=str(data)), data, ds),
        STALE_ON_NEW_DATA,
    )
    return launch_for_result(
        "models.preranking.cascade_train",
        [
            "--config",
            config,
            "--data",
            str(data),
            "--ds",
            ds,
            "--out",
            str(out),
            "--require-tracking",
            *extra_args,
        ],  # fmt: skip
        what=f"pre-ranking training for ds={ds}",
        out_dir=out,
        keys=RESULT_KEYS,
        processes=settings.train_processes,
        settings=settings,
        echo=True,
        ds=ds,
    )


if __name__ == "__main__":
    main()
