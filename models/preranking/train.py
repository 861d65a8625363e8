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
import collections
import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
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

from cascade.config import REPO_ROOT, Settings, load_settings
from cascade.ctr_schema import LABEL, MODEL_FEATURES, TIMESTAMP
from cascade.lake import Lake, check_ds
from cascade.ports import free_port
from cascade.results import write_result
from models.preranking.config_registry import CONFIGS, TrainConfig, get_config
from models.preranking.fields import FieldEncoder
from models.preranking.inference import (
    CONFIG_ARTIFACT,
    STATE_DICT_ARTIFACT,
    PreRankerPyfunc,
    build_model,
    frame_inputs,
    score_frame,
)
from models.preranking.model import PreRanker

EXPERIMENT = "preranking"
REQUIRED_COLUMNS = ("user_id", "item_id", TIMESTAMP, LABEL, *MODEL_FEATURES)
RESULT_KEYS = ("run_id", "test_auc", "model_uri", "config", "ds")
"""Keys every complete ``result.json`` carries."""


# --- data -------------------------------------------------------------------------------


def load_training_frame(path: Path) -> pd.DataFrame:
    """Read and check the training parquet (columns, labels, size)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"training set {path} does not exist; build it first (the Feast training-set task "
            "of the ctr_preranking DAG writes Lake.training_set('preranking', ds)/data.parquet)"
        )
    frame = pd.read_parquet(path)
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(
            f"training set {path} lacks columns {missing}; expected {REQUIRED_COLUMNS}"
        )
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
    return {
        "train_micro_batch_size_per_gpu": config.batch_size,
        "gradient_accumulation_steps": 1,
        "optimizer": {
            "type": "Adam",
            # DeepSpeed's fused CPU Adam compiles for ~80 s on first use; torch's is enough here.
            "params": {"lr": config.lr, "weight_decay": config.weight_decay, "torch_adam": True},
        },
        "zero_optimization": {"stage": config.zero_stage},
        "bf16": {"enabled": bool(config.bf16 and bf16_supported)},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def _ensure_distributed_env() -> None:
    """Let ``python -m models.preranking.train`` run as a single process without a launcher."""
    if "RANK" in os.environ:
        return
    os.environ.update(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    )


def _consolidated_state_dict(engine: Any, zero_stage: int) -> dict[str, torch.Tensor] | None:
    """Full weights on rank 0 (None elsewhere). Under ZeRO-3 every rank must call this."""
    if zero_stage == 3:
        return engine._zero3_consolidated_16bit_state_dict()
    if dist.get_rank() != 0:
        return None
    return {k: v.detach().cpu().clone() for k, v in engine.module.state_dict().items()}


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


def use_experiment(settings: Settings, name: str = EXPERIMENT) -> str:
    """Point MLflow at ``settings`` and return experiment ``name``'s id (created if missing).

    With a local store (sqlite/file) the experiment's artifacts go under ``settings.home``:
    MLflow's default is ``./mlruns`` of the current directory, i.e. inside the repository.
    """
    import mlflow

    uri = settings.tracking_uri
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    experiment = mlflow.get_experiment_by_name(name)
    if experiment is not None:
        return str(experiment.experiment_id)
    local_store = not uri.startswith(("http://", "https://", "databricks"))
    location = (settings.home / "mlflow-artifacts").as_uri() if local_store else None
    try:
        return str(mlflow.create_experiment(name, artifact_location=location))
    except mlflow.exceptions.MlflowException:
        # Another process created it between our lookup and create.
        experiment = mlflow.get_experiment_by_name(name)
        if experiment is None:
            raise
        return str(experiment.experiment_id)


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

    settings = settings or load_settings()
    out.mkdir(parents=True, exist_ok=True)
    state_path = out / "state_dict.pt"
    config_path = out / "train_config.json"
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, state_path)
    config_path.write_text(json.dumps(config.to_dict(), indent=2))

    experiment_id = use_experiment(settings)
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
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=PreRankerPyfunc(),
            artifacts={STATE_DICT_ARTIFACT: str(state_path), CONFIG_ARTIFACT: str(config_path)},
            input_example=example,
            # Listing requirements skips MLflow's slow inference of them; the model also needs
            # this repository's `models.preranking` package importable where it is loaded.
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", "pandas", "numpy"],
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


def open_resumable_run(
    settings: Settings, experiment: str, marker: Path, run_name: str, params: dict[str, str]
) -> str:
    """Start an MLflow run in ``experiment`` and record its id in ``marker``, or reopen the run
    an interrupted attempt recorded there (its params are already logged)."""
    import mlflow

    experiment_id = use_experiment(settings, experiment)
    if marker.exists():
        run_id = str(json.loads(marker.read_text())["run_id"])
        mlflow.start_run(run_id=run_id)
        return run_id
    run = mlflow.start_run(experiment_id=experiment_id, run_name=run_name)
    write_result(marker, {"run_id": run.info.run_id})
    mlflow.log_params(params)
    return str(run.info.run_id)


CRASH_ENV = "CASCADE_CRASH_AT"
"""Fault injection for resume tests: ``train:STEP`` makes rank 0 SIGKILL itself right after
that optimizer step (and its checkpoint, if one falls due)."""
CHECKPOINTS = "checkpoints"
"""Folder under ``--out`` with the DeepSpeed checkpoints of an unfinished run."""
RUN_MARKER = "mlflow_run.json"
"""File under ``--out`` naming the MLflow run of the unfinished run, so a resume continues it."""


def crash_point(env: dict[str, str] | None = None) -> tuple[str, int] | None:
    """``(phase, step)`` from ``CASCADE_CRASH_AT=phase:step``, or None when unset."""
    value = load_settings(env).hooks.crash_at
    if not value:
        return None
    phase, _, step = value.rpartition(":")
    return phase, int(step)


def run_fingerprint(config: TrainConfig, data: Path, ds: str) -> str:
    """What a checkpoint must match to be resumed: the config, the data file and the partition.

    A checkpoint left by a run on other data or with another config is never resumed.
    """
    stat = data.stat()
    blob = json.dumps([config.to_dict(), str(data.resolve()), stat.st_size, stat.st_mtime_ns, ds])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def save_latest_checkpoint(engine: Any, ckpt_dir: Path, step: int) -> None:
    """Save a DeepSpeed checkpoint tagged ``step{step}`` and drop older ones (only the latest is
    needed to resume). Every rank must call it."""
    engine.save_checkpoint(str(ckpt_dir), tag=f"step{step}", client_state={"step": step})
    dist.barrier()
    if dist.get_rank() == 0:
        for old in ckpt_dir.glob("step*"):
            if old.name != f"step{step}":
                shutil.rmtree(old, ignore_errors=True)


def _step_seed(config: TrainConfig, step: int, rank: int, world: int) -> int:
    """Dropout's seed for one step: a function of the step, so a resumed run draws the same."""
    return config.seed * 1_000_003 + step * world + rank


def _mlflow_run(settings: Settings, out: Path, config: TrainConfig, ds: str, resume: bool) -> str:
    """Start the run, or reopen the one an interrupted attempt left in ``out/RUN_MARKER``.

    A marker without a checkpoint to resume belongs to an attempt that died before its first
    checkpoint: that run is marked KILLED, so the registry never shows it as still running.
    """
    import mlflow

    experiment_id = use_experiment(settings)
    marker = out / RUN_MARKER
    previous = json.loads(marker.read_text())["run_id"] if marker.exists() else None
    if resume and previous:
        mlflow.start_run(run_id=previous)
        return str(previous)
    if previous:
        with contextlib.suppress(Exception):
            mlflow.tracking.MlflowClient().set_terminated(previous, "KILLED")
    run_id = mlflow.start_run(
        experiment_id=experiment_id, run_name=f"{config.name}-{ds}"
    ).info.run_id
    write_result(marker, {"run_id": run_id})
    return str(run_id)


def train(config: TrainConfig, *, data: Path, out: Path, ds: str) -> dict[str, Any] | None:
    """One distributed run; returns the result on rank 0, None on other ranks.

    Every ``config.checkpoint_every`` steps a DeepSpeed checkpoint goes to ``out/checkpoints``;
    started again with the same ``out``, config and data, the run resumes from it and ends with
    the same weights and metrics as an uninterrupted run (batch order and dropout are functions
    of the seed and the step). A finished run removes its checkpoints.
    """
    started = time.monotonic()
    _ensure_distributed_env()
    cuda = torch.cuda.is_available()
    # Must be set before deepspeed is imported: it picks its accelerator at import time.
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if cuda else "cpu")
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
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
    resume = (
        found
        and (ckpt_dir / "latest").exists()
        and fingerprint_file.exists()
        and fingerprint_file.read_text() == fingerprint
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
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        fingerprint_file.write_text(fingerprint)

    import mlflow

    settings = load_settings()
    run_id = None
    if rank == 0:
        run_id = _mlflow_run(settings, out, config, ds, resume=start_step > 0)
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
        order_epoch, order = -1, torch.empty(0, dtype=torch.long)
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
            if step % config.log_every == 0:
                mean = torch.tensor([loss.item()], dtype=torch.float64)
                dist.all_reduce(mean)
                value = mean.item() / world
                if rank == 0:
                    print(f"[train] epoch={epoch} step={step} loss={value:.4f}", flush=True)
                    mlflow.log_metric("loss", value, step=step)
            if step % config.checkpoint_every == 0 and step < total:
                checkpoint(step)
            if crash == ("train", step) and rank == 0:
                print(f"[train] {CRASH_ENV}: killing rank 0 after step {step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

        state_dict = _consolidated_state_dict(engine, config.zero_stage)
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
    train(get_config(args.config), data=args.data, out=args.out, ds=args.ds)


# --- launching from Python --------------------------------------------------------------


def torch_extensions_dir(env: dict[str, str]) -> str:
    """A stable cache outside CASCADE_HOME, one per virtual environment.

    Stable: the DeepSpeed extension compiles once, not once per home. Per venv: the build
    records its include paths, so two checkouts sharing one folder (seen: a CI clone beside
    the working tree) rebuild it on every launch, ~3 minutes each on a loaded 2-core machine.
    """
    venv = hashlib.sha1(sys.prefix.encode()).hexdigest()[:10]
    cache = Path(env.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return str(cache / "cascade" / "torch_extensions" / venv)


def read_complete_result(
    path: Path, ds: str | None, keys: Sequence[str] = RESULT_KEYS
) -> dict[str, Any] | None:
    """The result at ``path`` if it exists, parses, has every one of ``keys`` and is for ``ds``
    (any partition when ``ds`` is None)."""
    try:
        result = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if not isinstance(result, dict) or any(result.get(k) in (None, "") for k in keys):
        return None
    return result if ds is None or result["ds"] == ds else None


def check_launch_outcome(
    returncode: int, result_path: Path, ds: str, log_tail: str
) -> dict[str, Any]:
    """Accept a run whose result is complete, even if a rank crashed at exit; else raise."""
    result = read_complete_result(result_path, ds)
    if returncode == 0 and result is not None:
        return result
    if result is not None:
        # Seen here: rank 0 SIGABRTs at interpreter exit after everything was written.
        warnings.warn(
            f"training for ds={ds} exited with code {returncode} after writing a complete "
            f"{result_path}; accepting run {result['run_id']}",
            RuntimeWarning,
            stacklevel=2,
        )
        return result
    raise RuntimeError(
        f"pre-ranking training for ds={ds} failed (exit code {returncode}) without a complete "
        f"{result_path}; last log lines:\n{log_tail}"
    )


def run_torchrun(
    module: str,
    args: list[str],
    *,
    processes: int,
    settings: Settings,
    log_path: Path,
    echo: bool = False,
    append: bool = False,
    extra_env: dict[str, str] | None = None,
) -> tuple[int, str]:
    """Run ``python -m module args`` under ``torch.distributed.run`` on this node.

    The output goes to ``log_path`` line by line (and to stdout with ``echo``); returns the
    exit code and the last 60 lines.
    """
    env = dict(os.environ)
    # The child reads its settings from the environment: hand it these, not the ambient ones.
    env.update(
        CASCADE_HOME=str(settings.home),
        CASCADE_MLFLOW_URI=settings.tracking_uri,
        PYTHONUNBUFFERED="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        **(extra_env or {}),
    )
    if not torch.cuda.is_available():
        env.setdefault("DS_ACCELERATOR", "cpu")
    env.setdefault("TORCH_EXTENSIONS_DIR", torch_extensions_dir(env))
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // processes)))
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1",
        "--nproc_per_node", str(processes),
        "--master_addr", env["MASTER_ADDR"],
        "--master_port", env["MASTER_PORT"],
        "-m", module, *args,
    ]  # fmt: skip
    if echo:
        print(f"[launch] {' '.join(cmd)}", flush=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tail: collections.deque[str] = collections.deque(maxlen=60)
    with (
        open(log_path, "a" if append else "w", buffering=1) as log,  # line by line: watchable
        subprocess.Popen(
            cmd,
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        ) as proc,
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            if echo:
                sys.stdout.write(line)
            log.write(line)
            tail.append(line)
        returncode = proc.wait()
    if echo:
        sys.stdout.flush()
    return returncode, "".join(tail)


def launch_for_result(
    module: str,
    args: list[str],
    *,
    what: str,
    out_dir: Path,
    keys: Sequence[str],
    processes: int,
    settings: Settings,
    echo: bool,
) -> dict[str, Any]:
    """Run ``module`` under :func:`run_torchrun` (log in ``OUT/train.log``) and return its
    complete ``OUT/result.json`` (every one of ``keys`` set); raise with the log's tail when
    there is none. A stale result is removed first, so it never passes for this launch's."""
    result_path = out_dir / "result.json"
    result_path.unlink(missing_ok=True)
    returncode, tail = run_torchrun(
        module,
        args,
        processes=processes,
        settings=settings,
        log_path=out_dir / "train.log",
        echo=echo,
        append=True,
    )
    result = read_complete_result(result_path, None, keys)
    if result is None:
        raise RuntimeError(
            f"{what} failed (exit code {returncode}) without a complete {result_path}; "
            f"last log lines:\n{tail}"
        )
    if returncode != 0:
        # Seen with DeepSpeed on CPU: a rank SIGABRTs at exit after everything was written.
        warnings.warn(
            f"{what} exited with code {returncode} after writing a complete {result_path}; "
            f"accepting run {result['run_id']}",
            RuntimeWarning,
            stacklevel=3,
        )
    return result


def partition_training_set(lake: Lake, ds: str) -> Path:
    """The partition's training-set parquet, or FileNotFoundError naming the missing task."""
    data = lake.training_set("preranking", ds) / "data.parquet"
    if not data.exists():
        raise FileNotFoundError(
            f"training set {data} does not exist; run the training-set task for ds={ds} first"
        )
    return data


def launch(ds: str, *, config: str = "ml100k", settings: Settings | None = None) -> dict:
    """Train on ``Lake.training_set("preranking", ds)`` with ``settings.train_processes``
    processes, stream the log, and return the run's ``result.json``."""
    check_ds(ds)
    get_config(config)  # fail fast on a bad name, before starting processes
    settings = settings or load_settings()
    lake = Lake(settings.lake_root)
    data = partition_training_set(lake, ds)
    out = lake.reports("train", ds)
    out.mkdir(parents=True, exist_ok=True)
    result_path = out / "result.json"
    result_path.unlink(missing_ok=True)  # a stale result must never pass for this launch's

    returncode, tail = run_torchrun(
        "models.preranking.train",
        ["--config", config, "--data", str(data), "--out", str(out), "--ds", ds],
        processes=settings.train_processes,
        settings=settings,
        log_path=out / "train.log",
        echo=True,
    )
    return check_launch_outcome(returncode, result_path, ds, tail)


if __name__ == "__main__":
    main()
