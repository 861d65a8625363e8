"""Pass ``fold_batch_norm``: fold inference BatchNorm into the Conv1d/Conv2d/Linear that
feeds it.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

from compilers.passes.graph import add_const, call, const, shape_of
from compilers.passes.interface import PassContext, PassResult

aten = torch.ops.aten


_CONVS = {aten.conv1d.default, aten.conv2d.default}


def _batch_norm_parts(node: fx.Node) -> tuple[fx.Node, list[Any], float] | None:
    """``(input, [weight, bias, mean, var], eps)`` of an inference BatchNorm node."""
    if node.target == aten.batch_norm.default and not node.args[5]:
        return node.args[0], list(node.args[1:5]), float(node.args[7])
    if node.target == aten._native_batch_norm_legit_no_training.default:
        return node.args[0], list(node.args[1:5]), float(node.args[6])
    return None


def fold_batch_norm(gm: fx.GraphModule, context: PassContext) -> PassResult:
    """Fold inference BatchNorm into the Conv1d/Conv2d/Linear that feeds it.

    ``bn(conv(x, W, b)) == conv(x, W * s, (b - mean) * s + beta)`` with
    ``s = gamma / sqrt(var + eps)``. Invariant: the folded layer replaces the BatchNorm (same
    output shape and dtype); the producer must have no other user, so no value is changed for
    anyone else.
    """
    folded = 0
    for node in list(gm.graph.nodes):
        parts = _batch_norm_parts(node)
        if parts is None:
            continue
        producer, (gamma, beta, mean, var), eps = parts
        if producer.op != "call_function" or len(producer.users) != 1:
            continue
        is_linear = producer.target == aten.linear.default
        if not (is_linear or producer.target in _CONVS):
            continue
        if is_linear and len(shape_of(producer) or ()) != 2:
            continue  # BatchNorm1d on [N, L, C] normalizes dim 1, not the out features
        weight = const(gm, producer.args[1])
        bias_arg = producer.args[2] if len(producer.args) > 2 else None
        bias = const(gm, bias_arg) if bias_arg is not None else None
        stats = [const(gm, a) if a is not None else None for a in (gamma, beta, mean, var)]
        if weight is None or stats[2] is None or stats[3] is None:
            continue
        if bias_arg is not None and bias is None:
            continue
        running_mean, running_var = stats[2].double(), stats[3].double()
        scale = torch.rsqrt(running_var + eps)
        if stats[0] is not None:
            scale = scale * stats[0].double()
        shift = -running_mean * scale
        if bias is not None:
            shift = shift + bias.double() * scale
        if stats[1] is not None:
            shift = shift + stats[1].double()
        new_weight = weight.double() * scale.reshape(-1, *([1] * (weight.dim() - 1)))
        with gm.graph.inserting_before(producer):
            weight_node = add_const(gm, new_weight.to(weight.dtype), "folded_weight")
            bias_node = add_const(gm, shift.to(weight.dtype), "folded_bias")
            args = list(producer.args) + [None] * max(0, 3 - len(producer.args))
            args[1], args[2] = weight_node, bias_node
        with gm.graph.inserting_after(producer):
            fused = call(gm, producer.target, *args)  # type: ignore[arg-type]
        # The folded layer is still the producer's module: later passes (rsq_quantize with
        # per-module ranges) find it by that name.
        if "nn_module_stack" in producer.meta:
            fused.meta["nn_module_stack"] = producer.meta["nn_module_stack"]
        replace = node
        if node.target == aten._native_batch_norm_legit_no_training.default:
            getitems = [u for u in node.users if u.target == operator.getitem and u.args[1] == 0]
            if len(getitems) != len(node.users):
                gm.graph.erase_node(fused)
                continue
            for getitem in getitems:
                getitem.replace_all_uses_with(fused)
                gm.graph.erase_node(getitem)
            replace = node
        replace.replace_all_uses_with(fused)
        gm.graph.erase_node(replace)
        gm.graph.erase_node(producer)
        folded += 1
    return PassResult(fired=folded, modified=folded > 0, details={"folded": folded})
