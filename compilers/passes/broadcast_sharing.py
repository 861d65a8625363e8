"""Pass ``share_broadcast_computation``: move work on a tensor that is only repeated along dim 0
(the user side of a 1 user x N candidates request) to before the repeat.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from compilers.passes.graph import (
    ELEMENTWISE,
    add_const,
    call,
    cat_parts,
    const,
    flattened_input,
    is_static,
    same_size,
    shape_of,
)
from compilers.passes.interface import PassContext, PassResult

aten = torch.ops.aten


def _broadcast_source(node: Any) -> fx.Node | None:
    """``x`` when ``node`` is ``x.expand(N, ...)`` that repeats a size-1 dim 0 only."""
    if not isinstance(node, fx.Node) or node.target != aten.expand.default:
        return None
    source = node.args[0]
    in_shape, out_shape = shape_of(source), shape_of(node)
    if in_shape is None or out_shape is None or len(in_shape) != len(out_shape) or not in_shape:
        return None
    if not (is_static(in_shape[0]) and in_shape[0] == 1):
        return None
    if not all(same_size(a, b) for a, b in zip(in_shape[1:], out_shape[1:], strict=True)):
        return None
    return source  # type: ignore[return-value]


def _broadcasts_trailing(gm: fx.GraphModule, arg: Any, rank: int) -> bool:
    """A constant or scalar that cannot vary along dim 0 of a rank-``rank`` result."""
    if isinstance(arg, (int, float, bool)) or arg is None:
        return True
    tensor = const(gm, arg)
    if tensor is None:
        return False
    return tensor.dim() < rank or tensor.shape[0] == 1


def _pull_broadcast_after(gm: fx.GraphModule, node: fx.Node) -> bool:
    """``op(x.expand(N, ...), c) -> op(x, c).expand(N, ...)`` for elementwise ops and
    ``embedding(W, ids.expand(N)) -> embedding(W, ids).expand(N, -1)``."""
    shape = shape_of(node)
    if shape is None:
        return False
    if node.target == aten.embedding.default:
        source = _broadcast_source(node.args[1])
        if source is None or const(gm, node.args[0]) is None:
            return False
        size = node.args[1].args[1][0]  # type: ignore[union-attr,index]
        with gm.graph.inserting_before(node):
            shared = call(gm, aten.embedding.default, node.args[0], source, *node.args[2:])
            expanded = call(gm, aten.expand.default, shared, [size] + [-1] * (len(shape) - 1))
        node.replace_all_uses_with(expanded)
        gm.graph.erase_node(node)
        return True
    if node.target not in ELEMENTWISE:
        return False
    sources: list[Any] = []
    size = None
    for arg in node.args:
        source = _broadcast_source(arg)
        if source is not None:
            out = shape_of(arg)
            if out is None or len(out) != len(shape):
                return False
            size = arg.args[1][0]  # type: ignore[union-attr,index]
            sources.append(source)
        elif _broadcasts_trailing(gm, arg, len(shape)):
            sources.append(arg)
        else:
            return False
    if size is None:
        return False
    with gm.graph.inserting_before(node):
        shared = call(gm, node.target, *sources, **node.kwargs)  # type: ignore[arg-type]
        expanded = call(gm, aten.expand.default, shared, [size] + [-1] * (len(shape) - 1))
    node.replace_all_uses_with(expanded)
    gm.graph.erase_node(node)
    return True


def _split_across_cat(gm: fx.GraphModule, node: fx.Node) -> bool:
    """``op(cat([a, b], -1), c) -> cat([op(a, c[..., :wa]), op(b, c[..., wa:])], -1)``."""
    if node.target not in ELEMENTWISE:
        return False
    shape = shape_of(node)
    cats = [cat_parts(a) for a in node.args]
    split = next((c for c in cats if c is not None), None)
    if shape is None or split is None:
        return False
    widths = split[1]
    pieces: list[list[Any]] = [[] for _ in widths]
    for arg, cat in zip(node.args, cats, strict=True):
        if cat is not None:
            if cat[1] != widths:
                return False
            for piece, part in zip(pieces, cat[0], strict=True):
                piece.append(part)
            continue
        if isinstance(arg, (int, float, bool)) or arg is None:
            for piece in pieces:
                piece.append(arg)
            continue
        tensor = const(gm, arg)
        if tensor is None:
            return False
        if tensor.dim() == 0 or tensor.shape[-1] == 1:
            for piece in pieces:
                piece.append(arg)
            continue
        if tensor.shape[-1] != sum(widths):
            return False
        offset = 0
        with gm.graph.inserting_before(node):
            for piece, width in zip(pieces, widths, strict=True):
                piece.append(add_const(gm, tensor[..., offset : offset + width], "split"))
                offset += width
    with gm.graph.inserting_before(node):
        parts = [call(gm, node.target, *p, **node.kwargs) for p in pieces]  # type: ignore[arg-type]
        joined = call(gm, aten.cat.default, parts, -1)
    node.replace_all_uses_with(joined)
    gm.graph.erase_node(node)
    return True


def _flatten_cat(gm: fx.GraphModule, node: fx.Node) -> bool:
    """``cat([cat([a, b], -1), c], -1) -> cat([a, b, c], -1)``."""
    outer = cat_parts(node)
    if outer is None:
        return False
    parts: list[fx.Node] = []
    changed = False
    for part in outer[0]:
        inner = cat_parts(part)
        if inner is not None and len(part.users) == 1:
            parts.extend(inner[0])
            changed = True
        else:
            parts.append(part)
    if not changed:
        return False
    with gm.graph.inserting_before(node):
        joined = call(gm, aten.cat.default, parts, -1)
    node.replace_all_uses_with(joined)
    gm.graph.erase_node(node)
    return True


def _split_linear_over_broadcast(gm: fx.GraphModule, node: fx.Node) -> bool:
    """``linear(cat([u.expand(N, -1), v]), W, b) -> linear(v, W_v) + linear(u, W_u, b)``.

    The per-request part ``u`` is multiplied once; the broadcasting add replaces the expand.
    """
    if node.target != aten.linear.default:
        return False
    cat = cat_parts(node.args[0])
    weight = const(gm, node.args[1])
    if cat is None or weight is None or len(shape_of(node) or ()) != 2:
        return False
    parts, widths = cat
    shared_cols: list[int] = []
    own_cols: list[int] = []
    shared_parts: list[fx.Node] = []
    own_parts: list[fx.Node] = []
    offset = 0
    for part, width in zip(parts, widths, strict=True):
        source = _broadcast_source(part)
        columns = list(range(offset, offset + width))
        if source is not None:
            shared_parts.append(source)
            shared_cols += columns
        else:
            own_parts.append(part)
            own_cols += columns
        offset += width
    if not shared_parts or not own_parts:
        return False
    bias = node.args[2] if len(node.args) > 2 else None
    with gm.graph.inserting_before(node):
        shared_weight = add_const(gm, weight[:, shared_cols], "shared_weight")
        own_weight = add_const(gm, weight[:, own_cols], "own_weight")
        shared_in = (
            shared_parts[0]
            if len(shared_parts) == 1
            else call(gm, aten.cat.default, shared_parts, -1)
        )
        own_in = own_parts[0] if len(own_parts) == 1 else call(gm, aten.cat.default, own_parts, -1)
        shared = call(gm, aten.linear.default, shared_in, shared_weight, bias)
        own = call(gm, aten.linear.default, own_in, own_weight)
        total = call(gm, aten.add.Tensor, own, shared)
    node.replace_all_uses_with(total)
    gm.graph.erase_node(node)
    return True


def _collapse_shared_bilinear(gm: fx.GraphModule, node: fx.Node) -> bool:
    """``linear(flatten(matmul(s, x.transpose(1, 2)), 1), W, b) -> mm(flatten(x, 1), A) + b``.

    ``s [1, F, d]`` is one request's rows, broadcast by the matmul over the ``N`` candidates
    of ``x [N, G, d]``; ``W [h, F*G]`` is constant. The Linear of the ``F x G`` dot products is
    linear in ``x`` once ``s`` is fixed: ``A[g*d + k, :] = sum_f W[:, f*G + g] * s[0, f, k]``,
    a ``[G*d, h]`` matrix computed once per request (a ``[G, h, F] @ [F, d]`` product), so the
    per-candidate work is one GEMM instead of a batched matmul and a Linear.
    """
    if node.target != aten.linear.default or len(node.args) < 2:
        return False
    product = flattened_input(node)
    if (
        not isinstance(product, fx.Node)
        or product.target != aten.matmul.default
        or len(product.users) != 1
    ):
        return False
    shared, transposed = product.args
    if (
        not isinstance(transposed, fx.Node)
        or transposed.target != aten.transpose.int
        or sorted(int(d) for d in transposed.args[1:]) != [1, 2]
    ):
        return False
    x = transposed.args[0]
    s_shape, x_shape = shape_of(shared), shape_of(x)
    weight = const(gm, node.args[1])
    if s_shape is None or x_shape is None or weight is None or weight.dim() != 2:
        return False
    if len(s_shape) != 3 or len(x_shape) != 3 or s_shape[0] != 1:
        return False
    if not all(is_static(v) for v in (*s_shape[1:], *x_shape[1:])) or s_shape[2] != x_shape[2]:
        return False
    fields, others, width = int(s_shape[1]), int(x_shape[1]), int(x_shape[2])
    hidden = int(weight.shape[0])
    if weight.shape[1] != fields * others:
        return False
    bias = node.args[2] if len(node.args) > 2 else None
    with gm.graph.inserting_before(node):
        # [h, F, G] -> [G, h, F]: A's blocks come out of one batched product with s[0].
        blocks = weight.reshape(hidden, fields, others).permute(2, 0, 1)
        per_item = add_const(gm, blocks, "bilinear_weight")
        row = call(gm, aten.select.int, shared, 0, 0)  # [F, d]
        collapsed = call(gm, aten.matmul.default, per_item, row)  # [G, h, d]
        collapsed = call(gm, aten.permute.default, collapsed, [0, 2, 1])  # [G, d, h]
        collapsed = call(gm, aten.reshape.default, collapsed, [others * width, hidden])
        items = call(gm, aten.flatten.using_ints, x, 1)  # [N, G*d]
        total = call(gm, aten.mm.default, items, collapsed)
        if bias is not None:
            total = call(gm, aten.add.Tensor, total, bias)
    node.replace_all_uses_with(total)
    gm.graph.erase_node(node)
    return True


def share_broadcast_computation(gm: fx.GraphModule, context: PassContext) -> PassResult:
    """Move work on a tensor that is only repeated along dim 0 to before the repeat.

    For a pre-ranking request the user's row is expanded to ``N`` candidates; after this pass
    its transforms, embedding lookup and its columns of the first Linear run once per request.
    A Linear over the dot products of the request's rows with each candidate's is collapsed
    into one per-request matrix (:func:`_collapse_shared_bilinear`). Invariant: each rewrite
    computes the same values up to float rounding (elementwise ops commute with a broadcast; a
    Linear over a concatenation is the sum of Linears over its parts; a bilinear form with one
    side fixed is linear in the other); every new node carries ``meta["val"]``; no in-place
    ops are introduced.
    """
    rules = {
        "pull_broadcast": _pull_broadcast_after,
        "split_cat": _split_across_cat,
        "flatten_cat": _flatten_cat,
        "collapse_bilinear": _collapse_shared_bilinear,
        "split_linear": _split_linear_over_broadcast,
    }
    counts = dict.fromkeys(rules, 0)
    # Split a Linear only once nothing else moves: by then every broadcast part of its input
    # has surfaced in one flat cat, so the shared columns become one small Linear.
    phases = [[name for name in rules if name != "split_linear"], ["split_linear"]]
    for _ in range(100):  # each rewrite moves a broadcast strictly later; 100 is plenty
        changed = False
        for phase in phases:
            for node in list(gm.graph.nodes):
                if node.op != "call_function" or node.graph is not gm.graph:
                    continue
                for name in phase:
                    if rules[name](gm, node):
                        counts[name] += 1
                        changed = True
                        break
            gm.graph.eliminate_dead_code()
            if changed:
                break
        if not changed:
            break
    fired = sum(counts.values())
    return PassResult(fired=fired, modified=fired > 0, details=counts)
