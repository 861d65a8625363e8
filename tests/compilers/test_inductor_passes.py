"""The Inductor-level pass: addmm's bias add goes back into the elementwise kernel after it."""

from __future__ import annotations

import torch

from compilers.inductor_passes import UnfuseBiasAddmm


def _compiled(module: torch.nn.Module, unfuse: UnfuseBiasAddmm) -> torch.nn.Module:
    torch._dynamo.reset()
    # Without Inductor's FX graph cache: a cached graph skips the post-grad passes.
    options = {"fx_graph_cache": False, "post_grad_custom_post_pass": unfuse}
    return torch.compile(module, dynamic=True, options=options)


def test_bias_adds_before_elementwise_users_are_unfused_and_values_kept() -> None:
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(12, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32), torch.nn.ReLU()
    ).eval()
    unfuse = UnfuseBiasAddmm()
    compiled = _compiled(mlp, unfuse)
    with torch.no_grad():
        for n in (3, 50, 1000):
            x = torch.randn(n, 12)
            torch.testing.assert_close(compiled(x), mlp(x), rtol=1e-5, atol=1e-5)
    assert unfuse.fired == 2  # both Linears feed a ReLU


def test_an_addmm_feeding_a_gemm_or_the_output_is_left_alone() -> None:
    torch.manual_seed(0)
    # Linear -> Linear: the first one's output goes straight into the next GEMM; the second is
    # the output. Neither has an elementwise kernel to take the add.
    stack = torch.nn.Sequential(torch.nn.Linear(12, 64), torch.nn.Linear(64, 8)).eval()
    unfuse = UnfuseBiasAddmm()
    compiled = _compiled(stack, unfuse)
    with torch.no_grad():
        x = torch.randn(40, 12)
        torch.testing.assert_close(compiled(x), stack(x), rtol=1e-5, atol=1e-5)
    assert unfuse.fired == 0


def test_cache_identity_is_stable() -> None:
    assert repr(UnfuseBiasAddmm()) == repr(UnfuseBiasAddmm()) == "UnfuseBiasAddmm()"
    assert UnfuseBiasAddmm().uuid() == UnfuseBiasAddmm().uuid()
