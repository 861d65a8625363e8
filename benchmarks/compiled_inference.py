"""Benchmark: eager vs torch.compile (Inductor, dynamic) vs ONNX Runtime vs Cascade's artifact.

    cascade bench compile --model preranking --out bench-results/compilers.json [--quick]

The headline (top-level keys) is the FSCD pre-ranker, the network the pipeline deploys and the
server runs as a package (:mod:`benchmarks.compiled_fscd`): at 1 user x 1,000 and x 10,000
candidates, latency medians (all variants interleaved round by round in one process), speedups
(the top-level ones at 10,000; every size under ``sizes``), recompiles across 20+ candidate
counts, compile times, and the AUC change of each compiled form against eager on held-out
requests (``auc_delta``: the exact package's; ``auc_deltas``: every variant's).

``mlp`` holds the same comparison for the first network (``PreRanker``, ``ml100k`` shape,
trained for a few seconds on synthetic impressions with a known click signal). ``cascade`` is
the exact (fp32) AOTInductor artifact; ``cascade_int8`` the same artifact with RSQ int8 GEMMs
for its wide layers and ``cascade_bf16`` with bf16 GEMMs (``bf16_gemm``), each reported with its
own speedups and AUC change because neither is exact (the FSCD table has ``cascade_bf16`` too).
``--quick`` uses a tiny model and small sizes and runs only the PreRanker's eager and the pass
pipeline (with and without RSQ int8, for the AUC change), at the top level: the Inductor
compiles, the ONNX export and AOTInductor's gcc build take minutes on 2 cores. ``--model asr``
runs :func:`asr_compile_bench` (utterances of 1-20 s, ``cer_delta``)."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import roc_auc_score

from benchmarks.provenance import weights_digest
from cascade.compiled_packages import load_package
from cascade.config import load_settings
from cascade.ctr_schema import LABEL, MODEL_FEATURES
from compilers.export import BF16_PASSES, compile_graph, torch_threads
from compilers.gate import Request, held_out_requests
from compilers.pipeline import DEFAULT_PASSES, PassContext
from compilers.preranking import (
    PreRankingRequest,
    compile_preranking,
    preranking_dynamic_shapes,
    preranking_example,
)
from compilers.timing import interleaved_runs_ms
from models.preranking.config_registry import get_config
from models.preranking.model import PreRanker
from models.preranking.synthetic_data import synthetic_training_frame

Requests = list[Request]


def train_quickly(
    rows: int, config_name: str, *, epochs: int = 3, seed: int = 0
) -> tuple[PreRanker, pd.DataFrame]:
    """A PreRanker fitted with plain Adam on synthetic rows; returns it and the held-out frame.

    The benchmark needs a model with a real signal so the AUC change means something; DeepSpeed
    training is the pipeline's job and would dominate the benchmark's time.
    """
    torch.manual_seed(seed)
    frame = synthetic_training_frame(rows, seed=seed).sort_values("event_timestamp")
    split = int(len(frame) * 0.8)
    train, test = frame.iloc[:split], frame.iloc[split:]
    model = PreRanker(get_config(config_name).model)
    dense = torch.tensor(train[list(MODEL_FEATURES)].to_numpy(np.float32))
    users = torch.tensor(train["user_id"].to_numpy(np.int64))
    items = torch.tensor(train["item_id"].to_numpy(np.int64))
    labels = torch.tensor(train[LABEL].to_numpy(np.float32))
    model.fit_normalizer(dense)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(epochs):
        for index in torch.randperm(len(labels)).split(512):
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                model(dense[index], users[index], items[index]), labels[index]
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model.eval(), test


def request_auc(score: Callable[..., Any], requests: Requests) -> float:
    """AUC of ``score`` over all requests' candidates."""
    with torch.no_grad():
        scores = [np.asarray(torch.as_tensor(score(*inputs)).reshape(-1)) for inputs, _ in requests]
    labels = [labels for _, labels in requests]
    return float(roc_auc_score(np.concatenate(labels), np.concatenate(scores)))


def onnxruntime_session(
    request: torch.nn.Module,
    example: tuple[torch.Tensor, ...],
    path: Path,
    *,
    dynamic_shapes: Any = None,
    input_names: Sequence[str] = ("user_dense", "user_id", "item_dense", "item_id"),
) -> Callable[..., np.ndarray]:
    """Export the request module to ONNX (dynamic candidate dim; by default the PreRanker's
    request, :func:`preranking_dynamic_shapes`) and open a session on this process's threads."""
    import onnxruntime as ort

    torch.onnx.export(
        request,
        example,
        str(path),
        dynamic_shapes=preranking_dynamic_shapes() if dynamic_shapes is None else dynamic_shapes,
        input_names=list(input_names),
        dynamo=True,
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def run(*inputs: torch.Tensor) -> np.ndarray:
        return session.run(None, {n: x.numpy() for n, x in zip(names, inputs, strict=True)})[0]

    return run


def _recompiles(fn: Callable[..., Any], shapes: list[int], config: Any) -> dict[str, int]:
    """Dynamo frames compiled while running every shape (1 = a single compile)."""
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    with torch.no_grad():
        for n in shapes:
            fn(*preranking_example(config, n, seed=n))
    compiles = counters["stats"]["unique_graphs"] - before
    return {"compiles": compiles, "recompiles": max(0, compiles - 1)}


BENCH_THREADS = 1
"""Threads for every variant. On the shared, loaded 2-core machine two OpenMP threads made each
parallel region wait for a descheduled thread (eager 1x1000: 133 ms at 2 threads against
0.3 ms for ONNX Runtime), so timings measured scheduling, not the code."""


def run(out: Path, quick: bool) -> dict[str, Any]:
    """``cascade bench compilers``: see the module docstring."""
    from cascade.config import load_settings

    model = load_settings().bench.compile_model
    if model == "asr":
        return asr_compile_bench(out, quick)
    if model != "preranking":
        raise ValueError(f"cannot benchmark --model {model}: choose preranking or asr")
    with torch_threads(BENCH_THREADS):
        return _run(quick)


ASR_COMPILE_BENCH_SIZES = "500"
"""Corpus size of ``--model asr``: enough held-out voices for the CER change; the corpus job's
own throughput at 10k/100k utterances is ``cascade bench asr``'s."""


def asr_compile_bench(out: Path, quick: bool) -> dict[str, Any]:
    """``--model asr``: :mod:`benchmarks.asr_path` on a small corpus, which reports this
    benchmark's keys (``eager_ms`` ... ``speedup_vs_onnxruntime``, ``recompiles``,
    ``shapes_tried``, ``compile_s``, ``cer_delta``, ``passes``) beside its own. The model is
    ``CASCADE_BENCH_ASR_MODEL`` or one ``models.asr.train`` trains."""
    from benchmarks.asr_path import run as asr_bench
    from cascade.config import load_settings

    given = load_settings().bench.asr_sizes
    if given is None:
        os.environ["CASCADE_BENCH_ASR_SIZES"] = ASR_COMPILE_BENCH_SIZES
    try:
        return asr_bench(out, quick)
    finally:
        if given is None:
            os.environ.pop("CASCADE_BENCH_ASR_SIZES", None)


def _run(quick: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    sizes = [100, 1000] if quick else [1000, 10_000]
    shapes = sorted({int(x) for x in np.geomspace(1, sizes[-1], 20).round()} | {2, 3, 5, 7})[:24]
    rows, config_name, epochs = (2_000, "debug", 1) if quick else (30_000, "ml100k", 3)
    model, test = train_quickly(rows, config_name, epochs=epochs)
    request = PreRankingRequest(model).eval()
    requests = held_out_requests(test)[: 120 if quick else None]
    result: dict[str, Any] = {
        "quick": quick,
        "threads": torch.get_num_threads(),
        "shapes_tried": len(shapes),
        "sizes": {},
        "model_digest": weights_digest(model),
        "model_provenance": {
            "source": "trained by this run (train_quickly)",
            "network": "PreRanker",
            "config": config_name,
            "rows": rows,
            "epochs": epochs,
            "seed": 0,
        },
    }
    eager_auc = request_auc(request, requests)
    result["eager_auc"] = eager_auc

    work = Path(tempfile.mkdtemp(prefix="cascade-bench-"))
    example = preranking_example(model.config, 64)
    variants: dict[str, Callable[..., Any]] = {"eager": request}

    # The pass pipeline alone (graph run by PyTorch), and with RSQ int8, for accuracy.
    # Calibrate on real requests: random inputs span ranges no real feature reaches.
    calibration = [inputs for inputs, _ in requests[:32]]
    graph = compile_graph(request, example, preranking_dynamic_shapes(), reexport=False)
    result["passes"] = graph.report.to_dict()["passes"]
    quantized = compile_graph(
        request,
        example,
        preranking_dynamic_shapes(),
        passes=(*DEFAULT_PASSES[:4], "rsq_quantize"),
        context=PassContext(calibration_inputs=calibration),
        reexport=False,
    )
    result["passes_graph_auc_delta"] = request_auc(graph.graph_module, requests) - eager_auc
    result["rsq_int8_auc_delta"] = request_auc(quantized.graph_module, requests) - eager_auc
    compile_s: dict[str, float] = {}
    recompiles: dict[str, Any] = {}
    if not quick:
        start = time.perf_counter()
        ort_run = onnxruntime_session(request, example, work / "preranking.onnx")
        compile_s["onnxruntime"] = time.perf_counter() - start
        result["onnxruntime_auc_delta"] = request_auc(ort_run, requests) - eager_auc
        variants["onnxruntime"] = ort_run

        def torch_compiled(name: str, **options: Any) -> Any:
            """``request`` through ``torch.compile`` (dynamic shapes): its first-call compile
            time, recompiles over ``shapes`` and AUC delta go under ``name``."""
            torch._dynamo.reset()
            compiled = torch.compile(request, dynamic=True, **options)
            start = time.perf_counter()
            with torch.no_grad():
                compiled(*example)
            compile_s[name] = time.perf_counter() - start
            recompiles[name] = _recompiles(compiled, shapes, model.config)
            result[f"{name}_auc_delta"] = request_auc(compiled, requests) - eager_auc
            return compiled

        inductor = torch_compiled("inductor")
        backend = torch_compiled("cascade_backend", backend="cascade")

        cache = load_settings().home / "compile-cache"

        def package(name: str, file: str, **options: Any) -> tuple[Any, Any]:
            """``model`` compiled to one AOTInductor package and loaded: its compile time goes
            under ``name``; each of ``shapes`` runs once, so a failure is a shape the one
            package cannot serve."""
            start = time.perf_counter()
            artifact = compile_preranking(model, work / file, cache_dir=cache, **options)
            compile_s[name] = time.perf_counter() - start
            loaded = load_package(artifact.path)
            for n in shapes:
                loaded(*preranking_example(model.config, n, seed=n))
            recompiles[name] = {"compiles": 1, "recompiles": 0}
            return artifact, loaded

        artifact, loaded = package("cascade", "preranking.pt2")
        result["cascade_artifact"] = {k: v for k, v in artifact.report.items() if k != "passes"}
        result["passes"] = artifact.report["passes"]
        result["auc_delta"] = request_auc(loaded, requests) - eager_auc

        # The same artifact with RSQ int8 GEMMs for the wide layers: faster at large candidate
        # counts, not exact, so it is reported beside the headline rather than as it.
        int8, loaded_int8 = package(
            "cascade_int8", "preranking-int8.pt2", int8_calibration=calibration
        )
        result["int8_auc_delta"] = request_auc(loaded_int8, requests) - eager_auc
        result["int8_passes"] = int8.report["passes"]

        # And with bf16 GEMMs (fp32 accumulation) for the wide layers: not exact either.
        bf16, loaded_bf16 = package("cascade_bf16", "preranking-bf16.pt2", passes=BF16_PASSES)
        result["bf16_auc_delta"] = request_auc(loaded_bf16, requests) - eager_auc
        result["bf16_gemm"] = bf16.report["passes"]["bf16_gemm"]
        variants.update(
            {
                "inductor": inductor,
                "cascade_backend": backend,
                "cascade": loaded,
                "cascade_int8": loaded_int8,
                "cascade_bf16": loaded_bf16,
            }
        )
    result["compile_s"] = compile_s
    result["recompiles"] = recompiles

    for size in sizes:
        inputs = preranking_example(model.config, size, seed=size)
        with torch.no_grad():
            reference = request(*inputs)
            for name, fn in variants.items():
                if name.endswith(("int8", "bf16")):
                    # These random inputs reach far past the calibrated activation ranges, so
                    # int8 clamps them; bf16 rounds; their accuracy is judged on real requests
                    # (int8_auc_delta, bf16_auc_delta).
                    continue
                got = torch.as_tensor(fn(*inputs))
                if not torch.allclose(got.reshape(-1), reference, atol=1e-4, rtol=1e-4):
                    raise AssertionError(f"{name} disagrees with eager at 1x{size}")
            runs = interleaved_runs_ms(
                {name: (lambda fn=fn, inputs=inputs: fn(*inputs)) for name, fn in variants.items()},
                rounds=3 if quick else 7,
                repeats=5 if quick else 15,
                warmup_each_round=True,
            )
        timings = {name: statistics.median(values) for name, values in runs.items()}
        entry: dict[str, Any] = {f"{name}_ms": ms for name, ms in timings.items()}
        entry.update({f"{name}_ms_runs": values for name, values in runs.items()})
        headline = "cascade" if "cascade" in timings else "eager"
        for base in ("eager", "inductor", "onnxruntime"):
            if base in timings and base != headline:
                entry[f"speedup_vs_{base}"] = timings[base] / timings[headline]
        for variant in ("int8", "bf16"):
            if f"cascade_{variant}" in timings:
                for base in ("eager", "inductor", "onnxruntime"):
                    entry[f"{variant}_speedup_vs_{base}"] = (
                        timings[base] / timings[f"cascade_{variant}"]
                    )
        entry["headline_variant"] = headline
        result["sizes"][f"1x{size}"] = entry
    largest = result["sizes"][f"1x{sizes[-1]}"]
    result.update(
        {k: v for k, v in largest.items() if k.endswith(("_ms", "_ms_runs")) or "speedup" in k}
    )
    if quick:
        return result
    from benchmarks.compiled_fscd import fscd_compile_table

    # The network the pipeline deploys and the server runs as a package: its table is the
    # headline, the first network's goes under ``mlp``.
    fscd = fscd_compile_table(
        work, sizes=sizes, shapes=shapes, cache_dir=load_settings().home / "compile-cache"
    )
    return headline_table(fscd, mlp=result)


def headline_table(fscd: dict[str, Any], *, mlp: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's JSON: the FSCD table's keys at the top (its largest size's latencies and
    speedups, ``auc_delta`` of its package), every size under ``sizes``, all AUC changes under
    ``auc_deltas``, and the PreRanker's whole result under ``mlp``."""
    sizes = fscd["sizes"]
    largest = sizes[max(sizes, key=lambda name: int(name.split("x")[1]))]
    return {
        "quick": False,  # a quick run has no FSCD table: its PreRanker keys are the top level
        "network": "fscd",
        "threads": mlp.get("threads"),
        **{k: v for k, v in fscd.items() if k != "auc_delta"},
        **{k: v for k, v in largest.items() if k.endswith(("_ms", "_ms_runs")) or "speedup" in k},
        "auc_delta": fscd["auc_delta"].get("cascade"),
        "bf16_auc_delta": fscd["auc_delta"].get("cascade_bf16"),
        "auc_deltas": fscd["auc_delta"],
        "mlp": mlp,
    }
