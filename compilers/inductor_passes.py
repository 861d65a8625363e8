"""Passes Cascade hands to Inductor itself (its post-grad custom pass hook), for rewrites that
must see Inductor's own graph: ones Inductor's pattern matcher would otherwise undo.

``unfuse_bias_addmm``: on CPU Inductor turns every ``mm(a, b) + c`` (and a Linear with bias) into
``addmm(c, a, b)``, and ATen's CPU ``addmm`` first copies ``c``, broadcast to the full
``[N, h]`` output, into the result and then accumulates the GEMM on top: a memory-bound pass
over ``N x h`` floats per layer, ahead of the GEMM (profiled at 1 x 10,000 candidates of the
dense pre-ranker: three copies, ~200 us of a ~1.3 ms call). Inductor's own unfusing rule
(``should_prefer_unfused_addmm``) is GPU-only. The pass restores ``mm`` followed by ``add``,
so the add joins the elementwise kernel that already reads the GEMM's output (ReLU, the next
layer's input). Measured A/B in one process on one core: 1 x 1,000 0.152 -> 0.142 ms; at
1 x 10,000 no change (the GEMM's own first write of its output then pays what the copy paid).
Invariant: same values (the add happens after the GEMM either way, in fp32); only ``addmm``
with ``alpha = beta = 1`` whose output feeds only elementwise or reduction kernels is
rewritten.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import fx
from torch._inductor.custom_graph_pass import CustomGraphPass

aten = torch.ops.aten

_EXTERN = {
    aten.mm.default,
    aten.addmm.default,
    aten.bmm.default,
    aten.baddbmm.default,
    aten.convolution.default,
}
"""Users that are library calls, not Inductor kernels: an add in front of them would not fuse."""


class UnfuseBiasAddmm(CustomGraphPass):
    """``addmm(c, a, b) -> add(mm(a, b), c)`` on CPU (see the module docstring).

    ``fired`` counts the rewrites of the last graph it ran on.
    """

    name = "unfuse_bias_addmm"

    def __init__(self) -> None:
        self.fired = 0

    def __call__(self, graph: fx.Graph) -> None:
        from torch._guards import detect_fake_mode

        self.fired = 0
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target is not aten.addmm.default:
                continue
            if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
                continue
            bias, a, b = node.args[:3]
            values = [getattr(x, "meta", {}).get("val") for x in (bias, a, b)]
            if not all(isinstance(v, torch.Tensor) for v in values):
                continue
            if values[1].device.type != "cpu":
                continue
            if any(user.target in _EXTERN or user.op == "output" for user in node.users):
                continue
            with graph.inserting_before(node):
                product = graph.call_function(aten.mm.default, (a, b))
                total = graph.call_function(aten.add.Tensor, (product, bias))
            with detect_fake_mode(values) or contextlib.nullcontext():
                product.meta["val"] = aten.mm.default(values[1], values[2])
                total.meta["val"] = aten.add.Tensor(product.meta["val"], values[0])
            node.replace_all_uses_with(total)
            graph.erase_node(node)
            self.fired += 1

    def uuid(self) -> Any:
        # Inductor's cache key: the pass's source decides what it emits.
        from torch._inductor.custom_graph_pass import get_hash_for_files

        return get_hash_for_files((__file__,))

    def __repr__(self) -> str:  # stable, for compilers.export's package cache key
        return f"{type(self).__name__}()"
