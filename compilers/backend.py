"""The ``cascade`` torch.compile backend: Cascade's passes, then Inductor, in process.

    python -c "import torch; from models.preranking.model import *; \
m = PreRanker(PreRankerConfig()).eval(); torch.compile(m, backend='cascade', dynamic=True)"

Registered through the ``torch_dynamo_backends`` entry point (``pyproject.toml``), so
``backend="cascade"`` works once the package is installed. Dynamo hands over a Torch-level graph
whose parameters are inputs; the backend freezes those (inference only), exports the graph to the
same ATen form the AOT path uses, runs :data:`compilers.pipeline.DEFAULT_PASSES` and compiles the
result with Inductor under Dynamo's own symbolic shapes, so one compile serves every size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx
from torch.export import Dim

from compilers.inductor_passes import UnfuseBiasAddmm
from compilers.pipeline import DEFAULT_PASSES, PassContext, PipelineReport, run_pipeline

LAST_REPORTS: list[PipelineReport] = []
"""Pipeline reports of the graphs compiled in this process, newest last (for benchmarks)."""


def _is_module_state(node: fx.Node, value: Any) -> bool:
    """Dynamo lifts parameters, buffers and module float attributes as graph inputs."""
    if isinstance(value, torch.nn.Parameter):
        return True
    name = str(node.target)
    return "_modules_" in name or "_parameters_" in name or "_buffers_" in name


def _freeze(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> tuple[list[int], dict[str, Any]]:
    """Turn module-state inputs into constants and SymInt inputs into ``sym_size`` reads.

    Returns the positions of the remaining (user) inputs and their dynamic dims.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    user_positions: list[int] = []
    sizes: dict[str, tuple[fx.Node, int]] = {}
    for position, (node, value) in enumerate(zip(placeholders, example_inputs, strict=True)):
        fake = node.meta.get("example_value")
        if isinstance(value, torch.Tensor) and not _is_module_state(node, value):
            user_positions.append(position)
            for dim, size in enumerate(getattr(fake, "shape", ())):
                if isinstance(size, torch.SymInt):
                    sizes.setdefault(str(size.node.expr), (node, dim))
    first_user = placeholders[user_positions[0]] if user_positions else None
    for position, (node, value) in enumerate(zip(placeholders, example_inputs, strict=True)):
        if position in user_positions:
            continue
        fake = node.meta.get("example_value")
        if isinstance(value, torch.Tensor):
            for user in list(node.users):
                if user.op == "call_method" and user.target == "item":
                    # Module float attributes (momentum, eps, p) are constants once frozen.
                    user.replace_all_uses_with(value.item())  # type: ignore[arg-type]
                    gm.graph.erase_node(user)
            name = f"_cascade_frozen_{position}"
            gm.register_buffer(name, value.detach())
            with gm.graph.inserting_before(first_user or node):
                constant = gm.graph.get_attr(name)
            node.replace_all_uses_with(constant)
        else:
            source = sizes.get(str(getattr(fake, "node", fake).expr)) if fake is not None else None
            if node.users and source is None:
                raise NotImplementedError(
                    f"cascade backend: size input {node.name} is not a dim of any tensor input; "
                    "use backend='inductor' for this graph"
                )
            if node.users and source is not None:
                with gm.graph.inserting_after(source[0]):
                    size = gm.graph.call_function(torch.ops.aten.sym_size.int, source)
                node.replace_all_uses_with(size)
        gm.graph.erase_node(node)
    gm.recompile()
    dynamic: dict[str, Any] = {}
    for position in user_positions:
        fake = placeholders[position].meta.get("example_value")
        dims = {
            dim: Dim.DYNAMIC
            for dim, size in enumerate(getattr(fake, "shape", ()))
            if isinstance(size, torch.SymInt)
        }
        dynamic[str(placeholders[position].target)] = dims or None
    return user_positions, dynamic


def cascade_backend(
    gm: fx.GraphModule, example_inputs: Sequence[Any], passes: Sequence[str] = DEFAULT_PASSES
) -> Callable[..., Any]:
    """``(gm, example_inputs) -> callable``: freeze, export to ATen, run passes, Inductor."""
    from torch._inductor.compile_fx import compile_fx

    if torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad
        for x in example_inputs
        if not isinstance(x, torch.nn.Parameter)
    ):
        raise NotImplementedError(
            "the cascade backend compiles inference graphs; call the model under "
            "torch.no_grad() or use backend='inductor' for training"
        )
    # Work on a copy: Dynamo still reads the original graph's inputs after we return.
    graph = fx.Graph()
    output = graph.graph_copy(gm.graph, {})
    graph.output(output)
    gm = fx.GraphModule(gm, graph)
    user_positions, dynamic = _freeze(gm, example_inputs)
    user_inputs = tuple(example_inputs[i] for i in user_positions)
    # Export in its own tracing context: Dynamo's fake tensors must not leak into it.
    with torch._guards.tracing(None), torch.no_grad():
        program = torch.export.export(
            gm, user_inputs, dynamic_shapes=tuple(dynamic.values()), strict=False
        )
        # A plain GraphModule: the unlifted one carries a pre-hook lambda that Inductor's FX
        # graph cache cannot pickle, which would disable that cache.
        unlifted = program.module()
        aten_gm = fx.GraphModule(unlifted, unlifted.graph)
        report = run_pipeline(aten_gm, passes, PassContext(example_inputs=user_inputs))
    LAST_REPORTS.append(report)
    # Back in Dynamo's context: Inductor fakifies the inputs with Dynamo's symbolic sizes.
    # The packages' Inductor-level pass too, unless the caller set a post-grad pass.
    options: dict[str, Any] = {}
    if torch._inductor.config.post_grad_custom_post_pass is None:
        options["post_grad_custom_post_pass"] = UnfuseBiasAddmm()
    with torch._inductor.config.patch(options):
        compiled = compile_fx(aten_gm, list(user_inputs))

    def run(*args: Any) -> Any:
        return compiled(*(args[i] for i in user_positions))

    return run
