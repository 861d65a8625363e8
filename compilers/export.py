"""Export with dynamic dims -> pass pipeline -> AOTInductor ``.pt2`` package.

Compile a trained pre-ranking model (the two files a training run writes) into an artifact::

    python -m compilers.export --state-dict model.pt --config train_config.json --out model.pt2

The artifact is request-shaped (:class:`PreRankingRequest`: one user, any number of candidates)
and loads with :func:`load_artifact` (``torch._inductor.aoti_load_package``) without importing
``models.preranking``. Packages are cached by a digest of the weights, the passes and the torch
version, because AOTInductor compiles C++ with gcc and that takes minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.export import Dim, ExportedProgram

from cascade.ctr_schema import MODEL_FEATURES, USER_FEATURES
from compilers.pipeline import DEFAULT_PASSES, PassContext, PipelineReport, run_pipeline
from models.preranking.model import PreRanker, PreRankerConfig

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


def export_program(
    module: nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    dynamic_shapes: Sequence[dict[int, Any] | None],
) -> ExportedProgram:
    """``torch.export`` in eval mode; errors name the dim whose constraint failed."""
    if not isinstance(module, torch.fx.GraphModule):
        module.eval()  # an exported GraphModule refuses eval(); it has no train-mode branches
    with torch.no_grad():
        return torch.export.export(module, example_inputs, dynamic_shapes=tuple(dynamic_shapes))


@dataclass(kw_only=True)
class CompiledGraph:
    """The outcome of export + passes, before packaging."""

    graph_module: torch.fx.GraphModule
    """The transformed graph, runnable by PyTorch as it stands."""
    program: ExportedProgram | None
    """Re-exported program of the transformed graph (what AOTInductor packages); None when
    ``compile_graph(reexport=False)``."""
    report: PipelineReport
    """Per-pass report: fired counts and times."""
    export_s: float
    """Seconds spent in the two exports."""


def compile_graph(
    module: nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    dynamic_shapes: Sequence[dict[int, Any] | None],
    *,
    passes: Sequence[str] = DEFAULT_PASSES,
    context: PassContext | None = None,
    reexport: bool = True,
) -> CompiledGraph:
    """Export, run ``passes`` over the graph, re-export the result with the same dims.

    Re-exporting (rather than patching the program's graph in place) lets torch.export
    recompute shape metadata and the graph signature for the nodes the passes created.
    """
    start = time.perf_counter()
    program = export_program(module, example_inputs, dynamic_shapes)
    export_s = time.perf_counter() - start
    gm = program.module()
    context = context or PassContext()
    if context.example_inputs is None:
        context.example_inputs = example_inputs
    report = run_pipeline(gm, passes, context)
    if not reexport:
        return CompiledGraph(graph_module=gm, program=None, report=report, export_s=export_s)
    start = time.perf_counter()
    program = export_program(gm, example_inputs, dynamic_shapes)
    export_s += time.perf_counter() - start
    return CompiledGraph(graph_module=gm, program=program, report=report, export_s=export_s)


@dataclass(kw_only=True)
class Artifact:
    """A packaged model and how it was made."""

    path: Path
    """The ``.pt2`` AOTInductor package."""
    report: dict[str, Any] = field(default_factory=dict)
    """Pipeline report plus ``export_s``, ``package_s`` and ``cached``."""


def artifact_digest(module: nn.Module, passes: Sequence[str], extra: str = "") -> str:
    """Cache key: weights, buffers, pass list, graph-shaping extras and the torch version."""
    digest = hashlib.sha256()
    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in module.state_dict().items()}, buffer)
    digest.update(buffer.getvalue())
    digest.update(
        json.dumps([list(passes), extra, torch.__version__, type(module).__name__]).encode()
    )
    return digest.hexdigest()[:20]


def package_artifact(
    module: nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    dynamic_shapes: Sequence[dict[int, Any] | None],
    out: Path,
    *,
    passes: Sequence[str] = DEFAULT_PASSES,
    context: PassContext | None = None,
    cache_dir: Path | None = None,
    fast_build: bool = False,
) -> Artifact:
    """Compile ``module`` into an AOTInductor package at ``out`` (reused from ``cache_dir``).

    A cached package is keyed by :func:`artifact_digest`; its report is stored beside it.
    ``fast_build`` builds the C++ wrapper at ``-O0`` (kernels stay optimized): for tests, where
    gcc time matters more than the wrapper's per-call overhead.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    key = artifact_digest(module, passes, repr([tuple(x.shape) for x in example_inputs]))
    cached = None if cache_dir is None else Path(cache_dir) / f"{key}.pt2"
    if cached is not None and cached.exists() and cached.with_suffix(".json").exists():
        out.write_bytes(cached.read_bytes())
        report = json.loads(cached.with_suffix(".json").read_text())
        report["cached"] = True
        return Artifact(path=out, report=report)

    compiled = compile_graph(module, example_inputs, dynamic_shapes, passes=passes, context=context)
    assert compiled.program is not None
    start = time.perf_counter()
    level = "O0" if fast_build else torch._inductor.config.aot_inductor.compile_wrapper_opt_level
    with torch._inductor.config.patch({"aot_inductor.compile_wrapper_opt_level": level}):
        torch._inductor.aoti_compile_and_package(compiled.program, package_path=str(out))
    report = {
        **compiled.report.to_dict(),
        "export_s": compiled.export_s,
        "package_s": time.perf_counter() - start,
        "cached": False,
    }
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_bytes(out.read_bytes())
        cached.with_suffix(".json").write_text(json.dumps(report, indent=2))
    return Artifact(path=out, report=report)


def load_artifact(path: Path) -> Callable[..., Any]:
    """Load a ``.pt2`` package; the callable takes the exported inputs positionally.

    The compiled kernels assume the contiguous strides they were exported with and do not check
    them: a column slice of a pandas frame (Fortran order) silently gave wrong scores. So every
    input is made contiguous first (free when it already is).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no compiled artifact at {path}; build it with compilers.export")
    package = torch._inductor.aoti_load_package(str(path))

    def run(*inputs: torch.Tensor) -> Any:
        return package(*(x.contiguous() for x in inputs))

    return run


def compile_preranking(
    model: PreRanker,
    out: Path,
    *,
    passes: Sequence[str] = DEFAULT_PASSES,
    context: PassContext | None = None,
    cache_dir: Path | None = None,
    fast_build: bool = False,
) -> Artifact:
    """The request-shaped pre-ranking artifact (one user, dynamic candidate count)."""
    request = PreRankingRequest(model.eval()).eval()
    example = preranking_example(model.config, 64)
    return package_artifact(
        request,
        example,
        preranking_dynamic_shapes(),
        out,
        passes=passes,
        context=context,
        cache_dir=cache_dir,
        fast_build=fast_build,
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
