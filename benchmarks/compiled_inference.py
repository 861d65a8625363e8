"""Benchmark: Cascade's compiled packages against like-for-like peers, in one run.

    cascade bench compile --model preranking --out bench-results/compilers.json [--quick]
    cascade bench compile --model asr --model-dir MODEL_DIR --out bench-results/compile-asr.json

The headline (top-level keys) is the FSCD pre-ranker, the network the pipeline deploys and the
server runs as a package (:mod:`benchmarks.compiled_fscd`): at 1 user x 1,000 and x 10,000
candidates, latency medians and their rounds (all variants interleaved round by round, the
order rotating, in one process), speedups (the top-level ones at 10,000; every size under
``sizes``), recompiles across 20+ candidate counts, compile times, and the AUC change of each
compiled form against eager on held-out requests (``auc_delta``: the exact package's;
``auc_deltas``: every variant's).

Peers, fp32 against fp32 and int8 against int8:

* fp32: ``cascade`` (the exact AOTInductor package) against ``eager``, ``inductor``
  (``torch.compile(dynamic=True)``, Inductor's defaults), ``inductor_tuned`` (the fastest on a
  trial of :data:`TUNED_CANDIDATES`: the defaults, max-autotune without CUDA graphs, freezing,
  freezing with the C++ wrapper; ``inductor_tuned_options`` says which) and ``onnxruntime``
  (the ONNX export on ONNX Runtime's CPU provider). ``speedup_vs_{peer}`` =
  ``{peer}_ms / cascade_ms``.
* the headline, each package against the fastest peer of its precision:
  ``speedup_vs_best_fp32_peer`` (``best_fp32_peer``) and ``speedup_vs_best_int8_peer``
  (``best_int8_peer``; at the top level from ``mlp``, the network with an int8 package,
  ``int8_network``).
* int8: ``cascade_int8`` (the package with RSQ int8 GEMMs for the wide layers) against the
  int8 peers at their best, static and calibrated on real requests with weights per channel:
  ``inductor_pt2e_int8`` (PT2E with the X86 Inductor quantizer, compiled by Inductor with
  freezing; torchao's, since PT2E left ``torch.ao``) and ``onnxruntime_static_int8`` (ONNX
  Runtime's ``quantize_static``, QDQ, a ``CalibrationDataReader``); and for the record
  ``onnxruntime_int8`` (ONNX Runtime's dynamic quantizer on the same ONNX export) and
  ``eager_int8`` (PyTorch's dynamic int8 ``nn.Linear``). A static peer that does not build here
  is named with its error under ``peers_failed``. ``int8_speedup_vs_{peer}`` =
  ``{peer}_ms / cascade_int8_ms``; ``int8_speedup_vs_eager`` / ``_inductor`` /
  ``_onnxruntime`` divide the fp32 peers by the int8 package (compilation and quantization
  together) and are not headline figures.

``recompiles`` is measured per variant: Dynamo's graph count while the in-process compiles run
every candidate count (``compiles``; ``recompiles`` = graphs - 1), and for a package the
packages loaded to serve them (``recompiles`` = loads - 1) and ``shapes_served``.

``mlp`` holds the same comparison for the first network (``PreRanker``, ``ml100k`` shape,
trained for a few seconds on synthetic impressions with a known click signal), with the int8
peers; ``cascade_bf16`` (bf16 GEMMs, ``bf16_gemm``) is reported with its own speedups and AUC
change because it is not exact (the FSCD table has it too). ``--quick`` uses a tiny model and
small sizes and runs only the PreRanker's eager and the pass pipeline (with and without RSQ
int8, for the AUC change), at the top level: the Inductor compiles, the ONNX export and
AOTInductor's gcc build take minutes on 2 cores. ``--model asr`` runs :func:`asr_compile_bench`
(utterances of 1-20 s, ``cer_delta``) on the model folder ``--model-dir`` names.
"""

from __future__ import annotations

import functools
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

from benchmarks.compile_peers import (
    FP32_PEERS,
    INT8_PEERS,
    PEER_NAMES,
    RECOMPILE_LIMIT,
    STATIC_INT8_PEERS,
    Peer,
    build_peers,
)
from benchmarks.provenance import bench_repeats, weights_digest
from cascade.compiled_packages import load_package
from cascade.config import load_settings
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
from domains.ctr.schema import LABEL, MODEL_FEATURES
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


def request_auc(score: Callable[..., Any], requests: Sequence[tuple[Any, Any]]) -> float:
    """AUC of ``score`` over all requests' candidates."""
    with torch.no_grad():
        scores = [np.asarray(torch.as_tensor(score(*inputs)).reshape(-1)) for inputs, _ in requests]
    labels = [labels for _, labels in requests]
    return float(roc_auc_score(np.concatenate(labels), np.concatenate(scores)))


def served_shapes(
    load: Callable[[], Callable[..., Any]], shapes: Sequence[tuple[Any, ...]]
) -> tuple[Callable[..., Any], dict[str, int]]:
    """Load a package with ``load`` and run every input of ``shapes`` on it, loading another
    only when the one in hand raises on an input (what serving one package per shape range
    would need). Returns the last package and ``compiles`` (packages loaded),
    ``recompiles`` (loads - 1), ``shapes_served`` (distinct input shapes that ran) and
    ``shapes`` (tried). An input no freshly loaded package serves raises."""
    loads = 0

    def fresh() -> Callable[..., Any]:
        nonlocal loads
        loads += 1
        return load()

    package = fresh()
    served: set[tuple[tuple[int, ...], ...]] = set()
    with torch.no_grad():
        for inputs in shapes:
            try:
                package(*inputs)
            except Exception:
                package = fresh()
                package(*inputs)  # a shape no package serves fails the benchmark here
            served.add(tuple(tuple(getattr(x, "shape", ())) for x in inputs))
    return package, {
        "compiles": loads,
        "recompiles": loads - 1,
        "shapes_served": len(served),
        "shapes": len(shapes),
    }


def agree_with_eager(
    fns: dict[str, Callable[..., Any]],
    reference: torch.Tensor,
    inputs: tuple[Any, ...],
    *,
    what: str,
    tolerance: float = 1e-4,
    skip: tuple[str, ...] = ("int8", "bf16"),
) -> None:
    """Raise unless every variant but the inexact ones (names ending in ``skip``: judged by
    their accuracy change instead) gives ``reference`` on ``inputs``."""
    for name, fn in fns.items():
        if name.endswith(skip):
            continue
        got = torch.as_tensor(fn(*inputs)).reshape(-1)
        if not torch.allclose(got, reference.reshape(-1), atol=tolerance, rtol=tolerance):
            raise AssertionError(f"{name} disagrees with eager at {what}")


def speedups(timings: dict[str, float], headline: str = "cascade") -> dict[str, Any]:
    """Ratios of median milliseconds, each a peer's over a package's (above 1: the package is
    faster):

    * ``speedup_vs_{peer}`` = ``{peer}_ms / {headline}_ms`` for every fp32 peer of
      :data:`FP32_PEERS` (``headline`` is the fp32 package, ``cascade``; ``eager`` in a run
      without packages);
    * ``int8_speedup_vs_{peer}`` = ``{peer}_ms / cascade_int8_ms`` for the int8 peers of
      :data:`INT8_PEERS` (int8 against int8) and, kept for the record, for the fp32 ``eager``,
      ``inductor`` and ``onnxruntime`` (int8 package against fp32: part of that ratio is
      quantization, not compilation);
    * ``bf16_speedup_vs_{peer}`` = ``{peer}_ms / cascade_bf16_ms`` for the fp32 peers;
    * ``speedup_vs_best_fp32_peer`` = the fastest fp32 peer's ms (``best_fp32_peer``, eager and
      compiled peers alike) over the fp32 package's, and ``speedup_vs_best_int8_peer`` = the
      fastest int8 peer's (``best_int8_peer``) over the int8 package's: the headline, each
      package against the best its precision has to offer."""
    ratios: dict[str, Any] = {}
    for precision, peers, package in (
        ("fp32", FP32_PEERS, headline),
        ("int8", INT8_PEERS, "cascade_int8"),
    ):
        present = [p for p in peers if p in timings and p != package]
        if package in timings and present:
            best = min(present, key=timings.__getitem__)
            ratios[f"best_{precision}_peer"] = best
            ratios[f"speedup_vs_best_{precision}_peer"] = timings[best] / timings[package]
    for base in FP32_PEERS:
        if base in timings and base != headline and headline in timings:
            ratios[f"speedup_vs_{base}"] = timings[base] / timings[headline]
    if "cascade_int8" in timings:
        for base in (*INT8_PEERS, "eager", "inductor", "onnxruntime"):
            if base in timings:
                ratios[f"int8_speedup_vs_{base}"] = timings[base] / timings["cascade_int8"]
    if "cascade_bf16" in timings:
        for base in FP32_PEERS:
            if base in timings:
                ratios[f"bf16_speedup_vs_{base}"] = timings[base] / timings["cascade_bf16"]
    return ratios


def timed_entry(
    fns: dict[str, Callable[..., Any]],
    inputs: tuple[Any, ...],
    *,
    rounds: int,
    repeats: int,
    headline: str = "cascade",
) -> dict[str, Any]:
    """Every variant on ``inputs``, interleaved (order rotating each round): ``{name}_ms``
    (median of the rounds), ``{name}_ms_runs`` (each round's median of ``repeats`` calls) and
    :func:`speedups`."""
    with torch.no_grad():
        runs = interleaved_runs_ms(
            {name: functools.partial(fn, *inputs) for name, fn in fns.items()},
            rounds=rounds,
            repeats=repeats,
            warmup_each_round=True,
        )
    timings = {name: statistics.median(values) for name, values in runs.items()}
    entry: dict[str, Any] = {f"{name}_ms": ms for name, ms in timings.items()}
    entry.update({f"{name}_ms_runs": values for name, values in runs.items()})
    entry.update(speedups(timings, headline))
    return entry


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
    with torch_threads(BENCH_THREADS), torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
        return _run(quick)


ASR_COMPILE_BENCH_SIZES = "500"
"""Corpus size of ``--model asr``: enough held-out voices for the CER change; the corpus job's
own throughput at 10k/100k utterances is ``cascade bench asr``'s."""


def asr_model_source() -> str:
    """How ``--model asr`` gets its model, checked before anything slow runs: the folder
    ``--model-dir`` (``CASCADE_BENCH_ASR_MODEL``) names, which must hold an ``asr_model.pt`` or
    a training's ``fp32/`` (and ``int8/``) models, or, without one, training the
    ``CASCADE_BENCH_ASR_CONFIG`` config on a corpus synthesized with espeak-ng (which the
    evaluation corpus needs in either case). Raises ValueError saying what to give."""
    import shutil

    from jobs.speech_synth import ESPEAK

    bench = load_settings().bench
    given = bench.asr_model
    if given is not None:
        folder = Path(given)
        folder = folder.parent if folder.suffix == ".pt" else folder
        if (
            not (folder / "asr_model.pt").is_file()
            and not (folder / "fp32" / "asr_model.pt").is_file()
        ):
            raise ValueError(
                f"--model-dir {given}: no asr_model.pt there (nor fp32/asr_model.pt); give the "
                "folder of a trained ASR model (cascade asr train writes one)"
            )
    if shutil.which(ESPEAK) is None:
        needs = "its evaluation corpus" if given else "a corpus to train a model on"
        raise ValueError(
            f"cascade bench compile --model asr cannot run: {ESPEAK} is not installed and it "
            f"synthesizes {needs}; install it (infra/install.sh, Debian package espeak-ng)"
            + ("" if given else " and give --model-dir DIR, a trained ASR model's folder")
        )
    if given is not None:
        return f"--model-dir {given}"
    return f"trained now: config {bench.asr_config!r} (give --model-dir to skip training)"


def asr_compile_bench(out: Path, quick: bool) -> dict[str, Any]:
    """``--model asr``: :mod:`benchmarks.asr_path` on a small corpus, which reports this
    benchmark's keys (``eager_ms`` ... ``speedup_vs_onnxruntime`` fp32 against fp32,
    ``int8_speedup_vs_onnxruntime_int8`` / ``_eager_int8`` int8 against int8, ``recompiles``,
    ``shapes_tried``, ``compile_s``, ``cer_delta``, ``passes``) beside its own. The model is
    ``--model-dir`` (:func:`asr_model_source`) or one ``models.asr.train`` trains."""
    from benchmarks.asr_path import run as asr_bench
    from cascade.config import load_settings

    source = asr_model_source()
    print(f"[bench compile] ASR model: {source}", flush=True)
    given = load_settings().bench.asr_sizes
    if given is None:
        os.environ["CASCADE_BENCH_ASR_SIZES"] = ASR_COMPILE_BENCH_SIZES
    try:
        return asr_bench(out, quick)
    finally:
        if given is None:
            os.environ.pop("CASCADE_BENCH_ASR_SIZES", None)


MLP_PEERS = PEER_NAMES
"""The PreRanker's in-process and ONNX Runtime peers of its packages."""


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
    shape_inputs = [preranking_example(model.config, n, seed=n) for n in shapes]
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
    peers_failed: dict[str, str] = {}
    if not quick:
        peers = build_peers(
            request,
            example,
            work,
            names=MLP_PEERS,
            shapes=shape_inputs,
            dynamic_shapes=preranking_dynamic_shapes(),
            input_names=("user_dense", "user_id", "item_dense", "item_id"),
            trial_inputs=preranking_example(model.config, sizes[-1], seed=sizes[-1]),
            calibration_inputs=calibration,
            failed=peers_failed,
        )
        result.update(peer_report(peers))
        for name, peer in peers.items():
            try:
                with peer.scope():
                    auc = request_auc(peer.fn, requests)
            except Exception as exc:  # a peer that cannot score the held-out requests
                peers_failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                print(f"[bench compile] peer {name} left out: {peers_failed[name]}", flush=True)
                continue
            compile_s[name] = peer.compile_s
            if peer.recompiles is not None:
                recompiles[name] = peer.recompiles
            result[f"{name}_auc_delta"] = auc - eager_auc
            variants[name] = peer.fn

        cache = load_settings().home / "compile-cache"

        def package(name: str, file: str, **options: Any) -> tuple[Any, Any]:
            """``model`` compiled to one AOTInductor package: its compile time goes under
            ``name``, the packages loaded to serve every input of ``shapes`` under
            ``recompiles`` (:func:`served_shapes`)."""
            start = time.perf_counter()
            artifact = compile_preranking(model, work / file, cache_dir=cache, **options)
            compile_s[name] = time.perf_counter() - start
            loaded, recompiles[name] = served_shapes(
                lambda: load_package(artifact.path), shape_inputs
            )
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
            {"cascade": loaded, "cascade_int8": loaded_int8, "cascade_bf16": loaded_bf16}
        )
    result["compile_s"] = compile_s
    result["recompiles"] = recompiles
    result["peers_failed"] = peers_failed

    headline = "cascade" if "cascade" in variants else "eager"
    for size in sizes:
        inputs = preranking_example(model.config, size, seed=size)
        with torch.no_grad():
            # Random inputs reach far past the calibrated activation ranges, so int8 clamps
            # them; bf16 rounds: their accuracy is judged on real requests (*_auc_delta).
            agree_with_eager(variants, request(*inputs), inputs, what=f"1x{size}")
        entry = timed_entry(
            variants,
            inputs,
            rounds=bench_repeats(7, quick=quick, quick_default=3),
            repeats=5 if quick else 15,
            headline=headline,
        )
        entry["headline_variant"] = headline
        result["sizes"][f"1x{size}"] = entry
    largest = result["sizes"][f"1x{sizes[-1]}"]
    result.update({k: v for k, v in largest.items() if headline_key(k)})
    if quick:
        return result
    from benchmarks.compiled_fscd import fscd_compile_table

    # The network the pipeline deploys and the server runs as a package: its table is the
    # headline, the first network's goes under ``mlp``.
    fscd = fscd_compile_table(
        work,
        sizes=sizes,
        shapes=shapes,
        cache_dir=load_settings().home / "compile-cache",
        rounds=bench_repeats(7),
    )
    return headline_table(fscd, mlp=result)


def headline_key(key: str) -> bool:
    """A key of a size's entry that the top level repeats (latencies, speedups, best peers)."""
    return key.endswith(("_ms", "_ms_runs")) or "speedup" in key or key.startswith("best_")


def int8_headline(mlp: dict[str, Any]) -> dict[str, Any]:
    """The int8 comparison at the top level, from the network that has an int8 package (the
    FSCD table has none): ``speedup_vs_best_int8_peer`` and ``best_int8_peer`` of ``mlp``,
    named as such (``int8_network``)."""
    if "speedup_vs_best_int8_peer" not in mlp:
        return {}
    return {
        "speedup_vs_best_int8_peer": mlp["speedup_vs_best_int8_peer"],
        "best_int8_peer": mlp["best_int8_peer"],
        "int8_network": "mlp (PreRanker): the network with an int8 package",
    }


def peer_report(peers: dict[str, Peer]) -> dict[str, Any]:
    """What the peers were: ``inductor_tuned_options`` (the Inductor options the tuned peer
    ran with, and its max-autotune trial), ``onnxruntime_int8_quantization`` and
    ``eager_int8_quantization`` (the quantizer, its settings and how much it converted)."""
    report: dict[str, Any] = {}
    if "inductor_tuned" in peers:
        report["inductor_tuned_options"] = peers["inductor_tuned"].info
    for name in ("onnxruntime_int8", "eager_int8", *STATIC_INT8_PEERS):
        if name in peers:
            report[f"{name}_quantization"] = peers[name].info
    return report


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
        **{k: v for k, v in largest.items() if headline_key(k)},
        **int8_headline(mlp),
        "peers_failed": {**mlp.get("peers_failed", {}), **fscd.get("peers_failed", {})},
        "auc_delta": fscd["auc_delta"].get("cascade"),
        "bf16_auc_delta": fscd["auc_delta"].get("cascade_bf16"),
        "auc_deltas": fscd["auc_delta"],
        "mlp": mlp,
    }
