"""Range-scaled quantization (RSQ) arithmetic: int8 weights and range-scaled activations for
Linear and Conv1d written with float ops (the reference form, and what the rewritten graphs
call for grouped convs), the depthwise conv as shifted products, and the im2col layout that
runs an ungrouped conv as a GEMM.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


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
    (``compilers.passes.rsq_quantization._rsq_linear_nodes``), which Inductor (with freezing)
    lowers to a real int8 GEMM.
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
