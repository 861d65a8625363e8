"""Benchmark ``multimodal``: MoE vs dense image-text training at the same active parameters.

    cascade bench multimodal --out bench-results/multimodal.json             # base, ~15 min
    cascade bench multimodal --out /tmp/m.json --quick                       # debug, ~2 min
    CASCADE_BENCH_MULTIMODAL_CONFIG=debug cascade bench multimodal --out FILE

1. Step throughput: the MoE config and its dense twin (same active parameters per token) train
   the same batches in the same 2 DeepSpeed processes, one warm-up run each and then
   interleaved timed runs (medians): ``moe_vs_dense_throughput`` = dense step time / MoE step
   time (goal >= 0.7).
2. Quality: both configs are trained in full (:func:`models.multimodal.evaluate.compare`):
   ``recall_at_1_i2t`` / ``recall_at_1_t2i`` of the MoE model and ``dense_recall_at_1`` (mean of
   both directions) on the held-out split, ``expert_load_cv`` and ``tokens_dropped`` of the MoE
   run's last logging window, and recall per training PFLOP and per second.
3. Corpus figures (``pairs_per_s``, ``quarantined``, ``duplicates_removed``) come from the
   corpus job's own benchmark (``benchmarks.multimodal_corpus``, run now, or its JSON named by
   ``CASCADE_BENCH_MULTIMODAL_CORPUS_RESULT``); without the corpus job they are None with the
   reason in ``corpus_note``.

MFU needs a GPU: on CUDA the dense throughput run's FLOPs over the device's peak would be
reported; on CPU ``mfu`` is None (not measured).
"""

from __future__ import annotations

import importlib
import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.provenance import files_digest, private_tracking
from cascade.config import load_settings
from cascade.training.launch import run_torchrun
from models.multimodal.config_registry import dense_twin, get_config
from models.multimodal.evaluate import compare
from models.multimodal.model import parameter_counts
from models.multimodal.train import EXPERIMENT, build_model

CONFIG_ENV = "CASCADE_BENCH_MULTIMODAL_CONFIG"
"""MoE config of the full run (default ``base``); ``--quick`` always uses ``debug``."""
CORPUS_ENV = "CASCADE_BENCH_MULTIMODAL_CORPUS"
"""A corpus folder to train on instead of generated pairs (optional)."""
CORPUS_RESULT_ENV = "CASCADE_BENCH_MULTIMODAL_CORPUS_RESULT"
"""A ``cascade bench multimodal-corpus`` JSON to take the corpus figures from (else that
benchmark runs as part of this one)."""
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
"""Dense bf16 peak per device name fragment, for MFU."""


def throughput(config_name: str, steps: int, work: Path) -> dict[str, Any]:
    out = work / f"throughput-{config_name}"
    settings = load_settings()
    code, tail = run_torchrun(
        "models.multimodal.train",
        ["--config", config_name, "--out", str(out), "--throughput-steps", str(steps)],
        processes=settings.train_processes,
        settings=settings,
        log_path=out / "throughput.log",
        extra_env={"OMP_NUM_THREADS": "1"},
    )
    path = out / "throughput.json"
    if not path.exists():
        raise RuntimeError(f"throughput run exited {code} without {path}; last lines:\n{tail}")
    return dict(json.loads(path.read_text()))


def corpus_figures(work: Path, quick: bool) -> dict[str, Any]:
    """``pairs_per_s``, ``quarantined`` and ``duplicates_removed`` of the corpus job: read from
    the JSON named by :data:`CORPUS_RESULT_ENV` (a ``cascade bench multimodal-corpus`` result),
    else measured by running that benchmark now; None each, with the reason, when the corpus
    job is not importable."""
    keys = ("pairs_per_s", "quarantined", "duplicates_removed")
    given = load_settings().bench.multimodal_corpus_result
    if given:
        figures = json.loads(Path(given).read_text())
        source = f"read from {given}"
    else:
        try:
            corpus_bench = importlib.import_module("benchmarks.multimodal_corpus")
        except ImportError as error:
            return dict.fromkeys(keys) | {
                "corpus_note": f"the corpus job is not importable ({error}): corpus figures not "
                f"measured; set {CORPUS_RESULT_ENV} to a multimodal-corpus benchmark JSON"
            }
        figures = corpus_bench.bench_multimodal_corpus(work / "corpus-bench.json", quick)
        source = "measured by benchmarks.multimodal_corpus in this run"
    return {k: figures.get(k) for k in keys} | {"corpus_note": source}


def mfu(config_name: str, dense_steps_per_s: float, world: int) -> float | None:
    """Model FLOPs utilization of the dense twin on CUDA (6 x active params x tokens per step
    over the device's peak); None without a GPU."""
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    peak = next((v for k, v in PEAK_FLOPS.items() if k in name), None)
    if peak is None:
        return None
    config = dense_twin(get_config(config_name))
    active = parameter_counts(build_model(config, 1))["active"]
    tokens = config.batch_size * (config.model.patches + 2 * config.model.max_tokens)
    return 6.0 * active * tokens * dense_steps_per_s / (peak * world)


def run(out: Path, quick: bool) -> dict[str, Any]:
    config_name = "debug" if quick else load_settings().bench.multimodal_config
    corpus = load_settings().bench.multimodal_corpus
    steps = 8 if quick else 40
    with tempfile.TemporaryDirectory(prefix="bench-multimodal-") as tmp:
        work = Path(tmp)
        # A private MLflow store: the training processes need no stack and log into none.
        with private_tracking(work / "mlflow", (EXPERIMENT,)):
            speed = throughput(config_name, steps, work)
            table = compare(config_name, Path(corpus) if corpus else None, work / "compare")
        moe_result = json.loads((work / "compare" / "moe" / "result.json").read_text())
        model_digest = files_digest(
            [work / "compare" / kind / "model" / "final" for kind in ("moe", "dense")]
        )
        corpus_result = corpus_figures(work, quick)
    moe, dense = table["moe"], table["dense"]
    seconds = speed.get("seconds", {})
    result: dict[str, Any] = {
        "benchmark": "multimodal",
        "config": config_name,
        "data": corpus or "generator",
        "moe_vs_dense_throughput": speed["moe_vs_dense_throughput"],
        "moe_steps_per_s": speed["moe_steps_per_s"],
        "dense_steps_per_s": speed["dense_steps_per_s"],
        "moe_steps_per_s_runs": [steps / s for s in seconds.get("moe", [])],
        "dense_steps_per_s_runs": [steps / s for s in seconds.get("dense", [])],
        "moe_vs_dense_throughput_runs": [
            d / m for m, d in zip(seconds.get("moe", []), seconds.get("dense", []), strict=False)
        ],
        "repeats": speed.get("repeats"),
        "model_digest": model_digest,
        "model_provenance": {
            "source": "trained by this run",
            "configs": [config_name, dense_twin(get_config(config_name)).name],
            "training_config": get_config(config_name).to_dict(),
            "data": corpus or "generator",
            "files": "model/final of the MoE run and of its dense twin",
        },
        "throughput_goal_met": speed["moe_vs_dense_throughput"] >= 0.7,
        "expert_load_cv": moe_result.get("expert_load_cv"),
        "tokens_dropped": moe_result.get("tokens_dropped"),
        "recall_at_1_i2t": moe["i2t_recall_at_1"],
        "recall_at_1_t2i": moe["t2i_recall_at_1"],
        "recall_at_5_i2t": moe["i2t_recall_at_5"],
        "recall_at_5_t2i": moe["t2i_recall_at_5"],
        "dense_recall_at_1": dense["mean_recall_at_1"],
        "dense_recall_at_1_i2t": dense["i2t_recall_at_1"],
        "dense_recall_at_1_t2i": dense["t2i_recall_at_1"],
        "side_by_side": table,
        "throughput": speed,
        "mfu": mfu(config_name, speed["dense_steps_per_s"], speed["world_size"]),
        "mfu_note": None if torch.cuda.is_available() else "no CUDA device: MFU not measured",
        **corpus_result,
    }
    return result
