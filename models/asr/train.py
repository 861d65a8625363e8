"""DeepSpeed training of the ConvDFSMN ASR model: fp32 with CTC, then RSQ int8 QAT with
distillation; MLflow logging, resumable checkpoints, both model files and the evaluation.

    cascade asr train --config debug --corpus CORPUS --out OUT     # 2 processes

starts ``--processes`` (default: the settings' ``train_processes``, 2) workers under
``torch.distributed.run`` (gloo on CPU, NCCL on GPU); the same module is the worker::

    DS_ACCELERATOR=cpu python -m torch.distributed.run --nproc_per_node 2 \\
        -m models.asr.train --config synthetic --corpus CORPUS --out OUT

Make a corpus with the corpus job (``cascade asr synthesize --count 8000 --landing L``
then ``build --landing L --out CORPUS``). From Python (the DAG's step) call :func:`train_asr`.

The output alphabet is fitted from the normalized transcripts of the utterances the run trains
on (:meth:`models.asr.model.Alphabet.fit`: any script, digits included, each language's
characters), and the config's output layer sized to it; both model files store it
(``asr_model.vocabulary.json``, :mod:`models.asr.artifact`), and the result reports it
(``alphabet``) with the test and dev characters it lacks (``unseen``, counted as errors).

Phases, each a DeepSpeed run of its own: ``fp32`` (CTC loss, SpecAugment, warm-up then linear
decay) and ``qat``: the fp32 weights with every Linear/Conv1d range-scale fake-quantized to int8
(:mod:`models.asr.rsq`), trained on ``(1 - a) * CTC + a * KL(fp32 teacher || student)``; the
activation ranges follow an EMA, then stay fixed for the last part of the phase. Every
``checkpoint_every`` steps a phase saves a DeepSpeed checkpoint under ``OUT/checkpoints/PHASE``;
a finished phase leaves ``OUT/phases/PHASE/model.pt``. Started again with the same ``--out``,
config and corpus, a run skips finished phases and resumes the current one; batches, dropout and
augmentation are functions of (seed, step, rank), so it ends with the same weights and metrics.

Rank 0 then writes ``OUT/fp32/asr_model.pt`` and ``OUT/int8/asr_model.pt``
(:mod:`models.asr.artifact`; the int8 one holds the QAT weights and ``quantization`` with the
activation ranges), evaluates both on the test split's unseen voices
(:mod:`models.asr.evaluate`), and logs params, per-step losses, CER/WER, the evaluation with its
confusion summary and both files to the MLflow experiment ``asr``; ``OUT/result.json`` holds the
headline figures and paths. When the tracking server does not answer, the command line logs to
a SQLite store in ``OUT`` and says so in one line; the pipeline's train step
(:func:`train_asr` without ``local_tracking``) fails in one line before starting processes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn import functional as F

from cascade.config import Settings, load_settings
from cascade.progress import Progress
from cascade.results import write_result
from cascade.training.checkpoints import (
    CHECKPOINTS,
    consolidated_state_dict,
    exists_on_every_rank,
    fingerprint,
    keep_only_run,
    resume_step,
    save_finished_state,
    save_latest_checkpoint,
)
from cascade.training.crash_points import crash_if_due, crash_point
from cascade.training.curves import CURVES_DIR, CurveLog
from cascade.training.deepspeed_config import deepspeed_config as build_deepspeed_config
from cascade.training.deepspeed_config import warmup_decay_scheduler
from cascade.training.launch import (
    all_reduced,
    init_distributed,
    launch_for_result,
    rank_world,
)
from cascade.training.resumable_run import (
    RUN_MARKER,
    TrackingUnavailable,
    failed_on_error,
    open_resumable_run,
    reachable_tracking,
)
from models.asr.artifact import AsrArtifact, artifact_files, save_artifact
from models.asr.config_registry import CONFIGS, AsrTrainConfig, get_config
from models.asr.corpus import (
    Batch,
    Utterances,
    collate,
    corpus_n_mels,
    epoch_batches,
    load_split,
    source_of,
)
from models.asr.language_id import train_language_identifier
from models.asr.language_model import fit_corpus
from models.asr.model import BLANK, Alphabet, ConvDFSMN
from models.asr.rsq import (
    distillation_loss,
    float_state_dict,
    freeze_batch_norm,
    prepare_qat,
    quantization_record,
    set_range_tracking,
)

EXPERIMENT = "asr"
PHASES = ("fp32", "qat")
RESULT_KEYS = ("run_id", "config", "fp32_artifact", "int8_artifact", "cer_fp32", "cer_int8")
"""Keys every complete ``result.json`` carries."""


# --- the training loop --------------------------------------------------------------------


def deepspeed_config(config: AsrTrainConfig, *, lr: float, steps: int) -> dict[str, Any]:
    """One phase's DeepSpeed config: Adam, linear warm-up then linear decay to 0 over ``steps``
    (the scheduler is checkpointed with the optimizer, so a resumed phase keeps its rate)."""
    return build_deepspeed_config(
        micro_batch_size=config.batch_size,
        lr=lr,
        weight_decay=config.weight_decay,
        zero_stage=config.zero_stage,
        gradient_clipping=config.gradient_clipping,
        scheduler=warmup_decay_scheduler(lr=lr, steps=steps, warmup_steps=config.warmup_steps),
        throughput_timer=False,
    )


def ctc(log_probs: torch.Tensor, batch: Batch, output_lengths: torch.Tensor) -> torch.Tensor:
    return F.ctc_loss(
        log_probs.transpose(0, 1),
        batch.targets,
        output_lengths,
        batch.target_lengths,
        blank=BLANK,
        zero_infinity=True,
    )


@dataclass(frozen=True)
class PhasePlan:
    name: str
    steps: int
    lr: float
    offset: int
    """Separates the seeds of the phases."""


def phase_plans(config: AsrTrainConfig) -> list[PhasePlan]:
    return [
        PhasePlan("fp32", config.fp32_steps, config.lr, 0),
        PhasePlan("qat", config.qat_steps, config.qat_lr, 1),
    ]


def run_steps(
    engine: Any,
    data: Utterances,
    config: AsrTrainConfig,
    plan: PhasePlan,
    loss_of: Callable[[Batch], tuple[torch.Tensor, dict[str, float]]],
    *,
    start_step: int,
    checkpoint: Callable[[int], None],
    log: Callable[[int, dict[str, float]], None],
    before_step: Callable[[int], None] | None = None,
) -> int:
    """Steps ``start_step .. plan.steps`` of one phase; each rank takes its own batch of the
    epoch's bucketed order, a function of (seed, epoch) only."""
    rank, world = rank_world()
    lengths = data.lengths
    first = epoch_batches(
        lengths, batch_size=config.batch_size, pool_batches=config.bucket_batches,
        seed=config.seed, epoch=0,
    )  # fmt: skip
    steps_per_epoch = len(first) // world
    if steps_per_epoch < 1:
        raise ValueError(
            f"{len(data)} training utterances make {len(first)} batches of "
            f"{config.batch_size}: too few for {world} processes"
        )
    crash = crash_point()
    batches, batches_epoch = first, 0
    step = start_step
    window: list[float] = []
    progress = Progress(plan.steps - step, desc=f"asr {plan.name}", unit="step", enabled=rank == 0)
    while step < plan.steps:
        epoch, within = divmod(step, steps_per_epoch)
        if epoch != batches_epoch:
            batches = epoch_batches(
                lengths, batch_size=config.batch_size, pool_batches=config.bucket_batches,
                seed=config.seed, epoch=epoch,
            )  # fmt: skip
            batches_epoch = epoch
        seed = config.seed * 1_000_003 + plan.offset * 100_000_007 + step * world + rank
        torch.manual_seed(seed)
        augmenting = config.spec_augment or config.augmentation.enabled
        rng = np.random.default_rng(seed) if augmenting else None
        batch = collate(
            data,
            batches[within * world + rank],
            rng,
            config.augmentation,
            spec_augment=config.spec_augment,
        ).to(engine.device)
        if before_step is not None:
            before_step(step)
        loss, parts = loss_of(batch)
        engine.backward(loss)
        engine.step()
        step += 1
        progress.update()
        window.append(float(loss.detach()))
        if step % config.log_every == 0 or step == plan.steps:
            values = torch.tensor([float(np.mean(window)), *parts.values()], dtype=torch.float64)
            values = all_reduced(values) / world
            log(
                step,
                {"loss": values[0].item()} | dict(zip(parts, values[1:].tolist(), strict=True)),
            )
            window = []
        if step % config.checkpoint_every == 0 and step < plan.steps:
            checkpoint(step)
        crash_if_due(crash, plan.name, step, rank=rank, who="asr")
    progress.close()
    return step


def build_model(config: AsrTrainConfig, n_mels: int) -> ConvDFSMN:
    if config.model.n_mels != n_mels:
        raise ValueError(
            f"the corpus has {n_mels} mel bins but config {config.name!r} expects "
            f"{config.model.n_mels}; build the corpus with n_mels={config.model.n_mels}"
        )
    torch.manual_seed(config.seed)
    return ConvDFSMN(config.model)


def phase_file(out: Path, phase: str) -> Path:
    return out / "phases" / phase / "model.pt"


def train_phase(
    plan: PhasePlan,
    config: AsrTrainConfig,
    data: Utterances,
    out: Path,
    *,
    log: Callable[[str, int, dict[str, float]], None],
) -> dict[str, torch.Tensor]:
    """Train one phase with DeepSpeed (or load it when already finished); its full state."""
    import deepspeed

    rank, world = rank_world()
    final = phase_file(out, plan.name)
    if exists_on_every_rank(final):
        return dict(torch.load(final, map_location="cpu", weights_only=True))

    model = build_model(config, data.n_mels)
    teacher: ConvDFSMN | None = None
    if plan.name == "qat":
        teacher = build_model(config, data.n_mels)
        teacher.load_state_dict(torch.load(phase_file(out, "fp32"), weights_only=True))
        teacher.eval().requires_grad_(False)
        model.load_state_dict(teacher.state_dict())
        prepare_qat(model, bits=config.bits, momentum=config.range_momentum)
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=deepspeed_config(config, lr=plan.lr, steps=plan.steps),
    )
    if teacher is not None:
        teacher.to(engine.device)  # the engine moved the student there
    ckpt_dir = out / CHECKPOINTS / plan.name
    start = resume_step(engine, ckpt_dir)
    if start and rank == 0:
        print(f"[asr] {plan.name}: resumed at step {start} from {ckpt_dir}", flush=True)
    engine.train()
    module = engine.module
    if teacher is not None:
        freeze_batch_norm(module)  # the int8 model folds BN with these statistics
    freeze_at = int(round(plan.steps * (1.0 - config.qat_freeze_ranges)))
    alpha = config.distill_weight

    def before_step(step: int) -> None:
        if teacher is not None:
            set_range_tracking(module, step < freeze_at)

    def loss_of(batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        log_probs = engine(batch.features, batch.lengths)
        output_lengths = module.output_lengths(batch.lengths)
        ctc_loss = ctc(log_probs, batch, output_lengths)
        if teacher is None:
            return ctc_loss, {}
        with torch.no_grad():
            teacher_log_probs = teacher(batch.features, batch.lengths)
        kl = distillation_loss(
            log_probs, teacher_log_probs, output_lengths, config.distill_temperature
        )
        loss = (1.0 - alpha) * ctc_loss + alpha * kl
        return loss, {"ctc": float(ctc_loss.detach()), "kl": float(kl.detach())}

    def checkpoint(step: int) -> None:
        save_latest_checkpoint(engine, ckpt_dir, step)
        if rank == 0:
            print(f"[asr] {plan.name}: checkpoint step={step} {ckpt_dir}", flush=True)

    steps = run_steps(
        engine,
        data,
        config,
        plan,
        loss_of,
        start_step=start,
        checkpoint=checkpoint,
        log=lambda step, values: log(plan.name, step, values),
        before_step=before_step,
    )
    state = consolidated_state_dict(engine, config.zero_stage)
    if rank == 0:
        assert state is not None
        save_finished_state(final, {k: v.detach().cpu().float() for k, v in state.items()})
        print(f"[asr] {plan.name}: done after {steps} steps (world {world})", flush=True)
    dist.barrier()
    return dict(torch.load(final, map_location="cpu", weights_only=True))


# --- the run ------------------------------------------------------------------------------


def run_fingerprint(config: AsrTrainConfig, corpus: Path) -> str:
    """What checkpoints must match to be resumed: the config and the corpus (its summary)."""
    summary = (corpus / "summary.json").read_text()
    return fingerprint([config.to_dict(), str(corpus.resolve()), summary], sort_keys=True)


def _mlflow_run(
    settings: Settings, out: Path, config: AsrTrainConfig, corpus: Path, alphabet: Alphabet
) -> str:
    """Start the run, or reopen the one an interrupted attempt recorded in ``OUT/RUN_MARKER``."""
    params = config.flat_params() | {
        "corpus": str(corpus),
        "alphabet_size": str(len(alphabet)),
        "alphabet_languages": ",".join(sorted(alphabet.languages)),
        "normalization": str(alphabet.normalization),
    }
    inputs = {f"{corpus.parent.name}/{corpus.name}": corpus}
    return open_resumable_run(
        settings, EXPERIMENT, out / RUN_MARKER, f"asr-{config.name}", params, inputs=inputs
    )


def trained_split(config: AsrTrainConfig, corpus: Path) -> Utterances:
    """The corpus's training split as ``config`` uses it, each utterance once: its first
    ``max_train_utterances`` by id, without the recordings of people unless
    ``config.train_people``; its ``alphabet`` fitted from exactly these transcripts (every
    rank fits the same one: the fit is a function of the rows)."""
    data = load_split(corpus, "train", None, limit=config.max_train_utterances)
    if not config.train_people:
        data = data.subset([source_of(voice) == "synthetic" for voice in data.voices])
        data = data.encoded(None)
    if len(data) == 0:
        raise ValueError(f"{corpus} has no training utterances for config {config.name!r}")
    return data


def people_repeats(people: int, others: int, share: float) -> int:
    """How many times each of ``people`` recordings is used per epoch beside ``others``
    synthetic utterances so that people make up at least ``share`` of the epoch: the smallest
    whole number that does (1 when they already do, or when either side is empty)."""
    if share <= 0 or people == 0 or others == 0 or people >= share * (people + others):
        return 1
    return max(1, math.ceil(share * others / ((1.0 - share) * people) - 1e-9))


def with_people_share(data: Utterances, share: float) -> Utterances:
    """``data`` with each recording of a person repeated :func:`people_repeats` times (shared
    features: the repeats differ only by the augmentation each draw gets), in id order."""
    people = [source_of(voice) == "people" for voice in data.voices]
    repeats = people_repeats(sum(people), len(people) - sum(people), share)
    if repeats == 1:
        return data
    counts = [repeats if person else 1 for person in people]
    return data.take([i for i, count in enumerate(counts) for _ in range(count)])


def describe_alphabet(alphabet: Alphabet) -> dict[str, Any]:
    """What a run reports of its fitted alphabet: size (with the blank), characters per
    language, the normalization, and the characters themselves."""
    return {
        "size": len(alphabet),
        "languages": {k: len(v) for k, v in sorted(alphabet.languages.items())},
        "normalization": alphabet.normalization,
        "characters": "".join(alphabet.characters),
    }


def train(config: AsrTrainConfig, *, corpus: Path, out: Path) -> dict[str, Any] | None:
    """The whole run inside an initialized process group; the result on rank 0."""
    import mlflow

    started = time.monotonic()
    rank, world = rank_world()
    corpus, out = Path(corpus), Path(out)
    n_mels = corpus_n_mels(corpus)
    # Each utterance once (what the language identifier is fitted on), then the epoch's draw
    # with people's recordings repeated to config.people_share.
    split = trained_split(config, corpus)
    data = with_people_share(split, config.people_share)
    assert data.alphabet is not None
    alphabet = data.alphabet
    config = config.sized_for(alphabet)
    if rank == 0 and keep_only_run(
        out, run_fingerprint(config, corpus), (CHECKPOINTS, "phases", RUN_MARKER, CURVES_DIR)
    ):
        print(f"[asr] removed checkpoints and phases of another run from {out}", flush=True)
    dist.barrier()
    settings = load_settings()
    run_id = None
    if rank == 0:
        run_id = _mlflow_run(settings, out, config, corpus, alphabet)
        hours = float(data.lengths.sum()) * 0.01 / 3600
        print(
            f"[asr] config={config.name} world={world} train={len(data)} utterances "
            f"({hours:.2f} h, {len(set(data.voices))} voices) n_mels={n_mels} "
            f"zero={config.zero_stage} mlflow={settings.tracking_uri} run={run_id} "
            f"pid={os.getpid()}",
            flush=True,
        )
        languages = ", ".join(f"{k} {len(v)}" for k, v in sorted(alphabet.languages.items()))
        print(
            f"[asr] alphabet fitted from the training transcripts: {len(alphabet) - 1} "
            f"characters + blank ({languages or 'no language tags'})",
            flush=True,
        )
    clock = {"t": time.monotonic()}
    curves = CurveLog(out)

    def log(phase: str, step: int, values: dict[str, float]) -> None:
        if rank != 0:
            return
        now = time.monotonic()
        rate = config.log_every / max(now - clock["t"], 1e-9)
        clock["t"] = now
        text = " ".join(f"{k}={v:.4f}" for k, v in values.items())
        total = config.fp32_steps if phase == "fp32" else config.qat_steps
        print(f"[asr] {phase} step={step}/{total} {text} {rate:.2f} steps/s", flush=True)
        mlflow.log_metrics({f"{k}.{phase}": v for k, v in values.items()}, step=step)
        curves.add(step, values, phase=phase)

    with failed_on_error(rank):
        states = {
            plan.name: train_phase(plan, config, data, out, log=log) for plan in phase_plans(config)
        }
        result = None
        if rank == 0:
            assert run_id is not None
            result = finish(
                config,
                corpus,
                out,
                states,
                alphabet=alphabet,
                split=split,
                run_id=run_id,
                started=started,
                world=world,
            )
    return result


def finish(
    config: AsrTrainConfig,
    corpus: Path,
    out: Path,
    states: dict[str, dict[str, torch.Tensor]],
    *,
    alphabet: Alphabet,
    split: Utterances,
    run_id: str,
    started: float,
    world: int,
) -> dict[str, Any]:
    """Rank 0: write both model files (with the language identifier fitted on ``split``, the
    training utterances each once), evaluate them on the test split, log everything."""
    import mlflow

    from models.asr.evaluate import evaluate_artifacts, summary_lines

    n_mels = corpus_n_mels(corpus)
    fp32 = build_model(config, n_mels)
    fp32.load_state_dict(states["fp32"])
    student = prepare_qat(build_model(config, n_mels), bits=config.bits)
    student.load_state_dict(states["qat"])
    int8_weights = build_model(config, n_mels)
    int8_weights.load_state_dict(float_state_dict(student))
    meta = {
        "config": config.name,
        "train_config": config.to_dict(),
        "corpus": str(corpus),
        "corpus_fingerprint": run_fingerprint(config, corpus),
        "mlflow_run_id": run_id,
    }
    record = quantization_record(
        student,
        bits=config.bits,
        method="qat",
        qat_steps=config.qat_steps,
        distill_weight=config.distill_weight,
    )
    # Character n-grams of the training transcripts, for decoding a known language, and the
    # identifier that picks the language of an utterance given without one (fitted on the
    # fp32 model's output over the utterances it trained on).
    language_models = fit_corpus(corpus, alphabet.languages)
    identifier = train_language_identifier(fp32, alphabet, split)
    print(
        f"[asr] language identifier: {', '.join(identifier.languages)} "
        f"({len(identifier.mean)} inputs)",
        flush=True,
    )

    def save(
        model: ConvDFSMN, kind: str, quantization: dict[str, Any] | None, extra: dict[str, Any]
    ) -> Path:
        return save_artifact(
            out / kind,
            AsrArtifact(
                model=model.eval(),
                alphabet=alphabet,
                n_mels=n_mels,
                quantization=quantization,
                meta={**meta, "precision": kind, **extra},
                language_models=language_models,
                language_identifier=identifier,
            ),
        )

    fp32_path = save(fp32, "fp32", None, {})
    int8_path = save(int8_weights, "int8", record, {})
    evaluation = evaluate_artifacts(
        fp32_path, int8_path, corpus, split="test", beam=config.eval_beam
    )
    dev = (
        evaluate_artifacts(fp32_path, int8_path, corpus, split="dev")
        if _has_split(corpus, "dev")
        else None
    )
    for line in summary_lines(evaluation):
        print(f"[asr] {line}", flush=True)
    headline = {k: evaluation[k] for k in ("cer_fp32", "wer_fp32", "cer_int8", "wer_int8")}
    # People's recordings (test split only) are reported beside, never in, the headline.
    headline |= {
        k: v
        for k, v in evaluation.items()
        if k.startswith(("cer_human", "wer_human", "cer_people", "wer_people", "foreign_tokens"))
    }
    per_language = {
        f"{kind}_{metric}_{group}": values[metric]
        for kind in ("fp32", "int8")
        for group, values in evaluation[kind]["greedy"]["per_language"].items()
        for metric in ("cer", "wer")
    }
    metrics: dict[str, float] = {
        **headline,
        "int8_cer_delta": evaluation["int8_cer_delta"],
        **per_language,
        "test_utterances": float(evaluation["utterances"]),
        "alphabet_size": float(len(alphabet)),
        "unseen_characters_test": float(evaluation["unseen_characters"]),
        "unseen_utterances_test": float(evaluation["unseen_utterances"]),
        "train_seconds": time.monotonic() - started,
    }
    if config.eval_beam:
        metrics["cer_fp32_beam"] = evaluation["cer_fp32_beam"]
        metrics["cer_int8_beam"] = evaluation["cer_int8_beam"]
    if dev is not None:
        metrics["dev_cer_fp32"], metrics["dev_cer_int8"] = dev["cer_fp32"], dev["cer_int8"]
        metrics["unseen_characters_dev"] = float(dev["unseen_characters"])
    # The files carry their own figures (the serving and compile steps read them from there).
    fp32_path = save(
        fp32, "fp32", None, {"metrics": {"cer": metrics["cer_fp32"], "wer": metrics["wer_fp32"]}}
    )
    int8_path = save(
        int8_weights,
        "int8",
        record,
        {"metrics": {"cer": metrics["cer_int8"], "wer": metrics["wer_int8"]}},
    )
    confusions = {
        kind: {
            "top_confusions": evaluation[kind]["greedy"]["top_confusions"],
            "per_language": {
                g: v["top_confusions"]
                for g, v in evaluation[kind]["greedy"]["per_language"].items()
            },
            "characters": evaluation[kind]["greedy"]["characters"],
        }
        for kind in ("fp32", "int8")
    }
    write_result(out / "evaluation.json", {"test": evaluation, "dev": dev})
    write_result(out / "confusions.json", confusions)
    mlflow.log_metrics(metrics)
    mlflow.log_dict(confusions, "confusions.json")
    mlflow.log_artifact(str(out / "evaluation.json"))
    for kind, path in (("fp32", fp32_path), ("int8", int8_path)):
        for part in artifact_files(path):  # the weights and the fitted vocabulary
            mlflow.log_artifact(str(part), kind)
    result = {
        **metrics,
        "run_id": run_id,
        "config": config.name,
        "corpus": str(corpus),
        "world_size": world,
        "fp32_artifact": str(fp32_path),
        "int8_artifact": str(int8_path),
        "activation_ranges": record["activation_ranges"],
        "alphabet": describe_alphabet(alphabet),
        "unseen": {
            "test": evaluation["unseen"],
            **({} if dev is None else {"dev": dev["unseen"]}),
        },
        "goals": {
            "cer_fp32_at_most_5pct": metrics["cer_fp32"] <= 0.05,
            "int8_within_0.2_points": abs(metrics["int8_cer_delta"]) <= 0.2,
        },
    }
    write_result(out / "result.json", result)
    mlflow.log_artifact(str(out / "result.json"))
    mlflow.end_run()
    # Finished: nothing to resume; a later launch with this out starts afresh.
    shutil.rmtree(out / CHECKPOINTS, ignore_errors=True)
    shutil.rmtree(out / "phases", ignore_errors=True)
    (out / RUN_MARKER).unlink(missing_ok=True)
    print(
        f"[asr] done: CER fp32 {metrics['cer_fp32']:.2%} int8 {metrics['cer_int8']:.2%} "
        f"WER fp32 {metrics['wer_fp32']:.2%} int8 {metrics['wer_int8']:.2%} "
        f"seconds={metrics['train_seconds']:.0f} result={out / 'result.json'}",
        flush=True,
    )
    return result


def _has_split(corpus: Path, split: str) -> bool:
    return any((corpus / "shards" / f"split={split}").glob("*.parquet"))


# --- launching ----------------------------------------------------------------------------


def train_asr(
    settings: Settings | None,
    config_name: str,
    corpus_dir: Path,
    out_dir: Path,
    *,
    processes: int | None = None,
    echo: bool = True,
    local_tracking: bool = False,
) -> dict[str, Any]:
    """Train ``config_name`` on ``corpus_dir`` with ``processes`` (default
    ``settings.train_processes``) DeepSpeed processes; returns ``OUT/result.json``: CER/WER of
    the fp32 and int8 models on the test split, the MLflow run id and both artifact paths.

    A run killed half-way resumes from its checkpoints when called again with the same
    ``out_dir``. When the tracking server does not answer, this fails in one line before any
    process starts, or with ``local_tracking`` (the command line) logs to a SQLite store in
    ``out_dir`` and says so.
    """
    config = get_config(config_name)  # fail fast on a bad name, before starting processes
    settings = settings or load_settings()
    corpus_dir, out_dir = Path(corpus_dir).resolve(), Path(out_dir).resolve()
    corpus_n_mels(corpus_dir)
    if not _has_split(corpus_dir, "train"):
        raise FileNotFoundError(f"{corpus_dir} has no training shards (shards/split=train)")
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = reachable_tracking(settings, out_dir, fallback=local_tracking, who="asr")
    return launch_for_result(
        "models.asr.train",
        ["--config", config.name, "--corpus", str(corpus_dir), "--out", str(out_dir)],
        what=f"ASR training {config.name!r}",
        out_dir=out_dir,
        keys=RESULT_KEYS,
        processes=processes or settings.train_processes,
        settings=settings,
        echo=echo,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, choices=sorted(CONFIGS))
    parser.add_argument("--corpus", required=True, type=Path, help="corpus folder (audio_corpus)")
    parser.add_argument("--out", required=True, type=Path, help="run folder (resumes if present)")
    parser.add_argument(
        "--processes", type=int, default=None, help="workers to start (default: settings)"
    )
    # The deepspeed launcher passes --local_rank; torch.distributed.run sets LOCAL_RANK.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    if "RANK" not in os.environ:
        try:
            result = train_asr(
                None,
                args.config,
                args.corpus,
                args.out,
                processes=args.processes,
                local_tracking=True,
            )
        except TrackingUnavailable as exc:
            raise SystemExit(str(exc)) from None
        print(json.dumps({k: result[k] for k in (*RESULT_KEYS, "wer_fp32", "wer_int8")}, indent=2))
        return 0
    init_distributed()
    train(get_config(args.config), corpus=args.corpus, out=args.out)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
