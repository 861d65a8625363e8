"""Pass ``fuse_memory_bound_chains``: reshape memory-bound pointwise/reduction work so Inductor
emits fewer, vector kernels.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import fx

from compilers.passes.graph import (
    ELEMENTWISE,
    add_const,
    call,
    const,
    is_static,
    same_size,
    shape_of,
    val,
)
from compilers.passes.interface import PassContext, PassResult

aten = torch.ops.aten


VECTOR_LANES = 16
"""fp32 lanes of one AVX-512 register: a row narrower than this leaves Inductor's vector loop
with only a scalar tail."""
REDUCTION_MAX_OUT_FEATURES = 2
"""A Linear with at most this many outputs is a per-row dot product, i.e. a reduction."""

_CHAIN_OPS = ELEMENTWISE - {aten.remainder.Scalar, aten.remainder.Tensor}


def _narrow_chain(gm: fx.GraphModule, terminal: fx.Node) -> tuple[list[fx.Node], fx.Node] | None:
    """``(region, source)``: the pointwise ops computing ``terminal`` from one ``[N, k]`` tensor.

    Every region node has ``terminal``'s shape; operands outside the region are the source,
    scalars, or constants that vary only along the last dim. None unless all of that holds and
    the region's inner nodes feed nothing outside it.
    """
    shape = shape_of(terminal)
    if shape is None or len(shape) != 2 or not is_static(shape[1]) or shape[1] >= VECTOR_LANES:
        return None
    if is_static(shape[0]) and shape[0] < VECTOR_LANES:
        return None  # a few rows: nothing to vectorize along either way
    width = shape[1]
    region: set[fx.Node] = set()
    source: fx.Node | None = None
    stack = [terminal]
    while stack:
        node = stack.pop()
        if node in region:
            continue
        if node.op != "call_function" or node.target not in _CHAIN_OPS:
            return None
        node_shape = shape_of(node)
        if node_shape is None or not all(
            same_size(a, b) for a, b in zip(node_shape, shape, strict=True)
        ):
            return None
        region.add(node)
        operands = [a for a in (*node.args, *node.kwargs.values()) if isinstance(a, fx.Node)]
        for arg in operands:
            tensor = const(gm, arg)
            if tensor is not None:
                if tensor.numel() != 1 and tuple(tensor.shape) not in ((width,), (1, width)):
                    return None
                continue
            arg_shape = shape_of(arg)
            is_chain = arg.op == "call_function" and arg.target in _CHAIN_OPS
            if is_chain and arg_shape is not None and len(arg_shape) == 2:
                stack.append(arg)
            elif source is None or source is arg:
                source = arg
            else:
                return None
    if source is None or len(region) < 2:
        return None
    source_shape = shape_of(source)
    if source_shape is None or len(source_shape) != 2:
        return None
    ordered = [n for n in gm.graph.nodes if n in region]
    if any(u not in region for n in ordered if n is not terminal for u in n.users):
        return None
    return ordered, source


def _feature_major(gm: fx.GraphModule, terminal: fx.Node) -> bool:
    """Evaluate a narrow ``[N, k]`` pointwise chain on its transpose ``[k, N]``.

    Inductor vectorizes the innermost dim; with ``k < VECTOR_LANES`` columns innermost the
    chain ran as a scalar loop (a per-column select over the column index, ``log1p`` one value
    at a time). On the transpose the vector loop runs over the candidates, per-column
    constants become per-row scalars, and the Linear consuming the result reads the transposed
    operand without a copy.
    """
    if not terminal.users or any(
        u.target != aten.linear.default or u.args[0] is not terminal for u in terminal.users
    ):
        return False
    found = _narrow_chain(gm, terminal)
    if found is None:
        return False
    region, source = found
    columns: dict[fx.Node, fx.Node] = {}
    with gm.graph.inserting_before(region[0]):
        transposed_source = call(gm, aten.permute.default, source, [1, 0])
    env: dict[fx.Node, fx.Node] = {source: transposed_source}

    def operand(arg: Any) -> Any:
        if not isinstance(arg, fx.Node):
            return arg
        if arg in env:
            return env[arg]
        tensor = const(gm, arg)
        if tensor is None or tensor.numel() == 1:
            return arg
        if arg not in columns:
            columns[arg] = add_const(gm, tensor.reshape(-1, 1), "column")
        return columns[arg]

    with gm.graph.inserting_before(terminal):
        for node in region:
            args = tuple(operand(a) for a in node.args)
            kwargs = {k: operand(v) for k, v in node.kwargs.items()}
            env[node] = call(gm, node.target, *args, **kwargs)  # type: ignore[arg-type]
        back = call(gm, aten.permute.default, env[terminal], [1, 0])
    terminal.replace_all_uses_with(back)
    for node in reversed(region):
        gm.graph.erase_node(node)
    return True


NARROW_LINEAR_MIN_OUT_FEATURES = VECTOR_LANES
"""A Linear over fewer than ``VECTOR_LANES`` input features and at least this many outputs is
written out column by column: its output row holds whole vectors, its input row does not."""

_AFFINE_OPS = {aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor}


def _column_constant(gm: fx.GraphModule, arg: Any, width: int) -> torch.Tensor | None:
    """``arg`` as a float64 vector of ``width`` per-column values, if it is such a constant."""
    if isinstance(arg, (int, float)) and not isinstance(arg, bool):
        return torch.full((width,), float(arg), dtype=torch.float64)
    tensor = const(gm, arg)
    if tensor is None or not tensor.is_floating_point():
        return None
    if tensor.numel() == 1:
        return tensor.reshape(1).double().expand(width).clone()
    if tuple(tensor.shape) in ((width,), (1, width)):
        return tensor.reshape(width).double()
    return None


def _peel_column_affine(
    gm: fx.GraphModule, node: fx.Node, width: int
) -> tuple[fx.Node, torch.Tensor, torch.Tensor]:
    """``(base, scale, shift)`` with ``node == base * scale + shift`` per column.

    Walks back over add / sub / mul / div by per-column constants (the standardization at the
    end of a feature transform). A peeled op must have one user (the Linear, or the op after
    it), so dropping it loses no other use.
    """
    scale = torch.ones(width, dtype=torch.float64)
    shift = torch.zeros(width, dtype=torch.float64)
    current = node
    while (
        isinstance(current, fx.Node)
        and current.op == "call_function"
        and current.target in _AFFINE_OPS
        and not current.kwargs
        and len(current.users) == 1
    ):
        left, right = current.args[:2]
        constant = _column_constant(gm, right, width)
        base = left
        if constant is None and current.target in (aten.add.Tensor, aten.mul.Tensor):
            constant, base = _column_constant(gm, left, width), right
        if constant is None or not isinstance(base, fx.Node) or const(gm, base) is not None:
            break
        if current.target == aten.div.Tensor:
            if bool((constant == 0).any()):
                break
            scale = scale / constant
        elif current.target == aten.mul.Tensor:
            scale = scale * constant
        elif current.target == aten.sub.Tensor:
            shift = shift - constant * scale
        else:
            shift = shift + constant * scale
        current = base
    return current, scale, shift


def _narrow_linear_by_column(gm: fx.GraphModule, node: fx.Node) -> bool:
    """``linear(t[N, k], W[o, k], b)`` with ``k < VECTOR_LANES <= o`` ->
    ``sum_c t[:, c:c+1] * W[:, c] + b``, with the transform behind ``t`` split by column.

    As an extern GEMM the narrow Linear needs its input written out as ``[N, k]`` first,
    whose transform ran as a scalar or gathering loop (``k`` values per row, per-column
    constants), and then writes ``[N, o]`` for the next kernel to read back. Column by column,
    ``k`` multiply-adds per output vector join the kernel that consumes the Linear (the bias,
    the embedding rows and the ReLU after it). The transform is split so that no vector loop
    needs a per-column constant:

    * trailing per-column affine ops (``(x - mean) / std``) fold into ``W`` and ``b``;
    * a ``where`` on a constant per-column mask picks, per column, the branch it would take;
      the branches are stacked into one ``[branches, N, k]`` tensor, which one contiguous
      vector loop writes, and each term reads its column of its branch as a scalar.

    Invariant: the Linear's value is unchanged up to float rounding (the folded weights are
    computed in float64); the peeled ops and the ``where`` stay in the graph for dead-code
    elimination when nothing else reads them.
    """
    if node.target != aten.linear.default:
        return False
    weight = const(gm, node.args[1])
    shape = shape_of(node.args[0])
    if weight is None or weight.dim() != 2 or shape is None or len(shape) != 2:
        return False
    out_features, width = weight.shape
    if not (width < VECTOR_LANES and out_features >= NARROW_LINEAR_MIN_OUT_FEATURES):
        return False
    if not is_static(shape[1]):
        return False
    if is_static(shape[0]) and shape[0] < VECTOR_LANES:
        return False  # a few rows: the GEMM call is cheap and nothing vectorizes better
    bias = node.args[2] if len(node.args) > 2 else None
    bias_value = None
    if bias is not None:
        bias_value = const(gm, bias)
        if bias_value is None:
            return False
    source: fx.Node = node.args[0]  # type: ignore[assignment]
    base, scale, shift = _peel_column_affine(gm, source, width)
    branches: list[fx.Node] = [base] * width
    if (
        base.op == "call_function"
        and base.target == aten.where.self
        and (base is source or len(base.users) == 1)
    ):
        mask = const(gm, base.args[0])
        if (
            mask is not None
            and mask.dtype == torch.bool
            and tuple(mask.shape) in ((width,), (1, width))
            and all(isinstance(a, fx.Node) for a in base.args[1:])
        ):
            chosen = mask.reshape(width).tolist()
            branches = [base.args[1] if pick else base.args[2] for pick in chosen]  # type: ignore[misc]
    folded_weight = (weight.double() * scale).to(weight.dtype)
    if not bool(folded_weight.any()):
        return False
    folded_bias = weight.double() @ shift
    if bias_value is not None:
        folded_bias = folded_bias + bias_value.double()
    distinct = list(dict.fromkeys(branches))
    with gm.graph.inserting_before(node):
        # The branches are stacked into one [b, N, k] tensor: one kernel writes every branch
        # for all columns (a contiguous vector loop), and the terms read it back as scalars.
        stacked = call(
            gm, aten.cat.default, [call(gm, aten.unsqueeze.default, b, 0) for b in distinct], 0
        )
        total: fx.Node | None = None  # set by the first nonzero column, which exists
        for column, branch in enumerate(branches):
            if not bool(folded_weight[:, column].any()):
                continue
            rows = call(gm, aten.select.int, stacked, 0, distinct.index(branch))
            piece = call(gm, aten.slice.Tensor, rows, 1, column, column + 1)
            term = call(
                gm,
                aten.mul.Tensor,
                piece,
                add_const(gm, folded_weight[:, column], "column_weight"),
            )
            total = term if total is None else call(gm, aten.add.Tensor, total, term)
        assert total is not None
        if bias is not None or bool(folded_bias.any()):
            total = call(
                gm,
                aten.add.Tensor,
                total,
                add_const(gm, folded_bias.to(weight.dtype), "column_bias"),
            )
    node.replace_all_uses_with(total)
    gm.graph.erase_node(node)
    return True


def _nan_to_num_as_selects(gm: fx.GraphModule, node: fx.Node) -> bool:
    """``nan_to_num(x, nan, posinf, neginf)`` -> three selects on ``x != x``, ``x == inf``,
    ``x == -inf``: the same values, but compares Inductor keeps in vector registers. Its CPU
    code for ``isnan`` stores each vector and tests the 16 lanes one by one (1 x 70,000 floats:
    ~200 us against ~65 us for the selects)."""
    if node.target != aten.nan_to_num.default:
        return False
    value = val(node)
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        return False
    x = node.args[0]
    options = dict(zip(("nan", "posinf", "neginf"), node.args[1:], strict=False))
    options.update(node.kwargs)
    limits = torch.finfo(value.dtype)
    nan = 0.0 if options.get("nan") is None else float(options["nan"])
    posinf = limits.max if options.get("posinf") is None else float(options["posinf"])
    neginf = limits.min if options.get("neginf") is None else float(options["neginf"])
    with gm.graph.inserting_before(node):
        result = call(gm, aten.where.ScalarSelf, call(gm, aten.ne.Tensor, x, x), nan, x)
        for bound, replacement in ((math.inf, posinf), (-math.inf, neginf)):
            hit = call(gm, aten.eq.Scalar, x, bound)
            result = call(gm, aten.where.ScalarSelf, hit, replacement, result)
    node.replace_all_uses_with(result)
    gm.graph.erase_node(node)
    return True


def _linear_as_reduction(gm: fx.GraphModule, node: fx.Node) -> bool:
    """``linear(x, W[o, K], b)`` with ``o <= 2`` -> ``sum(x[..., None, :] * W, -1) + b``.

    A one-output Linear is a dot product per row: as an extern GEMM it needs its input
    written out first (the ReLU before it becomes its own kernel); as a reduction Inductor
    computes the ReLU, the products, the sum and the bias in one pass over the rows.
    """
    if node.target != aten.linear.default:
        return False
    weight = const(gm, node.args[1])
    shape = shape_of(node.args[0])
    if weight is None or weight.dim() != 2 or weight.shape[0] > REDUCTION_MAX_OUT_FEATURES:
        return False
    if shape is None or not is_static(shape[-1]):
        return False
    bias = node.args[2] if len(node.args) > 2 else None
    with gm.graph.inserting_before(node):
        if weight.shape[0] == 1:
            row = add_const(gm, weight[0], "dot_weight")
            product = call(gm, aten.mul.Tensor, node.args[0], row)
            total = call(gm, aten.sum.dim_IntList, product, [-1], True)
        else:
            rows = call(gm, aten.unsqueeze.default, node.args[0], -2)
            product = call(gm, aten.mul.Tensor, rows, add_const(gm, weight, "dot_weight"))
            total = call(gm, aten.sum.dim_IntList, product, [-1])
        if bias is not None:
            total = call(gm, aten.add.Tensor, total, bias)
    node.replace_all_uses_with(total)
    gm.graph.erase_node(node)
    return True


def fuse_memory_bound_chains(gm: fx.GraphModule, context: PassContext) -> PassResult:
    """Reshape memory-bound pointwise/reduction work so Inductor emits fewer, vector kernels.

    Four rewrites, all exact up to float rounding:

    * ``narrow_linear_by_column``: a Linear over fewer than ``VECTOR_LANES`` input features
      into at least as many outputs (the candidates' dense features into the first layer) is
      written out column by column (:func:`_narrow_linear_by_column`): its per-column
      standardization folds into the weights, its per-column ``log1p`` / plain choice becomes
      one stacked buffer of both branches, and the multiply-adds join the kernel that adds the
      embedding rows and applies the ReLU. 1 x 10,000 candidates (PreRanker, one core): the
      transform, the GEMM and that kernel, 0.60 ms -> 0.57 ms in profile; the package
      1.003 -> 0.925 ms.
    * ``feature_major``: a chain of pointwise ops over a narrow ``[N, k]`` tensor (the
      candidates' dense features: NaN repair, ``log1p`` of counts, standardization) that feeds
      a Linear with fewer outputs is evaluated on its transpose (:func:`_feature_major`), so
      its one kernel is a vector loop over the candidates instead of a scalar loop over ``k``
      columns.
    * ``linear_as_reduction``: a Linear with at most ``REDUCTION_MAX_OUT_FEATURES`` outputs
      becomes multiply + sum (:func:`_linear_as_reduction`), which fuses with the pointwise op
      before it and the bias after it into one reduction kernel instead of an extern GEMM plus
      a separate pointwise kernel.
    * ``nan_to_num_as_selects``: ``nan_to_num`` becomes three vector selects
      (:func:`_nan_to_num_as_selects`) instead of Inductor's lane-by-lane ``isnan``.

    Invariant: every replaced value keeps its shape and dtype; new nodes carry ``meta["val"]``;
    only views, pointwise ops and reductions are added; nothing is computed in place.
    """
    counts = {
        "narrow_linear_by_column": 0,
        "feature_major": 0,
        "linear_as_reduction": 0,
        "nan_to_num_as_selects": 0,
    }
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and _linear_as_reduction(gm, node):
            counts["linear_as_reduction"] += 1
        elif node.op == "call_function" and _narrow_linear_by_column(gm, node):
            counts["narrow_linear_by_column"] += 1
    # A rewrite erases a whole chain; walk from the output so a terminal is met before the
    # chain members it might erase, and re-check liveness for the rest.
    for node in reversed(list(gm.graph.nodes)):
        if node.op != "call_function" or node not in set(gm.graph.nodes):
            continue
        if _feature_major(gm, node):
            counts["feature_major"] += 1
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and _nan_to_num_as_selects(gm, node):
            counts["nan_to_num_as_selects"] += 1
    fired = sum(counts.values())
    return PassResult(fired=fired, modified=fired > 0, details=counts)
