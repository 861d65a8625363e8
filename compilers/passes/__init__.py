"""Graph passes over ATen-level ``torch.fx`` graphs (``torch.export(...).module()`` form).

    python -c "from compilers.pipeline import PASS_ORDER; print(PASS_ORDER)"

One pass = one function ``(gm, context) -> PassResult`` that rewrites ``gm`` in place and
states its invariant. Parameters are ``get_attr`` nodes with real values, activations carry
``meta["val"]`` fake tensors with symbolic sizes; passes that add nodes fill in their
``meta["val"]`` by fake propagation so later passes can read shapes. Run them through
:func:`compilers.pipeline.run_pipeline`, which enforces the order and lints the result.

One module per pass, in pipeline order: :mod:`~compilers.passes.shape_constraints`,
:mod:`~compilers.passes.noop_removal`, :mod:`~compilers.passes.batch_norm_folding`,
:mod:`~compilers.passes.broadcast_sharing`, :mod:`~compilers.passes.embedding_folding`,
:mod:`~compilers.passes.winograd_rewrite`, :mod:`~compilers.passes.rsq_quantization`,
:mod:`~compilers.passes.memory_bound_fusion`, :mod:`~compilers.passes.bf16_gemm_rewrite`.
Beside them: :mod:`~compilers.passes.interface` (``PassContext``, ``PassResult``,
``ShapeConstraints``), :mod:`~compilers.passes.graph` (the graph plumbing the passes share),
and the arithmetic the rewritten graphs compute, :mod:`~compilers.passes.winograd_arithmetic`
and :mod:`~compilers.passes.rsq_arithmetic`. The names below are re-exported here so that
``from compilers.passes import NAME`` works for every pass, type and kernel.
"""

from compilers.passes.batch_norm_folding import fold_batch_norm
from compilers.passes.bf16_gemm_rewrite import bf16_gemm
from compilers.passes.broadcast_sharing import share_broadcast_computation
from compilers.passes.embedding_folding import FOLDED_TABLE_MAX_ELEMENTS, fold_embedding_linear
from compilers.passes.interface import PassContext, PassResult, ShapeConstraints
from compilers.passes.memory_bound_fusion import (
    NARROW_LINEAR_MIN_OUT_FEATURES,
    REDUCTION_MAX_OUT_FEATURES,
    VECTOR_LANES,
    fuse_memory_bound_chains,
)
from compilers.passes.noop_removal import remove_noops
from compilers.passes.rsq_arithmetic import (
    DEPTHWISE_MAX_TAPS,
    RSQ_ZERO_POINT,
    columns_to_conv_output,
    conv1d_columns,
    conv1d_weight_as_gemm,
    depthwise_conv1d_taps,
    depthwise_taps,
    rsq_conv1d,
    rsq_depthwise_conv1d,
    rsq_levels,
    rsq_linear,
)
from compilers.passes.rsq_quantization import module_path, rsq_quantize
from compilers.passes.shape_constraints import collect_shape_constraints
from compilers.passes.winograd_arithmetic import (
    WINOGRAD_AT,
    WINOGRAD_BT,
    WINOGRAD_G,
    conv1d_multiplications,
    winograd_conv1d_f23,
    winograd_filter,
)
from compilers.passes.winograd_rewrite import winograd_conv1d

__all__ = [
    "DEPTHWISE_MAX_TAPS",
    "FOLDED_TABLE_MAX_ELEMENTS",
    "NARROW_LINEAR_MIN_OUT_FEATURES",
    "REDUCTION_MAX_OUT_FEATURES",
    "RSQ_ZERO_POINT",
    "VECTOR_LANES",
    "WINOGRAD_AT",
    "WINOGRAD_BT",
    "WINOGRAD_G",
    "PassContext",
    "PassResult",
    "ShapeConstraints",
    "bf16_gemm",
    "collect_shape_constraints",
    "columns_to_conv_output",
    "conv1d_columns",
    "conv1d_multiplications",
    "conv1d_weight_as_gemm",
    "depthwise_conv1d_taps",
    "depthwise_taps",
    "fold_batch_norm",
    "fold_embedding_linear",
    "fuse_memory_bound_chains",
    "module_path",
    "remove_noops",
    "rsq_conv1d",
    "rsq_depthwise_conv1d",
    "rsq_levels",
    "rsq_linear",
    "rsq_quantize",
    "share_broadcast_computation",
    "winograd_conv1d",
    "winograd_conv1d_f23",
    "winograd_filter",
]
