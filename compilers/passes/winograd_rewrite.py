"""Pass ``winograd_conv1d``: rewrite 3-tap Conv1d to Winograd F(2,3)
(:mod:`compilers.passes.winograd_arithmetic`) where it is faster here.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from compilers.passes.graph import add_const, call, const, shape_of
from compilers.passes.interface import PassContext, PassResult
from compilers.passes.winograd_arithmetic import (
    conv1d_multiplications,
    winograd_conv1d_f23,
    winograd_filter,
)
from compilers.timing import median_seconds

aten = torch.ops.aten


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
        weight = const(gm, args[1])
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
        bias = const(gm, bias_arg) if bias_arg is not None else None
        if context.winograd == "auto":
            x = real_inputs[node.name]
            with torch.no_grad():
                direct = 1000 * median_seconds(
                    lambda x=x, w=weight, b=bias, p=padding: F.conv1d(x, w, b, padding=p),
                    repeats=context.timing_repeats,
                )
                wino = 1000 * median_seconds(
                    lambda x=x, f=filt, b=bias, p=padding: winograd_conv1d_f23(x, f, b, p),
                    repeats=context.timing_repeats,
                )
            timings[node.name] = {"direct_ms": direct, "winograd_ms": wino}
            if wino >= direct:
                continue
        shape = shape_of(node)
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
            filt_node = add_const(gm, filt, "winograd_filter")
            replacement = call(gm, winograd_conv1d_f23, node.args[0], filt_node, bias_arg, padding)
        node.replace_all_uses_with(replacement)
        gm.graph.erase_node(node)
        rewritten += 1
    details: dict[str, Any] = {"candidates": len(candidates), "timings": timings}
    if multiplications["direct"]:
        details["multiplications"] = multiplications
    return PassResult(fired=rewritten, modified=rewritten > 0, details=details)
