"""Benchmark ``multimodal``: MoE vs dense image-text training at the same active parameters.

    cascade bench multimodal --out bench-results/multimodal.json             # base, ~15 min
    cascade bench multimodal --out /tmp/m.json --quick                       # debug, ~2 min
    CASCADE_BENCH_MULTIMODAL_CONFIG=debug cascade bench multimodal --out FILE

1. Step throughput: the MoE config and its dense twin (same active parameters per token) train
   the same batches in the same 2 DeepSpeed processes, one warm-up run each and then
   ``--repeats`` timed runs each (default 5, 3 with ``--quick``) in alternating order (the
   model that runs first rotates each round: ``throughput_order``); medians, and each run in
   ``*_runs`` for the spread: ``moe_vs_dense_throughput`` = dense step time / MoE step time
   (its goal: :data:`THROUGHPUT_GOAL`, ``throughput_goal_met``).
2. Quality: both configs are trained in full (:func:`models.multimodal.evaluate.compare`):
   ``recall_at_1_i2t`` / ``recall_at_1_t2i`` of the MoE model and ``dense_recall_at_1`` (mean of
   both directions) on the held-out split, ``expert_load_cv`` and ``tokens_dropped`` of the MoE
   run's last logging window, and recall per training PFLOP and per second. On generated pairs
   the test split's captions all have templates (colour + shape) seen in training;
   ``recall_heldout_templates_i2t`` / ``_t2i`` (MoE) and ``dense_recall_at_1_heldout_templates``
   are recall@1 on pairs of templates kept out of training
   (:data:`models.multimodal.pairs.HELDOUT_TEMPLATES`): colours and shapes seen, never
   together. On a corpus they are null with the reason in ``heldout_templates_note``.
3. Corpus figures (``pairs_per_s``, ``quarantined``, ``duplicates_removed``) come from the
   corpus job's own benchmark (``benchmarks.multimodal_corpus``, run now, or its JSON named by
   ``CASCADE_BENCH_MULTIMODAL_CORPUS_RESULT``); without the corpus job they are None with the
   reason in ``corpus_note``.

``CASCADE_BENCH_MULTIMODAL_SKIP=corpus`` leaves step 3 out (smoke runs): its figures are None
and ``skipped`` says why.

MFU needs a GPU: on CUDA, the dense throughput run's FLOPs (6 x active parameters x tokens per
step x steps/s, per process) over the device's peak for the dtype the training ran in
(``mfu_dtype``: fp32 unless the DeepSpeed config enables bf16 or fp16; :data:`PEAK_FLOPS_FP32`
or :data:`PEAK_FLOPS`); ``mfu_moe`` is the same for the MoE run. On CPU, or on a device missing
from the tables, they are None and ``mfu_note`` says why.
"""

from __future__ import annotations

import importlib
import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.goals import goal
from benchmarks.provenance import bench_repeats, files_digest, private_tracking
from cascade.config import load_settings
from cascade.training.launch import run_torchrun
from models.multimodal.config_registry import dense_twin, get_config
from models.multimodal.evaluate import compare
from models.multimodal.model import parameter_counts
from models.multimodal.pairs import HELDOUT_TEMPLATES
from models.multimodal.train import EXPERIMENT, THROUGHPUT_REPEATS, build_model, deepspeed_config

SKIP_REASONS = {
    "corpus": "CASCADE_BENCH_MULTIMODAL_SKIP=corpus: the corpus job's benchmark (a Spark "
    "session) is not run; cascade bench multimodal-corpus measures it on its own",
}
"""Why each part of ``CASCADE_BENCH_MULTIMODAL_SKIP`` is missing from a result."""
THROUGHPUT_GOAL = goal("multimodal", "moe_vs_dense_throughput")
"""``moe_vs_dense_throughput``'s goal: 70% of the dense twin's steps/s or more, as the issue that
asked for the benchmark set it and the page states it (``throughput_goal_met``)."""
CORPUS_RESULT_ENV = "CASCADE_BENCH_MULTIMODAL_CORPUS_RESULT"
"""A ``cascade bench multimodal-corpus`` JSON to take the corpus figures from (else that
benchmark runs as part of this one)."""
PEAK_FLOPS = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12, "A100": 312e12}
"""Dense bf16 (and fp16) tensor-core peak per device name fragment, for MFU; the first
fragment found in the device's name wins."""
PEAK_FLOPS_FP32 = {"H100 PCIe": 51e12, "H100": 67e12, "H200": 67e12, "A100": 19.5e12}
"""Dense fp32 peak (no TF32: PyTorch leaves TF32 matmuls off by default) per device name
fragment, for MFU of a training that runs in fp32."""
PEAKS_BY_DTYPE = {"bf16": PEAK_FLOPS, "fp16": PEAK_FLOPS, "fp32": PEAK_FLOPS_FP32}


def throughput(config_name: str, steps: int, work: Path, repeats: int) -> dict[str, Any]:
    out = work / f"throughput-{config_name}"
    settings = load_settings()
    code, tail = run_torchrun(
        "models.multimodal.train",
        [
            "--config",
            config_name,
            "--out",
            str(out),
            "--throughput-steps",
            str(steps),
            "--throughput-repeats",
            str(repeats),
        ],
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
    job is not importable or ``CASCADE_BENCH_MULTIMODAL_SKIP`` names ``corpus``."""
    keys = ("pairs_per_s", "quarantined", "duplicates_removed")
    given = load_settings().bench.multimodal_corpus_result
    if "corpus" in load_settings().bench.multimodal_skip:
        return dict.fromkeys(keys) | {"corpus_note": f"skipped: {SKIP_REASONS['corpus']}"}
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


def training_dtype(config_name: str) -> str:
    """``bf16``, ``fp16`` or ``fp32``: what the DeepSpeed config of ``config_name``'s training
    computes in (fp32 unless it enables bf16 or fp16)."""
    ds = deepspeed_config(get_config(config_name))
    for dtype in ("bf16", "fp16"):
        if (ds.get(dtype) or {}).get("enabled"):
            return dtype
    return "fp32"


def peak_flops(device: str, dtype: str) -> float | None:
    """The device's dense peak FLOP/s in ``dtype`` (by name fragment), or None if unknown."""
    table = PEAKS_BY_DTYPE[dtype]
    return next((v for k, v in table.items() if k in device), None)


def mfu_details(
    config_name: str, steps_per_s: dict[str, float], world: int, device: str | None
) -> dict[str, Any]:
    """``mfu`` (dense twin) and ``mfu_moe``: 6 x active params x tokens per step x steps/s
    over ``world`` x the ``device``'s peak in the training's dtype; None each with
    ``mfu_note`` saying why without a CUDA device or a known peak."""
    dtype = training_dtype(config_name)
    details: dict[str, Any] = {
        "mfu": None,
        "mfu_moe": None,
        "mfu_dtype": dtype,
        "mfu_peak_flops": None,
        "mfu_device": device,
    }
    if device is None:
        return details | {"mfu_note": "no CUDA device: MFU not measured"}
    peak = peak_flops(device, dtype)
    if peak is None:
        known = ", ".join(PEAKS_BY_DTYPE[dtype])
        return details | {
            "mfu_note": f"no {dtype} peak known for {device!r} (known: {known}): MFU not measured"
        }
    figures = {}
    for key, config in (
        ("mfu", dense_twin(get_config(config_name))),
        ("mfu_moe", get_config(config_name)),
    ):
        active = parameter_counts(build_model(config, 1))["active"]
        tokens = config.batch_size * (config.model.patches + 2 * config.model.max_tokens)
        rate = steps_per_s["dense" if key == "mfu" else "moe"]
        figures[key] = 6.0 * active * tokens * rate / (peak * world)
    return (
        details
        | figures
        | {
            "mfu_peak_flops": peak,
            "mfu_note": f"against the {dtype} dense peak of {device} ({peak / 1e12:g} TFLOP/s), "
            "the dtype the training ran in; attention FLOPs not counted",
        }
    )


def mfu(config_name: str, dense_steps_per_s: float, world: int) -> float | None:
    """Model FLOPs utilization of the dense twin on CUDA (6 x active params x tokens per step
    over the device's peak in the training's dtype); None without a GPU."""
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    rates = {"dense": dense_steps_per_s, "moe": dense_steps_per_s}
    return mfu_details(config_name, rates, world, device)["mfu"]


def heldout_figures(
    corpus: str | None, moe: dict[str, Any], dense: dict[str, Any]
) -> dict[str, Any]:
    """Recall@1 on pairs of templates no training pair has (generated pairs only)."""
    keys = (
        "recall_heldout_templates_i2t",
        "recall_heldout_templates_t2i",
        "recall_at_1_heldout_templates",
        "dense_recall_at_1_heldout_templates",
        "heldout_templates_pairs",
    )
    if corpus:
        return dict.fromkeys(keys) | {
            "heldout_templates": None,
            "heldout_templates_note": f"trained on the corpus {corpus}: its captions have no "
            "template split; recall on held-out templates is measured on generated pairs only",
        }
    missing = [r for r in (moe, dense) if "heldout_templates_i2t_recall_at_1" not in r]
    if missing:
        raise RuntimeError(
            f"a training result lacks heldout_templates_* recall; keys: {sorted(missing[0])}"
        )

    def mean(result: dict[str, Any]) -> float:
        return (
            result["heldout_templates_i2t_recall_at_1"]
            + result["heldout_templates_t2i_recall_at_1"]
        ) / 2

    return {
        "recall_heldout_templates_i2t": moe["heldout_templates_i2t_recall_at_1"],
        "recall_heldout_templates_t2i": moe["heldout_templates_t2i_recall_at_1"],
        "recall_at_1_heldout_templates": mean(moe),
        "dense_recall_at_1_heldout_templates": mean(dense),
        "heldout_templates_pairs": moe.get("heldout_templates_eval_pairs"),
        "heldout_templates": [f"{colour} {shape}" for colour, shape in HELDOUT_TEMPLATES],
        "heldout_templates_note": "recall@1 on generated pairs whose colour-shape template "
        "no training pair has (the test split's templates all appear in training)",
    }


def run(out: Path, quick: bool) -> dict[str, Any]:
    config_name = "debug" if quick else load_settings().bench.multimodal_config
    corpus = load_settings().bench.multimodal_corpus
    steps = 8 if quick else 40
    repeats = bench_repeats(THROUGHPUT_REPEATS, quick=quick, quick_default=3)
    with tempfile.TemporaryDirectory(prefix="bench-multimodal-") as tmp:
        work = Path(tmp)
        # A private MLflow store: the training processes need no stack and log into none.
        with private_tracking(work / "mlflow", (EXPERIMENT,)):
            speed = throughput(config_name, steps, work, repeats)
            table = compare(config_name, Path(corpus) if corpus else None, work / "compare")
        moe_result = json.loads((work / "compare" / "moe" / "result.json").read_text())
        dense_result = json.loads((work / "compare" / "dense" / "result.json").read_text())
        model_digest = files_digest(
            [work / "compare" / kind / "model" / "final" for kind in ("moe", "dense")]
        )
        corpus_result = corpus_figures(work, quick)
    moe, dense = table["moe"], table["dense"]
    skipped = {part: SKIP_REASONS[part] for part in load_settings().bench.multimodal_skip}
    seconds = speed.get("seconds", {})
    result: dict[str, Any] = {
        "benchmark": "multimodal",
        "config": config_name,
        "skipped": skipped,
        "data": corpus or "generator",
        # A corpus folder's bytes go into input_digest (benchmarks.provenance.provenance).
        "input_files_digest": files_digest([Path(corpus)]) if corpus else None,
        "moe_vs_dense_throughput": speed["moe_vs_dense_throughput"],
        "moe_steps_per_s": speed["moe_steps_per_s"],
        "dense_steps_per_s": speed["dense_steps_per_s"],
        "moe_steps_per_s_runs": [steps / s for s in seconds.get("moe", [])],
        "dense_steps_per_s_runs": [steps / s for s in seconds.get("dense", [])],
        "moe_vs_dense_throughput_runs": [
            d / m for m, d in zip(seconds.get("moe", []), seconds.get("dense", []), strict=False)
        ],
        "repeats": speed.get("repeats"),
        "throughput_order": speed.get("order"),
        "throughput_steps": steps,
        "model_digest": model_digest,
        "model_provenance": {
            "source": "trained by this run",
            "configs": [config_name, dense_twin(get_config(config_name)).name],
            "training_config": get_config(config_name).to_dict(),
            "data": corpus or "generator",
            "files": "model/final of the MoE run and of its dense twin",
        },
        "throughput_goal_met": THROUGHPUT_GOAL.met(speed["moe_vs_dense_throughput"]),
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
        **mfu_details(
            config_name,
            {"dense": speed["dense_steps_per_s"], "moe": speed["moe_steps_per_s"]},
            speed["world_size"],
            torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        ),
        **heldout_figures(str(corpus) if corpus else None, moe_result, dense_result),
        **corpus_result,
    }
    return result
