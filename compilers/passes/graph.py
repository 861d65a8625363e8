"""Graph plumbing the passes share: the tensor behind a ``get_attr`` node, new constants and
``call_function`` nodes with their ``meta["val"]`` propagated, static and symbolic sizes, the
elementwise ops the rewrites move or fuse, and two node patterns (a last-dim ``cat`` of static
widths, a ``flatten(x, 1)`` input).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce
from typing import Any

import torch
from torch import fx
from torch._guards import detect_fake_mode

aten = torch.ops.aten


def attr(gm: fx.GraphModule, target: str) -> Any:
    return reduce(getattr, target.split("."), gm)


def const(gm: fx.GraphModule, arg: Any) -> torch.Tensor | None:
    """The real tensor behind a ``get_attr`` node, else None."""
    if isinstance(arg, fx.Node) and arg.op == "get_attr":
        value = attr(gm, str(arg.target))
        return value if isinstance(value, torch.Tensor) else None
    return None


def val(arg: Any) -> Any:
    return arg.meta.get("val") if isinstance(arg, fx.Node) else arg


def fake_mode(gm: fx.GraphModule) -> Any:
    return detect_fake_mode([n.meta["val"] for n in gm.graph.nodes if "val" in n.meta])


def add_const(gm: fx.GraphModule, tensor: torch.Tensor, hint: str) -> fx.Node:
    """Register ``tensor`` as a buffer and return a ``get_attr`` node at the insert point."""
    index = 0
    while hasattr(gm, f"_cascade_{hint}_{index}"):
        index += 1
    name = f"_cascade_{hint}_{index}"
    gm.register_buffer(name, tensor.detach().clone().contiguous())
    node = gm.graph.get_attr(name)
    mode = fake_mode(gm)
    if mode is not None:
        node.meta["val"] = mode.from_tensor(getattr(gm, name), static_shapes=True)
    return node


def call(gm: fx.GraphModule, target: Callable[..., Any], *args: Any, **kwargs: Any) -> fx.Node:
    """A ``call_function`` node at the insert point, with ``meta["val"]`` propagated."""
    node = gm.graph.call_function(target, tuple(args), kwargs)
    mode = fake_mode(gm)
    if mode is not None:
        fake_args = fx.node.map_arg(node.args, val)
        fake_kwargs = fx.node.map_arg(node.kwargs, val)
        with mode:
            node.meta["val"] = target(*fake_args, **fake_kwargs)
    return node


def shape_of(node: Any) -> tuple[Any, ...] | None:
    value = val(node)
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def is_static(size: Any) -> bool:
    return isinstance(size, int)


def same_size(a: Any, b: Any) -> bool:
    # Symbolic sizes compare symbolically; ``==`` on SymInts would add a guard.
    if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt):
        return str(a) == str(b)
    return bool(a == b)


ELEMENTWISE = {
    aten.nan_to_num.default,
    aten.log1p.default,
    aten.clamp_min.default,
    aten.clamp.default,
    aten.relu.default,
    aten.sigmoid.default,
    aten.exp.default,
    aten.neg.default,
    aten.abs.default,
    aten.to.dtype,
    aten._to_copy.default,
    aten.remainder.Scalar,
    aten.remainder.Tensor,
    aten.add.Tensor,
    aten.sub.Tensor,
    aten.mul.Tensor,
    aten.div.Tensor,
    aten.add.Scalar,
    aten.sub.Scalar,
    aten.mul.Scalar,
    aten.div.Scalar,
    aten.where.self,
}


def cat_parts(node: Any) -> tuple[list[fx.Node], list[int]] | None:
    """``(parts, widths)`` of a ``cat`` along the last dim with static widths."""
    if not isinstance(node, fx.Node) or node.target != aten.cat.default:
        return None
    shape = shape_of(node)
    if shape is None:
        return None
    dim = node.args[1] if len(node.args) > 1 else 0
    if dim not in (-1, len(shape) - 1):
        return None
    widths = [(shape_of(p) or (None,))[-1] for p in node.args[0]]  # type: ignore[union-attr]
    if not all(isinstance(w, int) for w in widths):
        return None
    return list(node.args[0]), widths  # type: ignore[arg-type]


def flattened_input(node: fx.Node) -> Any:
    """``x`` when ``node``'s first argument is ``flatten(x, 1)`` used by ``node`` alone."""
    flat = node.args[0]
    if (
        not isinstance(flat, fx.Node)
        or flat.target != aten.flatten.using_ints
        or tuple(flat.args[1:]) not in ((1,), (1, -1))
        or len(flat.users) != 1
    ):
        return None
    return flat.args[0]
