"""The pre-rankers' request-shaped AOTInductor packages: one user, any number of candidates.

Compile a trained pre-ranking model (the two files a training run writes) into an artifact::

    python -m compilers.preranking --state-dict model.pt --config train_config.json --out model.pt2

:class:`PreRankingRequest` (the dense ``PreRanker``) and :class:`ColdPreRankingRequest` (the FSCD
``ColdPreRanker``: encoded fields in, the user side computed once, the cross side once per
distinct cross key) go through :func:`compilers.export.package_artifact` with the candidate
count (and the FSCD request's cross-key count) as dynamic dims.
``compile_preranking(..., int8_calibration=...)`` builds the RSQ int8 variant (int8 GEMMs for
the wide layers, via freezing).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.export import Dim

from compilers.export import INT8_INDUCTOR_CONFIG, Artifact, package_artifact
from compilers.pipeline import DEFAULT_PASSES, PASS_ORDER, PassContext
from domains.ctr.schema import MODEL_FEATURES, USER_FEATURES
from models.preranking.model import ColdPreRanker, PreRanker, PreRankerConfig, cross_keys

MAX_CANDIDATES = 1 << 20
"""Upper bound of the candidate dim; export needs a finite range to reason about sizes."""


class PreRankingRequest(nn.Module):
    """One ranking request: a user's features once, ``N`` candidates' features.

    Serving scores one user against many candidates, so the user's row is broadcast along the
    candidate dim here, inside the graph, where ``share_broadcast_computation`` can see it.
    ``USER_FEATURES`` lead ``MODEL_FEATURES``, so ``cat([user, candidate])`` keeps the order the
    model was trained with.
    """

    def __init__(self, model: PreRanker) -> None:
        super().__init__()
        if tuple(MODEL_FEATURES[: len(USER_FEATURES)]) != tuple(USER_FEATURES):
            raise ValueError("PreRankingRequest needs USER_FEATURES first in MODEL_FEATURES")
        self.model = model

    def forward(
        self,
        user_dense: torch.Tensor,
        user_id: torch.Tensor,
        item_dense: torch.Tensor,
        item_id: torch.Tensor,
    ) -> torch.Tensor:
        """Logits ``[N]`` from ``user_dense [1, U]``, ``user_id [1]``, ``item_dense [N, F-U]``,
        ``item_id [N]``."""
        n = item_dense.shape[0]
        dense = torch.cat([user_dense.expand(n, -1), item_dense], dim=1)
        return self.model(dense, user_id.expand(n), item_id)


def preranking_example(
    config: PreRankerConfig, candidates: int, *, seed: int = 0
) -> tuple[torch.Tensor, ...]:
    """Random request inputs (count-like, non-negative) for ``candidates`` candidates."""
    generator = torch.Generator().manual_seed(seed)
    users = len(USER_FEATURES)
    user_dense = torch.rand(1, users, generator=generator) * 50
    item_dense = torch.rand(candidates, config.num_dense - users, generator=generator) * 50
    user_id = torch.randint(0, 10_000, (1,), generator=generator)
    item_id = torch.randint(0, 10_000, (candidates,), generator=generator)
    return user_dense, user_id, item_dense, item_id


def preranking_dynamic_shapes() -> tuple[dict[int, Any] | None, ...]:
    """The candidate count is the one dynamic dim (``Dim("candidates")``)."""
    candidates = Dim("candidates", min=1, max=MAX_CANDIDATES)
    return None, None, {0: candidates}, {0: candidates}


class ColdPreRankingRequest(nn.Module):
    """One ranking request to the FSCD pre-ranker: the user's encoded fields once, ``N``
    candidates' encoded fields, and the cross fields once per distinct cross key
    (:meth:`ColdPreRanker.score_request`: the user side runs once, the cross side once per
    key)."""

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
        """Logits ``[N]`` from ``user_codes [1, F]``, ``candidate_codes [N, F]`` (the codes
        of ``models.preranking.fields.FieldEncoder.encode``; F = every field of the model's
        field set, ``model.field_set``; their cross columns are not read), ``cross_codes
        [K, F]`` (the distinct cross keys' codes) and ``cross_rows [N]`` (each candidate's
        key): :func:`cold_request_inputs` builds the last two from full candidate rows."""
        return self.model.score_request(user_codes[0], candidate_codes, cross_codes, cross_rows)


def cold_request_inputs(
    model: ColdPreRanker, user_codes: torch.Tensor, candidate_codes: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The four inputs of :class:`ColdPreRankingRequest` from a user's codes ``[1, F]`` and
    full candidate rows ``[N, F]`` (:func:`models.preranking.model.cross_keys`)."""
    cross, rows = cross_keys(model, candidate_codes)
    return user_codes, candidate_codes, cross, rows


def cold_preranking_example(
    candidates: int, fields: int, keys: int = 8
) -> tuple[torch.Tensor, ...]:
    """Request inputs of ``fields`` columns (the model's field set) with every code 0
    (unknown), ``keys`` cross keys: valid for any encoder of that set."""
    return (
        torch.zeros(1, fields, dtype=torch.long),
        torch.zeros(candidates, fields, dtype=torch.long),
        torch.zeros(keys, fields, dtype=torch.long),
        torch.arange(candidates, dtype=torch.long) % keys,
    )


def cold_dynamic_shapes() -> tuple[dict[int, Any] | None, ...]:
    """The candidate count and the cross-key count are the dynamic dims."""
    candidates = Dim("candidates", min=1, max=MAX_CANDIDATES)
    keys = Dim("cross_keys", min=1, max=MAX_CANDIDATES)
    return None, {0: candidates}, {0: keys}, {0: candidates}


COLD_INPUT_NAMES = ("user_codes", "candidate_codes", "cross_codes", "cross_rows")
"""The inputs of :class:`ColdPreRankingRequest`, in order."""


def compile_cold_preranking(
    model: ColdPreRanker,
    out: Path,
    *,
    passes: Sequence[str] = DEFAULT_PASSES,
    cache_dir: Path | None = None,
    fast_build: bool = False,
) -> Artifact:
    """The request-shaped FSCD pre-ranker artifact (:class:`ColdPreRankingRequest`, dynamic
    candidate and cross-key counts), through the same export, pass pipeline and AOTInductor
    packaging."""
    return package_artifact(
        ColdPreRankingRequest(model.eval()).eval(),
        cold_preranking_example(64, len(model.field_set)),
        cold_dynamic_shapes(),
        out,
        passes=passes,
        cache_dir=cache_dir,
        fast_build=fast_build,
    )


INT8_MIN_FEATURES = 16
"""Layers narrower than this stay fp32 in the int8 artifact: on 2 cores the int8 GEMM only
paid off for the 64 -> 32 hidden layer (10k candidates: 1.31 ms against 1.65 ms fp32), while
the 7-feature dense Linear and the 1-output head are cheaper in fp32 or as a reduction."""


def compile_preranking(
    model: PreRanker,
    out: Path,
    *,
    passes: Sequence[str] = DEFAULT_PASSES,
    context: PassContext | None = None,
    cache_dir: Path | None = None,
    fast_build: bool = False,
    int8_calibration: list[tuple[torch.Tensor, ...]] | None = None,
) -> Artifact:
    """The request-shaped pre-ranking artifact (one user, dynamic candidate count).

    With ``int8_calibration`` (a few real requests' inputs) the Linear layers of at least
    :data:`INT8_MIN_FEATURES` features run as RSQ int8 GEMMs; the accuracy change is the
    caller's to check (``compilers.gate``, the benchmark's ``int8_auc_delta``).
    """
    request = PreRankingRequest(model.eval()).eval()
    example = preranking_example(model.config, 64)
    inductor_config: dict[str, Any] = {}
    if int8_calibration is not None:
        if "rsq_quantize" in passes:
            raise ValueError("pass int8_calibration or list rsq_quantize in passes, not both")
        passes = tuple(sorted({*passes, "rsq_quantize"}, key=PASS_ORDER.index))
        context = context or PassContext()
        context.calibration_inputs = int8_calibration
        context.rsq_min_features = INT8_MIN_FEATURES
        inductor_config = INT8_INDUCTOR_CONFIG
    return package_artifact(
        request,
        example,
        preranking_dynamic_shapes(),
        out,
        passes=passes,
        context=context,
        cache_dir=cache_dir,
        fast_build=fast_build,
        inductor_config=inductor_config,
    )


def main(argv: list[str] | None = None) -> None:
    from models.preranking.inference import load_model_dir

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dict", type=Path, required=True, help="state dict from training")
    parser.add_argument("--config", type=Path, required=True, help="train_config.json")
    parser.add_argument("--out", type=Path, required=True, help="the .pt2 package to write")
    parser.add_argument("--cache-dir", type=Path, default=None, help="reuse packages from here")
    args = parser.parse_args(argv)
    model, _ = load_model_dir(args.state_dict, args.config)
    artifact = compile_preranking(model, args.out, cache_dir=args.cache_dir)
    print(json.dumps({"artifact": str(artifact.path), **artifact.report}, indent=2))


if __name__ == "__main__":
    main()
