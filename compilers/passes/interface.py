"""What every pass takes and returns: :class:`PassContext` (inputs and knobs the passes
share, and where they record findings), :class:`PassResult`, and the :class:`ShapeConstraints`
that ``collect_shape_constraints`` fills in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(kw_only=True)
class ShapeConstraints:
    """Facts about the symbolic dims of a graph, from ``collect_shape_constraints``."""

    bounds: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    """Symbol -> (lower, upper) bound; upper None when unbounded."""
    equal: list[list[str]] = field(default_factory=list)
    """Groups of input dims (``"name.dim"``) that share one symbol, hence are equal."""
    divisible: dict[str, int] = field(default_factory=dict)
    """Symbolic size expression -> a constant it is divisible by (e.g. ``2*s0`` -> 2)."""
    dynamic_inputs: dict[str, list[int]] = field(default_factory=dict)
    """Input name -> its dynamic dims."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "bounds": {k: list(v) for k, v in self.bounds.items()},
            "equal": self.equal,
            "divisible": self.divisible,
            "dynamic_inputs": self.dynamic_inputs,
        }


@dataclass(kw_only=True)
class PassContext:
    """Inputs and knobs the passes share; passes also record findings here."""

    example_inputs: tuple[torch.Tensor, ...] | None = None
    """Real inputs for timing decisions (``winograd="auto"``); set by the exporter."""
    calibration_inputs: list[tuple[torch.Tensor, ...]] | None = None
    """Input batches whose activation ranges calibrate ``rsq_quantize``; it needs these or
    ``rsq_input_ranges``."""
    rsq_input_ranges: dict[str, float] | None = None
    """Module path (``blocks.0.affine``) -> clipping range of that layer's input, as a
    quantization-aware training learned it; ``rsq_quantize`` uses these instead of calibrating
    the layers they name, so the artifact clips where training clipped."""
    winograd: str = "auto"
    """``auto``: rewrite a 3-tap Conv1d only where it is faster here; ``always`` / ``never``."""
    rsq_bits: int = 8
    """Quantization width of ``rsq_quantize`` (symmetric, so ``2**(bits-1) - 1`` levels)."""
    rsq_min_features: int = 1
    """``rsq_quantize`` keeps a layer fp32 when its input or output features are fewer."""
    bf16_min_features: int = 16
    """``bf16_gemm`` keeps a Linear fp32 when its input or output features are fewer."""
    timing_repeats: int = 7
    """Repeats per side when ``winograd="auto"`` times direct against Winograd."""
    constraints: ShapeConstraints = field(default_factory=ShapeConstraints)
    """Filled by ``collect_shape_constraints``."""

    def __post_init__(self) -> None:
        if self.winograd not in ("auto", "always", "never"):
            raise ValueError(f"winograd must be 'auto', 'always' or 'never', got {self.winograd!r}")
        if not 2 <= self.rsq_bits <= 8:
            raise ValueError(f"rsq_bits must be in [2, 8] (int8 storage), got {self.rsq_bits}")
        if self.rsq_min_features < 1:
            raise ValueError(f"rsq_min_features must be >= 1, got {self.rsq_min_features}")
        if self.bf16_min_features < 1:
            raise ValueError(f"bf16_min_features must be >= 1, got {self.bf16_min_features}")
        if self.timing_repeats < 1:
            raise ValueError(f"timing_repeats must be >= 1, got {self.timing_repeats}")


@dataclass(kw_only=True)
class PassResult:
    """What a pass did to the graph."""

    fired: int
    """Rewrites made (analysis passes: facts found)."""
    modified: bool
    """Whether the graph changed."""
    details: dict[str, Any] = field(default_factory=dict)
    """Pass-specific findings for the report."""
