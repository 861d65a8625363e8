"""Pass ``bf16_gemm``: run wide Linears over many rows as bf16 GEMMs with fp32 accumulation."""

from __future__ import annotations

import torch
from torch import fx

from compilers.passes.graph import add_const, call, const, is_static, shape_of
from compilers.passes.interface import PassContext, PassResult
from compilers.passes.memory_bound_fusion import VECTOR_LANES

aten = torch.ops.aten


def bf16_gemm(gm: fx.GraphModule, context: PassContext) -> PassResult:
    """Run wide Linears over many rows as bf16 GEMMs with fp32 accumulation.

    Invariant: each rewritten ``linear(x, W, b)`` (``W`` a constant fp32 weight with at least
    ``context.bf16_min_features`` inputs and outputs, ``x`` not a static handful of rows) becomes
    ``linear(x.bf16(), W.bf16(), b.bf16()).float()``: every other op, the graph's inputs and
    outputs stay fp32, and Inductor folds the two casts into the kernels on either side. On a
    CPU with AMX (or AVX512-BF16) oneDNN runs the GEMM at several times the fp32 rate. The
    values change by bf16 rounding of the operands and the output (8 significant bits), an
    accuracy change the caller must gate, as for ``rsq_quantize``.
    """
    fired = 0
    skipped = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target != aten.linear.default:
            continue
        weight = const(gm, node.args[1])
        shape = shape_of(node.args[0])
        if weight is None or weight.dtype != torch.float32 or weight.dim() != 2 or shape is None:
            continue
        if min(weight.shape) < context.bf16_min_features or (
            is_static(shape[0]) and shape[0] < VECTOR_LANES
        ):
            skipped += 1
            continue
        bias = node.args[2] if len(node.args) > 2 else None
        bias_value = const(gm, bias) if bias is not None else None
        if bias is not None and bias_value is None:
            skipped += 1
            continue
        with gm.graph.inserting_before(node):
            x = call(gm, aten._to_copy.default, node.args[0], dtype=torch.bfloat16)
            args = [x, add_const(gm, weight.to(torch.bfloat16), "bf16_weight")]
            if bias_value is not None:
                args.append(add_const(gm, bias_value.to(torch.bfloat16), "bf16_bias"))
            product = call(gm, aten.linear.default, *args)
            result = call(gm, aten._to_copy.default, product, dtype=torch.float32)
        node.replace_all_uses_with(result)
        gm.graph.erase_node(node)
        fired += 1
    return PassResult(
        fired=fired, modified=fired > 0, details={"bf16_layers": fired, "kept_fp32": skipped}
    )
