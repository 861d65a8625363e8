"""The compile benchmark's table for the FSCD pre-ranker, the network the pipeline deploys.

``cascade bench compile --model preranking`` reports it under ``fscd``: a ColdPreRanker over the
fields FSCD keeps on the generated logs (user, item and one user x genre cross field), fitted
for a few seconds with plain Adam on synthetic impressions, scored as one request of 1 user x N
candidates (:class:`compilers.preranking.ColdPreRankingRequest`, field codes in). Variants, all on
one thread and interleaved round by round:

* ``eager_rows``: the network's ``forward`` on N full rows (the user's fields repeated per
  candidate), what scoring a frame of impressions runs;
* ``eager``: :meth:`ColdPreRanker.score_request`, the user side once per request (what the
  server ran before it loaded packages), the baseline of ``speedup_vs_eager``;
* ``inductor``: ``torch.compile(dynamic=True)`` of the request module;
* ``onnxruntime``: its ONNX export (dynamic candidate dim) on ONNX Runtime's CPU provider;
* ``cascade``: the AOTInductor package the compile step builds and the server loads
  (:func:`compilers.preranking.compile_cold_preranking`);
* ``cascade_bf16``: the same package with ``bf16_gemm`` (bf16 GEMMs, fp32 accumulation), reported
  beside it (``bf16_speedup_vs_*``, ``auc_delta.cascade_bf16``) because it is not exact.

The AUC change of each against eager is measured on held-out requests (one per user), and the
recompiles of Inductor and of the package across ``shapes`` candidate counts.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.export import Dim

from benchmarks.compiled_inference import onnxruntime_session, request_auc
from benchmarks.provenance import weights_digest
from cascade.compiled_packages import load_package
from cascade.ctr_schema import LABEL
from compilers.export import BF16_PASSES
from compilers.preranking import MAX_CANDIDATES, ColdPreRankingRequest, compile_cold_preranking
from compilers.timing import interleaved_runs_ms
from models.preranking.config_registry import get_cascade_config
from models.preranking.fields import FIELDS, FieldEncoder
from models.preranking.model import ColdPreRanker
from models.preranking.synthetic_data import synthetic_training_frame

BENCH_FIELDS = ("user_id", "user_clicks", "user_ctr", "item_id", "item_ctr", "ug_ctr")
"""The fields FSCD kept on the generated logs (``cascade bench preranking``, config
``generated``, λ = 0.004): the user, item and cross sides all present."""

Request = tuple[tuple[torch.Tensor, torch.Tensor], np.ndarray]


def train_cold_quickly(
    rows: int, *, epochs: int = 2, seed: int = 0
) -> tuple[ColdPreRanker, FieldEncoder, list[Request]]:
    """A ColdPreRanker (``ml100k`` network) on BENCH_FIELDS fitted with plain Adam on synthetic
    impressions; returns it, its encoder and one held-out request per user."""
    from compilers.deploy_gate import cold_gate_sample

    torch.manual_seed(seed)
    frame = synthetic_training_frame(rows, seed=seed).sort_values("event_timestamp")
    split = int(len(frame) * 0.8)
    train, test = frame.iloc[:split], frame.iloc[split:]
    config = get_cascade_config("ml100k")
    encoder = FieldEncoder(bins=config.bins).fit(train)
    model = ColdPreRanker(config.net, BENCH_FIELDS, encoder.cardinalities())
    codes = encoder.encode(train)
    labels = torch.tensor(train[LABEL].to_numpy(np.float32))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(epochs):
        for index in torch.randperm(len(labels)).split(512):
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                model(codes[index]), labels[index]
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model.eval(), encoder, cold_gate_sample(test, encoder, max_users=10**9)


def request_example(
    encoder: FieldEncoder, candidates: int, *, seed: int
) -> tuple[torch.Tensor, ...]:
    """One user's codes ``[1, F]`` and ``candidates`` random candidates' codes ``[N, F]``, every
    code within its field's vocabulary."""
    generator = torch.Generator().manual_seed(seed)
    cards = torch.tensor(encoder.cardinalities())
    codes = (torch.rand(candidates, len(FIELDS), generator=generator) * cards).long()
    return codes[:1].clone(), codes


def full_rows(model: ColdPreRanker) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``(user_codes, candidate_codes) -> logits`` through ``model.forward`` on full rows."""
    user_positions = torch.tensor([i for i, f in enumerate(FIELDS) if f.kind == "user"])

    def run(user_codes: torch.Tensor, candidate_codes: torch.Tensor) -> torch.Tensor:
        rows = candidate_codes.clone()
        rows[:, user_positions] = user_codes[0, user_positions]
        return model(rows)

    return run


def onnxruntime_cold(request: ColdPreRankingRequest, path: Path) -> Callable[..., np.ndarray]:
    """The request module exported to ONNX (dynamic candidate dim) on ONNX Runtime."""
    from compilers.preranking import cold_preranking_example

    candidates = Dim("candidates", min=1, max=MAX_CANDIDATES)
    return onnxruntime_session(
        request,
        cold_preranking_example(64),
        path,
        dynamic_shapes=(None, {0: candidates}),
        input_names=("user_codes", "candidate_codes"),
    )


def fscd_compile_table(
    work: Path,
    *,
    sizes: Sequence[int] = (1_000, 10_000),
    shapes: Sequence[int] = (),
    rows: int = 30_000,
    variants: Sequence[str] = (
        "eager_rows",
        "eager",
        "inductor",
        "onnxruntime",
        "cascade",
        "cascade_bf16",
    ),
    rounds: int = 7,
    repeats: int = 15,
    cache_dir: Path | None = None,
    fast_build: bool = False,
) -> dict[str, Any]:
    """The table described in the module docstring; ``variants`` must include ``eager``."""
    if "eager" not in variants:
        raise ValueError(f"variants {list(variants)} must include eager, the baseline")
    model, encoder, requests = train_cold_quickly(rows)
    request = ColdPreRankingRequest(model).eval()
    fns: dict[str, Callable[..., Any]] = {"eager": request}
    if "eager_rows" in variants:
        fns["eager_rows"] = full_rows(model)
    compile_s: dict[str, float] = {}
    recompiles: dict[str, dict[str, int]] = {}
    if "onnxruntime" in variants:
        start = time.perf_counter()
        fns["onnxruntime"] = onnxruntime_cold(request, work / "fscd.onnx")
        compile_s["onnxruntime"] = time.perf_counter() - start
    if "inductor" in variants:
        from torch._dynamo.utils import counters

        torch._dynamo.reset()
        inductor = torch.compile(request, dynamic=True)
        start = time.perf_counter()
        with torch.no_grad():
            inductor(*request_example(encoder, 64, seed=64))
        compile_s["inductor"] = time.perf_counter() - start
        before = counters["stats"]["unique_graphs"]
        with torch.no_grad():
            for n in shapes:
                inductor(*request_example(encoder, n, seed=n))
        compiles = counters["stats"]["unique_graphs"] - before + 1
        recompiles["inductor"] = {"compiles": compiles, "recompiles": compiles - 1}
        fns["inductor"] = inductor
    passes: dict[str, Any] = {}
    bf16_report: dict[str, Any] = {}
    if "cascade" in variants:
        start = time.perf_counter()
        artifact = compile_cold_preranking(
            model, work / "fscd.pt2", cache_dir=cache_dir, fast_build=fast_build
        )
        compile_s["cascade"] = time.perf_counter() - start
        passes = artifact.report.get("passes", {})
        package = load_package(artifact.path)
        with torch.no_grad():
            for n in shapes:  # one package: a shape it cannot serve raises here
                package(*request_example(encoder, n, seed=n))
        recompiles["cascade"] = {"compiles": 1, "recompiles": 0}
        fns["cascade"] = package
    if "cascade_bf16" in variants:
        start = time.perf_counter()
        mixed = compile_cold_preranking(
            model,
            work / "fscd-bf16.pt2",
            passes=BF16_PASSES,
            cache_dir=cache_dir,
            fast_build=fast_build,
        )
        compile_s["cascade_bf16"] = time.perf_counter() - start
        bf16_report = mixed.report.get("passes", {}).get("bf16_gemm", {})
        fns["cascade_bf16"] = load_package(mixed.path)

    eager_auc = request_auc(request, requests)
    result: dict[str, Any] = {
        "fields": list(BENCH_FIELDS),
        "eager_auc": eager_auc,
        "requests": len(requests),
        "auc_delta": {
            name: request_auc(fn, requests) - eager_auc
            for name, fn in fns.items()
            if name != "eager"
        },
        "compile_s": compile_s,
        "recompiles": recompiles,
        "shapes_tried": len(shapes),
        "passes": passes,
        "sizes": {},
        "model_digest": weights_digest(model),
        "model_provenance": {
            "source": "trained by this run (train_cold_quickly)",
            "network": "ColdPreRanker",
            "config": "ml100k",
            "rows": rows,
            "epochs": 2,
            "seed": 0,
            "fields": list(BENCH_FIELDS),
        },
    }
    if "cascade_bf16" in fns:
        result["bf16_gemm"] = bf16_report
    headline = "cascade" if "cascade" in fns else "eager"
    for size in sizes:
        inputs = request_example(encoder, size, seed=size)
        with torch.no_grad():
            reference = request(*inputs)
            for name, fn in fns.items():
                got = torch.as_tensor(fn(*inputs)).reshape(-1)
                # bf16 GEMMs round to 8 significant bits: judged by the AUC change instead.
                tolerance = 5e-2 if name.endswith("bf16") else 1e-4
                if not torch.allclose(got, reference, atol=tolerance, rtol=tolerance):
                    raise AssertionError(f"fscd {name} disagrees with eager at 1x{size}")
            runs = interleaved_runs_ms(
                {name: (lambda fn=fn, inputs=inputs: fn(*inputs)) for name, fn in fns.items()},
                rounds=rounds,
                repeats=repeats,
                warmup_each_round=True,
            )
        timings = {name: statistics.median(values) for name, values in runs.items()}
        entry: dict[str, Any] = {f"{name}_ms": ms for name, ms in timings.items()}
        entry.update({f"{name}_ms_runs": values for name, values in runs.items()})
        for base in ("eager_rows", "eager", "inductor", "onnxruntime"):
            if base in timings and base != headline:
                entry[f"speedup_vs_{base}"] = timings[base] / timings[headline]
            if base in timings and "cascade_bf16" in timings:
                entry[f"bf16_speedup_vs_{base}"] = timings[base] / timings["cascade_bf16"]
        result["sizes"][f"1x{size}"] = entry
    return result
