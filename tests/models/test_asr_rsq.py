"""RSQ fake quantization: int8 levels, range scaling, straight-through gradients, agreement with
the compiler's int8 layers, and a QAT model close to its fp32 source."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from compilers.passes.rsq_arithmetic import rsq_conv1d, rsq_linear
from models.asr.model import ConvDFSMN, ConvDFSMNConfig
from models.asr.rsq import (
    RSQConv1d,
    RSQLinear,
    activation_ranges,
    distillation_loss,
    fake_quant_activation,
    fake_quant_weight,
    float_state_dict,
    prepare_qat,
    quantizable_layers,
    quantization_record,
    quantized_model,
    weight_scale,
)

LEVELS = 127


def test_weights_take_at_most_255_levels_per_channel_scaled_by_their_range() -> None:
    torch.manual_seed(0)
    weight = torch.randn(6, 10) * torch.tensor([0.01, 0.1, 1, 10, 100, 1000])[:, None]
    quantized = fake_quant_weight(weight, LEVELS)
    scale = weight_scale(weight, LEVELS)
    steps = quantized / scale
    assert torch.allclose(steps, steps.round(), atol=1e-4)
    assert steps.abs().max() <= LEVELS + 1e-4
    # Range scaling: each channel's largest weight maps to +-127 whatever its magnitude, so
    # the relative error is the same for every channel.
    assert torch.allclose(steps.abs().amax(dim=1), torch.full((6,), 127.0))
    relative = (quantized - weight).abs().amax(dim=1) / weight.abs().amax(dim=1)
    assert (relative <= 0.5 / LEVELS + 1e-6).all()


def test_activations_clip_at_their_range_and_gradients_pass_straight_through() -> None:
    x = torch.linspace(-3, 3, 61, requires_grad=True)
    out = fake_quant_activation(x, torch.tensor(2.0), LEVELS)
    assert float(out.detach().max()) == pytest.approx(2.0)
    assert float(out.detach().min()) == pytest.approx(-2.0)
    assert len(torch.unique(out.detach())) <= 2 * LEVELS + 1
    assert (out.detach() - x.detach()).abs()[x.detach().abs() <= 2].max() <= 1 / LEVELS + 1e-6
    out.sum().backward()
    assert x.grad is not None
    inside = x.detach().abs() < 2  # (at exactly +-2 the clamp splits the gradient)
    assert torch.equal(x.grad[inside], torch.ones(int(inside.sum())))
    assert torch.equal(x.grad[x.detach().abs() > 2], torch.zeros(20))

    weight = torch.randn(4, 3, requires_grad=True)
    fake_quant_weight(weight, LEVELS).sum().backward()
    assert weight.grad is not None and torch.equal(weight.grad, torch.ones(4, 3))


def test_rsq_layers_compute_what_the_compilers_int8_layers_compute() -> None:
    torch.manual_seed(1)
    linear = RSQLinear(nn.Linear(12, 5), levels=LEVELS, momentum=0.9)
    conv = RSQConv1d(
        nn.Conv1d(8, 8, kernel_size=5, dilation=2, groups=8, bias=False),
        levels=LEVELS,
        momentum=0.9,
    )
    x, y = torch.randn(3, 7, 12) * 2, torch.randn(2, 8, 20)
    linear.input_range.fill_(3.0)
    conv.input_range.fill_(1.5)
    linear.eval(), conv.eval()
    for layer, inputs in ((linear, x), (conv, y)):
        scale = weight_scale(layer.weight, LEVELS).flatten()
        weight_q = torch.round(layer.weight / weight_scale(layer.weight, LEVELS)).clamp(-127, 127)
        input_scale = float(layer.input_range) / LEVELS
        if isinstance(layer, RSQLinear):
            expected = rsq_linear(inputs, weight_q, scale, input_scale, layer.bias, LEVELS)
        else:
            expected = rsq_conv1d(
                inputs, weight_q, scale, input_scale, None, LEVELS, [1], [0], [2], 8
            )
        torch.testing.assert_close(layer(inputs), expected, rtol=1e-5, atol=1e-5)


def _model() -> ConvDFSMN:
    config = ConvDFSMNConfig(
        n_mels=16, vocab_size=40, conv_channels=16, hidden=32, memory=16, blocks=2
    )
    torch.manual_seed(0)
    return ConvDFSMN(config).eval()


def test_qat_model_tracks_ranges_and_stays_close_to_fp32() -> None:
    fp32 = _model()
    features = torch.randn(2, 50, 16) * 3 - 5
    with torch.no_grad():
        reference = fp32(features)
    student = prepare_qat(_model())
    names = quantizable_layers(fp32)
    assert names == ["front.0", "front.3"] + [
        f"blocks.{b}.{m}" for b in range(2) for m in ("affine", "project", "memory")
    ] + ["output"]
    # A training step sets every range to the largest input magnitude it saw.
    student.train()
    student(features)
    ranges = activation_ranges(student)
    assert set(ranges) == set(names) and all(v > 0 for v in ranges.values())
    assert ranges["front.0"] == pytest.approx(float(features.abs().max()))
    # The stripped state dict loads into the plain model: the artifact's format.
    plain = _model()
    plain.load_state_dict(float_state_dict(student))
    int8 = quantized_model(plain, ranges)
    with torch.no_grad():
        quantized = int8(features)
    assert not torch.equal(quantized, reference)
    assert (quantized.exp() - reference.exp()).abs().max() < 0.05
    record = quantization_record(student, bits=8)
    assert record["bits"] == 8 and record["activation_ranges"] == ranges
    with pytest.raises(ValueError, match="lacks layers"):
        quantized_model(plain, {"output": 1.0})


def test_distillation_is_zero_for_the_teacher_itself_and_ignores_padding() -> None:
    teacher = torch.log_softmax(torch.randn(2, 6, 5), -1)
    lengths = torch.tensor([6, 3])
    assert float(distillation_loss(teacher, teacher, lengths)) == pytest.approx(0.0, abs=1e-6)
    student = teacher.clone()
    student[1, 3:] = torch.log_softmax(torch.randn(3, 5), -1)  # only padded frames differ
    assert float(distillation_loss(student, teacher, lengths)) == pytest.approx(0.0, abs=1e-6)
    student[0, 0] = torch.log_softmax(torch.randn(5), -1)
    assert float(distillation_loss(student, teacher, lengths)) > 0


def test_quantizing_before_batch_norm_equals_quantizing_the_folded_conv() -> None:
    """The compiler folds BatchNorm into the front conv, then quantizes: the same numbers."""
    torch.manual_seed(2)
    conv = nn.Conv1d(10, 6, kernel_size=3, padding=1)
    norm = nn.BatchNorm1d(6).eval()
    norm.running_mean.uniform_(-1, 1), norm.running_var.uniform_(0.5, 2)
    norm.weight.data.uniform_(-2, 2), norm.bias.data.uniform_(-1, 1)
    qat = RSQConv1d(conv, levels=LEVELS, momentum=0.9).eval()
    qat.input_range.fill_(4.0)
    x = torch.randn(2, 10, 30) * 2
    factor = norm.weight / torch.sqrt(norm.running_var + norm.eps)
    folded_weight = conv.weight.detach() * factor[:, None, None]
    folded_bias = (conv.bias - norm.running_mean) * factor + norm.bias
    scale = weight_scale(folded_weight, LEVELS)
    weight_q = torch.round(folded_weight / scale).clamp(-LEVELS, LEVELS)
    with torch.no_grad():
        expected = rsq_conv1d(
            x, weight_q, scale.flatten(), 4.0 / LEVELS, folded_bias, LEVELS, [1], [1], [1], 1
        )
        torch.testing.assert_close(norm(qat(x)), expected, rtol=1e-4, atol=1e-4)
