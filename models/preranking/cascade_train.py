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

The data is split in time: the networks train on the oldest rows, the end of the training
period (``validation_fraction`` of it) is the validation split and the latest ``test_fraction``
is the test split. Rank 0 evaluates all models on both (AUC, GAUC, recall@k of each model's top-k
against the teacher's per user, feature cost), chooses λ on validation only (best validation AUC
within ``cost_budget``) and reports that model's test figures. It writes
``OUT/evaluation.json`` (both tables), ``OUT/metrics.json`` (DVC metrics), ``OUT/tradeoff.png``
(AUC vs cost across λ, validation and test) and ``OUT/result.json``; all of it, the per-step
losses, the selected fields and the chosen FSCD model (with its signature) go to the MLflow
experiment ``preranking-cascade``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import math
import os
import shutil
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
from models.preranking.fields import FIELD_NAMES, FIELDS, FieldEncoder
from models.preranking.model import ColdPreRanker, DCNTeacher, TwoTower
from models.preranking.train import (
    CRASH_ENV,
    crash_point,
    save_latest_checkpoint,
    use_experiment,
)

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


@dataclass(frozen=True, kw_only=True)
class EvalSplit:
    """Encoded rows that a model is scored on, never trained on."""

    codes: torch.Tensor
    labels: np.ndarray
    users: np.ndarray

    @classmethod
    def of(cls, frame: pd.DataFrame, encoder: FieldEncoder) -> EvalSplit:
        return cls(
            codes=encoder.encode(frame),
            labels=frame[LABEL].to_numpy(np.int64),
            users=frame["user_id"].to_numpy(np.int64),
        )


@dataclass(kw_only=True)
class Prepared:
    """Encoded splits and the encoder fitted on the training rows.

    Three splits in time order: the networks train on ``train``; ``validation`` (the end of
    the training period) chooses the FSCD regularizer strength; ``test`` (the latest rows) is
    only reported, so its numbers are an unbiased estimate for the chosen model.
    """

    encoder: FieldEncoder
    train_codes: torch.Tensor
    train_labels: torch.Tensor
    validation: EvalSplit
    test: EvalSplit
    costs: dict[str, float]
    example: pd.DataFrame
    """A few raw test rows (the field columns): the logged model's input example."""


def prepare(config: CascadeTrainConfig, frame: pd.DataFrame | None = None) -> Prepared:
    """Time split into train / validation / test, fit the encoder on train only, encode all.

    The encoder sees only the training rows, so ids first seen in the validation period are
    unknown to it exactly as ids first seen in the test period are: validation mimics test.
    """
    from models.preranking.train import time_split

    frame = load_frame(config) if frame is None else frame
    period, test = time_split(frame, config.test_fraction)
    if len(period) < 2:
        raise ValueError(
            f"{len(frame)} rows leave {len(period)} before the test split; need at least 2 to "
            "carve a validation split (lower test_fraction or use more data)"
        )
    train, validation = time_split(period, config.validation_fraction)
    encoder = FieldEncoder(bins=config.bins).fit(train)
    return Prepared(
        encoder=encoder,
        train_codes=encoder.encode(train),
        train_labels=torch.from_numpy(train[LABEL].to_numpy(np.float32)),
        validation=EvalSplit.of(validation, encoder),
        test=EvalSplit.of(test, encoder),
        costs=dict(zip(ALL_FIELDS, encoder.costs(config.net.embedding_dim), strict=True)),
        example=test[list(FIELD_NAMES)].head(5).reset_index(drop=True),
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
        self.gradient_clipping = config.gradient_clipping

    def __call__(self, *args: Any) -> torch.Tensor:
        return self.module(*args)

    def train(self) -> None:
        self.module.train()

    def backward(self, loss: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()

    def step(self) -> None:
        if self.gradient_clipping > 0:
            nn.utils.clip_grad_norm_(self.module.parameters(), self.gradient_clipping)
        self.optimizer.step()


def deepspeed_config(config: CascadeTrainConfig, *, bf16_supported: bool) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": config.batch_size,
        "gradient_accumulation_steps": 1,
        "optimizer": {
            "type": "Adam",
            # DeepSpeed's fused CPU Adam compiles for ~80 s on first use; torch's is enough.
            # "Adam" alone means torch's AdamW (weight decay 0.01) in DeepSpeed; adam_w_mode off
            # makes it plain Adam, the optimizer of the PlainTorch baseline.
            "params": {"lr": config.lr, "torch_adam": True, "adam_w_mode": False},
        },
        "zero_optimization": {"stage": config.zero_stage},
        "bf16": {"enabled": bool(config.bf16 and bf16_supported)},
        "gradient_clipping": config.gradient_clipping,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        # The engine's samples/s timer runs on every step (and synchronizes the device) even
        # when nothing prints it; the run measures its own throughput.
        "timers": {"throughput": {"enabled": False, "synchronized": False}},
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
    if engine.dp_world_size == 1 and config.zero_stage == 0:
        # Averaging gradients over a single process is the identity, yet the engine still
        # flattens every gradient, all-reduces it through gloo and copies it back: on CPU that
        # was a third of a teacher step. Skipping it leaves the numerics unchanged. (ZeRO
        # stages >= 1 reduce inside their optimizer, not through this flag.)
        engine.enable_backward_allreduce = False
    # Per-step bookkeeping with nothing to do here, each ~0.05 ms of a ~4.5 ms CPU step:
    if ds_config["gradient_accumulation_steps"] == 1:
        # backward() divides the loss by the accumulation steps: by 1 here, an extra autograd
        # node each way for bit-identical gradients.
        engine.backward = functools.partial(engine.backward, scale_wrt_gas=False)
    if config.zero_stage == 0 and not engine.bfloat16_enabled() and not engine.fp16_enabled():
        # The engine's own zero_grad (called after each fp32 ZeRO-0 step) walks
        # named_parameters() through the module tree every step to set each grad to None;
        # the parameters never change, so walk a list of them instead.
        parameters = list(engine.module.parameters())

        def zero_grad() -> None:
            for parameter in parameters:
                parameter.grad = None

        engine.zero_grad = zero_grad
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
        if rank == 0:
            print(f"[cascade] {phase.name}: checkpoint at step {step} in {ckpt_dir}", flush=True)

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
    models: dict[str, nn.Module],
    split: EvalSplit,
    costs: dict[str, float],
    config: CascadeTrainConfig,
) -> list[dict[str, Any]]:
    """One row per model on one split: AUC, GAUC, recall@k vs the teacher, cost, cost ratio."""
    scores = {name: predict(m, split.codes) for name, m in models.items()}
    teacher_cost = model_cost(used_fields(models["teacher"]), costs)
    teacher_auc = float(roc_auc_score(split.labels, scores["teacher"]))
    rows = []
    for name, model in models.items():
        fields = used_fields(model)
        auc = float(roc_auc_score(split.labels, scores[name]))
        cost = model_cost(fields, costs)
        rows.append(
            {
                "model": name,
                "auc": auc,
                "gauc": gauc(split.labels, scores[name], split.users),
                f"recall_at_{config.recall_k}": recall_at_k(
                    scores[name], scores["teacher"], split.users, config.recall_k
                ),
                "auc_ratio": auc / teacher_auc,
                "cost": cost,
                "cost_ratio": cost / teacher_cost,
                "fields": list(fields),
            }
        )
    return rows


def choose_fscd(validation_rows: list[dict[str, Any]], budget: float) -> dict[str, Any]:
    """The FSCD row with the best validation AUC within the cost budget; the cheapest FSCD row
    if none is.

    Pass validation rows only: choosing on the test rows would report the best of several
    test draws, an optimistic figure the deployed model would not reproduce.
    """
    fscd = [r for r in validation_rows if r["model"].startswith("fscd_")]
    if not fscd:
        raise ValueError("no fscd_<λ> rows to choose from; fscd_strengths must not be empty")
    within = [r for r in fscd if r["cost_ratio"] <= budget + 1e-9]
    if within:
        return max(within, key=lambda r: r["auc"])
    return min(fscd, key=lambda r: (r["cost_ratio"], -r["auc"]))


def headline_metrics(
    validation_rows: list[dict[str, Any]],
    test_rows: list[dict[str, Any]],
    config: CascadeTrainConfig,
) -> dict[str, float]:
    """The run's figures: λ chosen on the validation rows, every reported figure from the test
    rows of that same λ (and of the teacher and the two-tower baseline)."""
    by_name = {r["model"]: r for r in test_rows}
    on_validation = choose_fscd(validation_rows, config.cost_budget)
    chosen = by_name[on_validation["model"]]
    teacher, two_tower = by_name["teacher"], by_name["two_tower"]
    validation_teacher = next(r for r in validation_rows if r["model"] == "teacher")
    recall_key = f"recall_at_{config.recall_k}"
    return {
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
        "fscd_validation_auc": on_validation["auc"],
        "teacher_validation_auc": validation_teacher["auc"],
        "validation_auc_ratio": on_validation["auc"] / validation_teacher["auc"],
    }


def plot_tradeoff(
    validation_rows: list[dict[str, Any]],
    test_rows: list[dict[str, Any]],
    chosen: str,
    path: Path,
    budget: float | None = None,
) -> None:
    """AUC vs feature cost ratio across λ, on validation (where λ is chosen) and on test (what
    is reported); the teacher and the two-tower baseline as single test points; ``budget``
    (the cost ratio the chosen model must stay within) as a vertical line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def sweep(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted((r for r in rows if r["model"].startswith("fscd_")), key=_sweep_order)

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for rows, style, label in (
        (validation_rows, "o--", "FSCD λ sweep, validation"),
        (test_rows, "o-", "FSCD λ sweep, test"),
    ):
        points = sweep(rows)
        ax.plot([r["cost_ratio"] for r in points], [r["auc"] for r in points], style, label=label)
    # λs that kept the same fields land on one point: one label naming them all.
    labels: dict[tuple[float, float], list[str]] = {}
    for r in sweep(test_rows):
        point = (round(float(r["cost_ratio"]), 6), round(float(r["auc"]), 6))
        labels.setdefault(point, []).append(r["model"].removeprefix("fscd_"))
    for (cost, auc), strengths in labels.items():
        ax.annotate(f"λ={', '.join(strengths)}", (cost, auc), fontsize=7)
    if budget is not None:
        ax.axvline(budget, color="grey", linestyle=":", label=f"cost budget ({budget:g})")
    pick = next(r for r in test_rows if r["model"] == chosen)
    ax.plot([pick["cost_ratio"]], [pick["auc"]], "*", markersize=14, label=f"chosen ({chosen})")
    for name, marker in (("teacher", "s"), ("two_tower", "^")):
        r = next(r for r in test_rows if r["model"] == name)
        ax.plot([r["cost_ratio"]], [r["auc"]], marker, label=f"{name}, test")
    ax.set_xlabel("feature cost / teacher's")
    ax.set_ylabel("AUC")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _sweep_order(row: dict[str, Any]) -> tuple[float, float]:
    return (row["cost_ratio"], float(row["model"].removeprefix("fscd_")))


# --- the run ------------------------------------------------------------------------------


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=2, default=str))
    os.replace(tmp, path)


def _mlflow_run(settings: Settings, out: Path, config: CascadeTrainConfig) -> str:
    """Start (or, on resume, reopen) the run recorded in ``OUT/mlflow_run.json``."""
    import mlflow

    experiment_id = use_experiment(settings, EXPERIMENT)
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


def train_cascade(config: CascadeTrainConfig, out: Path, ds: str = "") -> dict[str, Any] | None:
    """The whole run inside an initialized process group; the result on rank 0. ``ds``: the
    partition the data belongs to (the pipeline's train step), recorded in ``result.json``."""
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
            f"validation={len(data.validation.labels)} test={len(data.test.labels)} run={run_id} "
            f"pid={os.getpid()}",
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
            result = finish(
                config, data, models, selections, out, started=started, world=world, ds=ds
            )
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
    ds: str = "",
) -> dict[str, Any]:
    """Rank 0: choose λ on validation, report test; write the tables, metrics, plot and
    result; log them to MLflow.

    The chosen FSCD model is what the run deploys: its weights, config, kept fields and the
    field encoder go to ``OUT/fscd_model`` and to MLflow as a :class:`ColdPreRankerPyfunc`
    (``result["model_uri"]``, what the registry registers); ``result["test_auc"]`` is its
    test AUC, the figure the registry compares champions by."""
    import mlflow
    import mlflow.pyfunc
    from mlflow.models import infer_signature

    from models.preranking.inference import (
        COLD_DIR_ARTIFACT,
        ColdPreRankerPyfunc,
        save_cold_model,
        score_frame,
    )

    validation_rows = evaluate_models(models, data.validation, data.costs, config)
    rows = evaluate_models(models, data.test, data.costs, config)
    metrics = headline_metrics(validation_rows, rows, config)
    metrics["train_seconds"] = time.monotonic() - started
    chosen_name = choose_fscd(validation_rows, config.cost_budget)["model"]
    chosen = next(r for r in rows if r["model"] == chosen_name)
    recall_key = f"recall_at_{config.recall_k}"
    goals = {
        "auc_ratio_at_least_0.98": metrics["auc_ratio"] >= 0.98,
        "cost_ratio_at_most_0.5": metrics["cost_ratio"] <= 0.5,
        "beats_two_tower": metrics["fscd_auc"] > metrics["two_tower_auc"],
    }
    evaluation = {
        "config": config.name,
        "world_size": world,
        "recall_k": config.recall_k,
        "selected_on": "validation",
        "chosen": chosen["model"],
        "split_rows": {
            "train": len(data.train_labels),
            "validation": len(data.validation.labels),
            "test": len(data.test.labels),
        },
        "rows": rows,
        "validation_rows": validation_rows,
    }
    _write_json(out / "evaluation.json", evaluation)
    _write_json(out / "selections.json", selections)
    _write_json(out / "metrics.json", metrics)
    plot_tradeoff(
        validation_rows, rows, chosen["model"], out / "tradeoff.png", budget=config.cost_budget
    )
    run = mlflow.active_run()
    assert run is not None
    mlflow.log_metrics(metrics)
    # The deployed model's hold-out AUC under the name the registry and the dense-feature
    # training use.
    mlflow.log_metric("test_auc", metrics["fscd_auc"])
    for r in rows:
        mlflow.log_metrics(
            {
                f"{r['model']}.{k}": float(r[k])
                for k in ("auc", "gauc", recall_key, "cost", "cost_ratio")
            }
        )
    mlflow.log_metrics({f"{r['model']}.validation_auc": float(r["auc"]) for r in validation_rows})
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
    fscd_model = models[chosen["model"]]
    assert isinstance(fscd_model, ColdPreRanker)
    model_dir = save_cold_model(out / COLD_DIR_ARTIFACT, fscd_model, config, data.encoder)
    # The signature: the raw field columns in, one click probability per row out.
    signature = infer_signature(data.example, score_frame(fscd_model, data.example, data.encoder))
    info = mlflow.pyfunc.log_model(
        name="fscd_preranker",
        python_model=ColdPreRankerPyfunc(),
        artifacts={COLD_DIR_ARTIFACT: str(model_dir)},
        signature=signature,
        input_example=data.example,
        # Listing requirements skips MLflow's slow inference of them; the model also needs
        # this repository's `models.preranking` package importable where it is loaded.
        pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", "pandas", "numpy"],
    )
    result = {
        **metrics,
        "goals": goals,
        "chosen": chosen["model"],
        "fscd_fields": chosen["fields"],
        "run_id": run.info.run_id,
        "model_uri": info.model_uri,
        "model_kind": "fscd",
        "test_auc": metrics["fscd_auc"],
        "config": config.name,
        "ds": ds,
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
        "--data", default=None, help="training parquet, in place of the config's data source"
    )
    parser.add_argument("--ds", default="", help="partition date of --data (recorded)")
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


THROUGHPUT_REPEATS = 15
"""Timed runs of each loop (in pairs); the reported ratio is the median over the pairs."""


def paired_ratio(plain: list[float], deep: list[float]) -> dict[str, float]:
    """Median, min and max over pairs of ``plain[i] / deep[i]`` (times of the same work run
    back to back): a load change between pairs moves both runs of a pair alike, so it cancels
    out of each ratio, where a ratio of two medians would mix runs from different moments."""
    if not plain or len(plain) != len(deep):
        raise ValueError(f"need pairs of timings, got {len(plain)} and {len(deep)}")
    ratios = [p / d for p, d in zip(plain, deep, strict=True)]
    return {
        "median": float(np.median(ratios)),
        "min": float(min(ratios)),
        "max": float(max(ratios)),
    }


def measure_throughput(config: CascadeTrainConfig, out: Path, steps: int) -> dict[str, Any]:
    """Samples/s of the teacher's DeepSpeed loop (and, on one process, the plain loop).

    On one process both loops run the same ``steps`` batches through the same
    :func:`run_steps` (same data path), on the same thread count, fp32 both: one warm-up run
    each, then :data:`THROUGHPUT_REPEATS` pairs, the order alternating within pairs (plain
    first, then DeepSpeed first) so neither loop always runs on a warmer cache.
    ``ds_vs_torch_throughput`` is the median over pairs of plain time / DeepSpeed time
    (:func:`paired_ratio`), robust to background load on a shared machine, with its range;
    ``deepspeed_samples_per_s`` is the plain loop's median throughput times that ratio
    (``deepspeed_samples_per_s_median``: its own median). Besides wall-clock time it records
    process CPU time per loop: on a loaded machine wall time also counts waiting for a core,
    CPU time only the loop's own work.
    """
    rank, world = _rank_world()
    # fp32 for both loops: the plain loop has no bf16 path, and "same model" means same dtype.
    config = dataclasses.replace(config, bf16=False)
    data = prepare(config)
    cardinalities = data.encoder.cardinalities()

    def loop(engine: Any) -> Callable[[], tuple[float, float]]:
        def run() -> tuple[float, float]:
            wall, cpu = time.perf_counter(), time.process_time()
            # The same first batches every repeat: the work per call is identical.
            run_steps(engine, data.train_codes, data.train_labels, config, max_steps=steps)
            if world > 1:
                dist.barrier()
            return time.perf_counter() - wall, time.process_time() - cpu

        return run

    torch.manual_seed(config.seed)
    ds_run = loop(make_engine(build_network("teacher", config, cardinalities), config))
    samples = steps * config.batch_size * world
    result: dict[str, Any] = {
        "world_size": world,
        "steps": steps,
        "repeats": THROUGHPUT_REPEATS,
        "batch_size": config.batch_size,
        "zero_stage": config.zero_stage,
        "precision": "fp32",
        "torch_threads": torch.get_num_threads(),
        "load_average_before": os.getloadavg()[0],
    }
    if world > 1:
        ds_run()  # warm-up
        deep = [ds_run() for _ in range(THROUGHPUT_REPEATS)]
        result["deepspeed_samples_per_s"] = samples / float(np.median([w for w, _ in deep]))
    else:
        torch.manual_seed(config.seed)
        plain_run = loop(PlainTorch(build_network("teacher", config, cardinalities), config))
        plain_run(), ds_run()  # warm-up
        plain, deep = [], []
        for repeat in range(THROUGHPUT_REPEATS):  # interleaved: both see the same load
            if repeat % 2 == 0:
                plain.append(plain_run())
                deep.append(ds_run())
            else:
                deep.append(ds_run())
                plain.append(plain_run())
        wall = paired_ratio([w for w, _ in plain], [w for w, _ in deep])
        cpu = paired_ratio([c for _, c in plain], [c for _, c in deep])
        result["torch_samples_per_s"] = samples / float(np.median([w for w, _ in plain]))
        result["ds_vs_torch_throughput"] = wall["median"]
        result["ds_vs_torch_throughput_range"] = [wall["min"], wall["max"]]
        result["deepspeed_samples_per_s"] = result["torch_samples_per_s"] * wall["median"]
        result["deepspeed_samples_per_s_median"] = samples / float(np.median([w for w, _ in deep]))
        result["torch_cpu_ms_per_step"] = float(np.median([c for _, c in plain])) / steps * 1e3
        result["deepspeed_cpu_ms_per_step"] = float(np.median([c for _, c in deep])) / steps * 1e3
        result["ds_vs_torch_cpu_time"] = cpu["median"]
    result["load_average_after"] = os.getloadavg()[0]
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
    if args.zero_stage is not None:
        config = dataclasses.replace(config, zero_stage=args.zero_stage)
    if args.data is not None:
        config = dataclasses.replace(config, data=str(args.data))
    if args.checkpoint_every is not None:
        config = dataclasses.replace(config, checkpoint_every=args.checkpoint_every)
    if args.seed is not None:
        config = dataclasses.replace(config, seed=args.seed)
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


STALE_ON_NEW_DATA = ("phases", "checkpoints", "mlflow_run.json")
"""What a run folder keeps to resume; it belongs to one config, data file and partition."""
CHECKPOINT_EVERY_ENV = "CASCADE_PRERANKING_CHECKPOINT_EVERY"
"""Overrides the pipeline config's checkpoint interval (steps); the fault tests set it so a
phase checkpoints well before it ends."""


def checkpoint_every_override(env: dict[str, str] | None = None) -> int | None:
    """The interval from :data:`CHECKPOINT_EVERY_ENV`, or None when unset."""
    return load_settings(env).runtime.preranking_checkpoint_every


def pipeline_fingerprint(config: CascadeTrainConfig, data: Path, ds: str) -> str:
    """What a run folder's finished phases and checkpoints must match to be reused."""
    stat = data.stat()
    blob = json.dumps([config.to_dict(), str(data.resolve()), stat.st_size, stat.st_mtime_ns, ds])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def launch_pipeline(
    ds: str, *, config: str = "pipeline", settings: Settings | None = None
) -> dict[str, Any]:
    """The ``ctr_preranking`` train step: the cascade (teacher, FSCD selection, ColdPreRanker)
    on ``Lake.training_set("preranking", ds)`` with ``settings.train_processes`` processes,
    into ``Lake.reports("train", ds)``; returns the run's ``result.json``.

    Retried for the same partition, data and config, it resumes (finished phases, the last
    checkpoint, the same MLflow run); phases and checkpoints left by other data or another
    config are removed first. :data:`CHECKPOINT_EVERY_ENV` overrides the config's checkpoint
    interval.
    """
    from cascade.lake import Lake, check_ds
    from models.preranking.train import check_launch_outcome, partition_training_set, run_torchrun

    check_ds(ds)
    cascade = get_cascade_config(config)  # fail fast on a bad name, before starting processes
    checkpoint_every = checkpoint_every_override()
    extra_args: list[str] = []
    if checkpoint_every is not None:
        cascade = dataclasses.replace(cascade, checkpoint_every=checkpoint_every)
        extra_args = ["--checkpoint-every", str(checkpoint_every)]
    settings = settings or load_settings()
    lake = Lake(settings.lake_root)
    data = partition_training_set(lake, ds)
    out = lake.reports("train", ds)
    out.mkdir(parents=True, exist_ok=True)
    fingerprint = pipeline_fingerprint(dataclasses.replace(cascade, data=str(data)), data, ds)
    marker = out / "fingerprint.txt"
    if not marker.exists() or marker.read_text() != fingerprint:
        for name in STALE_ON_NEW_DATA:
            path = out / name
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        marker.write_text(fingerprint)
    result_path = out / "result.json"
    result_path.unlink(missing_ok=True)  # a stale result must never pass for this launch's
    returncode, tail = run_torchrun(
        "models.preranking.cascade_train",
        ["--config", config, "--data", str(data), "--ds", ds, "--out", str(out), *extra_args],
        processes=settings.train_processes,
        settings=settings,
        log_path=out / "train.log",
        echo=True,
        append=True,
    )
    return check_launch_outcome(returncode, result_path, ds, tail)


if __name__ == "__main__":
    main()
