"""Pass ``remove_noops``: drop eval-mode dropout and ops that return their input unchanged."""

from __future__ import annotations

import torch
from torch import fx

from compilers.passes.graph import same_size, val
from compilers.passes.interface import PassContext, PassResult

aten = torch.ops.aten


_DROPOUTS = {aten.dropout.default, aten.feature_dropout.default, aten.alpha_dropout.default}
_IDENTITIES = {aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default}


def _noop_source(node: fx.Node) -> fx.Node | None:
    """The node ``node`` merely forwards, or None."""
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], fx.Node):
        return None
    source = node.args[0]
    if node.target in _DROPOUTS:
        train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train", False)
        probability = node.args[1] if len(node.args) > 1 else 0.0
        return source if (not train or probability == 0) else None
    if node.target in _IDENTITIES:
        return source
    in_value, out_value = val(source), node.meta.get("val")
    if not isinstance(in_value, torch.Tensor) or not isinstance(out_value, torch.Tensor):
        return None
    same_shape = len(in_value.shape) == len(out_value.shape) and all(
        same_size(a, b) for a, b in zip(in_value.shape, out_value.shape, strict=True)
    )
    if not same_shape or in_value.dtype != out_value.dtype:
        return None
    if node.target in (aten.expand.default, aten.view.default, aten.reshape.default):
        return source
    if node.target in (aten.to.dtype, aten._to_copy.default, aten.to.dtype_layout):
        return source if in_value.device == out_value.device else None
    scalar = node.args[1] if len(node.args) > 1 else None
    if node.target in (aten.mul.Tensor, aten.div.Tensor, aten.mul.Scalar, aten.div.Scalar):
        return source if isinstance(scalar, (int, float)) and scalar == 1 else None
    if node.target in (aten.add.Tensor, aten.sub.Tensor, aten.add.Scalar, aten.sub.Scalar):
        alpha = node.kwargs.get("alpha", 1)
        return source if isinstance(scalar, (int, float)) and scalar * alpha == 0 else None
    return None


def remove_noops(gm: fx.GraphModule, context: PassContext) -> PassResult:
    """Drop eval-mode dropout and ops that return their input unchanged.

    Invariant: every replaced node had the same shape, dtype, device and values as its input
    (``_assert_tensor_metadata`` checks are dropped: they compute nothing); a node feeding the
    graph output is kept so outputs never alias inputs.
    """
    removed: dict[str, int] = {}
    for node in list(gm.graph.nodes):
        if node.target == aten._assert_tensor_metadata.default:
            # Export's dtype checks on intermediates pin them alive; re-export adds its own.
            gm.graph.erase_node(node)
            removed["assert_tensor_metadata"] = removed.get("assert_tensor_metadata", 0) + 1
            continue
        source = _noop_source(node)
        if source is None or any(user.op == "output" for user in node.users):
            continue
        node.replace_all_uses_with(source)
        gm.graph.erase_node(node)
        key = str(node.target)
        removed[key] = removed.get(key, 0) + 1
    return PassResult(fired=sum(removed.values()), modified=bool(removed), details=removed)
