"""Each pass: output matches eager (assert_close) and its counter shows it fired."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.export import Dim

from benchmarks.compiled_fscd import RowwiseColdRequest
from compilers.export import export_program
from compilers.passes import (
    PassContext,
    bf16_gemm,
    collect_shape_constraints,
    columns_to_conv_output,
    conv1d_columns,
    conv1d_multiplications,
    conv1d_weight_as_gemm,
    depthwise_conv1d_taps,
    depthwise_taps,
    fold_batch_norm,
    fold_embedding_linear,
    fuse_memory_bound_chains,
    remove_noops,
    rsq_quantization,
    rsq_quantize,
    share_broadcast_computation,
    winograd_conv1d,
    winograd_conv1d_f23,
    winograd_filter,
)
from compilers.pipeline import DEFAULT_PASSES, PASS_ORDER, run_pipeline
from compilers.preranking import (
    ColdPreRankingRequest,
    PreRankingRequest,
    cold_dynamic_shapes,
    cold_request_inputs,
    preranking_dynamic_shapes,
    preranking_example,
)
from models.preranking.fields import FIELDS
from models.preranking.model import ColdPreRanker, PreRanker, PreRankerConfig

aten = torch.ops.aten


class ConvStack(nn.Module):
    """A small ASR-like block: Conv1d(3 taps)+BN, dropout, a 5-tap conv, Linear+BN head."""

    def __init__(self, channels: int = 6) -> None:
        super().__init__()
        self.conv = nn.Conv1d(channels, 8, 3, padding=1)
        self.bn = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.3)
        self.conv5 = nn.Conv1d(8, 8, 5, padding=2, bias=False)
        self.head = nn.Linear(8, 4)
        self.head_bn = nn.BatchNorm1d(4)
        for bn in (self.bn, self.head_bn):  # non-trivial statistics, so folding matters
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.drop(torch.relu(self.bn(self.conv(x))))
        y = self.conv5(y) * 1 + 0
        pooled = y.mean(dim=2)  # [B, 8]
        return self.head_bn(self.head(pooled))


def conv_program(batch: int = 2, length: int = 16) -> tuple[nn.Module, torch.fx.GraphModule]:
    torch.manual_seed(0)
    module = ConvStack().eval()
    example = (torch.randn(batch, 6, length),)
    dims = ({0: Dim("batch", min=1, max=64), 2: Dim("time", min=4, max=4096)},)
    return module, export_program(module, example, dims).module()


def count(gm: torch.fx.GraphModule, target: object) -> int:
    return sum(1 for n in gm.graph.nodes if n.target == target)


def prepared(gm: torch.fx.GraphModule) -> PassContext:
    context = PassContext(winograd="always")
    collect_shape_constraints(gm, context)
    return context


def test_shape_constraints_find_equal_bounded_dims() -> None:
    torch.manual_seed(0)
    model = PreRanker(PreRankerConfig(id_buckets=64, embedding_dim=4, hidden=(8,))).eval()
    example = preranking_example(model.config, 5)
    gm = export_program(PreRankingRequest(model), example, preranking_dynamic_shapes()).module()
    context = PassContext()
    result = collect_shape_constraints(gm, context)
    assert result.fired >= 2 and not result.modified
    assert ["item_dense.0", "item_id.0"] in context.constraints.equal
    (symbol,) = context.constraints.bounds
    lower, upper = context.constraints.bounds[symbol]
    assert lower >= 1 and upper == 1 << 20
    assert context.constraints.dynamic_inputs == {"item_dense": [0], "item_id": [0]}


def test_remove_noops_drops_dropout_and_identities() -> None:
    module, gm = conv_program()
    result = remove_noops(gm, prepared(gm))
    assert result.details.get("aten.dropout.default") == 1
    assert result.details.get("aten.mul.Tensor") == 1 and result.details.get("aten.add.Tensor") == 1
    assert count(gm, aten.dropout.default) == 0
    gm.recompile()
    x = torch.randn(3, 6, 21)
    torch.testing.assert_close(gm(x), module(x))


def test_fold_batch_norm_conv_and_linear() -> None:
    module, gm = conv_program()
    context = prepared(gm)
    remove_noops(gm, context)
    result = fold_batch_norm(gm, context)
    assert result.fired == 2
    assert count(gm, aten.batch_norm.default) == 0
    gm.recompile()
    for length in (4, 9, 40):
        x = torch.randn(2, 6, length)
        torch.testing.assert_close(gm(x), module(x), rtol=1e-5, atol=1e-5)


def test_share_broadcast_runs_user_side_once() -> None:
    torch.manual_seed(0)
    model = PreRanker(PreRankerConfig(id_buckets=64, embedding_dim=4, hidden=(8, 4))).eval()
    model.fit_normalizer(torch.rand(100, model.config.num_dense) * 20)
    request = PreRankingRequest(model).eval()
    example = preranking_example(model.config, 6)
    gm = export_program(request, example, preranking_dynamic_shapes()).module()
    context = prepared(gm)
    remove_noops(gm, context)
    result = share_broadcast_computation(gm, context)
    assert result.details["split_linear"] == 1
    assert result.details["pull_broadcast"] >= 3  # remainder, embedding, the dense transforms
    assert result.details["split_cat"] >= 4
    # The user embedding is now looked up for one row, whatever the candidate count.
    user_table = "model.user_embedding.weight"
    (lookup,) = [
        n
        for n in gm.graph.nodes
        if n.target == aten.embedding.default and n.args[0].target == user_table
    ]
    assert tuple(lookup.meta["val"].shape)[0] == 1
    gm.graph.lint()
    gm.recompile()
    for n in (1, 3, 257):
        inputs = preranking_example(model.config, n, seed=n)
        torch.testing.assert_close(gm(*inputs), request(*inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("length", [7, 8, 33])
def test_winograd_f23_matches_conv_with_fewer_multiplications(length: int) -> None:
    torch.manual_seed(length)
    x, weight, bias = torch.randn(2, 5, length), torch.randn(7, 5, 3), torch.randn(7)
    expected = torch.nn.functional.conv1d(x, weight, bias, padding=1)
    got = winograd_conv1d_f23(x, winograd_filter(weight), bias, 1)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    direct = conv1d_multiplications(2, 5, 7, 64, winograd=False)
    assert direct / conv1d_multiplications(2, 5, 7, 64, winograd=True) == 1.5


def test_winograd_pass_rewrites_only_3_tap_convs() -> None:
    module, gm = conv_program()
    context = prepared(gm)
    result = winograd_conv1d(gm, context)
    assert result.fired == 1 and result.details["candidates"] == 1  # the 5-tap conv is left
    assert count(gm, aten.conv1d.default) == 1
    gm.recompile()
    for length in (5, 12, 31):
        x = torch.randn(2, 6, length)
        torch.testing.assert_close(gm(x), module(x), rtol=1e-4, atol=1e-4)


def test_winograd_auto_times_both_forms() -> None:
    _, gm = conv_program(length=64)
    context = PassContext(winograd="auto", example_inputs=(torch.randn(2, 6, 64),))
    context.timing_repeats = 3
    result = winograd_conv1d(gm, context)
    (timing,) = result.details["timings"].values()
    assert timing["direct_ms"] > 0 and timing["winograd_ms"] > 0
    assert result.fired == int(timing["winograd_ms"] < timing["direct_ms"])


@pytest.fixture
def int8_gemm_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass as it runs on a CPU with VNNI: the int8 GEMM pattern (the graph is checked in
    eager float ops, so this runs on any CPU)."""
    monkeypatch.setattr(rsq_quantization, "exact_int8_gemm", lambda: True)


def test_rsq_quantize_int8_with_calibration(int8_gemm_exact: None) -> None:
    module, gm = conv_program()
    calibration = [(torch.randn(4, 6, 32),) for _ in range(4)]
    context = PassContext(calibration_inputs=calibration)
    collect_shape_constraints(gm, context)
    result = rsq_quantize(gm, context)
    assert result.fired == 3  # two Conv1d and the Linear
    int8 = [b for name, b in gm.named_buffers() if name.startswith("_cascade_rsq_weight")]
    assert len(int8) == 3 and all(b.dtype == torch.int8 for b in int8)
    gm.recompile()
    x = torch.randn(4, 6, 32)
    expected = module(x)
    error = (gm(x) - expected).norm() / expected.norm()
    assert 0 < error < 0.03, f"int8 relative error {error:.4f}"


@pytest.mark.parametrize(("stride", "padding", "dilation"), [(1, 1, 1), (2, 1, 1), (2, 0, 2)])
def test_conv1d_as_columns_and_gemm_matches_conv(stride: int, padding: int, dilation: int) -> None:
    x, weight, bias = torch.randn(3, 5, 17), torch.randn(7, 5, 3), torch.randn(7)
    expected = torch.nn.functional.conv1d(x, weight, bias, stride, padding, dilation)
    columns = conv1d_columns(x, 3, stride, padding, dilation)
    got = columns_to_conv_output(columns @ conv1d_weight_as_gemm(weight).T + bias, x)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


class StridedConvs(nn.Module):
    """The ASR front end's shape: a 3-tap conv, then a 3-tap conv of stride 2."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Conv1d(6, 8, 3, padding=1)
        self.second = nn.Conv1d(8, 8, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x)))


class MemoryBlock(nn.Module):
    """A DFSMN memory's shape: projected frames plus a depthwise 7-tap filter over time."""

    def __init__(self) -> None:
        super().__init__()
        self.project = nn.Conv1d(6, 8, 1)
        self.memory = nn.Conv1d(8, 8, 7, groups=8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.project(x)
        return p + self.memory(torch.nn.functional.pad(p, (4, 2)))


@pytest.mark.parametrize(
    ("name", "layers", "as_gemm", "as_taps"),
    [("stack", 3, 2, 0), ("strided", 2, 2, 0), ("memory", 2, 1, 1)],
)
def test_rsq_quantize_runs_convs_as_int8_gemms_and_taps_under_a_symbolic_length(
    name: str, layers: int, as_gemm: int, as_taps: int, int8_gemm_exact: None
) -> None:
    if name == "stack":
        module, gm = conv_program()
    else:
        torch.manual_seed(0)
        module = (StridedConvs() if name == "strided" else MemoryBlock()).eval()
        dims = ({2: Dim("time", min=4, max=4096)},)
        gm = export_program(module, (torch.randn(2, 6, 16),), dims).module()
    context = PassContext(
        calibration_inputs=[(torch.randn(2, 6, 32),) for _ in range(4)], rsq_min_features=1
    )
    collect_shape_constraints(gm, context)
    result = rsq_quantize(gm, context)
    assert result.fired == layers
    assert result.details["conv_as_gemm"] == as_gemm
    assert result.details["depthwise_as_taps"] == as_taps
    assert count(gm, aten.conv1d.default) == 0
    qd = torch.ops.quantized_decomposed
    assert count(gm, qd.quantize_per_tensor.default) == layers - as_taps  # the GEMM pattern
    gm.recompile()
    length = Dim("length", min=4, max=256)
    program = export_program(gm, (torch.randn(2, 6, 16),), ({2: length},))
    for frames in (5, 16, 33):
        x = torch.randn(2, 6, frames)
        expected = module(x)
        got = program.module()(x)
        assert got.shape == expected.shape
        error = (got - expected).norm() / expected.norm()
        assert error < 0.03, f"{frames} frames: int8 relative error {error:.4f}"


@pytest.mark.parametrize("dilation", [1, 2])
def test_depthwise_conv1d_taps_matches_conv(dilation: int) -> None:
    x, weight = torch.randn(2, 5, 19), torch.randn(5, 1, 4)
    expected = torch.nn.functional.conv1d(x, weight, None, 1, 2, dilation, groups=5)
    got = depthwise_conv1d_taps(x, depthwise_taps(weight), 2, dilation)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_rsq_quantize_emits_int8_linear_pattern_and_keeps_narrow_layers(
    int8_gemm_exact: None,
) -> None:
    request, gm, _ = request_graph(hidden=(32, 16))
    calibration = [preranking_example(request.model.config, 50, seed=s) for s in range(4)]
    context = PassContext(calibration_inputs=calibration, rsq_min_features=16)
    collect_shape_constraints(gm, context)
    result = rsq_quantize(gm, context)
    # Only 32 -> 16 is wide on both sides; the user's and the candidates' parts of the first
    # layer (4 and 11 inputs) and the 16 -> 1 head stay fp32.
    assert result.fired == 1
    assert result.details["layers"] == 1 and result.details["kept_fp32"] == 3
    qd = torch.ops.quantized_decomposed
    assert count(gm, qd.quantize_per_tensor.default) == 1
    assert count(gm, qd.dequantize_per_channel.default) == 1
    gm.recompile()
    inputs = preranking_example(request.model.config, 200, seed=9)
    with torch.no_grad():
        expected = request(*inputs)
        error = (gm(*inputs) - expected).norm() / expected.norm()
    assert 0 < error < 0.05, f"int8 relative error {error:.4f}"


def test_without_an_exact_int8_gemm_the_same_integer_operands_run_in_fp32(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module, gm = conv_program()
    reference_gm = copy.deepcopy(gm)
    calibration = [(torch.randn(4, 6, 32),) for _ in range(4)]
    results = {}
    for exact, graph in ((False, gm), (True, reference_gm)):
        monkeypatch.setattr(rsq_quantization, "exact_int8_gemm", lambda exact=exact: exact)
        context = PassContext(calibration_inputs=calibration)
        collect_shape_constraints(graph, context)
        results[exact] = rsq_quantize(graph, context)
        graph.recompile()
    fallback = results[False]
    assert fallback.fired == 3 and fallback.details["int8_kernels"] is False
    assert fallback.details["fp32_arithmetic"] == 3 and fallback.details["conv_as_gemm"] == 0
    assert count(gm, torch.ops.quantized_decomposed.quantize_per_tensor.default) == 0
    assert results[True].details["fp32_arithmetic"] == 0
    # The same quantized values: both graphs agree with each other, not only with fp32.
    x = torch.randn(4, 6, 32)
    torch.testing.assert_close(gm(x), reference_gm(x), rtol=1e-4, atol=1e-4)
    error = (gm(x) - module(x)).norm() / module(x).norm()
    assert 0 < error < 0.03


@pytest.mark.parametrize(
    ("flags", "exact"),
    [
        ("fpu sse2 avx2 fma", False),
        ("fpu sse2 avx2 avx512f avx512bw", False),
        ("fpu sse2 avx2 avx512f avx512_vnni", True),
        ("fpu sse2 avx2 avx_vnni", True),
        ("fp asimd", True),
    ],
)
def test_exact_int8_gemm_reads_the_cpu_flags(tmp_path: Path, flags: str, exact: bool) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    assert rsq_quantization.exact_int8_gemm(str(cpuinfo)) is exact


def test_rsq_quantize_needs_calibration() -> None:
    _, gm = conv_program()
    with pytest.raises(ValueError, match="calibration_inputs"):
        rsq_quantize(gm, PassContext())


def request_graph(
    hidden: tuple[int, ...] = (8, 4),
) -> tuple[PreRankingRequest, torch.fx.GraphModule, PassContext]:
    """A pre-ranking request graph after the passes that precede the folding ones."""
    torch.manual_seed(0)
    model = PreRanker(PreRankerConfig(id_buckets=64, embedding_dim=4, hidden=hidden)).eval()
    model.fit_normalizer(torch.rand(100, model.config.num_dense) * 20)
    request = PreRankingRequest(model).eval()
    example = preranking_example(model.config, 32)
    gm = export_program(request, example, preranking_dynamic_shapes()).module()
    context = prepared(gm)
    remove_noops(gm, context)
    share_broadcast_computation(gm, context)
    return request, gm, context


def test_fold_embedding_linear_premultiplies_both_tables() -> None:
    request, gm, context = request_graph()
    tables = {"model.user_embedding.weight", "model.item_embedding.weight"}
    result = fold_embedding_linear(gm, context)
    assert result.fired == 2  # the user's and the candidates' lookups
    assert result.details["folded_tables"] == [[64, 8], [64, 8]]  # id buckets x first layer
    lookups = [n for n in gm.graph.nodes if n.target == aten.embedding.default]
    assert len(lookups) == 2 and not any(str(n.args[0].target) in tables for n in lookups)
    gm.graph.lint()
    gm.recompile()
    for n in (1, 5, 300):
        inputs = preranking_example(request.model.config, n, seed=n)
        torch.testing.assert_close(gm(*inputs), request(*inputs), rtol=1e-5, atol=1e-5)


def cold_request_graph(
    rowwise: bool = True,
) -> tuple[torch.nn.Module, torch.fx.GraphModule, PassContext]:
    """The FSCD pre-ranker's request graph (user, item and cross fields), noops removed: in the
    row-wise form (:class:`RowwiseColdRequest`), else the served request path's."""
    from models.preranking.config_registry import CascadeNetConfig

    torch.manual_seed(0)
    fields = ("user_id", "user_ctr", "item_id", "item_ctr", "genre", "ug_ctr")
    cards = [30 + 7 * j for j in range(len(FIELDS))]
    model = ColdPreRanker(CascadeNetConfig(embedding_dim=4, hidden=(16, 8)), fields, cards)
    request: torch.nn.Module = (RowwiseColdRequest if rowwise else ColdPreRankingRequest)(
        model.eval()
    ).eval()
    gm = export_program(request, cold_codes(model, cards, 32), cold_dynamic_shapes()).module()
    context = prepared(gm)
    remove_noops(gm, context)
    return request, gm, context


def cold_codes(
    model: ColdPreRanker, cards: list[int], n: int, seed: int = 0
) -> tuple[torch.Tensor, ...]:
    """A request's four inputs (:func:`cold_request_inputs`), the cross fields drawn from 5
    keys, so candidates share them."""
    generator = torch.Generator().manual_seed(seed)
    codes = (torch.rand(n, len(cards), generator=generator) * torch.tensor(cards)).long()
    codes[:, model.cross_index] = codes[torch.arange(n) % 5][:, model.cross_index]
    return cold_request_inputs(model, codes[:1].clone(), codes)


def test_shared_bilinear_collapses_and_field_lookups_fold_into_the_first_layer() -> None:
    request, gm, context = cold_request_graph()
    cards = [30 + 7 * j for j in range(len(FIELDS))]
    shared = share_broadcast_computation(gm, context)
    # The user x item dot products and their Linear became one per-request matrix.
    assert shared.details["collapse_bilinear"] == 1
    assert count(gm, aten.matmul.default) == 1  # [Fi, h, Fu] @ [Fu, d], once per request
    assert count(gm, aten.mm.default) == 1
    folded = fold_embedding_linear(gm, context)
    # The user, item and cross sides' lookups fold into their Linears (one table per side:
    # fields x rows of the side's table, by the first layer's width); the MLP's are left.
    model = request.model
    sides = [(model.user_embedding, 2), (model.item_embedding, 3), (model.cross_embedding, 1)]
    assert folded.details["folded_tables"] == [
        [fields * side.table.weight.shape[0], 16] for side, fields in sides
    ]
    assert count(gm, aten.linear.default) == 2
    # Each side's folded rows are fetched field by field and added pointwise (one fused
    # kernel, rows contiguous), not gathered to [N, F, h] and reduced over F.
    assert count(gm, aten.sum.dim_IntList) == 0
    folded_lookups = [
        node
        for node in gm.graph.nodes
        if node.target == aten.embedding.default and "folded_fields" in str(node.args[0])
    ]
    assert len(folded_lookups) == sum(fields for _, fields in sides)
    assert all(len(node.meta["val"].shape) == 2 for node in folded_lookups)
    gm.graph.lint()
    gm.recompile()
    for n in (1, 5, 300):
        inputs = cold_codes(request.model, cards, n, seed=n)
        torch.testing.assert_close(gm(*inputs), request(*inputs), rtol=1e-5, atol=1e-5)


def test_the_served_request_collapses_in_the_model_and_folds_user_and_cross_lookups() -> None:
    """:meth:`ColdPreRanker.score_request` collapses the interactions itself (one product of
    the item embeddings with the request's matrix, item Linear included): the pass finds no
    bilinear left; the user and cross sides' lookups fold, the item side's stay (they feed the
    per-request product), and the graph computes the request's logits."""
    request, gm, context = cold_request_graph(rowwise=False)
    model = request.model
    cards = [30 + 7 * j for j in range(len(FIELDS))]
    assert share_broadcast_computation(gm, context).details["collapse_bilinear"] == 0
    folded = fold_embedding_linear(gm, context)
    sides = [(model.user_embedding, 2), (model.cross_embedding, 1)]
    assert folded.details["folded_tables"] == [
        [fields * side.table.weight.shape[0], 16] for side, fields in sides
    ]
    assert count(gm, aten.linear.default) == 2  # the MLP's
    gm.graph.lint()
    gm.recompile()
    for n in (1, 5, 300):
        inputs = cold_codes(model, cards, n, seed=n)
        torch.testing.assert_close(gm(*inputs), request(*inputs), rtol=1e-5, atol=1e-5)
        rowwise = RowwiseColdRequest(model)(*inputs)
        torch.testing.assert_close(gm(*inputs), rowwise, rtol=1e-5, atol=1e-5)


def test_field_lookups_stay_when_the_folded_table_would_be_too_large(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from compilers.passes import embedding_folding

    _, gm, context = cold_request_graph()
    monkeypatch.setattr(embedding_folding, "FOLDED_TABLE_MAX_ELEMENTS", 100)
    assert fold_embedding_linear(gm, context).fired == 0
    assert count(gm, aten.linear.default) == 6  # user, item, cross, interaction, MLP x 2


def test_memory_bound_chains_rewrite_narrow_chain_and_head() -> None:
    request, gm, context = request_graph()
    fold_embedding_linear(gm, context)
    linears = count(gm, aten.linear.default)
    result = fuse_memory_bound_chains(gm, context)
    # The candidates' 7 dense features are transformed feature-major (the first layer has only
    # 8 outputs, too few to write it column by column); the 1-output head becomes multiply +
    # sum; both sides' NaN repairs become selects.
    assert result.details == {
        "narrow_linear_by_column": 0,
        "feature_major": 1,
        "linear_as_reduction": 1,
        "nan_to_num_as_selects": 2,
    }
    assert result.fired == 4
    assert count(gm, aten.nan_to_num.default) == 0
    assert count(gm, aten.linear.default) == linears - 1
    assert count(gm, aten.sum.dim_IntList) == 1
    (transposed,) = [
        n
        for n in gm.graph.nodes
        if n.target == aten.permute.default and n.args[0].target == "item_dense"
    ]
    assert tuple(transposed.meta["val"].shape)[0] == 7
    gm.graph.lint()
    gm.recompile()
    for n in (1, 16, 333):
        inputs = preranking_example(request.model.config, n, seed=n)
        # Missing and infinite features, on both sides, take the repaired values eager gives.
        inputs[0][0, 1] = float("nan")
        inputs[2][:: max(1, n // 5), 0] = float("nan")
        inputs[2][1::3, 2] = float("inf")
        inputs[2][2::3, 3] = float("-inf")
        torch.testing.assert_close(gm(*inputs), request(*inputs), rtol=1e-5, atol=1e-5)


def test_narrow_linear_by_column_folds_the_transform_and_stacks_its_branches() -> None:
    request, gm, context = request_graph(hidden=(32, 16))
    fold_embedding_linear(gm, context)
    linears = count(gm, aten.linear.default)
    result = fuse_memory_bound_chains(gm, context)
    # The candidates' 7 features feed 32 outputs: written out column by column, with the
    # standardization folded into the weights and log1p / plain picked per column.
    assert result.details["narrow_linear_by_column"] == 1
    assert result.details["feature_major"] == 0
    assert count(gm, aten.linear.default) == linears - 2  # that Linear and the head
    gm.graph.eliminate_dead_code()
    (stacked,) = [n for n in gm.graph.nodes if n.target == aten.cat.default]
    assert tuple(stacked.meta["val"].shape)[::2] == (2, 7)  # [branches, N, features]
    assert count(gm, aten.where.self) == 1  # the user side's; the candidates' is gone
    assert count(gm, aten.div.Tensor) == 1
    gm.recompile()
    for n in (1, 16, 333):
        inputs = preranking_example(request.model.config, n, seed=n)
        inputs[2][:: max(1, n // 5), 0] = float("nan")
        inputs[2][1::3, 2] = float("inf")
        inputs[2][2::3, 4] = -1.0  # a negative count: clamped before log1p
        torch.testing.assert_close(gm(*inputs), request(*inputs), rtol=1e-5, atol=1e-5)


def test_nan_to_num_as_selects_keeps_every_value() -> None:
    class Repair(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (
                torch.nan_to_num(x),
                torch.nan_to_num(x, nan=1.5),
                torch.nan_to_num(x, nan=0.0, posinf=7.0, neginf=-2.0),
            )

    x = torch.tensor([[float("nan"), float("inf"), -float("inf"), 3.0, -0.0, 1e38]])
    gm = torch.export.export(Repair(), (x,)).module()
    result = fuse_memory_bound_chains(gm, PassContext())
    assert result.details["nan_to_num_as_selects"] == 3
    assert count(gm, aten.nan_to_num.default) == 0
    gm.recompile()
    for got, want in zip(gm(x), Repair()(x), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def inductor_kernels(gm: torch.fx.GraphModule, inputs: tuple[torch.Tensor, ...]) -> int:
    """Kernels in Inductor's generated code: C++ loop kernels plus extern (GEMM) calls."""
    from torch._inductor.compile_fx import compile_fx

    gm = copy.deepcopy(gm)  # compile_fx rewrites the graph's output into a tuple
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    # A cache hit would skip code generation, leaving nothing to count.
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        _, (code, *_) = run_and_get_code(lambda: compile_fx(gm, list(inputs))(*inputs))
    return code.count("async_compile.cpp_pybinding(") + code.count("extern_kernels.")


@pytest.mark.slow
def test_memory_bound_chains_leave_inductor_fewer_kernels() -> None:
    request, gm, context = request_graph()
    fold_embedding_linear(gm, context)
    inputs = preranking_example(request.model.config, 64, seed=1)
    gm.recompile()
    before = inductor_kernels(gm, inputs)
    result = fuse_memory_bound_chains(gm, context)
    gm.recompile()
    after = inductor_kernels(gm, inputs)
    assert result.details["linear_as_reduction"] == 1
    # The head's extern GEMM and the ReLU kernel feeding it become one reduction kernel.
    assert after < before, (before, after)
    with torch.no_grad():
        torch.testing.assert_close(gm(*inputs), request(*inputs), rtol=1e-5, atol=1e-5)


def test_bf16_gemm_runs_wide_layers_in_bf16_and_keeps_the_rest() -> None:
    request, gm, context = request_graph(hidden=(32, 16))
    fuse_memory_bound_chains(gm, context)
    result = bf16_gemm(gm, context)
    # Only 32 -> 16 is wide on both sides. The user's part of the first layer (one static row)
    # stays fp32; the candidates' part (11 inputs) is written out column by column and the
    # head is a reduction, so neither is a Linear any more.
    assert result.details == {"bf16_layers": 1, "kept_fp32": 1}
    (wide,) = [
        n
        for n in gm.graph.nodes
        if n.target == aten.linear.default and n.args[0].meta["val"].dtype == torch.bfloat16
    ]
    assert [a.meta["val"].dtype for a in wide.args] == [torch.bfloat16] * 3
    (back,) = wide.users
    assert back.meta["val"].dtype == torch.float32
    gm.recompile()
    inputs = preranking_example(request.model.config, 300, seed=3)
    with torch.no_grad():
        expected = request(*inputs)
        got = gm(*inputs)
    assert got.dtype == torch.float32
    error = (got - expected).norm() / expected.norm()
    assert 0 < error < 0.02, f"bf16 relative error {error:.5f}"
    # A context that asks for wider layers than any keeps everything fp32.
    _, narrow, narrow_context = request_graph(hidden=(32, 16))
    narrow_context.bf16_min_features = 64
    assert bf16_gemm(narrow, narrow_context).fired == 0


def test_pipeline_enforces_order_and_reports() -> None:
    module, gm = conv_program()
    with pytest.raises(ValueError, match="unknown passes"):
        run_pipeline(gm, ["collect_shape_constraints", "constant_fold"])
    with pytest.raises(ValueError, match="out of order"):
        run_pipeline(gm, ["collect_shape_constraints", "fold_batch_norm", "remove_noops"])
    with pytest.raises(ValueError, match="must start with"):
        run_pipeline(gm, ["remove_noops"])
    report = run_pipeline(gm, DEFAULT_PASSES, PassContext(winograd="always"))
    assert [p.name for p in report.passes] == list(DEFAULT_PASSES)
    assert report.fired("fold_batch_norm") == 2 and report.fired("winograd_conv1d") == 1
    assert all(p.ms >= 0 for p in report.passes)
    assert set(report.to_dict()["passes"]) <= set(PASS_ORDER)
    x = torch.randn(3, 6, 19)
    torch.testing.assert_close(gm(x), module(x), rtol=1e-4, atol=1e-4)
