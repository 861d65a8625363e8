"""Export with dynamic dims -> pass pipeline -> AOTInductor ``.pt2`` package, for any module.

:func:`compile_graph` exports a module with its dynamic dims, runs the pass pipeline
(``compilers.pipeline``) and re-exports the result; :func:`package_artifact` packages it with
AOTInductor. Packages are cached by a digest of the weights, the passes and this package's
source, the build settings (Inductor options, thread count) and the torch version, because
AOTInductor compiles C++ with gcc and that takes minutes on 2 cores. The models' request
modules and their compile functions are beside it (``compilers.preranking``, ``compilers.asr``);
a package loads with :func:`cascade.compiled_packages.load_package` without importing the model.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import io
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.export import ExportedProgram

from compilers.inductor_passes import UnfuseBiasAddmm
from compilers.passes.rsq_quantization import exact_int8_gemm
from compilers.pipeline import DEFAULT_PASSES, PassContext, PipelineReport, run_pipeline


def export_program(
    module: nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    dynamic_shapes: Sequence[dict[int, Any] | None],
) -> ExportedProgram:
    """``torch.export`` in eval mode; errors name the dim whose constraint failed."""
    if not isinstance(module, torch.fx.GraphModule):
        module.eval()  # an exported GraphModule refuses eval(); it has no train-mode branches
    with torch.no_grad():
        return torch.export.export(module, example_inputs, dynamic_shapes=tuple(dynamic_shapes))


@dataclass(kw_only=True)
class CompiledGraph:
    """The outcome of export + passes, before packaging."""

    graph_module: torch.fx.GraphModule
    """The transformed graph, runnable by PyTorch as it stands."""
    program: ExportedProgram | None
    """Re-exported program of the transformed graph (what AOTInductor packages); None when
    ``compile_graph(reexport=False)``."""
    report: PipelineReport
    """Per-pass report: fired counts and times."""
    export_s: float
    """Seconds spent in the two exports."""


def compile_graph(
    module: nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    dynamic_shapes: Sequence[dict[int, Any] | None],
    *,
    passes: Sequence[str] = DEFAULT_PASSES,
    context: PassContext | None = None,
    reexport: bool = True,
) -> CompiledGraph:
    """Export, run ``passes`` over the graph, re-export the result with the same dims.

    Re-exporting (rather than patching the program's graph in place) lets torch.export
    recompute shape metadata and the graph signature for the nodes the passes created.
    """
    start = time.perf_counter()
    program = export_program(module, example_inputs, dynamic_shapes)
    export_s = time.perf_counter() - start
    gm = program.module()
    context = context or PassContext()
    if context.example_inputs is None:
        context.example_inputs = example_inputs
    report = run_pipeline(gm, passes, context)
    if not reexport:
        return CompiledGraph(graph_module=gm, program=None, report=report, export_s=export_s)
    start = time.perf_counter()
    program = export_program(gm, example_inputs, dynamic_shapes)
    export_s += time.perf_counter() - start
    return CompiledGraph(graph_module=gm, program=program, report=report, export_s=export_s)


@dataclass(kw_only=True)
class Artifact:
    """A packaged model and how it was made."""

    path: Path
    """The ``.pt2`` AOTInductor package."""
    report: dict[str, Any] = field(default_factory=dict)
    """Pipeline report plus ``export_s``, ``package_s`` and ``cached``."""


def artifact_digest(module: nn.Module, passes: Sequence[str], extra: str = "") -> str:
    """Cache key: weights, buffers, pass list, graph-shaping extras and the torch version."""
    digest = hashlib.sha256()
    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in module.state_dict().items()}, buffer)
    digest.update(buffer.getvalue())
    digest.update(
        json.dumps([list(passes), extra, torch.__version__, type(module).__name__]).encode()
    )
    return digest.hexdigest()[:20]


def _calibration_key(context: PassContext | None) -> str:
    """Digest of the calibration batches and quantization knobs (they shape an int8 graph, and
    so does whether this CPU's int8 GEMM is exact)."""
    if context is None:
        return ""
    digest = hashlib.sha256()
    for batch in context.calibration_inputs or []:
        for tensor in batch:
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    knobs = (context.rsq_bits, context.rsq_min_features, context.winograd, exact_int8_gemm())
    digest.update(repr(knobs).encode())
    return digest.hexdigest()[:16]


@functools.cache
def compiler_source_digest() -> str:
    """Digest of this package's source (the passes, the export and packaging code): a cached
    package built by other pass code is stale even when weights and pass names match."""
    digest = hashlib.sha256()
    root = Path(__file__).parent
    for path in sorted(root.rglob("*.py")):  # the pass modules are in compilers/passes/
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def module_source_digest(module: nn.Module) -> str:
    """Digest of the source files defining ``module``'s classes and its submodules' (their
    forward code, e.g. a model's request path, shapes the exported graph as much as its
    weights do): a cached package of an older request path is stale."""
    digest = hashlib.sha256()
    files = set()
    for sub in module.modules():
        try:
            files.add(inspect.getsourcefile(type(sub)))
        except TypeError:  # a builtin class: no source file
            continue
    for name in sorted(f for f in files if f):
        digest.update(name.encode())
        digest.update(Path(name).read_bytes())
    return digest.hexdigest()[:16]


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """PyTorch's intra-op thread count set to ``threads`` inside the block, restored after.

    Packages bake the count they were built under into their kernels, and timings depend on
    it: build, gate and time a package under the count it will be served with."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def package_artifact(
    module: nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    dynamic_shapes: Sequence[dict[int, Any] | None],
    out: Path,
    *,
    passes: Sequence[str] = DEFAULT_PASSES,
    context: PassContext | None = None,
    cache_dir: Path | None = None,
    fast_build: bool = False,
    inductor_config: dict[str, Any] | None = None,
) -> Artifact:
    """Compile ``module`` into an AOTInductor package at ``out`` (reused from ``cache_dir``).

    A cached package is keyed by :func:`artifact_digest` over everything that shapes the
    generated code: weights, passes and their source (:func:`compiler_source_digest`), the
    module's own source (:func:`module_source_digest`), example
    shapes, ``inductor_config``, the calibration settings and the thread count. The thread count
    matters because Inductor bakes it into the C++ kernels: compiled under one thread they have
    no parallel loops at all, compiled under a count other than the machine's cores they pin
    ``num_threads(n)``; a package built under other settings than it is served with is slower,
    never wrong. Its report is stored beside it. ``fast_build`` builds the C++ wrapper at
    ``-O0`` (kernels stay optimized): for tests, where gcc time matters more than the wrapper's
    per-call overhead. ``inductor_config`` patches ``torch._inductor.config`` for the build
    (e.g. ``{"freezing": True}``).
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = {
        "compilers": compiler_source_digest(),
        "module_source": module_source_digest(module),
        "shapes": [tuple(x.shape) for x in example_inputs],
        "inductor": sorted((inductor_config or {}).items()),
        "threads": torch.get_num_threads(),
        "fast_build": fast_build,
        "calibration": _calibration_key(context),
    }
    key = artifact_digest(module, passes, repr(settings))
    cached = None if cache_dir is None else Path(cache_dir) / f"{key}.pt2"
    if cached is not None and cached.exists() and cached.with_suffix(".json").exists():
        out.write_bytes(cached.read_bytes())
        report = json.loads(cached.with_suffix(".json").read_text())
        report["cached"] = True
        return Artifact(path=out, report=report)

    compiled = compile_graph(module, example_inputs, dynamic_shapes, passes=passes, context=context)
    assert compiled.program is not None
    start = time.perf_counter()
    level = "O0" if fast_build else torch._inductor.config.aot_inductor.compile_wrapper_opt_level
    unfuse = UnfuseBiasAddmm()
    options = {
        "post_grad_custom_post_pass": unfuse,
        # Inductor's own FX graph cache would skip the post-grad passes (and their count);
        # this function's package cache already keys on everything that shapes the code.
        "fx_graph_cache": False,
        **(inductor_config or {}),
        "aot_inductor.compile_wrapper_opt_level": level,
    }
    # Inductor applies freezing (and with it the int8 weight prepacking) only to graphs
    # compiled without autograd; an inference artifact never needs it.
    with torch._inductor.config.patch(options), torch.no_grad():
        torch._inductor.aoti_compile_and_package(compiled.program, package_path=str(out))
    report = {
        **compiled.report.to_dict(),
        "export_s": compiled.export_s,
        "package_s": time.perf_counter() - start,
        "threads": settings["threads"],
        "inductor_config": dict(inductor_config or {}),
        "inductor_passes": (
            {unfuse.name: unfuse.fired} if options["post_grad_custom_post_pass"] is unfuse else {}
        ),
        "cached": False,
    }
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_bytes(out.read_bytes())
        cached.with_suffix(".json").write_text(json.dumps(report, indent=2))
    return Artifact(path=out, report=report)


BF16_PASSES: tuple[str, ...] = (*DEFAULT_PASSES, "bf16_gemm")
"""The exact passes plus ``bf16_gemm``: the mixed-precision build of a package, which the
accuracy gate must pass like the int8 one."""

INT8_INDUCTOR_CONFIG: dict[str, Any] = {"freezing": True}
"""Freezing lets Inductor prepack the RSQ weights into oneDNN's int8 Linear; the fp32 artifact
does without it (a frozen fp32 Linear was slower here than the plain GEMM)."""
