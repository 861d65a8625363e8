"""Winograd F(2,3) for a 3-tap, stride-1 Conv1d: the transforms, the convolution they compute
(what ``winograd_conv1d`` puts in the graph) and its multiplication count.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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
