"""The ordered pass pipeline: passes applied by name, in :data:`PASS_ORDER`, with a report.

    python -c "from compilers.pipeline import PASS_ORDER; print(PASS_ORDER)"

Each pass is one function in its own module of :mod:`compilers.passes`
(``(gm, context) -> PassResult``) whose docstring states its invariant. The pipeline refuses
unknown names and names out of order (later passes rely on earlier ones: everything reads the
constraints of ``collect_shape_constraints``; quantization must see folded BatchNorms), and ends
every run with dead-code elimination, ``recompile()`` and ``graph.lint()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import fx

from compilers.passes.batch_norm_folding import fold_batch_norm
from compilers.passes.bf16_gemm_rewrite import bf16_gemm
from compilers.passes.broadcast_sharing import share_broadcast_computation
from compilers.passes.embedding_folding import fold_embedding_linear
from compilers.passes.interface import PassContext, PassResult
from compilers.passes.memory_bound_fusion import fuse_memory_bound_chains
from compilers.passes.noop_removal import remove_noops
from compilers.passes.rsq_quantization import rsq_quantize
from compilers.passes.shape_constraints import collect_shape_constraints
from compilers.passes.winograd_rewrite import winograd_conv1d

__all__ = ["DEFAULT_PASSES", "PASS_ORDER", "PassContext", "PipelineReport", "run_pipeline"]

PASSES: dict[str, Callable[[fx.GraphModule, PassContext], PassResult]] = {
    "collect_shape_constraints": collect_shape_constraints,
    "remove_noops": remove_noops,
    "fold_batch_norm": fold_batch_norm,
    "share_broadcast_computation": share_broadcast_computation,
    "fold_embedding_linear": fold_embedding_linear,
    "winograd_conv1d": winograd_conv1d,
    "rsq_quantize": rsq_quantize,
    "fuse_memory_bound_chains": fuse_memory_bound_chains,
    "bf16_gemm": bf16_gemm,
}
"""Every pass by name."""

PASS_ORDER: tuple[str, ...] = tuple(PASSES)
"""The only order passes may run in; a pipeline is any subsequence of it."""

DEFAULT_PASSES: tuple[str, ...] = (
    "collect_shape_constraints",
    "remove_noops",
    "fold_batch_norm",
    "share_broadcast_computation",
    "fold_embedding_linear",
    "winograd_conv1d",
    "fuse_memory_bound_chains",
)
"""Exact (numerics-preserving up to rounding) passes; ``rsq_quantize`` is opt-in because it
changes accuracy and must pass the accuracy gate."""


@dataclass(kw_only=True)
class PassReport:
    """What one pass did."""

    name: str
    """Pass name."""
    fired: int
    """How many rewrites (or facts, for analysis passes) the pass made."""
    ms: float
    """Wall time of the pass in milliseconds."""
    details: dict[str, Any] = field(default_factory=dict)
    """Pass-specific counts and findings."""


@dataclass(kw_only=True)
class PipelineReport:
    """The per-pass reports of one pipeline run, in order."""

    passes: list[PassReport] = field(default_factory=list)
    """One entry per pass run."""
    nodes_before: int = 0
    """Graph nodes before the first pass."""
    nodes_after: int = 0
    """Graph nodes after the final cleanup."""

    def fired(self, name: str) -> int:
        """Fired count of pass ``name`` (0 when it did not run)."""
        return sum(p.fired for p in self.passes if p.name == name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passes": {
                p.name: {"fired": p.fired, "ms": round(p.ms, 3), **p.details} for p in self.passes
            },
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
        }


def check_order(names: Sequence[str]) -> None:
    """Raise ValueError unless ``names`` is a duplicate-free subsequence of PASS_ORDER."""
    unknown = [n for n in names if n not in PASSES]
    if unknown:
        raise ValueError(f"unknown passes {unknown}; known passes, in order: {list(PASS_ORDER)}")
    positions = [PASS_ORDER.index(n) for n in names]
    if positions != sorted(set(positions)):
        raise ValueError(
            f"passes {list(names)} are out of order or repeated; list them in the order "
            f"{list(PASS_ORDER)}"
        )
    if names and names[0] != "collect_shape_constraints":
        raise ValueError(
            "a pipeline must start with 'collect_shape_constraints': the later passes read the "
            "shape facts it collects"
        )


def run_pipeline(
    gm: fx.GraphModule, names: Sequence[str], context: PassContext | None = None
) -> PipelineReport:
    """Apply the passes ``names`` to ``gm`` in place, in the enforced order; return the report."""
    check_order(names)
    context = context or PassContext()
    report = PipelineReport(nodes_before=len(gm.graph.nodes))
    for name in names:
        start = time.perf_counter()
        result = PASSES[name](gm, context)
        elapsed = (time.perf_counter() - start) * 1000
        if result.modified:
            # Each pass leaves a valid graph; lint here so a broken pass is named, not the next.
            gm.graph.lint()
        report.passes.append(
            PassReport(name=name, fired=result.fired, ms=elapsed, details=result.details)
        )
    gm.graph.eliminate_dead_code()
    gm.delete_all_unused_submodules()
    gm.recompile()
    gm.graph.lint()
    report.nodes_after = len(gm.graph.nodes)
    return report
