"""Graph passes over ATen-level ``torch.fx`` graphs (``torch.export(...).module()`` form).

    python -c "from compilers.pipeline import PASS_ORDER; print(PASS_ORDER)"

One pass = one function ``(gm, context) -> PassResult`` that rewrites ``gm`` in place and
states its invariant. Parameters are ``get_attr`` nodes with real values, activations carry
``meta["val"]`` fake tensors with symbolic sizes; passes that add nodes fill in their
``meta["val"]`` by fake propagation so later passes can read shapes. Run them through
:func:`compilers.pipeline.run_pipeline`, which enforces the order and lints the result.
"""

from __future__ import annotations

import operator
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

import torch
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
    """Input batches whose activation ranges calibrate ``rsq_quantize``; required by it."""
    winograd: str = "auto"
    """``auto``: rewrite a 3-tap Conv1d only where it is faster here; ``always`` / ``never``."""
    rsq_bits: int = 8
    """Quantization width of ``rsq_quantize`` (symmetric, so ``2**(bits-1) - 1`` levels)."""
    timing_repeats: int = 7
    """Repeats per side when ``winograd="auto"`` times direct against Winograd."""
    constraints: ShapeConstraints = field(default_factory=ShapeConstraints)
    """Filled by ``collect_shape_constraints``."""

    def __post_init__(self) -> None:
        if self.winograd not in ("auto", "always", "never"):
            raise ValueError(f"winograd must be 'auto', 'always' or 'never', got {self.winograd!r}")
        if not 2 <= self.rsq_bits <= 8:
            raise ValueError(f"rsq_bits must be in [2, 8] (int8 storage), got {self.rsq_bits}")
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


def share_broadcast_computation(gm: fx.GraphModule, context: PassContext) -> PassResult:
    """Move work on a tensor that is only repeated along dim 0 to before the repeat.

    For a pre-ranking request the user's row is expanded to ``N`` candidates; after this pass
    its transforms, embedding lookup and its columns of the first Linear run once per request.
    Invariant: each rewrite computes the same values (elementwise ops commute with a
    broadcast; a Linear over a concatenation is the sum of Linears over its parts); every new
    node carries ``meta["val"]``; no in-place ops are introduced.
    """
    rules = {
        "pull_broadcast": _pull_broadcast_after,
        "split_cat": _split_across_cat,
        "flatten_cat": _flatten_cat,
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


# --- 5. Winograd F(2,3) -----------------------------------------------------------------------

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


# --- 6. RSQ int8 quantization -----------------------------------------------------------------


def rsq_linear(
    x: torch.Tensor,
    weight_q: torch.Tensor,
    weight_scale: torch.Tensor,
    input_scale: float,
    bias: torch.Tensor | None,
    levels: int,
) -> torch.Tensor:
    """Linear on int8 weights and range-scaled int8-valued activations, fp32 accumulation."""
    q = torch.clamp(torch.round(x / input_scale), -levels, levels)
    out = F.linear(q, weight_q.to(x.dtype)) * (weight_scale * input_scale)
    return out if bias is None else out + bias


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
    """Conv1d on int8 weights and range-scaled int8-valued activations."""
    q = torch.clamp(torch.round(x / input_scale), -levels, levels)
    out = F.conv1d(q, weight_q.to(x.dtype), None, stride, padding, dilation, groups)
    out = out * (weight_scale * input_scale)[:, None]
    return out if bias is None else out + bias[:, None]


def _layer_input_ranges(
    gm: fx.GraphModule, batches: Sequence[tuple[torch.Tensor, ...]], names: set[str]
) -> dict[str, float]:
    ranges: dict[str, float] = {}

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


def rsq_quantize(gm: fx.GraphModule, context: PassContext) -> PassResult:
    """Range-scaled quantization (RSQ) of Linear and Conv1d weights and input activations.

    Weights: symmetric per output channel, scale = range / levels. Activations: one scale per
    layer from the largest magnitude seen on ``context.calibration_inputs``. Invariant: same
    output shapes and dtypes; values change by the quantization error (check accuracy after).
    """
    if not context.calibration_inputs:
        raise ValueError(
            "rsq_quantize needs PassContext.calibration_inputs: a few input batches drawn from "
            "real data, to set the activation ranges"
        )
    levels = 2 ** (context.rsq_bits - 1) - 1
    layers = [
        n
        for n in gm.graph.nodes
        if n.target in (aten.linear.default, aten.conv1d.default)
        and _const(gm, n.args[1]) is not None
    ]
    ranges = _layer_input_ranges(gm, context.calibration_inputs, {n.name for n in layers})
    quantized = 0
    for node in layers:
        weight = _const(gm, node.args[1])
        assert weight is not None
        input_range = ranges.get(node.name, 0.0)
        if input_range == 0.0:
            continue  # never saw a non-zero input: nothing to scale by
        flat = weight.reshape(weight.shape[0], -1)
        weight_scale = flat.abs().amax(dim=1).clamp_min(1e-12) / levels
        shape = [-1] + [1] * (weight.dim() - 1)
        weight_q = torch.round(weight / weight_scale.reshape(shape)).clamp(-levels, levels)
        args = list(node.args) + [None] * (7 - len(node.args))
        with gm.graph.inserting_before(node):
            q_node = _add_const(gm, weight_q.to(torch.int8), "rsq_weight")
            s_node = _add_const(gm, weight_scale, "rsq_scale")
            scale = input_range / levels
            if node.target == aten.linear.default:
                replacement = _call(gm, rsq_linear, args[0], q_node, s_node, scale, args[2], levels)
            else:
                replacement = _call(
                    gm,
                    rsq_conv1d,
                    args[0],
                    q_node,
                    s_node,
                    scale,
                    args[2],
                    levels,
                    args[3] or [1],
                    args[4] or [0],
                    args[5] or [1],
                    args[6] or 1,
                )
        node.replace_all_uses_with(replacement)
        gm.graph.erase_node(node)
        quantized += 1
    return PassResult(
        fired=quantized,
        modified=quantized > 0,
        details={"layers": len(layers), "input_ranges": ranges, "bits": context.rsq_bits},
    )


# --- 7. memory-bound chains -------------------------------------------------------------------

_REDUCTIONS = {aten.sum.default, aten.sum.dim_IntList, aten.mean.dim, aten.amax.default}
# Inference BatchNorm is a per-channel affine map, hence pointwise.
_POINTWISE = _ELEMENTWISE | {aten.squeeze.dim, aten.unsqueeze.default, aten.batch_norm.default}


def fuse_memory_bound_chains(gm: fx.GraphModule, context: PassContext) -> PassResult:
    """Group single-consumer chains of pointwise ops (optionally ending in a reduction).

    Each group gets ``meta["cascade_fusion_group"]``; Inductor (the backend and AOTInductor)
    emits one loop per group, so the report's ``kernels_after`` counts the memory passes left
    of ``kernels_before``. Invariant: annotation only; no node is added, removed or reordered.
    """
    group = 0
    ops_grouped = 0
    kernels_before = 0
    seen: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.target in _POINTWISE or node.target in _REDUCTIONS:
            kernels_before += 1
        if node in seen or node.target not in _POINTWISE:
            continue
        chain = [node]
        current = node
        while len(current.users) == 1:
            (user,) = current.users
            if user.target in _POINTWISE or user.target in _REDUCTIONS:
                chain.append(user)
                current = user
                if user.target in _REDUCTIONS:
                    break
            else:
                break
        seen.update(chain)
        if len(chain) < 2:
            continue
        for member in chain:
            member.meta["cascade_fusion_group"] = group
        group += 1
        ops_grouped += len(chain)
    kernels_after = kernels_before - ops_grouped + group
    return PassResult(
        fired=group,
        modified=False,
        details={
            "ops_grouped": ops_grouped,
            "kernels_before": kernels_before,
            "kernels_after": kernels_after,
        },
    )
