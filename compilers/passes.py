"""Graph passes over ATen-level ``torch.fx`` graphs (``torch.export(...).module()`` form).

    python -c "from compilers.pipeline import PASS_ORDER; print(PASS_ORDER)"

One pass = one function ``(gm, context) -> PassResult`` that rewrites ``gm`` in place and
states its invariant. Parameters are ``get_attr`` nodes with real values, activations carry
``meta["val"]`` fake tensors with symbolic sizes; passes that add nodes fill in their
``meta["val"]`` by fake propagation so later passes can read shapes. Run them through
:func:`compilers.pipeline.run_pipeline`, which enforces the order and lints the result.
"""

from __future__ import annotations

import math
import operator
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed ops)
import torch.nn.functional as F
from torch import fx
from torch._guards import detect_fake_mode

aten = torch.ops.aten


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


# --- graph plumbing ---------------------------------------------------------------------------


def _attr(gm: fx.GraphModule, target: str) -> Any:
    return reduce(getattr, target.split("."), gm)


def _const(gm: fx.GraphModule, arg: Any) -> torch.Tensor | None:
    """The real tensor behind a ``get_attr`` node, else None."""
    if isinstance(arg, fx.Node) and arg.op == "get_attr":
        value = _attr(gm, str(arg.target))
        return value if isinstance(value, torch.Tensor) else None
    return None


def _val(arg: Any) -> Any:
    return arg.meta.get("val") if isinstance(arg, fx.Node) else arg


def _fake_mode(gm: fx.GraphModule) -> Any:
    return detect_fake_mode([n.meta["val"] for n in gm.graph.nodes if "val" in n.meta])


def _add_const(gm: fx.GraphModule, tensor: torch.Tensor, hint: str) -> fx.Node:
    """Register ``tensor`` as a buffer and return a ``get_attr`` node at the insert point."""
    index = 0
    while hasattr(gm, f"_cascade_{hint}_{index}"):
        index += 1
    name = f"_cascade_{hint}_{index}"
    gm.register_buffer(name, tensor.detach().clone().contiguous())
    node = gm.graph.get_attr(name)
    mode = _fake_mode(gm)
    if mode is not None:
        node.meta["val"] = mode.from_tensor(getattr(gm, name), static_shapes=True)
    return node


def _call(gm: fx.GraphModule, target: Callable[..., Any], *args: Any, **kwargs: Any) -> fx.Node:
    """A ``call_function`` node at the insert point, with ``meta["val"]`` propagated."""
    node = gm.graph.call_function(target, tuple(args), kwargs)
    mode = _fake_mode(gm)
    if mode is not None:
        fake_args = fx.node.map_arg(node.args, _val)
        fake_kwargs = fx.node.map_arg(node.kwargs, _val)
        with mode:
            node.meta["val"] = target(*fake_args, **fake_kwargs)
    return node


def _shape(node: Any) -> tuple[Any, ...] | None:
    value = _val(node)
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def _is_static(size: Any) -> bool:
    return isinstance(size, int)


def _same_size(a: Any, b: Any) -> bool:
    # Symbolic sizes compare symbolically; ``==`` on SymInts would add a guard.
    if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt):
        return str(a) == str(b)
    return bool(a == b)


# --- 1. symbolic shapes -----------------------------------------------------------------------


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


# --- 2. no-ops --------------------------------------------------------------------------------

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
    in_value, out_value = _val(source), node.meta.get("val")
    if not isinstance(in_value, torch.Tensor) or not isinstance(out_value, torch.Tensor):
        return None
    same_shape = len(in_value.shape) == len(out_value.shape) and all(
        _same_size(a, b) for a, b in zip(in_value.shape, out_value.shape, strict=True)
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


# --- 3. BatchNorm folding ---------------------------------------------------------------------

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
        if is_linear and len(_shape(producer) or ()) != 2:
            continue  # BatchNorm1d on [N, L, C] normalizes dim 1, not the out features
        weight = _const(gm, producer.args[1])
        bias_arg = producer.args[2] if len(producer.args) > 2 else None
        bias = _const(gm, bias_arg) if bias_arg is not None else None
        stats = [_const(gm, a) if a is not None else None for a in (gamma, beta, mean, var)]
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
            weight_node = _add_const(gm, new_weight.to(weight.dtype), "folded_weight")
            bias_node = _add_const(gm, shift.to(weight.dtype), "folded_bias")
            args = list(producer.args) + [None] * max(0, 3 - len(producer.args))
            args[1], args[2] = weight_node, bias_node
        with gm.graph.inserting_after(producer):
            fused = _call(gm, producer.target, *args)  # type: ignore[arg-type]
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


# --- 4. computation sharing across the candidate broadcast ------------------------------------

_ELEMENTWISE = {
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


def _broadcast_source(node: Any) -> fx.Node | None:
    """``x`` when ``node`` is ``x.expand(N, ...)`` that repeats a size-1 dim 0 only."""
    if not isinstance(node, fx.Node) or node.target != aten.expand.default:
        return None
    source = node.args[0]
    in_shape, out_shape = _shape(source), _shape(node)
    if in_shape is None or out_shape is None or len(in_shape) != len(out_shape) or not in_shape:
        return None
    if not (_is_static(in_shape[0]) and in_shape[0] == 1):
        return None
    if not all(_same_size(a, b) for a, b in zip(in_shape[1:], out_shape[1:], strict=True)):
        return None
    return source  # type: ignore[return-value]


def _broadcasts_trailing(gm: fx.GraphModule, arg: Any, rank: int) -> bool:
    """A constant or scalar that cannot vary along dim 0 of a rank-``rank`` result."""
    if isinstance(arg, (int, float, bool)) or arg is None:
        return True
    tensor = _const(gm, arg)
    if tensor is None:
        return False
    return tensor.dim() < rank or tensor.shape[0] == 1


def _cat_parts(node: Any) -> tuple[list[fx.Node], list[int]] | None:
    """``(parts, widths)`` of a ``cat`` along the last dim with static widths."""
    if not isinstance(node, fx.Node) or node.target != aten.cat.default:
        return None
    shape = _shape(node)
    if shape is None:
        return None
    dim = node.args[1] if len(node.args) > 1 else 0
    if dim not in (-1, len(shape) - 1):
        return None
    widths = [(_shape(p) or (None,))[-1] for p in node.args[0]]  # type: ignore[union-attr]
    if not all(isinstance(w, int) for w in widths):
        return None
    return list(node.args[0]), widths  # type: ignore[arg-type]


def _pull_broadcast_after(gm: fx.GraphModule, node: fx.Node) -> bool:
    """``op(x.expand(N, ...), c) -> op(x, c).expand(N, ...)`` for elementwise ops and
    ``embedding(W, ids.expand(N)) -> embedding(W, ids).expand(N, -1)``."""
    shape = _shape(node)
    if shape is None:
        return False
    if node.target == aten.embedding.default:
        source = _broadcast_source(node.args[1])
        if source is None or _const(gm, node.args[0]) is None:
            return False
        size = node.args[1].args[1][0]  # type: ignore[union-attr,index]
        with gm.graph.inserting_before(node):
            shared = _call(gm, aten.embedding.default, node.args[0], source, *node.args[2:])
            expanded = _call(gm, aten.expand.default, shared, [size] + [-1] * (len(shape) - 1))
        node.replace_all_uses_with(expanded)
        gm.graph.erase_node(node)
        return True
    if node.target not in _ELEMENTWISE:
        return False
    sources: list[Any] = []
    size = None
    for arg in node.args:
        source = _broadcast_source(arg)
        if source is not None:
            out = _shape(arg)
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
        shared = _call(gm, node.target, *sources, **node.kwargs)  # type: ignore[arg-type]
        expanded = _call(gm, aten.expand.default, shared, [size] + [-1] * (len(shape) - 1))
    node.replace_all_uses_with(expanded)
    gm.graph.erase_node(node)
    return True


def _split_across_cat(gm: fx.GraphModule, node: fx.Node) -> bool:
    """``op(cat([a, b], -1), c) -> cat([op(a, c[..., :wa]), op(b, c[..., wa:])], -1)``."""
    if node.target not in _ELEMENTWISE:
        return False
    shape = _shape(node)
    cats = [_cat_parts(a) for a in node.args]
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
        tensor = _const(gm, arg)
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
                piece.append(_add_const(gm, tensor[..., offset : offset + width], "split"))
                offset += width
    with gm.graph.inserting_before(node):
        parts = [_call(gm, node.target, *p, **node.kwargs) for p in pieces]  # type: ignore[arg-type]
        joined = _call(gm, aten.cat.default, parts, -1)
    node.replace_all_uses_with(joined)
    gm.graph.erase_node(node)
    return True


def _flatten_cat(gm: fx.GraphModule, node: fx.Node) -> bool:
    """``cat([cat([a, b], -1), c], -1) -> cat([a, b, c], -1)``."""
    outer = _cat_parts(node)
    if outer is None:
        return False
    parts: list[fx.Node] = []
    changed = False
    for part in outer[0]:
        inner = _cat_parts(part)
        if inner is not None and len(part.users) == 1:
            parts.extend(inner[0])
            changed = True
        else:
            parts.append(part)
    if not changed:
        return False
    with gm.graph.inserting_before(node):
        joined = _call(gm, aten.cat.default, parts, -1)
    node.replace_all_uses_with(joined)
    gm.graph.erase_node(node)
    return True


def _split_linear_over_broadcast(gm: fx.GraphModule, node: fx.Node) -> bool:
    """``linear(cat([u.expand(N, -1), v]), W, b) -> linear(v, W_v) + linear(u, W_u, b)``.

    The per-request part ``u`` is multiplied once; the broadcasting add replaces the expand.
    """
    if node.target != aten.linear.default:
        return False
    cat = _cat_parts(node.args[0])
    weight = _const(gm, node.args[1])
    if cat is None or weight is None or len(_shape(node) or ()) != 2:
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
        shared_weight = _add_const(gm, weight[:, shared_cols], "shared_weight")
        own_weight = _add_const(gm, weight[:, own_cols], "own_weight")
        shared_in = (
            shared_parts[0]
            if len(shared_parts) == 1
            else _call(gm, aten.cat.default, shared_parts, -1)
        )
        own_in = own_parts[0] if len(own_parts) == 1 else _call(gm, aten.cat.default, own_parts, -1)
        shared = _call(gm, aten.linear.default, shared_in, shared_weight, bias)
        own = _call(gm, aten.linear.default, own_in, own_weight)
        total = _call(gm, aten.add.Tensor, own, shared)
    node.replace_all_uses_with(total)
    gm.graph.erase_node(node)
    return True


def _flattened_input(node: fx.Node) -> Any:
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
    product = _flattened_input(node)
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
    s_shape, x_shape = _shape(shared), _shape(x)
    weight = _const(gm, node.args[1])
    if s_shape is None or x_shape is None or weight is None or weight.dim() != 2:
        return False
    if len(s_shape) != 3 or len(x_shape) != 3 or s_shape[0] != 1:
        return False
    if not all(_is_static(v) for v in (*s_shape[1:], *x_shape[1:])) or s_shape[2] != x_shape[2]:
        return False
    fields, others, width = int(s_shape[1]), int(x_shape[1]), int(x_shape[2])
    hidden = int(weight.shape[0])
    if weight.shape[1] != fields * others:
        return False
    bias = node.args[2] if len(node.args) > 2 else None
    with gm.graph.inserting_before(node):
        # [h, F, G] -> [G, h, F]: A's blocks come out of one batched product with s[0].
        blocks = weight.reshape(hidden, fields, others).permute(2, 0, 1)
        per_item = _add_const(gm, blocks, "bilinear_weight")
        row = _call(gm, aten.select.int, shared, 0, 0)  # [F, d]
        collapsed = _call(gm, aten.matmul.default, per_item, row)  # [G, h, d]
        collapsed = _call(gm, aten.permute.default, collapsed, [0, 2, 1])  # [G, d, h]
        collapsed = _call(gm, aten.reshape.default, collapsed, [others * width, hidden])
        items = _call(gm, aten.flatten.using_ints, x, 1)  # [N, G*d]
        total = _call(gm, aten.mm.default, items, collapsed)
        if bias is not None:
            total = _call(gm, aten.add.Tensor, total, bias)
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


# --- 5. embedding folding ----------------------------------------------------------------------

FOLDED_TABLE_MAX_ELEMENTS = 1 << 24
"""Largest folded table (``rows x out_features``, 64 MiB in fp32) ``fold_embedding_linear``
builds; beyond it the extra memory outweighs the saved multiply."""


def _fold_field_lookups(gm: fx.GraphModule, node: fx.Node) -> list[int] | None:
    """``linear(flatten(embedding(E, ids [N, F]), 1), W, b)`` -> ``sum_j T[ids[:, j] + j*R]``.

    One lookup of ``F`` fields per row (``E [R, d]``, one table for all of them, as a side's
    field embeddings are) flattened into a Linear ``W [h, F*d]``: field ``j``'s block of
    columns folds into ``E @ W[:, j*d:(j+1)*d].T``; the blocks are stacked into one table
    ``T [F*R, h]``, so a row costs ``F`` fetches of ``h`` finished values and their sum instead
    of a ``F*d x h`` GEMM row. The lookup itself stays for any other user (e.g. dot products).
    Returns the folded table's shape, or None when the pattern does not match or the table
    would exceed :data:`FOLDED_TABLE_MAX_ELEMENTS`.
    """
    lookup = _flattened_input(node)
    if not isinstance(lookup, fx.Node) or lookup.target != aten.embedding.default:
        return None
    table, weight = _const(gm, lookup.args[0]), _const(gm, node.args[1])
    ids_shape = _shape(lookup.args[1])
    if table is None or weight is None or table.dim() != 2 or weight.dim() != 2:
        return None
    if ids_shape is None or len(ids_shape) != 2 or not _is_static(ids_shape[1]):
        return None
    rows, width = table.shape
    fields, hidden = int(ids_shape[1]), int(weight.shape[0])
    if weight.shape[1] != fields * width or fields * rows * hidden > FOLDED_TABLE_MAX_ELEMENTS:
        return None
    blocks = [
        table.double() @ weight[:, j * width : (j + 1) * width].double().t() for j in range(fields)
    ]
    folded = torch.cat(blocks).to(weight.dtype)  # [F*R, h]
    bias = node.args[2] if len(node.args) > 2 else None
    with gm.graph.inserting_before(node):
        table_node = _add_const(gm, folded, "folded_fields")
        offsets = _add_const(gm, torch.arange(fields, dtype=torch.long) * rows, "field_offsets")
        ids = _call(gm, aten.add.Tensor, lookup.args[1], offsets)
        parts = _call(gm, aten.embedding.default, table_node, ids)  # [N, F, h]
        total = _call(gm, aten.sum.dim_IntList, parts, [1])
        if bias is not None:
            total = _call(gm, aten.add.Tensor, total, bias)
    node.replace_all_uses_with(total)
    gm.graph.erase_node(node)
    return list(folded.shape)


def fold_embedding_linear(gm: fx.GraphModule, context: PassContext) -> PassResult:
    """Fold a Linear's columns that read an embedding lookup into the embedding table.

    ``linear(cat([x, embedding(E, ids)]), W, b) == linear(x, W_x, b) + embedding(E @ W_e.T, ids)``:
    the table is multiplied by its weight columns once, at compile time, so per candidate the
    lookup fetches finished rows and the remaining GEMM has only ``x``'s few columns (after
    ``share_broadcast_computation`` that is the candidate's dense features). Invariant: same
    output shape and dtype, values equal up to float rounding; only constant tables and weights
    are folded, each table-and-weight pair into one new constant of at most
    :data:`FOLDED_TABLE_MAX_ELEMENTS` elements; the lookup and the cat must feed nothing else.
    """
    folded = 0
    tables: list[list[int]] = []
    for node in list(gm.graph.nodes):
        if node.target != aten.linear.default or len(_shape(node) or ()) != 2:
            continue
        fields_table = _fold_field_lookups(gm, node)
        if fields_table is not None:
            folded += 1
            tables.append(fields_table)
            continue
        cat = _cat_parts(node.args[0])
        weight = _const(gm, node.args[1])
        if cat is None or weight is None or len(node.args[0].users) != 1:  # type: ignore[union-attr]
            continue
        parts, widths = cat
        kept: list[fx.Node] = []
        kept_cols: list[int] = []
        lookups: list[tuple[fx.Node, torch.Tensor]] = []
        offset = 0
        for part, width in zip(parts, widths, strict=True):
            table = _const(gm, part.args[0]) if part.target == aten.embedding.default else None
            columns = list(range(offset, offset + width))
            offset += width
            fits = table is not None and table.shape[0] * weight.shape[0] <= (
                FOLDED_TABLE_MAX_ELEMENTS
            )
            if table is not None and fits and len(part.users) == 1 and table.dim() == 2:
                folded_table = (table.double() @ weight[:, columns].double().t()).to(weight.dtype)
                lookups.append((part, folded_table))
            else:
                kept.append(part)
                kept_cols += columns
        if not lookups:
            continue
        bias = node.args[2] if len(node.args) > 2 else None
        with gm.graph.inserting_before(node):
            total: fx.Node | None = None
            if kept:
                kept_in = kept[0] if len(kept) == 1 else _call(gm, aten.cat.default, kept, -1)
                kept_weight = _add_const(gm, weight[:, kept_cols], "kept_weight")
                total = _call(gm, aten.linear.default, kept_in, kept_weight, bias)
                bias = None
            for lookup, folded_table in lookups:
                table_node = _add_const(gm, folded_table, "folded_table")
                rows = _call(gm, aten.embedding.default, table_node, lookup.args[1])
                total = rows if total is None else _call(gm, aten.add.Tensor, total, rows)
                tables.append(list(folded_table.shape))
            assert total is not None
            if bias is not None:
                total = _call(gm, aten.add.Tensor, total, bias)
        node.replace_all_uses_with(total)
        gm.graph.erase_node(node)
        folded += len(lookups)
    gm.graph.eliminate_dead_code()
    return PassResult(fired=folded, modified=folded > 0, details={"folded_tables": tables})


# --- 6. Winograd F(2,3) -----------------------------------------------------------------------

WINOGRAD_BT = torch.tensor(
    [[1.0, 0.0, -1.0, 0.0], [0.0, 1.0, 1.0, 0.0], [0.0, -1.0, 1.0, 0.0], [0.0, 1.0, 0.0, -1.0]]
)
"""Input transform ``B^T`` of F(2,3) (Lavin & Gray, 2015)."""
WINOGRAD_G = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])
"""Filter transform ``G`` of F(2,3)."""
WINOGRAD_AT = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 1.0, -1.0, -1.0]])
"""Output transform ``A^T`` of F(2,3)."""


def winograd_filter(weight: torch.Tensor) -> torch.Tensor:
    """``[O, C, 3]`` Conv1d weight -> ``[4, C, O]`` transformed filter ``G g``."""
    return torch.einsum("jk,ock->jco", WINOGRAD_G.to(weight.dtype), weight).contiguous()


def winograd_conv1d_f23(
    x: torch.Tensor, filt: torch.Tensor, bias: torch.Tensor | None, padding: int
) -> torch.Tensor:
    """Conv1d (3 taps, stride 1) as Winograd F(2,3): 4 channel products per 2 outputs, not 6."""
    x = F.pad(x, (padding, padding))
    batch, channels, length = x.shape
    out_len = length - 2
    tiles = (out_len + 1) // 2
    x = F.pad(x, (0, 2 * tiles + 2 - length))
    d = x.unfold(2, 4, 2)  # [B, C, T, 4]: overlapping 4-wide tiles, stride 2
    v = torch.matmul(d, WINOGRAD_BT.t().to(x.dtype))  # [B, C, T, 4]
    v = v.permute(3, 0, 2, 1).reshape(4, batch * tiles, channels)
    m = torch.bmm(v, filt)  # [4, B*T, O]: the only channel contraction
    y = torch.matmul(m.permute(1, 2, 0), WINOGRAD_AT.t().to(x.dtype))  # [B*T, O, 2]
    out = y.reshape(batch, tiles, -1, 2).permute(0, 2, 1, 3).reshape(batch, -1, 2 * tiles)
    out = out[:, :, :out_len]
    return out if bias is None else out + bias[:, None]


def conv1d_multiplications(
    batch: int, channels: int, out_channels: int, out_len: int, *, winograd: bool
) -> int:
    """Multiplications in the channel contraction of a 3-tap Conv1d (transforms excluded)."""
    if winograd:
        return 4 * ((out_len + 1) // 2) * batch * channels * out_channels
    return 3 * out_len * batch * channels * out_channels


def _conv_inputs(gm: fx.GraphModule, inputs: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
    """The real input of every conv node for one run of the graph."""
    captured: dict[str, torch.Tensor] = {}

    class Capture(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            if n.target == aten.conv1d.default:
                captured[n.name] = self.env[n.args[0]]  # type: ignore[index]
            return super().run_node(n)

    with torch.no_grad():
        Capture(gm).run(*inputs)
    return captured


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def winograd_conv1d(gm: fx.GraphModule, context: PassContext) -> PassResult:
    """Rewrite 3-tap, stride-1, undilated, ungrouped Conv1d to Winograd F(2,3).

    With ``winograd="auto"`` a conv is rewritten only when the Winograd form was faster than
    the direct one on its input from ``context.example_inputs`` (side by side, medians).
    Invariant: same output shape and dtype; values equal up to float rounding.
    """
    candidates = []
    for node in gm.graph.nodes:
        if node.target != aten.conv1d.default:
            continue
        args = list(node.args) + [None] * (7 - len(node.args))
        weight = _const(gm, args[1])
        stride, padding, dilation, groups = (
            args[3] or [1],
            args[4] or [0],
            args[5] or [1],
            args[6] or 1,
        )
        if isinstance(padding, str) or weight is None or weight.shape[-1] != 3:
            continue
        if list(stride) != [1] or list(dilation) != [1] or groups != 1:
            continue
        candidates.append((node, weight, args[2], int(list(padding)[0])))
    if context.winograd == "never" or not candidates:
        return PassResult(fired=0, modified=False, details={"candidates": len(candidates)})
    timings: dict[str, dict[str, float]] = {}
    real_inputs: dict[str, torch.Tensor] = {}
    if context.winograd == "auto":
        if context.example_inputs is None:
            raise ValueError("winograd='auto' needs PassContext.example_inputs to time the convs")
        real_inputs = _conv_inputs(gm, context.example_inputs)
    rewritten = 0
    multiplications = {"direct": 0, "winograd": 0}
    for node, weight, bias_arg, padding in candidates:
        filt = winograd_filter(weight)
        bias = _const(gm, bias_arg) if bias_arg is not None else None
        if context.winograd == "auto":
            x = real_inputs[node.name]
            with torch.no_grad():
                direct = _median_ms(
                    lambda x=x, w=weight, b=bias, p=padding: F.conv1d(x, w, b, padding=p),
                    context.timing_repeats,
                )
                wino = _median_ms(
                    lambda x=x, f=filt, b=bias, p=padding: winograd_conv1d_f23(x, f, b, p),
                    context.timing_repeats,
                )
            timings[node.name] = {"direct_ms": direct, "winograd_ms": wino}
            if wino >= direct:
                continue
        shape = _shape(node)
        if shape is not None and all(isinstance(s, int) for s in shape):
            batch, out_channels, out_len = shape
            channels = weight.shape[1]
            multiplications["direct"] += conv1d_multiplications(
                batch, channels, out_channels, out_len, winograd=False
            )
            multiplications["winograd"] += conv1d_multiplications(
                batch, channels, out_channels, out_len, winograd=True
            )
        with gm.graph.inserting_before(node):
            filt_node = _add_const(gm, filt, "winograd_filter")
            replacement = _call(gm, winograd_conv1d_f23, node.args[0], filt_node, bias_arg, padding)
        node.replace_all_uses_with(replacement)
        gm.graph.erase_node(node)
        rewritten += 1
    details: dict[str, Any] = {"candidates": len(candidates), "timings": timings}
    if multiplications["direct"]:
        details["multiplications"] = multiplications
    return PassResult(fired=rewritten, modified=rewritten > 0, details=details)


# --- 7. RSQ int8 quantization -----------------------------------------------------------------


def rsq_levels(x: torch.Tensor, input_scale: float, levels: int) -> torch.Tensor:
    """``x`` in RSQ steps of ``input_scale``: integer values in ``[-levels, levels]``."""
    return torch.clamp(torch.round(x / input_scale), -levels, levels)


def _rsq_channels_out(
    out: torch.Tensor, weight_scale: torch.Tensor, input_scale: float, bias: torch.Tensor | None
) -> torch.Tensor:
    """A conv's integer-valued sums ``[B, out, T]`` scaled back per output channel, biased."""
    out = out * (weight_scale * input_scale)[:, None]
    return out if bias is None else out + bias[:, None]


def rsq_linear(
    x: torch.Tensor,
    weight_q: torch.Tensor,
    weight_scale: torch.Tensor,
    input_scale: float,
    bias: torch.Tensor | None,
    levels: int,
) -> torch.Tensor:
    """Linear on int8 weights and range-scaled int8-valued activations, fp32 accumulation.

    The reference form: what ``rsq_quantize`` computes, written with float ops. The pass
    itself emits the equivalent ``quantized_decomposed`` quantize/dequantize pattern
    (:func:`_rsq_linear_nodes`), which Inductor (with freezing) lowers to a real int8 GEMM.
    """
    q = rsq_levels(x, input_scale, levels)
    out = F.linear(q, weight_q.to(x.dtype)) * (weight_scale * input_scale)
    return out if bias is None else out + bias


RSQ_ZERO_POINT = 128
"""Activations are stored as uint8 around this zero point: x86 int8 GEMMs (VNNI) multiply
unsigned activations by signed weights, and ``[128 - levels, 128 + levels]`` holds RSQ's
symmetric range exactly."""


def rsq_conv1d(
    x: torch.Tensor,
    weight_q: torch.Tensor,
    weight_scale: torch.Tensor,
    input_scale: float,
    bias: torch.Tensor | None,
    levels: int,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
) -> torch.Tensor:
    """Conv1d on int8 weights and range-scaled int8-valued activations (what ``rsq_quantize``
    puts in place of a Conv1d, computed with float ops)."""
    q = rsq_levels(x, input_scale, levels)
    out = F.conv1d(q, weight_q.to(x.dtype), None, stride, padding, dilation, groups)
    return _rsq_channels_out(out, weight_scale, input_scale, bias)


DEPTHWISE_MAX_TAPS = 16
"""A depthwise Conv1d with at most this many taps runs as shifted multiply-adds."""


def depthwise_conv1d_taps(
    x: torch.Tensor, taps: torch.Tensor, padding: int, dilation: int
) -> torch.Tensor:
    """Depthwise Conv1d (stride 1) of ``x [B, C, T]`` as shifted products summed, ``taps
    [k, C]`` its weight tap by tap (:func:`depthwise_taps`): pointwise work Inductor fuses
    with the quantization before it and the adds after it into one loop over the channels,
    where oneDNN's depthwise conv was a separate pass over memory (2-4x slower on one core).
    With the weight ``[C, 1, k]`` as it is, each tap's 16 lanes came from 16 scalar loads,
    slower than the conv from ~500 frames on."""
    if padding:
        x = F.pad(x, (padding, padding))
    count = taps.shape[0]
    length = x.shape[2] - dilation * (count - 1)
    out = x[:, :, :length] * taps[0][:, None]
    for j in range(1, count):
        out = out + x[:, :, j * dilation : j * dilation + length] * taps[j][:, None]
    return out


def depthwise_taps(weight: torch.Tensor) -> torch.Tensor:
    """A depthwise Conv1d weight ``[C, 1, k]`` as the ``[k, C]`` rows
    :func:`depthwise_conv1d_taps` takes."""
    return weight[:, 0, :].T.contiguous()


def rsq_depthwise_conv1d(
    x: torch.Tensor,
    taps_q: torch.Tensor,
    weight_scale: torch.Tensor,
    input_scale: float,
    bias: torch.Tensor | None,
    levels: int,
    padding: int,
    dilation: int,
) -> torch.Tensor:
    """:func:`rsq_conv1d` of a depthwise, stride-1 conv through :func:`depthwise_conv1d_taps`
    (``taps_q``: the int8 weight as :func:`depthwise_taps`): the same integer-valued sums,
    scaled once after."""
    q = rsq_levels(x, input_scale, levels)
    out = depthwise_conv1d_taps(q, taps_q.to(x.dtype), padding, dilation)
    return _rsq_channels_out(out, weight_scale, input_scale, bias)


def conv1d_columns(
    x: torch.Tensor, kernel_size: int, stride: int, padding: int, dilation: int
) -> torch.Tensor:
    """``x [B, C, T]`` -> ``[B * T', kernel_size * C]``: row ``b * T' + t`` holds the inputs
    output frame ``t`` of a Conv1d sees (im2col), tap by tap, channels innermost: the ASR
    convs read a ``[B, T, C]`` tensor through a transpose, so each tap is one contiguous row
    of it (with taps innermost the copy ran 3 lanes to a 16-lane vector)."""
    span = dilation * (kernel_size - 1) + 1
    # Unfolded along time of the [B, T, C] view: unfolding [B, C, T] and permuting made
    # export guard on the strided length (T + 2 >= 2 * ((T - 1) // 2) + 2) and fail.
    frames = F.pad(x.transpose(1, 2), (0, 0, padding, padding))  # [B, T + 2p, C]
    windows = frames.unfold(1, span, stride)  # [B, T', C, span]
    if dilation > 1:
        windows = windows[..., ::dilation]
    return windows.transpose(2, 3).contiguous().view(-1, kernel_size * x.shape[1])


def conv1d_weight_as_gemm(weight: torch.Tensor) -> torch.Tensor:
    """A Conv1d weight ``[out, C, k]`` as the ``[out, k * C]`` matrix that multiplies
    :func:`conv1d_columns`."""
    return weight.permute(0, 2, 1).reshape(weight.shape[0], -1)


def columns_to_conv_output(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The GEMM over :func:`conv1d_columns` of ``x`` (``[B * T', out]``) -> ``[B, out, T']``,
    the Conv1d's output layout."""
    return y.reshape(x.shape[0], -1, y.shape[1]).transpose(1, 2)


def _rsq_conv1d_as_gemm(
    gm: fx.GraphModule,
    x: fx.Node,
    weight_q: torch.Tensor,
    weight_scale: torch.Tensor,
    input_scale: float,
    bias: Any,
    levels: int,
    stride: int,
    padding: int,
    dilation: int,
) -> fx.Node:
    """RSQ Conv1d (``groups == 1``) as im2col + the int8 Linear pattern: the same products and
    sums as the convolution, run by oneDNN's int8 GEMM."""
    columns = _call(gm, conv1d_columns, x, weight_q.shape[2], stride, padding, dilation)
    gemm = _rsq_linear_nodes(
        gm,
        columns,
        conv1d_weight_as_gemm(weight_q),
        weight_scale,
        input_scale,
        bias,
        levels,
    )
    return _call(gm, columns_to_conv_output, gemm, x)


def _rsq_activation(gm: fx.GraphModule, x: fx.Node, input_scale: float, levels: int) -> fx.Node:
    """Quantize -> dequantize of a layer input: uint8 around :data:`RSQ_ZERO_POINT`."""
    qd = torch.ops.quantized_decomposed
    low, high = RSQ_ZERO_POINT - levels, RSQ_ZERO_POINT + levels
    quantized = _call(
        gm,
        qd.quantize_per_tensor.default,
        x,
        input_scale,
        RSQ_ZERO_POINT,
        low,
        high,
        torch.uint8,
    )
    return _call(
        gm,
        qd.dequantize_per_tensor.default,
        quantized,
        input_scale,
        RSQ_ZERO_POINT,
        low,
        high,
        torch.uint8,
    )


def _rsq_weight(
    gm: fx.GraphModule, weight_q: torch.Tensor, weight_scale: torch.Tensor, levels: int
) -> fx.Node:
    """Dequantize of an int8, per-output-channel weight constant."""
    q_node = _add_const(gm, weight_q.to(torch.int8), "rsq_weight")
    s_node = _add_const(gm, weight_scale.float(), "rsq_scale")
    z_node = _add_const(gm, torch.zeros(weight_q.shape[0], dtype=torch.int64), "rsq_zero")
    return _call(
        gm,
        torch.ops.quantized_decomposed.dequantize_per_channel.default,
        q_node,
        s_node,
        z_node,
        0,
        -levels,
        levels,
        torch.int8,
    )


def _rsq_linear_nodes(
    gm: fx.GraphModule,
    x: fx.Node,
    weight_q: torch.Tensor,
    weight_scale: torch.Tensor,
    input_scale: float,
    bias: Any,
    levels: int,
) -> fx.Node:
    """RSQ Linear as quantize -> dequantize (activation), dequantize (weight) -> linear.

    This is PyTorch's reference representation of a statically quantized Linear; Inductor's
    freezing passes match it and run ``onednn.qlinear_pointwise`` (uint8 x int8, fp32 out)
    with the weight prepacked. Eager PyTorch runs it as float ops with the same values as
    :func:`rsq_linear` up to rounding.
    """
    shape = _shape(x)
    if shape is not None and len(shape) > 2:
        # Inductor's int8 Linear patterns are for 2-D inputs; a 3-D one with a symbolic dim
        # reaches a matcher that cannot compare symbolic sizes. Rows are independent, so run
        # the layer on ``[prod(lead), in]`` and restore the lead dims.
        lead = [
            size if _is_static(size) else _call(gm, aten.sym_size.int, x, dim)
            for dim, size in enumerate(shape[:-1])
        ]
        flat = _call(gm, aten.reshape.default, x, [-1, shape[-1]])
        out = _rsq_linear_nodes(gm, flat, weight_q, weight_scale, input_scale, bias, levels)
        return _call(gm, aten.reshape.default, out, [*lead, int(weight_q.shape[0])])
    activation = _rsq_activation(gm, x, input_scale, levels)
    weight = _rsq_weight(gm, weight_q, weight_scale, levels)
    return _call(gm, aten.linear.default, activation, weight, bias)


def module_path(node: fx.Node) -> str | None:
    """Dotted path of the innermost module that produced ``node`` (``blocks.0.affine``), from
    the ``nn_module_stack`` export records; None for a node made outside any module."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    path = list(stack.values())[-1][0]
    return str(path) if path else None


def _layer_input_ranges(
    gm: fx.GraphModule, batches: Sequence[tuple[torch.Tensor, ...]], names: set[str]
) -> dict[str, float]:
    ranges: dict[str, float] = {}
    if not names:
        return ranges

    class Calibrate(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            if n.name in names:
                value = self.env[n.args[0]]  # type: ignore[index]
                ranges[n.name] = max(ranges.get(n.name, 0.0), float(value.abs().max()))
            return super().run_node(n)

    with torch.no_grad():
        for batch in batches:
            Calibrate(gm).run(*batch)
    return ranges


def _single(value: Any, default: int) -> int:
    """A Conv1d's stride / padding / dilation argument (``[n]``, ``n`` or absent) as an int."""
    if value is None:
        return default
    return int(value[0]) if isinstance(value, list | tuple) else int(value)


def _as_taps(conv_args: list[Any], weight: torch.Tensor) -> bool:
    """Whether a grouped ``aten.conv1d`` (args padded to 7) runs as
    :func:`depthwise_conv1d_taps`: one input channel per group and per output channel,
    stride 1, at most DEPTHWISE_MAX_TAPS taps."""
    return (
        (conv_args[6] or 1) == weight.shape[0]
        and weight.shape[1] == 1
        and _single(conv_args[3], 1) == 1
        and weight.shape[2] <= DEPTHWISE_MAX_TAPS
    )


def rsq_quantize(gm: fx.GraphModule, context: PassContext) -> PassResult:
    """Range-scaled quantization (RSQ) of Linear and Conv1d weights and input activations.

    Weights: symmetric per output channel, scale = range / levels. Activations: one scale per
    layer, ``range / levels``, where the range is the layer's entry in
    ``context.rsq_input_ranges`` (by module path: what quantization-aware training learned) or
    else the largest magnitude seen on ``context.calibration_inputs``. Linear layers are
    emitted as the quantize/dequantize pattern Inductor lowers to an int8 GEMM (3-D inputs
    flattened to 2-D for it); an ungrouped Conv1d as im2col (:func:`conv1d_columns`) into
    that same pattern, a depthwise one as shifted products (:func:`rsq_depthwise_conv1d`),
    another grouped one as :func:`rsq_conv1d`. Invariant:
    same output shapes and dtypes; values change by the quantization error (check accuracy
    after).
    """
    given = context.rsq_input_ranges or {}
    if not context.calibration_inputs and not given:
        raise ValueError(
            "rsq_quantize needs PassContext.calibration_inputs (a few input batches drawn from "
            "real data, to set the activation ranges) or rsq_input_ranges (a quantization-aware "
            "model's own ranges)"
        )
    levels = 2 ** (context.rsq_bits - 1) - 1
    layers = [
        n
        for n in gm.graph.nodes
        if n.target in (aten.linear.default, aten.conv1d.default)
        and _const(gm, n.args[1]) is not None
    ]
    # Too little work per activation value to pay for quantizing it (and a narrow Linear is
    # left for fuse_memory_bound_chains to turn into a reduction).
    small = [n for n in layers if min(_const(gm, n.args[1]).shape[:2]) < context.rsq_min_features]
    layers = [n for n in layers if n not in small]
    ranges: dict[str, float] = {}
    from_model: list[str] = []
    for node in layers:
        path = module_path(node)
        if path is not None and path in given:
            ranges[node.name] = float(given[path])
            from_model.append(path)
    to_calibrate = {n.name for n in layers if n.name not in ranges}
    if to_calibrate and context.calibration_inputs:
        ranges.update(_layer_input_ranges(gm, context.calibration_inputs, to_calibrate))
    quantized = as_gemm = as_taps = 0
    for node in layers:
        weight = _const(gm, node.args[1])
        assert weight is not None
        input_range = ranges.get(node.name, 0.0)
        if not input_range > 0.0:
            continue  # no range (never saw a non-zero input, or none given): nothing to scale by
        flat = weight.reshape(weight.shape[0], -1)
        weight_scale = flat.abs().amax(dim=1).clamp_min(1e-12) / levels
        shape = [-1] + [1] * (weight.dim() - 1)
        weight_q = torch.round(weight / weight_scale.reshape(shape)).clamp(-levels, levels)
        args = list(node.args) + [None] * (7 - len(node.args))
        with gm.graph.inserting_before(node):
            scale = input_range / levels
            if node.target == aten.linear.default:
                replacement = _rsq_linear_nodes(
                    gm, args[0], weight_q, weight_scale, scale, args[2], levels
                )
            elif (args[6] or 1) == 1:  # ungrouped (``aten.conv1d.default``: numeric padding)
                # Not Inductor's int8 conv (qconv_pointwise): it gets a Conv1d's output length
                # wrong under a symbolic length (one frame too many per padded conv, torch
                # 2.13). As im2col + GEMM the conv gets the int8 Linear instead.
                replacement = _rsq_conv1d_as_gemm(
                    gm,
                    args[0],
                    weight_q,
                    weight_scale,
                    scale,
                    args[2],
                    levels,
                    _single(args[3], 1),
                    _single(args[4], 0),
                    _single(args[5], 1),
                )
                as_gemm += 1
            else:
                # A depthwise conv as shifted products; another grouped one as float ops on
                # the int8-valued operands (the same values, without an int8 kernel).
                taps = _as_taps(args, weight)
                stored = depthwise_taps(weight_q) if taps else weight_q
                q_node = _add_const(gm, stored.to(torch.int8), "rsq_weight")
                s_node = _add_const(gm, weight_scale, "rsq_scale")
                operands = (args[0], q_node, s_node, scale, args[2], levels)
                if taps:
                    extra = (_single(args[4], 0), _single(args[5], 1))
                    replacement = _call(gm, rsq_depthwise_conv1d, *operands, *extra)
                    as_taps += 1
                else:
                    extra = (args[3] or [1], args[4] or [0], args[5] or [1], args[6] or 1)
                    replacement = _call(gm, rsq_conv1d, *operands, *extra)
        if "nn_module_stack" in node.meta:
            replacement.meta["nn_module_stack"] = node.meta["nn_module_stack"]
        node.replace_all_uses_with(replacement)
        gm.graph.erase_node(node)
        quantized += 1
    return PassResult(
        fired=quantized,
        modified=quantized > 0,
        details={
            "layers": len(layers),
            "kept_fp32": len(small),
            "conv_as_gemm": as_gemm,
            "depthwise_as_taps": as_taps,
            "ranges_from_model": len(from_model),
            "calibrated": len(to_calibrate) if context.calibration_inputs else 0,
            "input_ranges": ranges,
            "bits": context.rsq_bits,
        },
    )


# --- 8. memory-bound chains -------------------------------------------------------------------

VECTOR_LANES = 16
"""fp32 lanes of one AVX-512 register: a row narrower than this leaves Inductor's vector loop
with only a scalar tail."""
REDUCTION_MAX_OUT_FEATURES = 2
"""A Linear with at most this many outputs is a per-row dot product, i.e. a reduction."""

_CHAIN_OPS = _ELEMENTWISE - {aten.remainder.Scalar, aten.remainder.Tensor}


def _narrow_chain(gm: fx.GraphModule, terminal: fx.Node) -> tuple[list[fx.Node], fx.Node] | None:
    """``(region, source)``: the pointwise ops computing ``terminal`` from one ``[N, k]`` tensor.

    Every region node has ``terminal``'s shape; operands outside the region are the source,
    scalars, or constants that vary only along the last dim. None unless all of that holds and
    the region's inner nodes feed nothing outside it.
    """
    shape = _shape(terminal)
    if shape is None or len(shape) != 2 or not _is_static(shape[1]) or shape[1] >= VECTOR_LANES:
        return None
    if _is_static(shape[0]) and shape[0] < VECTOR_LANES:
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
        node_shape = _shape(node)
        if node_shape is None or not all(
            _same_size(a, b) for a, b in zip(node_shape, shape, strict=True)
        ):
            return None
        region.add(node)
        operands = [a for a in (*node.args, *node.kwargs.values()) if isinstance(a, fx.Node)]
        for arg in operands:
            tensor = _const(gm, arg)
            if tensor is not None:
                if tensor.numel() != 1 and tuple(tensor.shape) not in ((width,), (1, width)):
                    return None
                continue
            arg_shape = _shape(arg)
            is_chain = arg.op == "call_function" and arg.target in _CHAIN_OPS
            if is_chain and arg_shape is not None and len(arg_shape) == 2:
                stack.append(arg)
            elif source is None or source is arg:
                source = arg
            else:
                return None
    if source is None or len(region) < 2:
        return None
    source_shape = _shape(source)
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
        transposed_source = _call(gm, aten.permute.default, source, [1, 0])
    env: dict[fx.Node, fx.Node] = {source: transposed_source}

    def operand(arg: Any) -> Any:
        if not isinstance(arg, fx.Node):
            return arg
        if arg in env:
            return env[arg]
        tensor = _const(gm, arg)
        if tensor is None or tensor.numel() == 1:
            return arg
        if arg not in columns:
            columns[arg] = _add_const(gm, tensor.reshape(-1, 1), "column")
        return columns[arg]

    with gm.graph.inserting_before(terminal):
        for node in region:
            args = tuple(operand(a) for a in node.args)
            kwargs = {k: operand(v) for k, v in node.kwargs.items()}
            env[node] = _call(gm, node.target, *args, **kwargs)  # type: ignore[arg-type]
        back = _call(gm, aten.permute.default, env[terminal], [1, 0])
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
    tensor = _const(gm, arg)
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
        if constant is None or not isinstance(base, fx.Node) or _const(gm, base) is not None:
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
    weight = _const(gm, node.args[1])
    shape = _shape(node.args[0])
    if weight is None or weight.dim() != 2 or shape is None or len(shape) != 2:
        return False
    out_features, width = weight.shape
    if not (width < VECTOR_LANES and out_features >= NARROW_LINEAR_MIN_OUT_FEATURES):
        return False
    if not _is_static(shape[1]):
        return False
    if _is_static(shape[0]) and shape[0] < VECTOR_LANES:
        return False  # a few rows: the GEMM call is cheap and nothing vectorizes better
    bias = node.args[2] if len(node.args) > 2 else None
    bias_value = None
    if bias is not None:
        bias_value = _const(gm, bias)
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
        mask = _const(gm, base.args[0])
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
        stacked = _call(
            gm, aten.cat.default, [_call(gm, aten.unsqueeze.default, b, 0) for b in distinct], 0
        )
        total: fx.Node | None = None  # set by the first nonzero column, which exists
        for column, branch in enumerate(branches):
            if not bool(folded_weight[:, column].any()):
                continue
            rows = _call(gm, aten.select.int, stacked, 0, distinct.index(branch))
            piece = _call(gm, aten.slice.Tensor, rows, 1, column, column + 1)
            term = _call(
                gm,
                aten.mul.Tensor,
                piece,
                _add_const(gm, folded_weight[:, column], "column_weight"),
            )
            total = term if total is None else _call(gm, aten.add.Tensor, total, term)
        assert total is not None
        if bias is not None or bool(folded_bias.any()):
            total = _call(
                gm,
                aten.add.Tensor,
                total,
                _add_const(gm, folded_bias.to(weight.dtype), "column_bias"),
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
    value = _val(node)
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
        result = _call(gm, aten.where.ScalarSelf, _call(gm, aten.ne.Tensor, x, x), nan, x)
        for bound, replacement in ((math.inf, posinf), (-math.inf, neginf)):
            hit = _call(gm, aten.eq.Scalar, x, bound)
            result = _call(gm, aten.where.ScalarSelf, hit, replacement, result)
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
    weight = _const(gm, node.args[1])
    shape = _shape(node.args[0])
    if weight is None or weight.dim() != 2 or weight.shape[0] > REDUCTION_MAX_OUT_FEATURES:
        return False
    if shape is None or not _is_static(shape[-1]):
        return False
    bias = node.args[2] if len(node.args) > 2 else None
    with gm.graph.inserting_before(node):
        if weight.shape[0] == 1:
            row = _add_const(gm, weight[0], "dot_weight")
            product = _call(gm, aten.mul.Tensor, node.args[0], row)
            total = _call(gm, aten.sum.dim_IntList, product, [-1], True)
        else:
            rows = _call(gm, aten.unsqueeze.default, node.args[0], -2)
            product = _call(gm, aten.mul.Tensor, rows, _add_const(gm, weight, "dot_weight"))
            total = _call(gm, aten.sum.dim_IntList, product, [-1])
        if bias is not None:
            total = _call(gm, aten.add.Tensor, total, bias)
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
        weight = _const(gm, node.args[1])
        shape = _shape(node.args[0])
        if weight is None or weight.dtype != torch.float32 or weight.dim() != 2 or shape is None:
            continue
        if min(weight.shape) < context.bf16_min_features or (
            _is_static(shape[0]) and shape[0] < VECTOR_LANES
        ):
            skipped += 1
            continue
        bias = node.args[2] if len(node.args) > 2 else None
        bias_value = _const(gm, bias) if bias is not None else None
        if bias is not None and bias_value is None:
            skipped += 1
            continue
        with gm.graph.inserting_before(node):
            x = _call(gm, aten._to_copy.default, node.args[0], dtype=torch.bfloat16)
            args = [x, _add_const(gm, weight.to(torch.bfloat16), "bf16_weight")]
            if bias_value is not None:
                args.append(_add_const(gm, bias_value.to(torch.bfloat16), "bf16_bias"))
            product = _call(gm, aten.linear.default, *args)
            result = _call(gm, aten._to_copy.default, product, dtype=torch.float32)
        node.replace_all_uses_with(result)
        gm.graph.erase_node(node)
        fired += 1
    return PassResult(
        fired=fired, modified=fired > 0, details={"bf16_layers": fired, "kept_fp32": skipped}
    )
