"""Train the ranking cascade on DeepSpeed: teacher, FSCD pre-ranker sweep, two-tower baseline.

Run it with 2 processes (gloo on CPU, NCCL on GPU)::

    DS_ACCELERATOR=cpu python -m torch.distributed.run --nproc_per_node 2 \\
        -m models.preranking.cascade_train --config ml100k --out /tmp/cascade-ml100k

Configs (``models.preranking.config_registry.CASCADE_CONFIGS``): ``debug`` (seconds),
``ml100k`` (MovieLens-100k, point-in-time features), ``generated`` (synthetic logs, 200k rows).
From Python, :func:`launch_cascade` builds that command.

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

Rank 0 evaluates all models on the time-split hold-out (AUC, GAUC, recall@k of each model's
top-k against the teacher's per user, feature cost) and writes ``OUT/evaluation.json`` (the
table), ``OUT/metrics.json`` (DVC metrics), ``OUT/tradeoff.png`` (AUC vs cost across λ) and
``OUT/result.json``; all of it, the per-step losses, the selected fields and the chosen FSCD
model (with its signature) go to the MLflow experiment ``preranking-cascade``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from sklearn.metrics import roc_auc_score
from torch import nn

from cascade.config import Settings, load_settings
from cascade.ctr_schema import LABEL
from models.preranking.config_registry import (
    CASCADE_CONFIGS,
    CascadeTrainConfig,
    get_cascade_config,
)
from models.preranking.fields import FIELDS, FieldEncoder
from models.preranking.model import ColdPreRanker, DCNTeacher, TwoTower
from models.preranking.train import CRASH_ENV, crash_point, save_latest_checkpoint

EXPERIMENT = "preranking-cascade"

ALL_FIELDS = tuple(f.name for f in FIELDS)


# --- data -------------------------------------------------------------------------------


def load_frame(config: CascadeTrainConfig) -> pd.DataFrame:
    """The labelled impressions named by ``config.data``."""
    if config.data == "synthetic":
        from models.preranking.synthetic_data import synthetic_training_frame

        return synthetic_training_frame(
            config.rows, users=max(50, config.rows // 40), items=max(80, config.rows // 25)
        )
    if config.data == "ml100k":
        from models.preranking.movielens_frame import movielens_training_frame

        return movielens_training_frame()
    from models.preranking.train import load_training_frame

    return load_training_frame(Path(config.data))


@dataclass(kw_only=True)
class Prepared:
    """Encoded splits and the encoder fitted on the training split."""

    encoder: FieldEncoder
    train_codes: torch.Tensor
    train_labels: torch.Tensor
    test_codes: torch.Tensor
    test_labels: np.ndarray
    test_users: np.ndarray
    costs: dict[str, float]


def prepare(config: CascadeTrainConfig, frame: pd.DataFrame | None = None) -> Prepared:
    """Time split, fit the encoder on train only, encode both splits."""
    from models.preranking.train import time_split

    frame = load_frame(config) if frame is None else frame
    train, test = time_split(frame, config.test_fraction)
    encoder = FieldEncoder(bins=config.bins).fit(train)
    return Prepared(
        encoder=encoder,
        train_codes=encoder.encode(train),
        train_labels=torch.from_numpy(train[LABEL].to_numpy(np.float32)),
        test_codes=encoder.encode(test),
        test_labels=test[LABEL].to_numpy(np.int64),
        test_users=test["user_id"].to_numpy(np.int64),
        costs=dict(zip(ALL_FIELDS, encoder.costs(config.net.embedding_dim), strict=True)),
    )


# --- models and phases -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Phase:
    """One network trained by the loop."""

    name: str
    """``teacher``, ``two_tower``, ``select_<λ>`` or ``fscd_<λ>``."""
    kind: str
    """``teacher``, ``two_tower``, ``select`` or ``fscd``."""
    strength: float = 0.0
    """FSCD regularizer strength λ (select phases)."""


def phases(config: CascadeTrainConfig) -> list[Phase]:
    out = [Phase(name="teacher", kind="teacher"), Phase(name="two_tower", kind="two_tower")]
    for strength in config.fscd_strengths:
        out.append(Phase(name=f"select_{strength:g}", kind="select", strength=strength))
        out.append(Phase(name=f"fscd_{strength:g}", kind="fscd", strength=strength))
    return out


def build_network(
    kind: str,
    config: CascadeTrainConfig,
    cardinalities: list[int],
    fields: tuple[str, ...] = ALL_FIELDS,
) -> nn.Module:
    """A fresh network of one phase kind over ``fields``."""
    if kind == "teacher":
        return DCNTeacher(config.net, fields, cardinalities)
    if kind == "two_tower":
        return TwoTower(config.net, fields, cardinalities)
    if kind in ("select", "fscd"):
        return ColdPreRanker(
            config.net,
            fields,
            cardinalities,
            gated=kind == "select",
            temperature=config.fscd_temperature,
            gate_init=config.gate_init,
        )
    raise ValueError(f"unknown phase kind {kind!r}")


def fscd_regularizer(model: ColdPreRanker, costs: dict[str, float]) -> torch.Tensor:
    """λ-free FSCD penalty: Σ_j keep_prob_j · cost_j / mean cost.

    Up to a constant this is E_z[-log prior(z)] for z_j ~ Bernoulli(keep_prob_j) and the prior
    Bernoulli(sigmoid(-cost_j / mean cost)): dear fields are a priori likely dropped.
    """
    relative = torch.tensor([costs[n] for n in model.gate_fields])
    relative = relative / relative.mean()
    return (model.keep_probability() * relative.to(model.gate_logits.device)).sum()


def model_cost(fields: tuple[str, ...], costs: dict[str, float]) -> float:
    return float(sum(costs[n] for n in fields))


def used_fields(model: nn.Module) -> tuple[str, ...]:
    """The fields a trained model reads at serving time."""
    if isinstance(model, ColdPreRanker) and model.gated:
        return model.kept_fields()
    return tuple(model.fields)  # type: ignore[arg-type]


# --- the training loop --------------------------------------------------------------------


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def epoch_shard(n: int, *, seed: int, epoch: int, rank: int, world: int) -> torch.Tensor:
    """Row order of one rank in one epoch: a seeded permutation, equal length on every rank."""
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    order = torch.randperm(n, generator=generator)
    per_rank = n // world
    return order[rank::world][:per_rank]


def gate_noise(shape: tuple[int, int], *, seed: int, step: int, rank: int) -> torch.Tensor:
    """Uniform noise of the relaxed Bernoulli gates; a function of (seed, step, rank) only."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    return torch.rand(shape, generator=generator)


class PlainTorch:
    """The same step as DeepSpeed's engine, with ``torch.optim.Adam`` (the baseline loop)."""

    def __init__(self, model: nn.Module, config: CascadeTrainConfig) -> None:
        self.module = model
        self.optimizer = torch.optim.Adam(parameter_groups(model, config), lr=config.lr)
        self.device = torch.device("cpu")

    def __call__(self, *args: Any) -> torch.Tensor:
        return self.module(*args)

    def train(self) -> None:
        self.module.train()

    def backward(self, loss: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()

    def step(self) -> None:
        self.optimizer.step()


def deepspeed_config(config: CascadeTrainConfig, *, bf16_supported: bool) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": config.batch_size,
        "gradient_accumulation_steps": 1,
        "optimizer": {
            "type": "Adam",
            # DeepSpeed's fused CPU Adam compiles for ~80 s on first use; torch's is enough.
            "params": {"lr": config.lr, "torch_adam": True},
        },
        "zero_optimization": {"stage": config.zero_stage},
        "bf16": {"enabled": bool(config.bf16 and bf16_supported)},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def parameter_groups(model: nn.Module, config: CascadeTrainConfig) -> list[dict[str, Any]]:
    """Trainable parameters; FSCD gate logits get their own, larger learning rate: at the
    network's rate they would barely move from their initial keep probability in one run."""
    gates = [p for n, p in model.named_parameters() if n == "gate_logits" and p.requires_grad]
    rest = [p for n, p in model.named_parameters() if n != "gate_logits" and p.requires_grad]
    groups: list[dict[str, Any]] = [{"params": rest}]
    if gates:
        groups.append({"params": gates, "lr": config.gate_lr})
    return groups


def make_engine(model: nn.Module, config: CascadeTrainConfig) -> Any:
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    ds_config = deepspeed_config(config, bf16_supported=bool(get_accelerator().is_bf16_supported()))
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=parameter_groups(model, config),
        config=ds_config,
    )
    return engine


def run_steps(
    engine: Any,
    codes: torch.Tensor,
    labels: torch.Tensor,
    config: CascadeTrainConfig,
    *,
    phase: str = "",
    gated: bool = False,
    regularizer: Callable[[], torch.Tensor] | None = None,
    start_step: int = 0,
    max_steps: int | None = None,
    checkpoint: Callable[[int], None] | None = None,
    log: Callable[[int, float], None] | None = None,
) -> int:
    """Train from ``start_step`` to the end of ``config.epochs`` (or ``max_steps``); returns
    the last step. Batches are a deterministic function of the step, so any start resumes."""
    rank, world = _rank_world()
    n = len(labels)
    per_rank = n // world
    if per_rank < 1:
        raise ValueError(f"{n} training rows cannot be split over {world} processes")
    steps_per_epoch = math.ceil(per_rank / config.batch_size)
    total = steps_per_epoch * config.epochs
    if max_steps is not None:
        total = min(total, start_step + max_steps)
    loss_fn = nn.BCEWithLogitsLoss()
    crash = crash_point()
    engine.train()
    shard: torch.Tensor | None = None
    shard_epoch = -1
    device = engine.device
    step = start_step
    while step < total:
        epoch, within = divmod(step, steps_per_epoch)
        if epoch != shard_epoch:
            shard = epoch_shard(n, seed=config.seed, epoch=epoch, rank=rank, world=world)
            shard_epoch = epoch
        assert shard is not None
        idx = shard[within * config.batch_size : (within + 1) * config.batch_size]
        batch = codes[idx].to(device)
        if gated:
            noise = gate_noise((len(idx), len(FIELDS)), seed=config.seed, step=step, rank=rank).to(
                device
            )
            logits = engine(batch, noise)
        else:
            logits = engine(batch)
        loss = loss_fn(logits.float(), labels[idx].to(device))
        if regularizer is not None:
            loss = loss + regularizer()
        engine.backward(loss)
        engine.step()
        step += 1
        if log is not None and step % config.log_every == 0:
            value = torch.tensor([loss.item()], dtype=torch.float64)
            if world > 1:
                dist.all_reduce(value)
            log(step, value.item() / world)
        if checkpoint is not None and step % config.checkpoint_every == 0 and step < total:
            checkpoint(step)
        if crash is not None and crash == (phase, step) and rank == 0:
            print(f"[cascade] {CRASH_ENV}: killing rank 0 after {phase} step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    return step


def _float_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {
        k: v.detach().cpu().float() if v.is_floating_point() else v.detach().cpu()
        for k, v in state.items()
    }


def train_phase(
    phase: Phase,
    config: CascadeTrainConfig,
    data: Prepared,
    out: Path,
    *,
    fields: tuple[str, ...] = ALL_FIELDS,
    log: Callable[[str, int, float], None] | None = None,
) -> nn.Module:
    """Train one phase with DeepSpeed (or load it when already finished); fp32 eval model."""
    from models.preranking.train import _consolidated_state_dict

    rank, _ = _rank_world()
    cardinalities = data.encoder.cardinalities()
    final_path = out / "phases" / phase.name / "model.pt"
    torch.manual_seed(config.seed)
    model = build_network(phase.kind, config, cardinalities, fields)
    if final_path.exists():
        model.load_state_dict(torch.load(final_path, map_location="cpu", weights_only=True))
        return model.eval()

    engine = make_engine(model, config)
    ckpt_dir = out / "checkpoints" / phase.name
    start = 0
    if (ckpt_dir / "latest").exists():
        _, client_state = engine.load_checkpoint(str(ckpt_dir))
        start = int(client_state["step"])
        if rank == 0:
            print(f"[cascade] {phase.name}: resumed at step {start} from {ckpt_dir}", flush=True)

    def checkpoint(step: int) -> None:
        save_latest_checkpoint(engine, ckpt_dir, step)

    regularizer = None
    if phase.kind == "select":
        cold = engine.module

        def regularizer() -> torch.Tensor:
            return phase.strength * fscd_regularizer(cold, data.costs)

    steps = run_steps(
        engine,
        data.train_codes,
        data.train_labels,
        config,
        phase=phase.name,
        gated=phase.kind == "select",
        regularizer=regularizer,
        start_step=start,
        checkpoint=checkpoint,
        log=None if log is None else (lambda step, value: log(phase.name, step, value)),
    )
    state = _consolidated_state_dict(engine, config.zero_stage)
    if rank == 0:
        assert state is not None
        final_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = final_path.with_suffix(".tmp")
        torch.save(_float_state(state), tmp)
        os.replace(tmp, final_path)  # a crash never leaves a half-written "finished" phase
        print(f"[cascade] {phase.name}: done after {steps} steps", flush=True)
    dist.barrier()
    fp32 = build_network(phase.kind, config, cardinalities, fields)
    fp32.load_state_dict(torch.load(final_path, map_location="cpu", weights_only=True))
    return fp32.eval()


# --- evaluation ---------------------------------------------------------------------------


@torch.no_grad()
def predict(model: nn.Module, codes: torch.Tensor, batch: int = 65_536) -> np.ndarray:
    model.eval()
    return torch.cat(
        [torch.sigmoid(model(codes[s : s + batch]).float()) for s in range(0, len(codes), batch)]
    ).numpy()


def gauc(labels: np.ndarray, scores: np.ndarray, users: np.ndarray) -> float:
    """Impression-weighted mean of per-user AUC over users with both classes.

    Vectorized with the rank-sum form of AUC (ties get average ranks, as in roc_auc_score):
    a per-user loop over sklearn took minutes for 5,000 users x 8 models.
    """
    frame = pd.DataFrame({"y": labels.astype(np.int64), "s": scores, "u": users})
    frame["r"] = frame.groupby("u")["s"].rank(method="average")
    frame["pos_rank"] = frame["r"] * frame["y"]
    per_user = frame.groupby("u").agg(
        n=("y", "size"), pos=("y", "sum"), rank_sum=("pos_rank", "sum")
    )
    per_user = per_user[(per_user["pos"] > 0) & (per_user["pos"] < per_user["n"])]
    if per_user.empty:
        return float("nan")
    neg = per_user["n"] - per_user["pos"]
    auc = (per_user["rank_sum"] - per_user["pos"] * (per_user["pos"] + 1) / 2) / (
        per_user["pos"] * neg
    )
    return float((auc * per_user["n"]).sum() / per_user["n"].sum())


def recall_at_k(scores: np.ndarray, teacher: np.ndarray, users: np.ndarray, k: int) -> float:
    """Mean over users with more than k candidates of |top-k(model) ∩ top-k(teacher)| / k.

    Ties are broken by row order, the same for both rankings.
    """
    frame = pd.DataFrame({"s": scores, "t": teacher, "u": users})
    by_user = frame.groupby("u")
    frame["n"] = by_user["s"].transform("size")
    frame["both"] = (by_user["s"].rank(method="first", ascending=False) <= k) & (
        by_user["t"].rank(method="first", ascending=False) <= k
    )
    eligible = frame[frame["n"] > k]
    if eligible.empty:
        return float("nan")
    return float((eligible.groupby("u")["both"].sum() / k).mean())


def evaluate_models(
    models: dict[str, nn.Module], data: Prepared, config: CascadeTrainConfig
) -> list[dict[str, Any]]:
    """One row per model: AUC, GAUC, recall@k vs the teacher, cost and cost ratio."""
    scores = {name: predict(m, data.test_codes) for name, m in models.items()}
    teacher_cost = model_cost(used_fields(models["teacher"]), data.costs)
    teacher_auc = float(roc_auc_score(data.test_labels, scores["teacher"]))
    rows = []
    for name, model in models.items():
        fields = used_fields(model)
        auc = float(roc_auc_score(data.test_labels, scores[name]))
        cost = model_cost(fields, data.costs)
        rows.append(
            {
                "model": name,
                "auc": auc,
                "gauc": gauc(data.test_labels, scores[name], data.test_users),
                f"recall_at_{config.recall_k}": recall_at_k(
                    scores[name], scores["teacher"], data.test_users, config.recall_k
                ),
                "auc_ratio": auc / teacher_auc,
                "cost": cost,
                "cost_ratio": cost / teacher_cost,
                "fields": list(fields),
            }
        )
    return rows


def choose_fscd(rows: list[dict[str, Any]], budget: float) -> dict[str, Any]:
    """The best-AUC FSCD row within the cost budget; the cheapest FSCD row if none is."""
    fscd = [r for r in rows if r["model"].startswith("fscd_")]
    within = [r for r in fscd if r["cost_ratio"] <= budget + 1e-9]
    if within:
        return max(within, key=lambda r: r["auc"])
    return min(fscd, key=lambda r: (r["cost_ratio"], -r["auc"]))


def plot_tradeoff(rows: list[dict[str, Any]], path: Path) -> None:
    """AUC vs feature cost ratio: one point per model, the FSCD sweep as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fscd = sorted(
        (r for r in rows if r["model"].startswith("fscd_")), key=lambda r: r["cost_ratio"]
    )
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["cost_ratio"] for r in fscd], [r["auc"] for r in fscd], "o-", label="FSCD (λ sweep)")
    for r in fscd:
        ax.annotate(r["model"].removeprefix("fscd_"), (r["cost_ratio"], r["auc"]), fontsize=7)
    for name, marker in (("teacher", "s"), ("two_tower", "^")):
        r = next(r for r in rows if r["model"] == name)
        ax.plot([r["cost_ratio"]], [r["auc"]], marker, label=name)
    ax.set_xlabel("feature cost / teacher's")
    ax.set_ylabel("test AUC")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- the run ------------------------------------------------------------------------------


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=2, default=str))
    os.replace(tmp, path)


def _mlflow_run(settings: Settings, out: Path, config: CascadeTrainConfig) -> str:
    """Start (or, on resume, reopen) the run recorded in ``OUT/mlflow_run.json``."""
    import mlflow

    mlflow.set_tracking_uri(settings.tracking_uri)
    mlflow.set_registry_uri(settings.tracking_uri)
    experiment = mlflow.get_experiment_by_name(EXPERIMENT)
    if experiment is None:
        # With a local store, artifacts go under CASCADE_HOME, not ./mlruns of the repository.
        local = not settings.tracking_uri.startswith(("http://", "https://", "databricks"))
        location = (settings.home / "mlflow-artifacts").as_uri() if local else None
        experiment_id = mlflow.create_experiment(EXPERIMENT, artifact_location=location)
    else:
        experiment_id = experiment.experiment_id
    marker = out / "mlflow_run.json"
    if marker.exists():
        run_id = json.loads(marker.read_text())["run_id"]
        mlflow.start_run(run_id=run_id)
    else:
        run_id = mlflow.start_run(
            experiment_id=experiment_id, run_name=f"cascade-{config.name}"
        ).info.run_id
        _write_json(marker, {"run_id": run_id})
        mlflow.log_params({k: str(v) for k, v in _flat(config.to_dict()).items()})
    return str(run_id)


def _flat(value: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, item in value.items():
        if isinstance(item, dict):
            flat.update(_flat(item, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = item
    return flat


def train_cascade(config: CascadeTrainConfig, out: Path) -> dict[str, Any] | None:
    """The whole run inside an initialized process group; the result on rank 0."""
    import mlflow

    started = time.monotonic()
    rank, world = _rank_world()
    out.mkdir(parents=True, exist_ok=True)
    data = prepare(config)
    settings = load_settings()
    if rank == 0:
        run_id = _mlflow_run(settings, out, config)
        _write_json(out / "encoder.json", data.encoder.state())
        print(
            f"[cascade] config={config.name} world={world} train={len(data.train_labels)} "
            f"test={len(data.test_labels)} run={run_id}",
            flush=True,
        )

    def log(phase: str, step: int, value: float) -> None:
        if rank == 0:
            print(f"[cascade] {phase} step={step} loss={value:.4f}", flush=True)
            mlflow.log_metric(f"loss.{phase}", value, step=step)

    try:
        models: dict[str, nn.Module] = {}
        selections: dict[str, Any] = {}
        for phase in phases(config):
            if phase.kind == "fscd":
                selector = models.pop(f"select_{phase.strength:g}")
                assert isinstance(selector, ColdPreRanker)
                kept = selector.kept_fields() or (
                    # Nothing kept: keep the single most probable field rather than no model.
                    (selector.gate_fields[int(selector.keep_probability().argmax())],)
                )
                selections[phase.name] = {
                    "keep_probability": dict(
                        zip(selector.gate_fields, selector.keep_probability().tolist(), strict=True)
                    ),
                    "kept": list(kept),
                }
                models[phase.name] = train_phase(phase, config, data, out, fields=kept, log=log)
            else:
                models[phase.name] = train_phase(phase, config, data, out, log=log)
        result = None
        if rank == 0:
            result = finish(config, data, models, selections, out, started=started, world=world)
    except BaseException:
        if rank == 0 and mlflow.active_run() is not None:
            mlflow.end_run("FAILED")
        raise
    return result


def finish(
    config: CascadeTrainConfig,
    data: Prepared,
    models: dict[str, nn.Module],
    selections: dict[str, Any],
    out: Path,
    *,
    started: float,
    world: int,
) -> dict[str, Any]:
    """Rank 0: evaluate, write the table, metrics, plot and result; log them to MLflow."""
    import mlflow
    from mlflow.models import infer_signature

    rows = evaluate_models(models, data, config)
    by_name = {r["model"]: r for r in rows}
    chosen = choose_fscd(rows, config.cost_budget)
    teacher, two_tower = by_name["teacher"], by_name["two_tower"]
    recall_key = f"recall_at_{config.recall_k}"
    metrics = {
        "teacher_auc": teacher["auc"],
        "teacher_gauc": teacher["gauc"],
        "fscd_auc": chosen["auc"],
        "fscd_gauc": chosen["gauc"],
        "two_tower_auc": two_tower["auc"],
        "two_tower_gauc": two_tower["gauc"],
        "auc_ratio": chosen["auc"] / teacher["auc"],
        "cost_ratio": chosen["cost_ratio"],
        "recall_at_k": chosen[recall_key],
        "two_tower_recall_at_k": two_tower[recall_key],
        "two_tower_cost_ratio": two_tower["cost_ratio"],
        "fscd_strength": float(chosen["model"].removeprefix("fscd_")),
        "train_seconds": time.monotonic() - started,
    }
    goals = {
        "auc_ratio_at_least_0.98": metrics["auc_ratio"] >= 0.98,
        "cost_ratio_at_most_0.5": metrics["cost_ratio"] <= 0.5,
        "beats_two_tower": metrics["fscd_auc"] > metrics["two_tower_auc"],
    }
    evaluation = {
        "config": config.name,
        "world_size": world,
        "recall_k": config.recall_k,
        "rows": rows,
    }
    _write_json(out / "evaluation.json", evaluation)
    _write_json(out / "selections.json", selections)
    _write_json(out / "metrics.json", metrics)
    plot_tradeoff(rows, out / "tradeoff.png")
    run = mlflow.active_run()
    assert run is not None
    mlflow.log_metrics(metrics)
    for r in rows:
        mlflow.log_metrics(
            {
                f"{r['model']}.{k}": float(r[k])
                for k in ("auc", "gauc", recall_key, "cost", "cost_ratio")
            }
        )
    mlflow.log_dict(evaluation, "evaluation.json")
    mlflow.log_dict(
        {
            "chosen": chosen["model"],
            "fields": chosen["fields"],
            "cost": chosen["cost"],
            "cost_ratio": chosen["cost_ratio"],
            "selections": selections,
        },
        "selected_features.json",
    )
    mlflow.log_artifact(str(out / "tradeoff.png"))
    mlflow.log_artifact(str(out / "encoder.json"))
    import mlflow.pytorch

    fscd_model = models[chosen["model"]]
    sample = data.test_codes[:5]
    info = mlflow.pytorch.log_model(
        fscd_model,
        name="fscd_preranker",
        signature=infer_signature(sample.numpy(), predict(fscd_model, sample)),
        input_example=sample.numpy(),
        pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
    )
    result = {
        **metrics,
        "goals": goals,
        "chosen": chosen["model"],
        "fscd_fields": chosen["fields"],
        "run_id": run.info.run_id,
        "model_uri": info.model_uri,
        "config": config.name,
        "world_size": world,
    }
    _write_json(out / "result.json", result)
    mlflow.end_run()
    print(f"[cascade] done: {json.dumps(metrics)}", flush=True)
    return result


# --- command line and launcher ------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, choices=sorted(CASCADE_CONFIGS))
    parser.add_argument("--out", required=True, type=Path, help="run folder (resumes if present)")
    parser.add_argument(
        "--throughput-steps",
        type=int,
        default=0,
        help="benchmark mode: time this many teacher steps, write OUT/throughput.json, no run",
    )
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None)
    return parser.parse_args(argv)


def init_distributed() -> None:
    from models.preranking.train import _ensure_distributed_env

    _ensure_distributed_env()
    cuda = torch.cuda.is_available()
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if cuda else "cpu")
    import deepspeed

    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")


def measure_throughput(config: CascadeTrainConfig, out: Path, steps: int) -> dict[str, Any]:
    """Samples/s of the teacher's DeepSpeed loop (and, on one process, the plain loop),
    alternating the two loops ``repeats`` times so load on the machine hits both alike."""
    from cascade.bench import median_seconds

    rank, world = _rank_world()
    # fp32 for both loops: the plain loop has no bf16 path, and "same model" means same dtype.
    config = dataclasses.replace(config, bf16=False)
    data = prepare(config)
    cardinalities = data.encoder.cardinalities()

    def loop(engine: Any) -> Callable[[], None]:
        def run() -> None:
            # The same first batches every repeat: the work per call is identical.
            run_steps(engine, data.train_codes, data.train_labels, config, max_steps=steps)
            if world > 1:
                dist.barrier()

        return run

    torch.manual_seed(config.seed)
    ds_run = loop(make_engine(build_network("teacher", config, cardinalities), config))
    samples = steps * config.batch_size * world
    result: dict[str, Any] = {
        "world_size": world,
        "steps": steps,
        "batch_size": config.batch_size,
        "zero_stage": config.zero_stage,
        "precision": "fp32",
    }
    if world > 1:
        result["deepspeed_samples_per_s"] = samples / median_seconds(ds_run, repeats=5)
    else:
        torch.manual_seed(config.seed)
        plain_run = loop(PlainTorch(build_network("teacher", config, cardinalities), config))
        plain_run(), ds_run()  # warm-up
        plain, deep = [], []
        for _ in range(5):  # interleaved: both loops see the same background load
            plain.append(median_seconds(plain_run, repeats=1, warmup=0))
            deep.append(median_seconds(ds_run, repeats=1, warmup=0))
        result["torch_samples_per_s"] = samples / float(np.median(plain))
        result["deepspeed_samples_per_s"] = samples / float(np.median(deep))
        result["ds_vs_torch_throughput"] = float(np.median(plain)) / float(np.median(deep))
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        _write_json(out / "throughput.json", result)
    return result


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    init_distributed()
    config = get_cascade_config(args.config)
    if args.throughput_steps:
        measure_throughput(config, args.out, args.throughput_steps)
    else:
        train_cascade(config, args.out)
    dist.barrier()
    dist.destroy_process_group()


def launch_cascade(
    config: str,
    out: Path,
    *,
    processes: int = 2,
    settings: Settings | None = None,
    extra_env: dict[str, str] | None = None,
    extra_args: list[str] | None = None,
) -> tuple[int, str]:
    """Run ``cascade_train`` under torchrun; returns ``(exit code, log tail)``.

    The caller reads ``OUT/result.json`` (or ``throughput.json``): a rank that crashes at exit
    after writing it (seen with DeepSpeed on CPU) must not hide a finished run.
    """
    from models.preranking.train import run_torchrun

    get_cascade_config(config)
    return run_torchrun(
        "models.preranking.cascade_train",
        ["--config", config, "--out", str(out), *(extra_args or [])],
        processes=processes,
        settings=settings or load_settings(),
        log_path=out / "train.log",
        append=True,
        extra_env=extra_env,
    )


if __name__ == "__main__":
    main()
