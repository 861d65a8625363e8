"""The ``cascade`` torch.compile backend: registered by name, one compile for every size."""

from __future__ import annotations

import pytest
import torch

from compilers import backend
from compilers.preranking import PreRankingRequest, preranking_example
from models.preranking.model import PreRanker, PreRankerConfig


def test_backend_is_registered_through_the_entry_point() -> None:
    from torch._dynamo.backends.registry import lookup_backend

    assert "cascade" in torch._dynamo.list_backends()
    assert lookup_backend("cascade") is backend.cascade_backend


@pytest.mark.slow
def test_backend_applies_passes_and_compiles_once() -> None:
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = PreRanker(PreRankerConfig(id_buckets=32, embedding_dim=4, hidden=(8,))).eval()
    model.fit_normalizer(torch.rand(64, model.config.num_dense) * 30)
    request = PreRankingRequest(model).eval()
    torch._dynamo.reset()
    counters.clear()
    reports = len(backend.LAST_REPORTS)
    compiled = torch.compile(request, backend="cascade", dynamic=True)
    with torch.no_grad():
        for n in (3, 4, 17, 256, 1000):
            inputs = preranking_example(model.config, n, seed=n)
            torch.testing.assert_close(compiled(*inputs), request(*inputs), rtol=1e-5, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1
    report = backend.LAST_REPORTS[-1]
    assert len(backend.LAST_REPORTS) > reports
    assert report.fired("share_broadcast_computation") > 0
