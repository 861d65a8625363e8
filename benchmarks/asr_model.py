"""The model ``cascade bench asr`` measures: the training config it trains when no model is
given (:func:`training_config_name`), an estimate of how long that training takes
(:func:`estimate_training_s`), and the fp32 and int8 model folders with their provenance,
given or trained now (:func:`obtain_model`). The benchmark is :mod:`benchmarks.asr_path`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.provenance import files_digest, private_tracking
from cascade.config import Settings, load_settings

FULL_CONFIG = "people"
QUICK_CONFIG = "fast"
"""Training configs of ``bench asr`` and ``bench asr --quick`` when no model is given."""
ESTIMATE_STEPS = 3
"""Timed steps of each phase behind the training estimate (after one warm-up step)."""


def training_config_name(quick: bool) -> str:
    """The config ``bench asr`` trains: ``CASCADE_BENCH_ASR_CONFIG``, else :data:`QUICK_CONFIG`
    with ``--quick`` or :data:`FULL_CONFIG`; an unknown name fails here, before any work."""
    from models.asr.config_registry import CONFIGS

    given = load_settings().bench.asr_config
    name = given or (QUICK_CONFIG if quick else FULL_CONFIG)
    if name not in CONFIGS:
        source = (
            "CASCADE_BENCH_ASR_CONFIG"
            if given
            else f"the default of bench asr{' --quick' if quick else ''}"
        )
        raise ValueError(
            f"unknown ASR training config {name!r} ({source}): models.asr.config_registry has "
            f"{', '.join(sorted(CONFIGS))}; set CASCADE_BENCH_ASR_CONFIG to one of them, or "
            "give a trained model with --model"
        )
    return name


def estimate_training_s(
    config_name: str, corpus: Path, processes: int, steps: int = ESTIMATE_STEPS
) -> dict[str, Any]:
    """How long :func:`models.asr.train.train_asr` will train ``config_name`` on ``corpus``:
    ``steps`` fp32 steps and ``steps`` QAT steps (teacher forward, fake quantization,
    distillation) of the config's model and batch size, timed here after a warm-up step with
    the threads each of ``processes`` workers gets, times the config's step counts. Start-up
    and the final evaluation are not included."""
    from compilers.export import torch_threads
    from models.asr.config_registry import get_config
    from models.asr.corpus import collate, epoch_batches, load_split
    from models.asr.rsq import distillation_loss, prepare_qat
    from models.asr.train import build_model, ctc

    config = get_config(config_name)
    pool = config.batch_size * config.bucket_batches
    # The alphabet of these utterances: training fits the corpus's, of about this size.
    data = load_split(corpus, "train", None, limit=min(pool, config.max_train_utterances or pool))
    if len(data) == 0:
        raise ValueError(f"{corpus} has no training utterances to time a step on")
    assert data.alphabet is not None
    config = config.sized_for(data.alphabet)
    batches = epoch_batches(
        data.lengths, batch_size=config.batch_size, pool_batches=config.bucket_batches,
        seed=config.seed, epoch=0,
    )  # fmt: skip
    rng = np.random.default_rng(config.seed)
    threads = max(1, (os.cpu_count() or 1) // processes)

    def timed(model: torch.nn.Module, teacher: torch.nn.Module | None) -> float:
        optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
        seconds = []
        for index in range(steps + 1):
            batch = collate(data, batches[index % len(batches)], rng)
            began = time.perf_counter()
            log_probs = model(batch.features, batch.lengths)
            lengths = model.output_lengths(batch.lengths)  # type: ignore[operator]
            loss = ctc(log_probs, batch, lengths)
            if teacher is not None:
                with torch.no_grad():
                    target = teacher(batch.features, batch.lengths)
                loss = loss + distillation_loss(
                    log_probs, target, lengths, config.distill_temperature
                )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if index:  # the first step warms up
                seconds.append(time.perf_counter() - began)
        return statistics.median(seconds)

    with torch_threads(threads):
        fp32_model = build_model(config, data.n_mels).train()
        fp32_step = timed(fp32_model, None)
        teacher = build_model(config, data.n_mels).eval().requires_grad_(False)
        student = prepare_qat(
            build_model(config, data.n_mels).train(),
            bits=config.bits,
            momentum=config.range_momentum,
        )
        qat_step = timed(student, teacher)
    total = fp32_step * config.fp32_steps + qat_step * config.qat_steps
    return {
        "config": config_name,
        "estimate_s": total,
        "fp32_step_s": fp32_step,
        "qat_step_s": qat_step,
        "fp32_steps": config.fp32_steps,
        "qat_steps": config.qat_steps,
        "processes": processes,
        "threads_per_process": threads,
        "timed_steps": steps,
        "note": "training steps only: start-up and the final evaluation are not included",
    }


def spoken_duration(seconds: float) -> str:
    """``42 s``, ``12.5 min`` or ``1.3 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def corpus_record(
    corpus: Path, distinct: int | None = None, digest: str | None = None
) -> dict[str, Any]:
    """The training corpus as a result names it: folder, utterance counts, digest (``digest``
    when already computed, else :func:`files_digest` of the folder)."""
    from models.asr.corpus import corpus_n_mels

    summary = json.loads((corpus / "summary.json").read_text())
    return {
        "path": str(corpus),
        "utterances": summary.get("utterances"),
        "distinct_utterances": distinct,
        "splits": summary.get("splits"),
        "quarantined": summary.get("quarantined"),
        "recordings": summary.get("recordings"),
        "n_mels": corpus_n_mels(corpus),
        "digest": digest or files_digest([corpus]),
    }


def _model_folder(path: Any) -> Path:
    """The folder of an ``asr_model.pt`` given as the file or its folder."""
    path = Path(path)
    return path.parent if path.suffix == ".pt" else path


def given_training(folder: Path) -> dict[str, Any] | None:
    """What a given model's training wrote about it (``result.json`` of a training's output
    folder, beside or above the model), or None."""
    for candidate in (folder / "result.json", folder.parent / "result.json"):
        if candidate.is_file():
            with contextlib.suppress(ValueError):
                written = json.loads(candidate.read_text())
                keys = ("config", "corpus", "run_id", "cer_fp32", "cer_int8")
                return {k: written.get(k) for k in keys} | {"result": str(candidate)}
    return None


def obtain_model(
    settings: Settings, corpus: Path, work: Path, *, quick: bool = False
) -> tuple[Path, Path, dict[str, Any]]:
    """``(fp32 model folder, int8 model folder, provenance)``.

    ``--model`` serves as both: its ``quantization`` ranges (or calibration) make the int8
    package. Without it, :func:`models.asr.train.train_asr` trains
    :func:`training_config_name` now, after an estimate of how long that takes on stderr; its
    result's ``fp32_artifact`` / ``int8_artifact`` (an ``asr_model.pt`` or its folder; ``fp32``
    / ``int8`` accepted too) are the float model and the quantization-aware one."""
    from models.asr.train import EXPERIMENT as ASR_EXPERIMENT
    from models.asr.train import train_asr

    given = str(load_settings().bench.asr_model or "")
    if given:
        trained_dir = Path(given)
        record = {"source": "given", "path": given, "training": given_training(trained_dir)}
        if (trained_dir / "fp32" / "asr_model.pt").is_file():
            # A training output folder: its fp32 model and its quantization-aware one.
            fp32_dir, int8_dir = trained_dir / "fp32", trained_dir / "int8"
            return fp32_dir, int8_dir, record
        return trained_dir, trained_dir, record
    config_name = training_config_name(quick)
    processes = (settings or load_settings()).train_processes
    estimate = estimate_training_s(config_name, corpus, processes)
    print(
        f"[bench asr] no --model: training config {config_name!r} on {corpus} "
        f"({estimate['fp32_steps']} fp32 + {estimate['qat_steps']} QAT steps, {processes} "
        f"process(es)); estimate: about {spoken_duration(estimate['estimate_s'])} of training "
        f"steps ({estimate['fp32_step_s']:.3f} s per fp32 step, {estimate['qat_step_s']:.3f} s "
        "per QAT step, timed here), plus start-up, DeepSpeed's overhead and the evaluation",
        file=sys.stderr,
        flush=True,
    )
    # A private MLflow store: the benchmark needs no stack, and logs nothing into one.
    started = time.perf_counter()
    with private_tracking(work / "mlflow", (ASR_EXPERIMENT,)) as uri:
        private = dataclasses.replace(settings, mlflow_tracking_uri=uri)
        trained = train_asr(private, config_name, corpus, work / "trained")
    train_s = time.perf_counter() - started
    print(
        f"[bench asr] trained {config_name!r} in {spoken_duration(train_s)} "
        f"(estimate: {spoken_duration(estimate['estimate_s'])} of steps)",
        file=sys.stderr,
        flush=True,
    )
    fp32 = trained.get("fp32_artifact") or trained.get("fp32")
    int8 = trained.get("int8_artifact") or trained.get("int8") or fp32
    if fp32 is None:
        raise RuntimeError(
            f"train_asr returned {sorted(trained)}; expected 'fp32_artifact' (and "
            "'int8_artifact'), the paths of the models it wrote"
        )
    provenance = {
        "source": "trained",
        "config": config_name,
        "metrics": trained.get("metrics"),
        "cer_fp32": trained.get("cer_fp32"),
        "cer_int8": trained.get("cer_int8"),
        "train_s": train_s,
        "train_estimate_s": estimate["estimate_s"],
        "train_estimate": estimate,
        "processes": processes,
        "corpus": str(corpus),
        "corpus_digest": files_digest([corpus]),
    }
    return _model_folder(fp32), _model_folder(int8), provenance
