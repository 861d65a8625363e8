"""Pass ``rsq_quantize``: range-scaled int8 quantization of Linear and Conv1d weights and input
activations (arithmetic in :mod:`compilers.passes.rsq_arithmetic`), emitted as the
quantize/dequantize pattern Inductor lowers to int8 GEMMs.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed ops)
from torch import fx

from compilers.passes.graph import add_const, call, const, is_static, shape_of
from compilers.passes.interface import PassContext, PassResult
from compilers.passes.rsq_arithmetic import (
    DEPTHWISE_MAX_TAPS,
    RSQ_ZERO_POINT,
    columns_to_conv_output,
    conv1d_columns,
    conv1d_weight_as_gemm,
    depthwise_taps,
    rsq_conv1d,
    rsq_depthwise_conv1d,
    rsq_linear,
)

aten = torch.ops.aten

INT8_DOT_PRODUCT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
"""x86 CPU flags of an int8 dot product that accumulates u8 x s8 products in 32 bits."""


@functools.cache
def exact_int8_gemm(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether oneDNN's int8 GEMM is exact on this CPU. Without VNNI (AVX2 only, or AVX-512
    without VNNI) it sums pairs of u8 x s8 products in a saturating 16-bit lane: activations
    up to 255 around the zero point times weights up to 127 overflow it, and a package's
    scores were off by 8% of their range here. Other CPUs are taken as exact."""
    try:
        with open(cpuinfo) as lines:
            flags = next((line for line in lines if line.startswith("flags")), "")
    except OSError:
        return True
    if not flags or " avx2" not in flags:
        return True  # not an x86 with oneDNN's AVX2 kernels (or unknown): nothing to avoid
    words = set(flags.split())
    return any(flag in words for flag in INT8_DOT_PRODUCT_FLAGS)


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
    columns = call(gm, conv1d_columns, x, weight_q.shape[2], stride, padding, dilation)
    gemm = _rsq_linear_nodes(
        gm,
        columns,
        conv1d_weight_as_gemm(weight_q),
        weight_scale,
        input_scale,
        bias,
        levels,
    )
    return call(gm, columns_to_conv_output, gemm, x)


def _rsq_activation(gm: fx.GraphModule, x: fx.Node, input_scale: float, levels: int) -> fx.Node:
    """Quantize -> dequantize of a layer input: uint8 around :data:`RSQ_ZERO_POINT`."""
    qd = torch.ops.quantized_decomposed
    low, high = RSQ_ZERO_POINT - levels, RSQ_ZERO_POINT + levels
    quantized = call(
        gm,
        qd.quantize_per_tensor.default,
        x,
        input_scale,
        RSQ_ZERO_POINT,
        low,
        high,
        torch.uint8,
    )
    return call(
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
    q_node = add_const(gm, weight_q.to(torch.int8), "rsq_weight")
    s_node = add_const(gm, weight_scale.float(), "rsq_scale")
    z_node = add_const(gm, torch.zeros(weight_q.shape[0], dtype=torch.int64), "rsq_zero")
    return call(
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


def _int8_operands(
    gm: fx.GraphModule, stored: torch.Tensor, weight_scale: torch.Tensor
) -> tuple[fx.Node, fx.Node]:
    """The int8 weight and its per-channel scale as graph constants, for the float-arithmetic
    kernels (:func:`rsq_linear`, :func:`rsq_conv1d`, :func:`rsq_depthwise_conv1d`)."""
    return (
        add_const(gm, stored.to(torch.int8), "rsq_weight"),
        add_const(gm, weight_scale, "rsq_scale"),
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
    :func:`compilers.passes.rsq_arithmetic.rsq_linear` up to rounding.
    """
    shape = shape_of(x)
    if shape is not None and len(shape) > 2:
        # Inductor's int8 Linear patterns are for 2-D inputs; a 3-D one with a symbolic dim
        # reaches a matcher that cannot compare symbolic sizes. Rows are independent, so run
        # the layer on ``[prod(lead), in]`` and restore the lead dims.
        lead = [
            size if is_static(size) else call(gm, aten.sym_size.int, x, dim)
            for dim, size in enumerate(shape[:-1])
        ]
        flat = call(gm, aten.reshape.default, x, [-1, shape[-1]])
        out = _rsq_linear_nodes(gm, flat, weight_q, weight_scale, input_scale, bias, levels)
        return call(gm, aten.reshape.default, out, [*lead, int(weight_q.shape[0])])
    activation = _rsq_activation(gm, x, input_scale, levels)
    weight = _rsq_weight(gm, weight_q, weight_scale, levels)
    return call(gm, aten.linear.default, activation, weight, bias)


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
    :func:`compilers.passes.rsq_arithmetic.depthwise_conv1d_taps`: one input channel per group
    and per output channel, stride 1, at most DEPTHWISE_MAX_TAPS taps."""
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
    another grouped one as :func:`rsq_conv1d`. On a CPU whose int8 GEMM saturates
    (:func:`exact_int8_gemm`), Linear and ungrouped Conv1d layers run the same integer-valued
    operands in fp32 arithmetic instead (``fp32_arithmetic`` counts them). Invariant:
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
        and const(gm, n.args[1]) is not None
    ]
    # Too little work per activation value to pay for quantizing it (and a narrow Linear is
    # left for fuse_memory_bound_chains to turn into a reduction).
    small = [n for n in layers if min(const(gm, n.args[1]).shape[:2]) < context.rsq_min_features]
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
    quantized = as_gemm = as_taps = as_float = 0
    int8_kernels = exact_int8_gemm()
    for node in layers:
        weight = const(gm, node.args[1])
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
            if node.target == aten.linear.default and not int8_kernels:
                # The same integer-valued operands in fp32 arithmetic: exact where the CPU's
                # int8 GEMM would saturate (:func:`exact_int8_gemm`).
                q_node, s_node = _int8_operands(gm, weight_q, weight_scale)
                replacement = call(gm, rsq_linear, args[0], q_node, s_node, scale, args[2], levels)
                as_float += 1
            elif node.target == aten.linear.default:
                replacement = _rsq_linear_nodes(
                    gm, args[0], weight_q, weight_scale, scale, args[2], levels
                )
            elif (args[6] or 1) == 1 and int8_kernels:  # ungrouped (numeric padding)
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
                operands = (
                    args[0],
                    *_int8_operands(gm, stored, weight_scale),
                    scale,
                    args[2],
                    levels,
                )
                if taps:
                    extra = (_single(args[4], 0), _single(args[5], 1))
                    replacement = call(gm, rsq_depthwise_conv1d, *operands, *extra)
                    as_taps += 1
                else:
                    extra = (args[3] or [1], args[4] or [0], args[5] or [1], args[6] or 1)
                    replacement = call(gm, rsq_conv1d, *operands, *extra)
                    as_float += (args[6] or 1) == 1
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
            "int8_kernels": int8_kernels,
            "fp32_arithmetic": as_float,
            "ranges_from_model": len(from_model),
            "calibrated": len(to_calibrate) if context.calibration_inputs else 0,
            "input_ranges": ranges,
            "bits": context.rsq_bits,
        },
    )
