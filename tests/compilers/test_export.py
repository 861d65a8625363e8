"""AOTInductor artifact: one package serves every candidate count, without the model's code."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest
import torch

from cascade.compiled_packages import load_package
from compilers.preranking import PreRankingRequest, compile_preranking, preranking_example
from models.preranking.model import PreRanker, PreRankerConfig

# Runs in a fresh interpreter that never imports the model package: the artifact must carry
# everything it needs.
LOAD_AND_RUN = """
import sys, torch
inputs = torch.load(sys.argv[2])
package = torch._inductor.aoti_load_package(sys.argv[1])
outputs = [package(*request) for request in inputs]
assert not any(name.startswith(("models", "compilers")) for name in sys.modules), "model code"
torch.save(outputs, sys.argv[3])
"""


@pytest.mark.slow
def test_artifact_runs_without_model_code_for_any_candidate_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    model = PreRanker(PreRankerConfig(id_buckets=32, embedding_dim=4, hidden=(8,))).eval()
    model.fit_normalizer(torch.rand(64, model.config.num_dense) * 30)
    cache = tmp_path / "cache"
    artifact = compile_preranking(model, tmp_path / "a.pt2", cache_dir=cache, fast_build=True)
    assert artifact.path.stat().st_size > 0 and artifact.report["cached"] is False
    assert artifact.report["passes"]["share_broadcast_computation"]["fired"] > 0
    # The hidden Linear's bias add went into the ReLU kernel after it, not an addmm's copy.
    assert artifact.report["inductor_passes"]["unfuse_bias_addmm"] >= 1

    requests = [preranking_example(model.config, n, seed=n) for n in (1, 2, 7, 64, 1000)]
    torch.save(requests, tmp_path / "inputs.pt")
    subprocess.run(
        [
            sys.executable,
            "-c",
            LOAD_AND_RUN,
            str(artifact.path),
            str(tmp_path / "inputs.pt"),
            str(tmp_path / "outputs.pt"),
        ],
        check=True,
        cwd=tmp_path,  # not the repo root, so `models` is not importable by accident
    )
    outputs = torch.load(tmp_path / "outputs.pt")
    request = PreRankingRequest(model)
    with torch.no_grad():
        for inputs, got in zip(requests, outputs, strict=True):
            torch.testing.assert_close(got, request(*inputs), rtol=1e-5, atol=1e-5)

    # A column slice of a Fortran-ordered frame: the kernels assume contiguous strides, so
    # load_package must fix the layout (this gave wrong scores before it did).
    user_dense, user_id, item_dense, item_id = preranking_example(model.config, 9, seed=5)
    strided = torch.cat([item_dense, item_dense], dim=1).t().contiguous().t()[:, :7]
    assert not strided.is_contiguous()
    # AOTInductor extracts the package under TMPDIR on every load; nothing of it stays there
    # (a swapping server left ~3 MB a load in /tmp), and the loaded kernels still run.
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    loaded = load_package(artifact.path)
    assert list(tmpdir.iterdir()) == [] and os.environ["TMPDIR"] == str(tmpdir)
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(user_dense, user_id, strided, item_id),
            request(user_dense, user_id, strided, item_id),
            rtol=1e-5,
            atol=1e-5,
        )

    with pytest.raises(TypeError, match="takes 4 tensors, got 2"):
        loaded(user_dense, user_id)

    start = time.perf_counter()
    again = compile_preranking(model, tmp_path / "b.pt2", cache_dir=cache, fast_build=True)
    assert again.report["cached"] is True and time.perf_counter() - start < 30
    assert again.path.read_bytes() == artifact.path.read_bytes()

    # Other pass code (the compilers' source changed): the cached package is not reused.
    def rebuilt(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("rebuilt")

    with (
        mock.patch("compilers.export.compiler_source_digest", return_value="other code"),
        mock.patch("compilers.export.compile_graph", rebuilt),
        pytest.raises(RuntimeError, match="rebuilt"),
    ):
        compile_preranking(model, tmp_path / "c.pt2", cache_dir=cache, fast_build=True)
    # Other model code (its request path changed, the weights did not): not reused either.
    with (
        mock.patch("compilers.export.module_source_digest", return_value="other model code"),
        mock.patch("compilers.export.compile_graph", rebuilt),
        pytest.raises(RuntimeError, match="rebuilt"),
    ):
        compile_preranking(model, tmp_path / "d.pt2", cache_dir=cache, fast_build=True)


@pytest.mark.slow
def test_int8_artifact_runs_rsq_layers_as_int8_gemms(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = PreRanker(PreRankerConfig(id_buckets=32, embedding_dim=4, hidden=(32, 16))).eval()
    model.fit_normalizer(torch.rand(64, model.config.num_dense) * 30)
    calibration = [preranking_example(model.config, 100, seed=s) for s in range(4)]
    artifact = compile_preranking(
        model, tmp_path / "int8.pt2", fast_build=True, int8_calibration=calibration
    )
    assert artifact.report["passes"]["rsq_quantize"]["fired"] == 1  # the 32 -> 16 layer
    assert artifact.report["inductor_config"] == {"freezing": True}
    loaded = load_package(artifact.path)
    request = PreRankingRequest(model)
    with torch.no_grad():
        for n in (1, 9, 500):
            inputs = preranking_example(model.config, n, seed=100 + n)
            expected = request(*inputs)
            got = loaded(*inputs)
            assert got.shape == expected.shape
            assert (got - expected).abs().max() < 0.05 * expected.abs().max()


def test_compiler_source_digest_covers_the_pass_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import compilers.export

    (tmp_path / "passes").mkdir()
    (tmp_path / "export.py").write_text("# export\n")
    (tmp_path / "passes" / "noop_removal.py").write_text("# one pass\n")
    monkeypatch.setattr(compilers.export, "__file__", str(tmp_path / "export.py"))
    digest = compilers.export.compiler_source_digest.__wrapped__
    before = digest()
    (tmp_path / "passes" / "noop_removal.py").write_text("# the pass, edited\n")
    assert digest() != before


def test_module_source_digest_covers_the_classes_of_the_module_and_its_submodules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from compilers.export import module_source_digest

    source = tmp_path / "a_request_path.py"
    source.write_text(
        "import torch\n"
        "class Inner(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x + 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import a_request_path

    outer = torch.nn.Sequential(a_request_path.Inner())
    before = module_source_digest(outer)
    assert before == module_source_digest(torch.nn.Sequential(a_request_path.Inner()))
    source.write_text(source.read_text().replace("x + 1", "x * 2"))
    assert module_source_digest(outer) != before
