"""Range-scaled quantization (RSQ) for training: int8 fake quantization of ConvDFSMN's Linear and
Conv1d layers, with straight-through gradients, EMA activation ranges and distillation.

RSQ maps a tensor onto the symmetric integer grid ``[-L, L]`` (``L = 2**(bits-1) - 1``, 127 for
int8) by scaling it with its range: ``q = clamp(round(x / s), -L, L)`` with ``s = range / L``,
and computes in float as ``q * s``. Weights use their own range per output channel (``range =
max |w|`` of the channel); a layer's input activation uses one range per layer, learned during
training as an exponential moving average of the largest magnitude each step sees, then frozen.

This is exactly what the inference side computes (``rsq_linear`` and ``rsq_conv1d`` in
:mod:`compilers.passes.rsq_arithmetic`, the ``rsq_quantize`` pass): the same per-channel weight
scale, the same per-layer activation scale ``range / L``, the same rounding and clamping, bias
added in float. So an int8 model built by ``compilers/`` from the fp32 weights in the QAT
artifact and its ``quantization["activation_ranges"]`` (module name -> range of that module's
input) computes what :func:`quantized_model` computes here, and the fake-quant evaluation is the
int8 model's accuracy. The front end's BatchNorm stays frozen (eval statistics) during QAT: the
compiler folds it into the conv before quantizing, and folding scales each output channel, which
commutes with per-channel range scaling.

Training (:func:`prepare_qat`) swaps every Linear/Conv1d for an :class:`RSQLinear` /
:class:`RSQConv1d` sharing its parameters. Rounding has no gradient, so the backward pass treats
it as the identity (straight-through estimator); activations clipped at their range get no
gradient. The QAT loss adds :func:`distillation_loss`, the KL divergence from the fp32 teacher's
CTC posteriors to the student's, to the CTC loss.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from models.asr.model import ConvDFSMN

RANGE_BUFFER = "input_range"
"""Name of the activation-range buffer each RSQ layer adds (not part of the fp32 state dict)."""


def levels_of(bits: int) -> int:
    if not 2 <= bits <= 8:
        raise ValueError(f"bits must be in [2, 8], got {bits}")
    return 2 ** (bits - 1) - 1


def weight_scale(weight: torch.Tensor, levels: int) -> torch.Tensor:
    """Per-output-channel scale ``max |w| / L``, shaped to broadcast over ``weight``."""
    flat = weight.detach().reshape(weight.shape[0], -1)
    scale = flat.abs().amax(dim=1).clamp_min(1e-12) / levels
    return scale.reshape([-1] + [1] * (weight.dim() - 1))


def quantize_weight(weight: torch.Tensor, levels: int) -> torch.Tensor:
    """The int8-valued weight ``clamp(round(w / s), -L, L)`` (float dtype) and its use as
    ``q * s`` (what the int8 GEMM multiplies by, after its scale)."""
    scale = weight_scale(weight, levels)
    return torch.clamp(torch.round(weight / scale), -levels, levels) * scale


def fake_quant_weight(weight: torch.Tensor, levels: int) -> torch.Tensor:
    """:func:`quantize_weight` forward, identity backward (straight-through)."""
    return weight + (quantize_weight(weight, levels) - weight).detach()


def fake_quant_activation(x: torch.Tensor, input_range: torch.Tensor, levels: int) -> torch.Tensor:
    """``clamp(round(x / s), -L, L) * s`` with ``s = range / L``; the gradient is 1 inside the
    range and 0 where ``x`` was clipped."""
    scale = (input_range / levels).clamp_min(1e-12)
    quantized = torch.clamp(torch.round(x / scale), -levels, levels) * scale
    clipped = torch.maximum(torch.minimum(x, input_range), -input_range)
    return clipped + (quantized - clipped).detach()


class _RangeTracking:
    """The activation range of one RSQ layer: EMA of each training step's largest |input|."""

    levels: int
    momentum: float
    tracking: bool
    input_range: torch.Tensor

    def _init_range(self, levels: int, momentum: float) -> None:
        self.levels, self.momentum, self.tracking = levels, momentum, True
        self.register_buffer(RANGE_BUFFER, torch.zeros(()))  # type: ignore[attr-defined]

    @torch.no_grad()
    def _observe(self, x: torch.Tensor) -> None:
        peak = x.detach().abs().amax().float().reshape(1)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # Every rank must keep the same range: each sees other utterances.
            dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        value = peak[0].to(self.input_range.dtype)
        if float(self.input_range) == 0.0:
            self.input_range.copy_(value)
        else:
            self.input_range.mul_(self.momentum).add_((1 - self.momentum) * value)

    def _quantize_input(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.tracking:  # type: ignore[attr-defined]
            self._observe(x)
        if float(self.input_range) == 0.0:
            raise RuntimeError(
                "RSQ layer used before its activation range was set: run a training step or "
                "give the ranges (quantized_model)"
            )
        return fake_quant_activation(x, self.input_range.to(x.dtype), self.levels)


class RSQLinear(nn.Linear, _RangeTracking):
    """``nn.Linear`` on range-scaled int8 weights and inputs (fake-quantized, float compute)."""

    def __init__(self, source: nn.Linear, *, levels: int, momentum: float) -> None:
        nn.Linear.__init__(self, 1, 1, bias=source.bias is not None)
        self.in_features, self.out_features = source.in_features, source.out_features
        self.weight, self.bias = source.weight, source.bias
        self._init_range(levels, momentum)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(
            self._quantize_input(x), fake_quant_weight(self.weight, self.levels), self.bias
        )


class RSQConv1d(nn.Conv1d, _RangeTracking):
    """``nn.Conv1d`` on range-scaled int8 weights and inputs (fake-quantized, float compute)."""

    def __init__(self, source: nn.Conv1d, *, levels: int, momentum: float) -> None:
        nn.Conv1d.__init__(
            self,
            source.in_channels,
            source.out_channels,
            source.kernel_size,  # type: ignore[arg-type]
            stride=source.stride,  # type: ignore[arg-type]
            padding=source.padding,  # type: ignore[arg-type]
            dilation=source.dilation,  # type: ignore[arg-type]
            groups=source.groups,
            bias=source.bias is not None,
            padding_mode=source.padding_mode,
        )
        self.weight, self.bias = source.weight, source.bias
        self._init_range(levels, momentum)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(
            self._quantize_input(x), fake_quant_weight(self.weight, self.levels), self.bias
        )


RSQ_LAYERS = (RSQLinear, RSQConv1d)


def quantizable_layers(model: nn.Module) -> list[str]:
    """Names of the Linear and Conv1d modules RSQ quantizes (all of them), in model order."""
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear | nn.Conv1d) and name
    ]


def prepare_qat(model: nn.Module, *, bits: int = 8, momentum: float = 0.95) -> nn.Module:
    """Swap every Linear/Conv1d of ``model`` (in place) for its RSQ version sharing the same
    parameters; returns ``model``. Call before handing the model to an optimizer or DeepSpeed."""
    levels = levels_of(bits)
    for name in quantizable_layers(model):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        source = getattr(parent, child)
        if isinstance(source, RSQ_LAYERS):
            continue
        if isinstance(source, nn.Conv1d):
            replacement: nn.Module = RSQConv1d(source, levels=levels, momentum=momentum)
        else:
            replacement = RSQLinear(source, levels=levels, momentum=momentum)
        setattr(parent, child, replacement)
    return model


def set_range_tracking(model: nn.Module, tracking: bool) -> None:
    """Let the activation ranges follow their EMA (True) or keep them fixed (False)."""
    for module in model.modules():
        if isinstance(module, RSQ_LAYERS):
            module.tracking = tracking


def freeze_batch_norm(model: nn.Module) -> None:
    """BatchNorm layers to eval mode (running statistics used, not updated): the int8 model
    folds them into the preceding conv with those statistics."""
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.eval()


def activation_ranges(model: nn.Module) -> dict[str, float]:
    """Module name -> activation range of its input, for every RSQ layer."""
    return {
        name: float(module.input_range)
        for name, module in model.named_modules()
        if isinstance(module, RSQ_LAYERS)
    }


def float_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of the plain model (RSQ range buffers dropped): what ``save_artifact``
    stores and ``compilers/`` quantizes."""
    suffix = "." + RANGE_BUFFER
    return {
        k: v.detach().cpu().clone() for k, v in model.state_dict().items() if not k.endswith(suffix)
    }


def quantization_record(model: nn.Module, *, bits: int, **extra: Any) -> dict[str, Any]:
    """The ``quantization`` entry of the int8 artifact (see :mod:`models.asr.artifact`)."""
    ranges = activation_ranges(model)
    return {
        "bits": bits,
        "scheme": "rsq",
        "levels": levels_of(bits),
        "weights": "symmetric per output channel, scale = max|w| / levels",
        "activations": "symmetric per layer input, scale = activation_range / levels",
        "activation_ranges": ranges,
        "layers": list(ranges),
        **extra,
    }


def quantized_model(model: ConvDFSMN, ranges: dict[str, float], *, bits: int = 8) -> ConvDFSMN:
    """A fake-quant int8 copy of ``model`` in eval mode with the given activation ranges (the
    numbers the int8 artifact computes); ``model`` itself is left as it is."""
    layers = quantizable_layers(model)
    missing = sorted(set(layers) - set(ranges))
    if missing:
        raise ValueError(f"activation_ranges lacks layers {missing}")
    bad = {k: v for k, v in ranges.items() if k in layers and not v > 0}
    if bad:
        raise ValueError(f"activation ranges must be > 0, got {bad}")
    student = copy.deepcopy(model)
    prepare_qat(student, bits=bits)
    for name, module in student.named_modules():
        if isinstance(module, RSQ_LAYERS):
            module.input_range.fill_(float(ranges[name]))
            module.tracking = False
    return student.eval()


def distillation_loss(
    student_log_probs: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    lengths: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Mean over valid frames of KL(teacher || student) between the CTC posteriors
    ``[B, T, V]`` (log-probabilities), softened by ``temperature`` (and scaled by its square,
    so the gradient's size does not depend on it)."""
    if temperature != 1.0:
        student_log_probs = F.log_softmax(student_log_probs / temperature, dim=-1)
        teacher_log_probs = F.log_softmax(teacher_log_probs / temperature, dim=-1)
    teacher_log_probs = teacher_log_probs.detach()
    per_frame = (teacher_log_probs.exp() * (teacher_log_probs - student_log_probs)).sum(-1)
    frames = torch.arange(per_frame.shape[1], device=per_frame.device)
    mask = (frames[None, :] < lengths[:, None]).to(per_frame.dtype)
    return (per_frame * mask).sum() / mask.sum().clamp_min(1.0) * temperature**2
