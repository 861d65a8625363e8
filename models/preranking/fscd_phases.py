"""The FSCD cascade's phases and the deterministic DeepSpeed loop that trains each of them:
``teacher`` (DCN-v2), ``two_tower``, ``select_λ`` (the gated COLD pre-ranker with FSCD's cost
regularizer) and ``fscd_λ`` (the kept fields fine-tuned, ungated)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from cascade.progress import Progress
from cascade.training.checkpoints import (
    consolidated_state_dict,
    exists_on_every_rank,
    resume_step,
    save_finished_state,
    save_latest_checkpoint,
)
from cascade.training.crash_points import crash_if_due, crash_point
from cascade.training.deepspeed_config import deepspeed_config as build_deepspeed_config
from cascade.training.launch import all_reduced, rank_world
from models.preranking.config_registry import CascadeTrainConfig
from models.preranking.fields import FIELDS, FieldSet
from models.preranking.fscd_data import Prepared
from models.preranking.model import ColdPreRanker, DCNTeacher, TwoTower


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
    fields: tuple[str, ...] | None = None,
    *,
    field_set: FieldSet = FIELDS,
) -> nn.Module:
    """A fresh network of one phase kind over ``fields`` (default: every field of
    ``field_set``, the encoder's set that ``cardinalities`` belong to)."""
    fields = field_set.names if fields is None else fields
    if kind == "teacher":
        return DCNTeacher(config.net, fields, cardinalities, field_set=field_set)
    if kind == "two_tower":
        return TwoTower(config.net, fields, cardinalities, field_set=field_set)
    if kind in ("select", "fscd"):
        return ColdPreRanker(
            config.net,
            fields,
            cardinalities,
            gated=kind == "select",
            temperature=config.fscd_temperature,
            gate_init=config.gate_init,
            field_set=field_set,
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
    """Plain Adam (the optimizer of the :class:`PlainTorch` baseline), the config's clipping,
    no throughput timer: the run measures its own throughput."""
    return build_deepspeed_config(
        micro_batch_size=config.batch_size,
        lr=config.lr,
        zero_stage=config.zero_stage,
        plain_adam=True,
        bf16=config.bf16 and bf16_supported,
        gradient_clipping=config.gradient_clipping,
        throughput_timer=False,
    )


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
    rank, world = rank_world()
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
    progress = Progress(total - step, desc=f"fscd {phase}", unit="step", enabled=rank == 0)
    while step < total:
        epoch, within = divmod(step, steps_per_epoch)
        if epoch != shard_epoch:
            shard = epoch_shard(n, seed=config.seed, epoch=epoch, rank=rank, world=world)
            shard_epoch = epoch
        assert shard is not None
        idx = shard[within * config.batch_size : (within + 1) * config.batch_size]
        batch = codes[idx].to(device)
        if gated:
            noise = gate_noise(
                (len(idx), codes.shape[1]), seed=config.seed, step=step, rank=rank
            ).to(device)
            logits = engine(batch, noise)
        else:
            logits = engine(batch)
        loss = loss_fn(logits.float(), labels[idx].to(device))
        if regularizer is not None:
            loss = loss + regularizer()
        engine.backward(loss)
        engine.step()
        step += 1
        progress.update()
        if log is not None and step % config.log_every == 0:
            value = all_reduced(torch.tensor([loss.item()], dtype=torch.float64))
            log(step, value.item() / world)
        if checkpoint is not None and step % config.checkpoint_every == 0 and step < total:
            checkpoint(step)
        crash_if_due(crash, phase, step, rank=rank, who="cascade")
    progress.close()
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
    fields: tuple[str, ...] | None = None,
    log: Callable[[str, int, float], None] | None = None,
) -> nn.Module:
    """Train one phase with DeepSpeed (or load it when already finished); fp32 eval model.
    ``fields``: the fields it reads (default: all of ``data.fields``). A finished phase
    leaves ``fields.json`` (the run's field set) beside its ``model.pt``."""
    rank, _ = rank_world()
    cardinalities = data.encoder.cardinalities()
    final_path = out / "phases" / phase.name / "model.pt"
    torch.manual_seed(config.seed)
    model = build_network(phase.kind, config, cardinalities, fields, field_set=data.fields)
    if exists_on_every_rank(final_path):
        saved = FieldSet.beside(final_path.parent)
        if saved != data.fields:
            raise ValueError(
                f"{final_path} was trained on fields {list(saved.names)}, this run's data has "
                f"{list(data.fields.names)}; start in a fresh --out"
            )
        model.load_state_dict(torch.load(final_path, map_location="cpu", weights_only=True))
        return model.eval()

    engine = make_engine(model, config)
    ckpt_dir = out / "checkpoints" / phase.name
    start = resume_step(engine, ckpt_dir)
    if start and rank == 0:
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
    state = consolidated_state_dict(engine, config.zero_stage)
    if rank == 0:
        assert state is not None
        final_path.parent.mkdir(parents=True, exist_ok=True)
        data.fields.save(final_path.parent)  # before the weights: model.pt marks the phase done
        save_finished_state(final_path, _float_state(state))
        print(f"[cascade] {phase.name}: done after {steps} steps", flush=True)
    dist.barrier()
    fp32 = build_network(phase.kind, config, cardinalities, fields, field_set=data.fields)
    fp32.load_state_dict(torch.load(final_path, map_location="cpu", weights_only=True))
    return fp32.eval()
