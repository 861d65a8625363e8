"""The deployment gate for a compiled pre-ranking model: parity, accuracy and latency, with
reasons.

    cascade step compile --pipeline ctr_preranking --ds 2026-11-22

Before a trained FSCD pre-ranker is registered and served, the pipeline's compile step
(:mod:`compilers.preranking_gate`) compiles it into the request-shaped AOTInductor artifact
(:func:`compilers.preranking.compile_cold_preranking`) and calls :func:`compile_cold_gate` on a
held-out sample of requests. The artifact may only replace eager serving when it scores like the
model it was compiled from and is not slower; a failed check comes back as a sentence that names
the check, the measured value and the limit, so the blocked deployment explains itself in the
Airflow log (:func:`judge_artifact` holds the checks, for any request form).

:func:`held_out_requests` builds the dense ``PreRanker``'s requests,
``[((user_dense [1, U], user_id [1], item_dense [N, F-U], item_id [N]), labels [N]), ...]``:
the compile benchmark's first network (``cascade bench compile --model preranking``, under
``mlp``), which no pipeline trains.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import roc_auc_score

from cascade.compiled_packages import load_package
from compilers.export import torch_threads
from compilers.preranking import (
    ColdPreRankingRequest,
    cold_request_inputs,
    compile_cold_preranking,
)
from compilers.timing import interleaved_ms
from domains.ctr.schema import LABEL, MODEL_FEATURES, USER_FEATURES
from models.preranking.model import ColdPreRanker

Request = tuple[tuple[torch.Tensor, ...], np.ndarray]
"""``(inputs, labels)``: the four request tensors and one 0/1 label per candidate."""


def held_out_requests(frame: pd.DataFrame) -> list[Request]:
    """One request per user: the user's mean features once, its impressions as candidates."""
    users = len(USER_FEATURES)
    requests: list[Request] = []
    for user_id, rows in frame.groupby("user_id"):
        dense = rows[list(MODEL_FEATURES)].to_numpy(np.float32)
        user_dense = torch.tensor(np.nan_to_num(dense[:, :users]).mean(axis=0, keepdims=True))
        inputs = (
            user_dense,
            torch.tensor([int(user_id)]),  # type: ignore[call-overload]
            torch.tensor(dense[:, users:]),
            torch.tensor(rows["item_id"].to_numpy(np.int64)),
        )
        requests.append((inputs, rows[LABEL].to_numpy()))
    return requests


DEFAULT_MAX_ABS_DIFF = 1e-3
"""Largest tolerated ``|artifact - eager|`` logit. The exact passes stay near 1e-6; int8
(RSQ) artifacts move logits by a few 1e-3 and are judged by the AUC budget instead."""


def _scores(score: Callable[..., Any], sample: Sequence[Request]) -> list[np.ndarray]:
    with torch.no_grad():
        return [torch.as_tensor(score(*inputs)).reshape(-1).float().numpy() for inputs, _ in sample]


def _auc(labels: np.ndarray, scores: np.ndarray) -> float:
    return float(roc_auc_score(labels, scores))


def judge_artifact(
    eager: Callable[..., Any],
    compiled: Callable[..., Any],
    sample: Sequence[Request],
    largest: tuple[torch.Tensor, ...],
    *,
    max_abs_diff: float,
    auc_budget: float,
    min_speedup: float,
) -> dict[str, Any]:
    """Parity, accuracy and latency of ``compiled`` against ``eager`` on ``sample`` (requests
    of any input form both take), latency on the one request ``largest`` (its last input's
    first dim is the candidate count). Returns the checks' figures, ``passed`` and
    ``reasons``."""
    reasons: list[str] = []

    eager_scores = _scores(eager, sample)
    artifact_scores = _scores(compiled, sample)
    worst = 0.0
    for index, (want, got) in enumerate(zip(eager_scores, artifact_scores, strict=True)):
        if got.shape != want.shape:
            reasons.append(
                f"parity: request {index} got {got.shape[0]} scores for {want.shape[0]} candidates"
            )
            worst = math.inf
            continue
        if not np.isfinite(got).all():
            reasons.append(f"parity: the artifact returned non-finite scores on request {index}")
            worst = math.inf
            continue
        worst = max(worst, float(np.abs(got - want).max(initial=0.0)))
    if worst > max_abs_diff and math.isfinite(worst):
        reasons.append(
            f"parity: max |artifact - eager| logit is {worst:.3g}, above the tolerance "
            f"{max_abs_diff:.3g}"
        )

    labels = np.concatenate([np.asarray(y) for _, y in sample])
    eager_auc = artifact_auc = auc_delta = math.nan
    if len(np.unique(labels)) < 2:
        reasons.append(
            "accuracy: the sample's labels hold a single class, so AUC is undefined; gate on "
            "a sample with clicks and non-clicks"
        )
    elif math.isfinite(worst):
        eager_auc = _auc(labels, np.concatenate(eager_scores))
        artifact_auc = _auc(labels, np.concatenate(artifact_scores))
        auc_delta = artifact_auc - eager_auc
        if abs(auc_delta) > auc_budget:
            reasons.append(
                f"accuracy: AUC changed by {auc_delta:+.4f} ({eager_auc:.4f} eager -> "
                f"{artifact_auc:.4f} artifact), beyond the budget of {auc_budget:.4f}"
            )

    # Timed with one intra-op thread, as each serving worker runs (CASCADE_SERVING_TORCH_THREADS):
    # that is the latency that matters, and multi-threaded kernels on a busy machine mostly
    # measure how long their threads wait for a core (0.46x seen with the suite running beside).
    with torch_threads(1), torch.no_grad():
        timings = interleaved_ms(
            {"eager": lambda: eager(*largest), "artifact": lambda: compiled(*largest)}
        )
    speedup = timings["eager"] / timings["artifact"]
    if speedup < min_speedup:
        reasons.append(
            f"latency: the artifact is {speedup:.2f}x eager on {largest[-1].shape[0]} "
            f"candidates ({timings['artifact']:.3f} ms vs {timings['eager']:.3f} ms), below "
            f"the required {min_speedup:.2f}x"
        )
    return {
        "passed": not reasons,
        "reasons": reasons,
        "max_abs_diff": worst,
        "auc_delta": auc_delta,
        "eager_auc": eager_auc,
        "artifact_auc": artifact_auc,
        "speedup_vs_eager": speedup,
        "eager_ms": timings["eager"],
        "artifact_ms": timings["artifact"],
        "candidates_timed": int(largest[-1].shape[0]),
    }


def compile_cold_gate(
    model: ColdPreRanker,
    sample: Sequence[Request],
    *,
    out_dir: Path,
    max_abs_diff: float = DEFAULT_MAX_ABS_DIFF,
    auc_budget: float = 0.001,
    min_speedup: float = 1.0,
    cache_dir: Path | None = None,
    fast_build: bool = False,
) -> dict[str, Any]:
    """Compile the FSCD pre-ranker ``model`` and decide whether its artifact may be deployed.

    Checks, each adding a readable reason when it fails (:func:`judge_artifact`):

    * parity: every artifact logit on ``sample`` is finite and within ``max_abs_diff`` of
      eager PyTorch's;
    * accuracy: ``|AUC(artifact) - AUC(eager)| <= auc_budget`` over all candidates of the
      sample (skipped, with a reason, when the labels hold one class only: AUC is undefined);
    * latency: on one request holding all the sample's candidates, eager median / artifact
      median (interleaved rounds) is at least ``min_speedup``.

    ``sample``: requests ``((user_codes [1, F], candidate_codes [N, F]), labels [N])`` of
    encoded fields (as :func:`compilers.preranking_gate.cold_gate_sample` builds them), each scored
    as served: its cross keys deduplicated (:func:`compilers.preranking.cold_request_inputs`).
    Returns ``{"passed", "reasons", "artifact", "max_abs_diff", "auc_delta", "eager_auc",
    "artifact_auc", "speedup_vs_eager", "eager_ms", "artifact_ms", "candidates_timed",
    "passes", "compile"}``; ``passes`` is the pass pipeline's per-pass report. ``cache_dir``
    and ``fast_build`` are passed to :func:`compilers.preranking.compile_cold_preranking`."""
    if max_abs_diff <= 0 or auc_budget < 0 or min_speedup <= 0:
        raise ValueError(
            f"gate limits must be positive (max_abs_diff={max_abs_diff}, "
            f"auc_budget={auc_budget}, min_speedup={min_speedup})"
        )
    if not sample:
        raise ValueError("compile_cold_gate needs a non-empty held-out sample of requests")
    for index, ((user_codes, candidate_codes), labels) in enumerate(sample):
        if user_codes.shape[0] != 1 or user_codes.shape[1] != candidate_codes.shape[1]:
            raise ValueError(
                f"sample[{index}]: user_codes {tuple(user_codes.shape)} must be [1, F] with the "
                f"F of candidate_codes {tuple(candidate_codes.shape)}"
            )
        if candidate_codes.shape[1] != len(model.field_set):
            raise ValueError(
                f"sample[{index}]: {candidate_codes.shape[1]} code columns, but the model's field "
                f"set has {len(model.field_set)} fields; encode with the model's FieldEncoder"
            )
        if candidate_codes.shape[0] != len(labels):
            raise ValueError(
                f"sample[{index}]: {candidate_codes.shape[0]} candidates, {len(labels)} labels"
            )
    model = model.eval()
    out_dir = Path(out_dir)
    artifact = compile_cold_preranking(
        model, out_dir / "preranking.pt2", cache_dir=cache_dir, fast_build=fast_build
    )
    user_codes = max(sample, key=lambda entry: entry[0][1].shape[0])[0][0]
    largest = cold_request_inputs(model, user_codes, torch.cat([inputs[1] for inputs, _ in sample]))
    keyed = [(cold_request_inputs(model, *inputs), labels) for inputs, labels in sample]
    verdict = judge_artifact(
        ColdPreRankingRequest(model).eval(),
        load_package(artifact.path),
        keyed,
        largest,
        max_abs_diff=max_abs_diff,
        auc_budget=auc_budget,
        min_speedup=min_speedup,
    )
    return _gate_report(verdict, artifact)


def _gate_report(verdict: dict[str, Any], artifact: Any) -> dict[str, Any]:
    """The gate's verdict with the artifact's path, its per-pass report and compile figures."""
    report = dict(artifact.report)
    return {
        **verdict,
        "artifact": str(artifact.path),
        "passes": report.pop("passes", {}),
        "compile": report,
    }
