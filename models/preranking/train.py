"""DeepSpeed training of the pre-ranking model, with MLflow logging on rank 0.

Run it on one node with 2 processes (gloo on CPU, NCCL on GPU)::

    DS_ACCELERATOR=cpu SPARK_LOCAL_IP=127.0.0.1 \\
    python -m torch.distributed.run --nproc_per_node 2 -m models.preranking.train \\
        --config ml100k --data .cascade/lake/training/preranking/dt=2026-01-31/data.parquet \\
        --out /tmp/preranking-out

or with the DeepSpeed launcher (which passes ``--local_rank``)::

    deepspeed --num_nodes 1 --num_gpus 2 --module models.preranking.train --config debug \\
        --data PATH --out DIR

From Python (Airflow task, CLI), :func:`launch` builds that command for a partition date:
data from ``Lake.training_set("preranking", ds)``, output in ``Lake.reports("train", ds)``.

The latest ``test_fraction`` of rows by ``event_timestamp`` is held out; rank 0 measures the
test AUC on it, logs params, per-step loss, metrics and the model to MLflow (experiment
``preranking``), and writes ``result.json`` (run_id, test_auc, model_uri, config, ds) to --out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from sklearn.metrics import log_loss, roc_auc_score
from torch.utils.data import TensorDataset
from torch.utils.data.distributed import DistributedSampler

from cascade.config import Settings, load_settings
from cascade.lake import Lake, check_ds
from cascade.progress import Progress
from cascade.results import write_result
from cascade.training import launch as launching
from cascade.training.checkpoints import (
    CHECKPOINTS,
    agreed_on_every_rank,
    consolidated_state_dict,
    data_fingerprint,
    save_latest_checkpoint,
)
from cascade.training.crash_points import crash_if_due, crash_point
from cascade.training.curves import CURVES_DIR, CurveLog
from cascade.training.deepspeed_config import deepspeed_config as build_deepspeed_config
from cascade.training.launch import init_distributed, launch_for_result
from cascade.training.resumable_run import RUN_MARKER, open_resumable_run, use_experiment
from domains.ctr.schema import LABEL, MODEL_FEATURES, TIMESTAMP
from models.preranking.config_registry import (
    CONFIGS,
    TrainConfig,
    get_config,
    override_args,
    with_overrides,
)
from models.preranking.fields import FieldEncoder
from models.preranking.inference import (
    CONFIG_ARTIFACT,
    STATE_DICT_ARTIFACT,
    build_model,
    frame_inputs,
    log_pyfunc,
    score_frame,
)
from models.preranking.model import PreRanker

EXPERIMENT = "preranking"
REQUIRED_COLUMNS = ("user_id", "item_id", TIMESTAMP, LABEL, *MODEL_FEATURES)
"""Columns of the MovieLens-shaped training-set contract (the plain pre-ranker's inputs)."""
ROW_COLUMNS = ("user_id", "item_id", TIMESTAMP, LABEL)
"""What every training set needs whatever its fields: the FSCD cascade takes its other columns
from the field set (``fields.json`` beside the parquet), which checks them itself."""
RESULT_KEYS = ("run_id", "test_auc", "model_uri", "config", "ds")
"""Keys every complete ``result.json`` carries."""


# --- data -------------------------------------------------------------------------------


def load_training_frame(path: Path, required: tuple[str, ...] = REQUIRED_COLUMNS) -> pd.DataFrame:
    """Read and check the training parquet (the ``required`` columns, labels, timestamps)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"training set {path} does not exist; build it first (the Feast training-set task "
            "of the ctr_preranking DAG writes Lake.training_set('preranking', ds)/data.parquet)"
        )
    frame = pd.read_parquet(path)
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise ValueError(f"training set {path} lacks columns {missing}; expected {required}")
    labels = set(pd.unique(frame[LABEL]))
    if not labels <= {0, 1}:
        raise ValueError(f"training set {path}: column {LABEL!r} must be 0/1, found {labels}")
    if frame[TIMESTAMP].isna().any():
        raise ValueError(f"training set {path}: {TIMESTAMP!r} has nulls; drop or fix those rows")
    return frame


def time_split(frame: pd.DataFrame, test_fraction: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(train, test)``: test is the latest ``test_fraction`` of rows by event time.

    Ties are broken by row order (stable sort), so the split is deterministic.
    """
    if len(frame) < 2:
        raise ValueError(f"need at least 2 rows for a train/test split, got {len(frame)}")
    ordered = frame.sort_values(TIMESTAMP, kind="stable").reset_index(drop=True)
    n_test = min(len(ordered) - 1, max(1, math.ceil(len(ordered) * test_fraction)))
    return ordered.iloc[: len(ordered) - n_test], ordered.iloc[len(ordered) - n_test :]


# --- distributed training ---------------------------------------------------------------


def deepspeed_config(config: TrainConfig, *, bf16_supported: bool) -> dict[str, Any]:
    """The DeepSpeed JSON config for one run."""
    return build_deepspeed_config(
        micro_batch_size=config.batch_size,
        lr=config.lr,
        weight_decay=config.weight_decay,
        zero_stage=config.zero_stage,
        bf16=config.bf16 and bf16_supported,
    )


def evaluate(
    model: torch.nn.Module, frame: pd.DataFrame, encoder: FieldEncoder | None = None
) -> dict[str, float]:
    """AUC and log loss of ``model`` on ``frame`` (a ColdPreRanker reads it through its
    ``encoder``)."""
    labels = frame[LABEL].to_numpy()
    if len(np.unique(labels)) < 2:
        raise ValueError(
            "the hold-out has a single class, so AUC is undefined; use more data or a larger "
            "test_fraction"
        )
    scores = score_frame(model, frame, encoder)
    return {
        "auc": float(roc_auc_score(labels, scores)),
        "logloss": float(log_loss(labels, np.clip(scores, 1e-7, 1 - 1e-7))),
    }


def log_run(
    model: PreRanker,
    config: TrainConfig,
    *,
    out: Path,
    ds: str,
    metrics: dict[str, float],
    params: dict[str, Any],
    input_example: pd.DataFrame,
    run_id: str | None = None,
    settings: Settings | None = None,
) -> dict[str, Any]:
    """Log model, config, params and metrics to MLflow; write and return ``result.json``.

    The state dict and run config are written to ``out`` first (they are the model's
    artifacts). Pass ``run_id`` to log into an already started run.
    """
    import mlflow
    from mlflow.models import infer_signature

    settings = settings or load_settings()
    out.mkdir(parents=True, exist_ok=True)
    state_path = out / "state_dict.pt"
    config_path = out / "train_config.json"
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, state_path)
    config_path.write_text(json.dumps(config.to_dict(), indent=2))

    experiment_id = use_experiment(settings, EXPERIMENT)
    active = mlflow.active_run()
    if active is not None and active.info.run_id == (run_id or active.info.run_id):
        # Rank 0 of train() started the run to log the loss curve; keep it open for its caller.
        run_context: Any = contextlib.nullcontext(active)
    else:
        run_context = mlflow.start_run(
            run_id=run_id, experiment_id=experiment_id, run_name=f"{config.name}-{ds}"
        )
    with run_context as run:
        mlflow.log_params({**config.flat_params(), **{k: str(v) for k, v in params.items()}})
        mlflow.log_metrics(metrics)
        mlflow.log_dict(config.to_dict(), "train_config.json")
        example = input_example[["user_id", "item_id", *MODEL_FEATURES]].head(5).copy()
        example[list(MODEL_FEATURES)] = example[list(MODEL_FEATURES)].astype("float64")
        # Ids and the dense features in, one click probability per row out.
        model.eval()
        signature = infer_signature(example, score_frame(model, example))
        info = log_pyfunc(
            "model",
            {STATE_DICT_ARTIFACT: str(state_path), CONFIG_ARTIFACT: str(config_path)},
            input_example=example,
            signature=signature,
        )
        result = {
            "run_id": run.info.run_id,
            "test_auc": metrics["test_auc"],
            "train_loss": metrics.get("train_loss"),
            "model_uri": info.model_uri,
            "model_kind": "mlp",
            "config": config.name,
            "ds": ds,
        }
    write_result(out / "result.json", result)
    return result


def run_fingerprint(config: TrainConfig, data: Path, ds: str) -> str:
    """What a checkpoint must match to be resumed: the config, the data file and the partition.

    A checkpoint left by a run on other data or with another config is never resumed.
    """
    return data_fingerprint(config.to_dict(), data, ds)


def _step_seed(config: TrainConfig, step: int, rank: int, world: int) -> int:
    """Dropout's seed for one step: a function of the step, so a resumed run draws the same."""
    return config.seed * 1_000_003 + step * world + rank


def _mlflow_run(
    settings: Settings, out: Path, config: TrainConfig, ds: str, resume: bool, data: Path
) -> str:
    """Start the run, or reopen the one an interrupted attempt left in ``out/RUN_MARKER``.

    A marker without a checkpoint to resume belongs to an attempt that died before its first
    checkpoint: that run is marked KILLED, so the registry never shows it as still running.
    """
    return open_resumable_run(
        settings,
        EXPERIMENT,
        out / RUN_MARKER,
        f"{config.name}-{ds}",
        {},
        resume=resume,
        inputs={f"{data.parent.name}/{data.name}": data},
    )


def train(config: TrainConfig, *, data: Path, out: Path, ds: str) -> dict[str, Any] | None:
    """One distributed run; returns the result on rank 0, None on other ranks.

    Every ``config.checkpoint_every`` steps a DeepSpeed checkpoint goes to ``out/checkpoints``;
    started again with the same ``out``, config and data, the run resumes from it and ends with
    the same weights and metrics as an uninterrupted run (batch order and dropout are functions
    of the seed and the step). A finished run removes its checkpoints.
    """
    started = time.monotonic()
    init_distributed()
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    rank, world = dist.get_rank(), dist.get_world_size()

    frame = load_training_frame(data)
    train_frame, test_frame = time_split(frame, config.test_fraction)
    dense, user, item = frame_inputs(train_frame)
    label = torch.from_numpy(train_frame[LABEL].to_numpy(dtype=np.float32))

    torch.manual_seed(config.seed)
    model = PreRanker(config.model)
    model.fit_normalizer(dense)
    bf16_supported = bool(get_accelerator().is_bf16_supported())
    ds_config = deepspeed_config(config, bf16_supported=bf16_supported)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=ds_config
    )
    device = engine.device

    # Resume only from a checkpoint of this very run (same config, data and partition).
    ckpt_dir = out / CHECKPOINTS
    fingerprint = run_fingerprint(config, data, ds)
    fingerprint_file = ckpt_dir / "fingerprint.txt"
    found = ckpt_dir.exists()
    resume = agreed_on_every_rank(
        found
        and (ckpt_dir / "latest").exists()
        and fingerprint_file.exists()
        and fingerprint_file.read_text() == fingerprint,
        f"whether {ckpt_dir} holds a checkpoint of this run",
    )
    dist.barrier()  # every rank has looked before rank 0 changes anything there
    start_step = 0
    if resume:
        _, client_state = engine.load_checkpoint(str(ckpt_dir))
        start_step = int(client_state["step"])
    elif rank == 0:
        if found:
            print(f"[train] removing checkpoints of another run from {ckpt_dir}", flush=True)
            shutil.rmtree(ckpt_dir, ignore_errors=True)
        shutil.rmtree(out / CURVES_DIR, ignore_errors=True)
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        fingerprint_file.write_text(fingerprint)

    import mlflow

    settings = load_settings()
    run_id = None
    if rank == 0:
        run_id = _mlflow_run(settings, out, config, ds, resume=start_step > 0, data=data)
        print(
            f"[train] config={config.name} ds={ds} world={world} rows train={len(train_frame)} "
            f"test={len(test_frame)} zero={config.zero_stage} "
            f"bf16={ds_config['bf16']['enabled']} mlflow={settings.tracking_uri} run={run_id} "
            f"pid={os.getpid()}",
            flush=True,
        )
        if start_step:
            print(f"[train] resumed at step {start_step} from {ckpt_dir}", flush=True)

    def checkpoint(step: int) -> None:
        save_latest_checkpoint(engine, ckpt_dir, step)
        if rank == 0:
            print(f"[train] checkpoint step={step} {ckpt_dir}", flush=True)

    crash = crash_point()
    try:
        # The sampler gives each rank a disjoint, equally long shard; batches are sliced from
        # in-memory tensors (a per-row Dataset + collate costs more than the model here).
        sampler: DistributedSampler[Any] = DistributedSampler(
            TensorDataset(label), num_replicas=world, rank=rank, shuffle=True, seed=config.seed
        )
        steps_per_epoch = math.ceil(len(sampler) / config.batch_size)
        total = steps_per_epoch * config.epochs
        if config.max_steps is not None:
            total = min(total, config.max_steps)
        loss_fn = torch.nn.BCEWithLogitsLoss()
        engine.train()
        step = start_step
        curves = CurveLog(out)
        order_epoch, order = -1, torch.empty(0, dtype=torch.long)
        progress = Progress(
            total - step, desc=f"preranking train {config.name}", unit="step", enabled=rank == 0
        )
        while step < total:
            epoch, within = divmod(step, steps_per_epoch)
            if epoch != order_epoch:
                sampler.set_epoch(epoch)
                order, order_epoch = torch.tensor(list(sampler), dtype=torch.long), epoch
            idx = order[within * config.batch_size : (within + 1) * config.batch_size]
            torch.manual_seed(_step_seed(config, step, rank, world))
            logits = engine(dense[idx].to(device), user[idx].to(device), item[idx].to(device))
            loss = loss_fn(logits.float(), label[idx].to(device))
            engine.backward(loss)
            engine.step()
            step += 1
            progress.update()
            if step % config.log_every == 0:
                mean = launching.all_reduced(torch.tensor([loss.item()], dtype=torch.float64))
                value = mean.item() / world
                if rank == 0:
                    print(f"[train] epoch={epoch} step={step} loss={value:.4f}", flush=True)
                    mlflow.log_metric("loss", value, step=step)
                    curves.add(step, {"loss": value})
            if step % config.checkpoint_every == 0 and step < total:
                checkpoint(step)
            crash_if_due(crash, "train", step, rank=rank, who="train")
        progress.close()

        state_dict = consolidated_state_dict(engine, config.zero_stage)
        result = None
        if rank == 0:
            assert state_dict is not None
            final = build_model(state_dict, config)
            test = evaluate(final, test_frame)
            # The final model's loss on its training rows: unlike a running mean over the
            # last epoch, the same whether or not the run was interrupted.
            train_loss = evaluate(final, train_frame)["logloss"]
            metrics = {
                "test_auc": test["auc"],
                "test_logloss": test["logloss"],
                "train_loss": train_loss,
                "steps": float(step),
                "train_seconds": time.monotonic() - started,
            }
            params = {
                "ds": ds,
                "data": str(data),
                "world_size": world,
                "bf16_effective": ds_config["bf16"]["enabled"],
                "train_rows": len(train_frame),
                "test_rows": len(test_frame),
                "test_from": str(test_frame[TIMESTAMP].iloc[0]),
                "test_positive_rate": f"{test_frame[LABEL].mean():.4f}",
                "resumed_from_step": start_step,
            }
            result = log_run(
                final,
                config,
                out=out,
                ds=ds,
                metrics=metrics,
                params=params,
                input_example=test_frame,
                run_id=run_id,
                settings=settings,
            )
            mlflow.end_run()
            # Finished: nothing to resume any more, and a later launch must start afresh.
            shutil.rmtree(ckpt_dir, ignore_errors=True)
            (out / RUN_MARKER).unlink(missing_ok=True)
            print(
                f"[train] done steps={step} train_loss={train_loss:.4f} test_auc={test['auc']:.4f} "
                f"seconds={metrics['train_seconds']:.1f} result={out / 'result.json'}",
                flush=True,
            )
    except BaseException:
        if rank == 0:
            mlflow.end_run("FAILED")
        raise
    dist.barrier()
    dist.destroy_process_group()
    return result


def _ds_from_path(path: Path) -> str:
    match = re.search(r"dt=(\d{4}-\d{2}-\d{2})", str(path))
    return match.group(1) if match else ""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``ds`` falls back to the ``dt=YYYY-MM-DD`` folder of ``--data``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, choices=sorted(CONFIGS))
    parser.add_argument("--data", required=True, type=Path, help="training parquet")
    parser.add_argument("--out", required=True, type=Path, help="folder for result.json")
    parser.add_argument("--ds", default=None, help="partition date (default: dt=... in --data)")
    parser.add_argument("--epochs", type=int, default=None, help="override the config's epochs")
    parser.add_argument(
        "--lr", type=float, default=None, help="override the config's learning rate"
    )
    # The deepspeed launcher passes --local_rank; torch.distributed.run sets LOCAL_RANK.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None)
    args = parser.parse_args(argv)
    if args.ds is None:
        args.ds = _ds_from_path(args.data)
    if args.ds:
        check_ds(args.ds)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    args.out.mkdir(parents=True, exist_ok=True)
    config = with_overrides(get_config(args.config), epochs=args.epochs, lr=args.lr)
    train(config, data=args.data, out=args.out, ds=args.ds)


# --- launching from Python --------------------------------------------------------------


def read_complete_result(
    path: Path, ds: str | None, keys: Sequence[str] = RESULT_KEYS
) -> dict[str, Any] | None:
    """The training result at ``path`` if complete (every one of ``keys``) and for ``ds``."""
    return launching.read_complete_result(path, ds, keys)


def check_launch_outcome(
    returncode: int, result_path: Path, ds: str, log_tail: str
) -> dict[str, Any]:
    """Accept a run whose result is complete, even if a rank crashed at exit; else raise."""
    return launching.accept_result(
        returncode,
        result_path,
        log_tail,
        what=f"pre-ranking training for ds={ds}",
        keys=RESULT_KEYS,
        ds=ds,
    )


def partition_training_set(lake: Lake, ds: str) -> Path:
    """The partition's training-set parquet, or FileNotFoundError naming the missing task."""
    data = lake.training_set("preranking", ds) / "data.parquet"
    if not data.exists():
        raise FileNotFoundError(
            f"training set {data} does not exist; run the training-set task for ds={ds} first"
        )
    return data


def require_dense_contract(data: Path) -> None:
    """Refuse, before any process starts, a training set without the dense network's columns
    (:data:`REQUIRED_COLUMNS`), such as the pipeline's engine-built one."""
    import pyarrow.parquet as pq

    missing = [c for c in REQUIRED_COLUMNS if c not in pq.read_schema(data).names]
    if missing:
        raise ValueError(
            f"the dense PreRanker (CASCADE_PRERANKING_MODEL=mlp) reads the MovieLens-shaped "
            f"columns, and training set {data} lacks {missing[:4]}"
            f"{' and more' if len(missing) > 4 else ''}; the pipeline's training set is the "
            "cross-statistics engine's fields: train the FSCD pre-ranker "
            "(CASCADE_PRERANKING_MODEL=fscd, the default), which reads any declared field set"
        )


def launch(
    ds: str,
    *,
    config: str = "ml100k",
    settings: Settings | None = None,
    epochs: int | None = None,
    lr: float | None = None,
) -> dict:
    """Train on ``Lake.training_set("preranking", ds)`` with ``settings.train_processes``
    processes, stream the log, and return the run's ``result.json``; ``epochs`` and ``lr``
    override the config's."""
    check_ds(ds)
    # Fail fast on a bad name or override, before starting processes.
    with_overrides(get_config(config), epochs=epochs, lr=lr)
    settings = settings or load_settings()
    lake = Lake(settings.lake_root)
    data = partition_training_set(lake, ds)
    require_dense_contract(data)
    out = lake.reports("train", ds)
    out.mkdir(parents=True, exist_ok=True)
    return launch_for_result(
        "models.preranking.train",
        [
            "--config",
            config,
            "--data",
            str(data),
            "--out",
            str(out),
            "--ds",
            ds,
            *override_args(epochs=epochs, lr=lr),
        ],  # fmt: skip
        what=f"pre-ranking training for ds={ds}",
        out_dir=out,
        keys=RESULT_KEYS,
        processes=settings.train_processes,
        settings=settings,
        echo=True,
        ds=ds,
        append=False,
    )


if __name__ == "__main__":
    main()
