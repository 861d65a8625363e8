"""The DeepSpeed training path on a GPU: each model under ``deepspeed.initialize`` with its
trainer's own DeepSpeed config, in the process group that
:func:`cascade.training.launch.init_distributed` joins (NCCL on a GPU, gloo on the CPU).

    cascade bench gpu-check --out gpu_check.json            # the full check (a GPU)
    cascade bench gpu-check --out gpu_check.json --quick    # CPU smoke: debug configs

Per model (the pre-ranker of the FSCD cascade, the ConvDFSMN ASR model, the image-text MoE
transformer), at its registry's training size (``--quick``: its ``debug`` config):

* ``warmup_steps`` then ``timed_steps`` optimizer steps on ONE fixed batch of synthetic inputs
  of the trainer's shapes (the trainer's loss, optimizer, schedule, clipping, ZeRO stage and
  precision), timed in ``runs`` of equal length: ``steps_per_s`` and ``samples_per_s`` from the
  median run, ``loss_first`` / ``loss_last`` (a fixed batch: the loss must fall), peak device
  memory, and FLOPs per step (forward + backward, optimizer excluded) counted with
  :class:`torch.utils.flop_counter.FlopCounterMode`, as executed: DeepSpeed's MoE runs its
  experts on capacity-sized buffers, so padding slots count. ``mfu`` divides the achieved
  FLOP/s by the dense bf16 peak of an H100 SXM, :data:`PEAK_BF16_FLOPS` (989 TFLOP/s), whatever
  precision ran (``precision`` says which); ``mfu_dtype_peak`` by the device's peak in that
  precision, and the MoE model's ``mfu_6nd`` counts 6 x active parameters x tokens instead
  (the convention of :mod:`benchmarks.multimodal_moe`);
* ``trainer_loop``: a few steps of the trainer's own loop (its ``run_steps`` / ``train_phase``),
  which moves each batch to the engine's device, so a trainer that feeds a GPU engine CPU
  tensors fails here.

Besides: ``collectives`` (a CPU tensor all-reduced straight through the process group, and through
:func:`cascade.training.launch.all_reduced`; NCCL refuses the first) and ``inductor``: the
pre-ranker's request path (:meth:`ColdPreRanker.score_request`, 1 user x 1,000 candidates)
eager against ``torch.compile`` (``--quick``: the ``aot_eager`` backend, no C++ or Triton
build), max abs difference of the scores and ms per request.

It imports no part of the local stack (MLflow, Spark, Feast): a bare GPU machine with torch,
DeepSpeed and pydantic runs it. A failing section is recorded (``error``) and the others still
run; the JSON is rewritten after each section, so a run cut short leaves what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.multimodal_moe import PEAK_FLOPS, peak_flops

PEAK_BF16_FLOPS = PEAK_FLOPS["H100"]
"""Dense bf16 tensor-core peak of an H100 SXM, 989 TFLOP/s (NVIDIA's figure, no sparsity)."""
CANDIDATES = 1_000
"""Candidates of the inference check's request (one user)."""
ERROR_LINES = 12
"""Last lines of a section's traceback kept in the result."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """How long each model trains and what is compared."""

    quick: bool
    warmup_steps: int
    runs: int
    steps_per_run: int
    loop_steps: int
    """Steps of each trainer-loop smoke."""
    preranking: str
    asr: str
    multimodal: str
    inference_repeats: int
    inference_calls: int

    @property
    def timed_steps(self) -> int:
        return self.runs * self.steps_per_run

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.timed_steps


def plan_for(quick: bool) -> Plan:
    if quick:
        return Plan(
            quick=True, warmup_steps=2, runs=3, steps_per_run=2, loop_steps=2,
            preranking="debug", asr="debug", multimodal="debug",
            inference_repeats=3, inference_calls=3,
        )  # fmt: skip
    return Plan(
        quick=False, warmup_steps=20, runs=5, steps_per_run=10, loop_steps=3,
        preranking="generated", asr="synthetic", multimodal="base",
        inference_repeats=5, inference_calls=100,
    )  # fmt: skip


# --- measuring ----------------------------------------------------------------------------


def device() -> torch.device:
    return (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else (torch.device("cpu"))
    )


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def error_record(exc: BaseException) -> dict[str, Any]:
    lines = traceback.format_exception(exc)
    return {"error": f"{type(exc).__name__}: {exc}", "traceback": "".join(lines[-ERROR_LINES:])}


@contextlib.contextmanager
def section_memory() -> Iterator[dict[str, Any]]:
    """Peak device memory of the block: ``peak_memory_bytes`` (what was allocated at the peak,
    the block's own allocations plus what was held when it started) and ``memory_at_start_bytes``;
    None on the CPU."""
    record: dict[str, Any] = {"peak_memory_bytes": None, "memory_at_start_bytes": None}
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        record["memory_at_start_bytes"] = torch.cuda.memory_allocated()
    yield record
    if torch.cuda.is_available():
        synchronize()
        record["peak_memory_bytes"] = torch.cuda.max_memory_allocated()


def train_fixed_batch(step: Callable[[], torch.Tensor], plan: Plan, batch: int) -> dict[str, Any]:
    """``plan.warmup_steps`` then ``plan.runs`` timed runs of ``plan.steps_per_run`` calls of
    ``step`` (one optimizer step; returns the detached loss). Losses are read after the runs,
    so the timed steps sync only where the step itself does."""
    losses: list[torch.Tensor] = [step() for _ in range(plan.warmup_steps)]
    seconds: list[float] = []
    for _ in range(plan.runs):
        synchronize()
        began = time.perf_counter()
        losses += [step() for _ in range(plan.steps_per_run)]
        synchronize()
        seconds.append(time.perf_counter() - began)
    values = [float(v) for v in losses]
    step_s = statistics.median(seconds) / plan.steps_per_run
    return {
        "batch_size": batch,
        "warmup_steps": plan.warmup_steps,
        "timed_steps": plan.timed_steps,
        "step_ms_runs": [1e3 * s / plan.steps_per_run for s in seconds],
        "steps_per_s": 1.0 / step_s,
        "samples_per_s": batch / step_s,
        "loss_first": values[0],
        "loss_last": values[-1],
        "loss_fell": values[-1] < values[0],
        "losses": values,
    }


def engine_steps(
    engine: Any, loss_of: Callable[[], torch.Tensor], after_step: Callable[[], None] | None = None
) -> tuple[Callable[[], torch.Tensor], Callable[[], torch.Tensor]]:
    """``(forward_backward, step)`` of ``engine`` on the loss ``loss_of()`` computes: the
    forward and backward pass (returns the loss), and one optimizer step after it (returns the
    detached loss; ``after_step`` runs after each)."""

    def forward_backward() -> torch.Tensor:
        loss = loss_of()
        engine.backward(loss)
        return loss

    def step() -> torch.Tensor:
        loss = forward_backward()
        engine.step()
        if after_step is not None:
            after_step()
        return loss.detach()

    return forward_backward, step


def counted_flops(engine: Any, forward_backward: Callable[[], Any]) -> int:
    """FLOPs of one call of ``forward_backward`` as executed, by FlopCounterMode; the engine
    then steps on the gradients that call left."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        forward_backward()
    engine.step()
    return int(counter.get_total_flops())


def add_utilization(
    result: dict[str, Any], flops_per_step: int, analytic_flops_per_step: float | None = None
) -> None:
    """``mfu``: counted FLOPs x steps/s over :data:`PEAK_BF16_FLOPS`; ``mfu_dtype_peak``: the
    same over this device's dense peak in the precision that ran (the convention of
    :mod:`benchmarks.multimodal_moe`; None off a known GPU); ``mfu_6nd``: with the analytic
    6 x active parameters x tokens instead of the counted FLOPs, when given."""
    achieved = flops_per_step * result["steps_per_s"]
    result["flops_per_step"] = flops_per_step
    result["flops_counted_by"] = "torch.utils.flop_counter.FlopCounterMode, forward + backward"
    result["achieved_tflops"] = achieved / 1e12
    result["mfu"] = achieved / PEAK_BF16_FLOPS
    result["mfu_peak"] = f"H100 SXM dense bf16, {PEAK_BF16_FLOPS / 1e12:g} TFLOP/s"
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    dtype_peak = peak_flops(name, result["precision"]) if name else None
    result["mfu_dtype_peak_flops"] = dtype_peak
    result["mfu_dtype_peak"] = achieved / dtype_peak if dtype_peak else None
    if analytic_flops_per_step is not None:
        result["flops_per_step_6nd"] = analytic_flops_per_step
        result["mfu_6nd"] = analytic_flops_per_step * result["steps_per_s"] / PEAK_BF16_FLOPS


def accelerator_bf16() -> bool:
    from deepspeed.accelerator import get_accelerator

    return bool(get_accelerator().is_bf16_supported())


def engine_facts(engine: Any, ds_config: dict[str, Any]) -> dict[str, Any]:
    parameters = sum(p.numel() for p in engine.module.parameters())
    return {
        "precision": "bf16" if engine.bfloat16_enabled() else "fp32",
        "zero_stage": int(ds_config.get("zero_optimization", {}).get("stage", 0)),
        "optimizer": type(engine.optimizer).__name__,
        "deepspeed_config": ds_config,
        "parameters": parameters,
        "engine_device": str(engine.device),
    }


def release() -> None:
    """Return what the last section's engines held to the device."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# --- the pre-ranker -----------------------------------------------------------------------


def preranking_cardinalities(field_set: Any, bins: int) -> list[int]:
    """Codes per field as a MovieLens-100k-sized encoder has them: 943 users, 1,682 items, 19
    genres (each + the unknown code), ``bins`` quantile bins (+ unknown, + overflow) per
    statistic."""
    named = {"user_id": 944, "item_id": 1683, "genre": 20}
    return [named.get(spec.name, bins + 2) for spec in field_set]


def preranking_batch(
    cards: list[int], rows: int, seed: int, field_set: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes ``[rows, F]`` and clicks drawn from a logistic model of per-code weights. A cross
    field (user x genre statistics) takes its code from the row's genre through a table per
    field, so one user's candidates have as many cross keys as genres."""
    rng = np.random.default_rng(seed)
    codes = np.stack([rng.integers(0, c, rows) for c in cards], axis=1)
    genre = field_set.names.index("genre")
    for j, spec in enumerate(field_set):
        if spec.kind == "cross":
            codes[:, j] = rng.integers(0, cards[j], cards[genre])[codes[:, genre]]
    logit = sum(rng.normal(0, 0.6, c)[codes[:, j]] for j, c in enumerate(cards)) - 1.0
    clicks = rng.random(rows) < 1 / (1 + np.exp(-logit))
    return torch.from_numpy(codes).long(), torch.from_numpy(clicks.astype(np.float32))


def check_preranking(plan: Plan, results: dict[str, Any]) -> None:
    """The FSCD select phase (gated ColdPreRanker, gate noise per step) with the cascade's
    engine (:func:`models.preranking.fscd_phases.make_engine`), then the inference check."""
    from torch import nn

    from models.preranking import fscd_phases as phases
    from models.preranking.config_registry import get_cascade_config
    from models.preranking.fields import FIELDS

    config = get_cascade_config(plan.preranking)
    cards = preranking_cardinalities(FIELDS, config.bins)
    codes, labels = preranking_batch(cards, config.batch_size, config.seed, FIELDS)
    # The trainer's loop takes its own batches: enough rows for plan.loop_steps of them.
    loop_rows = preranking_batch(cards, config.batch_size * plan.loop_steps, config.seed, FIELDS)
    result: dict[str, Any] = {
        "model": "ColdPreRanker (FSCD select phase: gated, relaxed-Bernoulli gate noise)",
        "config": config.name,
        "fields": len(cards),
    }
    results["preranking"] = result
    with section_memory() as memory:
        torch.manual_seed(config.seed)
        model = phases.build_network("select", config, cards)
        engine = phases.make_engine(model, config)
        # What make_engine passed to deepspeed.initialize.
        ds_config = phases.deepspeed_config(config, bf16_supported=accelerator_bf16())
        result |= engine_facts(engine, ds_config)
        engine.train()
        on_device = codes.to(engine.device), labels.to(engine.device)
        loss_fn = nn.BCEWithLogitsLoss()
        counter = {"step": 0}

        def loss_of() -> torch.Tensor:
            noise = phases.gate_noise(
                tuple(codes.shape), seed=config.seed, step=counter["step"], rank=0
            ).to(engine.device)
            return loss_fn(engine(on_device[0], noise).float(), on_device[1])

        def next_noise() -> None:
            counter["step"] += 1

        forward_backward, step = engine_steps(engine, loss_of, next_noise)
        result |= train_fixed_batch(step, plan, config.batch_size)
    result |= memory
    add_utilization(result, counted_flops(engine, forward_backward))
    result["trainer_loop"] = trainer_loop(
        lambda: phases.run_steps(engine, *loop_rows, config, gated=True, max_steps=plan.loop_steps)
    )
    state = {k: v.detach().float() if v.is_floating_point() else v for k, v in
             engine.module.state_dict().items()}  # fmt: skip
    try:
        results["inductor"] = check_inductor(plan, config, cards, state)
    except Exception as exc:  # noqa: BLE001 - recorded, the other sections still run
        results["inductor"] = error_record(exc)


def trainer_loop(run: Callable[[], Any]) -> dict[str, Any]:
    try:
        began = time.perf_counter()
        steps = run()
        return {"ok": True, "steps": steps, "seconds": time.perf_counter() - began}
    except Exception as exc:  # noqa: BLE001 - the finding is the error itself
        return {"ok": False} | error_record(exc)


def check_inductor(
    plan: Plan, config: Any, cards: list[int], state: dict[str, torch.Tensor]
) -> dict[str, Any]:
    """One request (1 user x :data:`CANDIDATES`) scored by the trained pre-ranker (fp32, eval:
    hard gates) eager and compiled; ms per request, the median of timed runs."""
    from models.preranking import fscd_phases as phases
    from models.preranking.fields import FIELDS
    from models.preranking.model import cross_keys

    where = device()
    model = phases.build_network("select", config, cards)
    model.load_state_dict(state)
    model = model.to(where).eval()
    codes, _ = preranking_batch(cards, CANDIDATES + 1, config.seed + 1, FIELDS)
    codes = codes.to(where)
    user, candidates = codes[0], codes[1:]
    cross, rows = cross_keys(model, candidates)
    request = (user, candidates, cross, rows)

    def timed(score: Callable[..., torch.Tensor]) -> list[float]:
        runs = []
        for _ in range(plan.inference_repeats):
            synchronize()
            began = time.perf_counter()
            for _ in range(plan.inference_calls):
                score(*request)
            synchronize()
            runs.append(1e3 * (time.perf_counter() - began) / plan.inference_calls)
        return runs

    backends = [("aot_eager", {"backend": "aot_eager"})] if plan.quick else [
        ("inductor", {}),
        ("inductor_reduce_overhead", {"mode": "reduce-overhead"}),
    ]  # fmt: skip
    result: dict[str, Any] = {
        "model": "ColdPreRanker.score_request (fp32, eval)",
        "request": f"1 user x {CANDIDATES} candidates, {int(cross.shape[0])} cross keys",
        "device": str(where),
    }
    with torch.inference_mode():
        eager = model.score_request(*request)
        for _ in range(3):
            model.score_request(*request)
        result["eager_ms_runs"] = timed(model.score_request)
        result["eager_ms"] = statistics.median(result["eager_ms_runs"])
        for name, options in backends:
            entry: dict[str, Any] = {"options": options or "torch.compile defaults"}
            try:
                torch._dynamo.reset()
                compiled = torch.compile(model.score_request, **options)
                began = time.perf_counter()
                scores = compiled(*request).clone()  # CUDA graphs reuse their outputs
                synchronize()
                entry["compile_s"] = time.perf_counter() - began
                entry["max_abs_diff_vs_eager"] = float((scores - eager).abs().max())
                entry["max_abs_score"] = float(eager.abs().max())
                for _ in range(3):
                    compiled(*request)
                entry["ms_runs"] = timed(compiled)
                entry["ms"] = statistics.median(entry["ms_runs"])
                entry["speedup_vs_eager"] = result["eager_ms"] / entry["ms"]
            except Exception as exc:  # noqa: BLE001 - one backend failing is a finding
                entry |= error_record(exc)
            result[name] = entry
    return result


# --- ASR ----------------------------------------------------------------------------------


def asr_utterances(config: Any, count: int, seed: int) -> Any:
    """``count`` synthetic utterances of 2.5 to 4 s (log-mel-like features, float16 as a corpus
    stores them) with transcripts of 25 to 45 characters (ids of the config's output layer, no
    blank)."""
    from models.asr.corpus import Utterances

    rng = np.random.default_rng(seed)
    n_mels = config.model.n_mels
    frames = rng.integers(250, 401, count)
    chars = rng.integers(25, 46, count)
    return Utterances(
        ids=[f"utt-{i}" for i in range(count)],
        texts=["" for _ in range(count)],
        languages=["en" for _ in range(count)],
        voices=["synthetic" for _ in range(count)],
        features=[
            torch.from_numpy(rng.normal(-4.0, 2.0, (int(t), n_mels)).astype(np.float16))
            for t in frames
        ],
        targets=[
            torch.from_numpy(rng.integers(1, config.model.vocab_size, int(c))).long() for c in chars
        ],
        n_mels=n_mels,
    )


def check_asr(plan: Plan, results: dict[str, Any]) -> None:
    """The fp32 phase's step (CTC, Adam, warm-up/decay, clipping, ZeRO stage of the config) on
    one fixed batch; then both phases (fp32, then QAT with the distillation teacher) through
    :func:`models.asr.train.train_phase` for a few steps."""
    import deepspeed

    from models.asr import train as asr_train
    from models.asr.config_registry import get_config
    from models.asr.corpus import collate

    config = get_config(plan.asr)
    data = asr_utterances(config, 2 * config.batch_size, seed=config.seed)
    batch = collate(data, np.arange(config.batch_size))
    result: dict[str, Any] = {
        "model": "ConvDFSMN (CTC), fp32 phase",
        "config": config.name,
        "frames_per_batch": int(batch.lengths.sum()),
    }
    results["asr"] = result
    with section_memory() as memory:
        model = asr_train.build_model(config, data.n_mels)
        ds_config = asr_train.deepspeed_config(config, lr=config.lr, steps=plan.total_steps)
        engine, _, _, _ = deepspeed.initialize(
            model=model,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=ds_config,
        )
        result |= engine_facts(engine, ds_config)
        result["bf16_in_config"] = False
        engine.train()
        on_device = batch.to(engine.device)
        module = engine.module

        def loss_of() -> torch.Tensor:
            log_probs = engine(on_device.features)
            return asr_train.ctc(log_probs, on_device, module.output_lengths(on_device.lengths))

        forward_backward, step = engine_steps(engine, loss_of)
        result |= train_fixed_batch(step, plan, config.batch_size)
    result |= memory
    add_utilization(result, counted_flops(engine, forward_backward))

    def both_phases() -> dict[str, int]:
        short = dataclasses.replace(config, fp32_steps=plan.loop_steps, qat_steps=plan.loop_steps)
        done = {}
        with tempfile.TemporaryDirectory() as out:
            for phase in asr_train.phase_plans(short):
                asr_train.train_phase(phase, short, data, Path(out), log=lambda *_: None)
                done[phase.name] = phase.steps
        return done

    result["trainer_loop"] = trainer_loop(both_phases)


# --- the multimodal MoE model ---------------------------------------------------------------


def check_multimodal(plan: Plan, results: dict[str, Any]) -> None:
    """The MoE transformer as its trainer builds it (:func:`models.multimodal.train.make_engine`:
    expert parameter groups, the trainer's DeepSpeed config), then the same with bf16 switched
    on in that config (a variant: the trainer's config has no bf16 section), at the config's batch
    and at 8x it."""
    from models.multimodal import train as mm_train
    from models.multimodal.config_registry import get_config
    from models.multimodal.evaluate import retrieval_metrics
    from models.multimodal.pairs import generate_pairs

    config = get_config(plan.multimodal)
    variants: list[tuple[str, Any, bool]] = [("as_trained", config, False)]
    if not plan.quick:
        variants += [
            ("bf16", config, True),
            ("bf16_batch_x8", dataclasses.replace(config, batch_size=8 * config.batch_size), True),
        ]
    largest = max(v.batch_size for _, v, _ in variants)
    pairs = generate_pairs(
        largest * 10 // 8 + 10, "train", max_tokens=config.model.max_tokens, seed=config.seed
    )
    test = generate_pairs(
        10 * config.batch_size, "test", max_tokens=config.model.max_tokens, seed=config.seed
    )
    results["multimodal"] = {"model": "ImageTextTransformer (MoE, expert prototyping)"}
    engine = None
    for name, variant, bf16 in variants:
        result: dict[str, Any] = {"config": variant.name, "variant": name}
        results["multimodal"][name] = result
        try:
            trained = check_multimodal_variant(variant, bf16, pairs, plan, result)
        except Exception as exc:  # noqa: BLE001 - recorded, the other variants still run
            result |= error_record(exc)
            continue
        if engine is None:  # the trainer's own engine: the trainer-loop smoke runs on it
            engine = trained
        else:
            del trained
    if engine is not None:
        first = dataclasses.replace(config, log_every=1)
        result = results["multimodal"]["as_trained"]
        result["trainer_loop"] = trainer_loop(
            lambda: mm_train.run_steps(
                engine, pairs, first, start_step=0, stop_step=plan.loop_steps,
                log=lambda *_: None,
            )
        )  # fmt: skip
        try:
            result["retrieval_metrics"] = retrieval_metrics(engine.module, test)
        except Exception as exc:  # noqa: BLE001
            result["retrieval_metrics"] = error_record(exc)


def check_multimodal_variant(
    config: Any, bf16: bool, pairs: Any, plan: Plan, result: dict[str, Any]
) -> Any:
    """Train one variant (see :func:`check_multimodal`) into ``result``; returns its engine."""
    import deepspeed
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    from models.multimodal import train as mm_train
    from models.multimodal.model import objective, parameter_counts

    config = dataclasses.replace(config, steps=plan.total_steps)
    with section_memory() as memory:
        model = mm_train.build_model(config, world=1)
        ds_config = mm_train.deepspeed_config(config)
        if bf16:
            ds_config["bf16"] = {"enabled": True}
            groups = split_params_into_different_moe_groups_for_optimizer(
                [{"params": [p for p in model.parameters() if p.requires_grad], "name": "params"}]
            )
            engine, _, _, _ = deepspeed.initialize(
                model=model, model_parameters=groups, config=ds_config
            )
        else:
            engine = mm_train.make_engine(model, config)
        result |= engine_facts(engine, ds_config)
        counts = parameter_counts(engine.module)
        sequence = config.model.patches + 2 * config.model.max_tokens
        result["parameter_counts"] = counts
        result["tokens_per_sample"] = sequence
        engine.train()
        images = pairs.images[: config.batch_size].to(engine.device)
        tokens = pairs.tokens[: config.batch_size].to(engine.device)
        module = engine.module

        def loss_of() -> torch.Tensor:
            return objective(module, engine(images, tokens), tokens)[0]

        forward_backward, step = engine_steps(engine, loss_of)
        result |= train_fixed_batch(step, plan, config.batch_size)
    result |= memory
    six_nd = 6.0 * counts["active"] * sequence * config.batch_size
    add_utilization(result, counted_flops(engine, forward_backward), six_nd)
    return engine


# --- collectives --------------------------------------------------------------------------


def check_collectives() -> dict[str, Any]:
    """A CPU tensor all-reduced through the process group directly (what the trainers did)
    and through :func:`cascade.training.launch.all_reduced` (what they do)."""
    import torch.distributed as dist

    from cascade.training.launch import all_reduced, collective_device

    result: dict[str, Any] = {"collective_device": str(collective_device())}
    try:
        value = torch.tensor([1.5], dtype=torch.float64)
        dist.all_reduce(value)
        result["cpu_tensor_direct"] = {"ok": True, "value": float(value)}
    except Exception as exc:  # noqa: BLE001 - the refusal is the finding
        result["cpu_tensor_direct"] = {"ok": False} | error_record(exc)
    try:
        value = torch.tensor([1.5], dtype=torch.float64, device=collective_device())
        dist.all_reduce(value)
        result["on_collective_device"] = {"ok": True, "value": float(value)}
        result["all_reduced_helper"] = {
            "ok": True,
            "value": float(all_reduced(torch.tensor([1.5], dtype=torch.float64))),
        }
    except Exception as exc:  # noqa: BLE001
        result["on_collective_device"] = {"ok": False} | error_record(exc)
    return result


# --- the run ------------------------------------------------------------------------------


def environment() -> dict[str, Any]:
    import deepspeed
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator

    cuda = torch.cuda.is_available()
    return {
        "backend": dist.get_backend(),
        "world_size": dist.get_world_size(),
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "deepspeed": deepspeed.__version__,
        "deepspeed_accelerator": get_accelerator().device_name(),
        "bf16_supported": bool(get_accelerator().is_bf16_supported()),
        "nccl": nccl_version() if cuda else None,
    }


def nccl_version() -> str:
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def stamp(result: dict[str, Any], plan: Plan, source_commit: str | None) -> dict[str, Any]:
    from benchmarks.provenance import provenance

    parameters = dataclasses.asdict(plan)
    generators = ["benchmarks.gpu_check", "models.multimodal.pairs"]
    stamped = dict(result)
    for key, value in provenance(result, generators=generators, parameters=parameters).items():
        stamped.setdefault(key, value)
    if source_commit:
        # Run from an exported copy of the tree (no git there): the commit it was exported from.
        stamped["git_commit"] = source_commit
        stamped["git_dirty"] = False
        stamped["git_commit_source"] = "--source-commit"
    return stamped


def run(out: Path, *, quick: bool, source_commit: str | None = None) -> dict[str, Any]:
    from cascade.training.launch import init_distributed

    os.environ.setdefault("DS_BUILD_OPS", "0")
    init_distributed()
    plan = plan_for(quick)
    result: dict[str, Any] = {"benchmark": "gpu_check", "quick": quick}

    def save() -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        stamped = stamp(result, plan, source_commit)
        out.write_text(json.dumps(stamped, indent=2, default=str))

    began = time.perf_counter()
    result["environment"] = environment()
    result["collectives"] = check_collectives()
    save()
    for name, check in (
        ("preranking", check_preranking),
        ("asr", check_asr),
        ("multimodal", check_multimodal),
    ):
        try:
            check(plan, result)
        except Exception as exc:  # noqa: BLE001 - recorded, the other models still run
            result.setdefault(name, {}).update(error_record(exc))
        release()
        print(f"[gpu_check] {name} done at {time.perf_counter() - began:.1f} s", flush=True)
        save()
    result["seconds"] = time.perf_counter() - began
    save()
    return stamp(result, plan, source_commit)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="result JSON")
    parser.add_argument("--quick", action="store_true", help="debug configs, a few steps (CPU)")
    parser.add_argument(
        "--source-commit",
        help="the commit this tree was exported from, when it runs outside a git checkout",
    )
    args = parser.parse_args(argv)
    result = run(args.out, quick=args.quick, source_commit=args.source_commit)
    env = result["environment"]
    print(f"[gpu_check] {env['device']} backend={env['backend']} -> {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
