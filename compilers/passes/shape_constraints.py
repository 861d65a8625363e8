"""Pass ``collect_shape_constraints``: which dims are dynamic, equal, bounded and divisible.

Every later pass reads these facts, so a pipeline starts with it.
"""

from __future__ import annotations

import torch
from torch import fx

from compilers.passes.interface import PassContext, PassResult, ShapeConstraints


def collect_shape_constraints(gm: fx.GraphModule, context: PassContext) -> PassResult:
    """Record which dims are dynamic, equal, bounded and divisible into ``context``.

    Invariant: analysis only; the graph is not changed.
    """
    constraints = ShapeConstraints()
    by_symbol: dict[str, list[str]] = {}
    shape_env = None
    for node in gm.graph.nodes:
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            continue
        for dim, size in enumerate(value.shape):
            if not isinstance(size, torch.SymInt):
                continue
            shape_env = size.node.shape_env
            expr = size.node.expr
            if node.op == "placeholder" and expr.is_symbol:
                by_symbol.setdefault(str(expr), []).append(f"{node.name}.{dim}")
                constraints.dynamic_inputs.setdefault(node.name, []).append(dim)
            elif expr.is_Mul and expr.args[0].is_Integer:
                constraints.divisible[str(expr)] = int(expr.args[0])
    for dims in by_symbol.values():
        if len(dims) > 1:
            constraints.equal.append(dims)
    if shape_env is not None:
        for symbol, value_range in shape_env.var_to_range.items():
            if str(symbol) in by_symbol:
                upper = value_range.upper
                # torch's own int infinity is neither finite nor sympy's oo.
                finite = upper.is_number and "oo" not in str(upper)
                constraints.bounds[str(symbol)] = (
                    int(value_range.lower),
                    int(upper) if finite else None,
                )
    context.constraints = constraints
    fired = len(constraints.bounds) + len(constraints.equal) + len(constraints.divisible)
    return PassResult(fired=fired, modified=False, details=constraints.to_dict())
