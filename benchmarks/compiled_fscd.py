"""The compile benchmark's table for the FSCD pre-ranker, the network the pipeline deploys.

``cascade bench compile --model preranking`` reports it at the top level. The network is the
one the pipeline's own train step makes (:func:`train_pipeline_fscd`:
:func:`models.preranking.cascade_train.launch_pipeline`, DeepSpeed, the teacher, the FSCD
selection sweep and the chosen ColdPreRanker) with the named config :data:`FSCD_CONFIG` on
synthetic impressions, against a private state folder and MLflow store; ``model_digest`` is its
weights' digest and ``model_provenance`` names the config and the training rows' digest. It is
scored as one request of 1 user x N candidates (:class:`compilers.preranking.ColdPreRankingRequest`,
field codes in, the cross fields once per distinct cross key). Variants, all on one thread and
interleaved round by round (order rotating):

* ``eager_rows``: the network's ``forward`` on N full rows (the user's fields repeated per
  candidate), what scoring a frame of impressions runs;
* ``eager``: :meth:`ColdPreRanker.score_request`, the user side once per request (what the
  server ran before it loaded packages);
* ``inductor``: ``torch.compile(dynamic=True)`` of the request module, Inductor's defaults;
* ``inductor_tuned``: the same with freezing and the C++ wrapper, plus max-autotune where it
  measured faster (``inductor_tuned_options``:
  :func:`benchmarks.compile_peers.inductor_tuned_peer`);
* ``onnxruntime``: its ONNX export (dynamic candidate and cross-key dims) on ONNX Runtime's CPU
  provider;
* ``cascade``: the AOTInductor package the compile step builds and the server loads
  (:func:`compilers.preranking.compile_cold_preranking`);
* ``cascade_rowwise``: the package of the request written as the training forward computes a
  row (:class:`RowwiseColdRequest`: the user x item dot products per candidate and a Linear over
  them, which ``share_broadcast_computation`` collapses), against the request path's own
  collapse with the item Linear merged in (``speedup_vs_cascade_rowwise``);
* ``cascade_bf16``: the same package with ``bf16_gemm`` (bf16 GEMMs, fp32 accumulation), reported
  beside it (``bf16_speedup_vs_*``, ``auc_delta.cascade_bf16``) because it is not exact.

``speedup_vs_{peer}`` = ``{peer}_ms / cascade_ms`` (fp32 against fp32). The pipeline deploys no
int8 FSCD package, so the int8 peers are the ``mlp`` table's. The AUC change of each against
eager is measured on held-out requests (one per user); ``recompiles`` are measured across
``shapes`` candidate counts: Dynamo's graphs for the in-process compiles, packages loaded and
``shapes_served`` for the package.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.compile_peers import build_peers
from benchmarks.compiled_inference import (
    agree_with_eager,
    peer_report,
    request_auc,
    served_shapes,
    timed_entry,
)
from benchmarks.provenance import files_digest, private_tracking, weights_digest
from cascade.compiled_packages import load_package
from compilers.export import BF16_PASSES, package_artifact
from compilers.preranking import (
    COLD_INPUT_NAMES,
    ColdPreRankingRequest,
    cold_dynamic_shapes,
    cold_preranking_example,
    cold_request_inputs,
    compile_cold_preranking,
)
from models.preranking.fields import FieldEncoder
from models.preranking.model import ColdPreRanker

FSCD_CONFIG = "pipeline"
"""The training config of the table's network: the ``ctr_preranking`` DAG's train step's."""

FSCD_ROWS = 100_000
"""Synthetic impressions the network trains, validates and is tested on: enough for the
pipeline config's selection sweep to keep a model within its cost budget (on 30,000 the
cheapest still cost 0.87 of the teacher, and the train step refuses every model over budget)."""

FSCD_DS = "2026-01-31"
"""The partition the private training set is written under (the frame's last day)."""

Request = tuple[tuple[torch.Tensor, torch.Tensor], np.ndarray]


@dataclass
class TrainedFscd:
    """The pipeline's FSCD pre-ranker, its encoder, held-out requests and provenance."""

    model: ColdPreRanker
    encoder: FieldEncoder
    requests: list[Request]
    provenance: dict[str, Any]


def train_pipeline_fscd(
    work: Path,
    *,
    config: str = FSCD_CONFIG,
    rows: int = FSCD_ROWS,
    seed: int = 0,
    epochs: int | None = None,
    cost_budget: float | None = None,
) -> TrainedFscd:
    """Train the FSCD cascade with the pipeline's own train step
    (:func:`~models.preranking.cascade_train.launch_pipeline`) and config ``config`` on
    ``rows`` synthetic impressions, under a private state folder and MLflow store in ``work``
    (no stack needed, nothing logged into one). Returns the chosen ColdPreRanker, its encoder,
    one held-out request per user of the run's own test split (the gate's sample), and its
    provenance (config, training rows and their digest, chosen model, fields, test AUC).
    ``epochs`` and ``cost_budget`` override the config's, as the pipeline's knobs do (``epochs``
    recorded in the provenance)."""
    from cascade.config import load_settings, scoped_environ
    from cascade.lake import Lake
    from compilers.preranking_gate import cold_gate_sample
    from models.preranking.cascade_train import launch_pipeline
    from models.preranking.fscd_run import EXPERIMENT
    from models.preranking.inference import load_trained
    from models.preranking.registration import held_out_rows
    from models.preranking.synthetic_data import synthetic_training_frame

    home = Path(work) / "fscd-home"
    with (
        scoped_environ({"CASCADE_HOME": str(home)}),
        private_tracking(home / "mlflow", (EXPERIMENT,)),
    ):
        settings = load_settings()
        lake = Lake(settings.lake_root)
        data = lake.training_set("preranking", FSCD_DS) / "data.parquet"
        data.parent.mkdir(parents=True, exist_ok=True)
        frame = synthetic_training_frame(rows, seed=seed, end=FSCD_DS)
        frame.to_parquet(data, index=False)
        trained = launch_pipeline(
            FSCD_DS, config=config, settings=settings, epochs=epochs, cost_budget=cost_budget
        )
        loaded = load_trained(lake.reports("train", FSCD_DS))
        held_out = held_out_rows(lake, FSCD_DS, loaded.test_fraction)
    model = loaded.model
    if not isinstance(model, ColdPreRanker) or loaded.encoder is None:
        raise TypeError(f"config {config!r} trained a {type(model).__name__}, not an FSCD model")
    provenance = {
        "source": "models.preranking.cascade_train.launch_pipeline (the pipeline's train step)",
        "network": "ColdPreRanker",
        "config": config,
        "epochs_override": epochs,
        "train_processes": settings.train_processes,
        "training_rows": len(frame),
        "training_rows_digest": files_digest([data]),
        "training_data": "models.preranking.synthetic_data.synthetic_training_frame",
        "seed": seed,
        "ds": FSCD_DS,
        "chosen": trained.get("chosen"),
        "fields": list(model.fields),
        "test_auc": trained.get("test_auc"),
    }
    requests = cold_gate_sample(held_out, loaded.encoder, max_users=10**9)
    return TrainedFscd(model.eval(), loaded.encoder, requests, provenance)


REQUEST_CROSS_KEYS = 19
"""Distinct cross keys of a random request: a user's candidates share the user x category
pairs of their categories (the benchmark's log has 19 genres)."""


def request_example(
    model: ColdPreRanker, encoder: FieldEncoder, candidates: int, *, seed: int
) -> tuple[torch.Tensor, ...]:
    """One request's inputs (:func:`compilers.preranking.cold_request_inputs`): a user's codes
    ``[1, F]`` and ``candidates`` random candidates' codes ``[N, F]``, every code within its
    field's vocabulary, the cross fields drawn from :data:`REQUEST_CROSS_KEYS` random keys."""
    generator = torch.Generator().manual_seed(seed)
    cards = torch.tensor(encoder.cardinalities())
    codes = (torch.rand(candidates, len(encoder.fields), generator=generator) * cards).long()
    index = model.cross_index
    keys = (torch.rand(REQUEST_CROSS_KEYS, len(index), generator=generator) * cards[index]).long()
    codes[:, index] = keys[torch.randint(0, len(keys), (candidates,), generator=generator)]
    return cold_request_inputs(model, codes[:1].clone(), codes)


def full_rows(model: ColdPreRanker) -> Callable[..., torch.Tensor]:
    """``(user_codes, candidate_codes, *cross keys) -> logits`` through ``model.forward`` on
    full rows (the candidates' own cross columns; the keys are not read)."""
    user_positions = torch.tensor([i for i, f in enumerate(model.field_set) if f.kind == "user"])

    def run(user_codes: torch.Tensor, candidate_codes: torch.Tensor, *_: Any) -> torch.Tensor:
        rows = candidate_codes.clone()
        rows[:, user_positions] = user_codes[0, user_positions]
        return model(rows)

    return run


class RowwiseColdRequest(torch.nn.Module):
    """A request to the FSCD pre-ranker written as its training forward computes a row: the
    user side once, then per candidate the cross side, the user x item dot products and a
    Linear over them (:meth:`ColdPreRanker._candidate_logits`); :meth:`ColdPreRanker.score_request`
    collapses those into one matrix per request and takes the cross side once per cross key
    instead. Same inputs (the keys are not read: the candidates' own cross columns are) and
    logits (up to rounding)."""

    def __init__(self, model: ColdPreRanker) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        user_codes: torch.Tensor,
        candidate_codes: torch.Tensor,
        cross_codes: torch.Tensor,
        cross_rows: torch.Tensor,
    ) -> torch.Tensor:
        m = self.model
        u, i, c = m.request_sides(user_codes, candidate_codes)
        return m._candidate_logits(m._user_part(u), u, i, c)


COLD_DYNAMIC_SHAPES = cold_dynamic_shapes()
"""The request's dynamic candidate and cross-key counts, as the package exports them."""

FSCD_VARIANTS = (
    "eager_rows",
    "eager",
    "inductor",
    "inductor_tuned",
    "onnxruntime",
    "cascade",
    "cascade_rowwise",
    "cascade_bf16",
)
"""The table's variants (module docstring)."""


def fscd_compile_table(
    work: Path,
    *,
    sizes: Sequence[int] = (1_000, 10_000),
    shapes: Sequence[int] = (),
    config: str = FSCD_CONFIG,
    rows: int = FSCD_ROWS,
    variants: Sequence[str] = FSCD_VARIANTS,
    rounds: int = 7,
    repeats: int = 15,
    cache_dir: Path | None = None,
    fast_build: bool = False,
    trained: TrainedFscd | None = None,
) -> dict[str, Any]:
    """The table described in the module docstring; ``variants`` must include ``eager``.
    ``trained`` is the network to compile (default: :func:`train_pipeline_fscd` with
    ``config`` on ``rows`` impressions)."""
    if "eager" not in variants:
        raise ValueError(f"variants {list(variants)} must include eager, the baseline")
    if trained is None:
        trained = train_pipeline_fscd(work, config=config, rows=rows)
    model, encoder = trained.model, trained.encoder
    requests = [(cold_request_inputs(model, *inputs), y) for inputs, y in trained.requests]
    request = ColdPreRankingRequest(model).eval()
    shape_inputs = [request_example(model, encoder, n, seed=n) for n in shapes]
    fns: dict[str, Callable[..., Any]] = {"eager": request}
    if "eager_rows" in variants:
        fns["eager_rows"] = full_rows(model)
    compile_s: dict[str, float] = {}
    recompiles: dict[str, dict[str, int]] = {}
    peers = build_peers(
        request,
        request_example(model, encoder, 64, seed=64),
        work,
        names=[v for v in variants if v in ("inductor", "inductor_tuned", "onnxruntime")],
        shapes=shape_inputs,
        dynamic_shapes=COLD_DYNAMIC_SHAPES,
        input_names=COLD_INPUT_NAMES,
        trial_inputs=request_example(model, encoder, max(sizes), seed=max(sizes)),
    )
    for name, peer in peers.items():
        compile_s[name] = peer.compile_s
        if peer.recompiles is not None:
            recompiles[name] = peer.recompiles
        fns[name] = peer.fn
    passes: dict[str, Any] = {}
    bf16_report: dict[str, Any] = {}
    if "cascade" in variants:
        start = time.perf_counter()
        artifact = compile_cold_preranking(
            model, work / "fscd.pt2", cache_dir=cache_dir, fast_build=fast_build
        )
        compile_s["cascade"] = time.perf_counter() - start
        passes = artifact.report.get("passes", {})
        fns["cascade"], recompiles["cascade"] = served_shapes(
            lambda: load_package(artifact.path), shape_inputs
        )
    if "cascade_rowwise" in variants:
        start = time.perf_counter()
        rowwise = package_artifact(
            RowwiseColdRequest(model).eval(),
            cold_preranking_example(64, len(model.field_set)),
            COLD_DYNAMIC_SHAPES,
            work / "fscd-rowwise.pt2",
            cache_dir=cache_dir,
            fast_build=fast_build,
        )
        compile_s["cascade_rowwise"] = time.perf_counter() - start
        fns["cascade_rowwise"], recompiles["cascade_rowwise"] = served_shapes(
            lambda: load_package(rowwise.path), shape_inputs
        )
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
        fns["cascade_bf16"], recompiles["cascade_bf16"] = served_shapes(
            lambda: load_package(mixed.path), shape_inputs
        )

    eager_auc = request_auc(request, requests)
    result: dict[str, Any] = {
        "fields": list(model.fields),
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
        "model_provenance": trained.provenance,
        **peer_report(peers),
    }
    if "cascade_bf16" in fns:
        result["bf16_gemm"] = bf16_report
    headline = "cascade" if "cascade" in fns else "eager"
    for size in sizes:
        inputs = request_example(model, encoder, size, seed=size)
        with torch.no_grad():
            # bf16 GEMMs round to 8 significant bits: judged by the AUC change instead.
            agree_with_eager(fns, request(*inputs), inputs, what=f"fscd 1x{size}")
        result["sizes"][f"1x{size}"] = timed_entry(
            fns, inputs, rounds=rounds, repeats=repeats, headline=headline
        )
    return result
