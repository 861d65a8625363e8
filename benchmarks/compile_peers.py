"""The peers of ``cascade bench compile`` (:mod:`benchmarks.compiled_inference`), built like for
like: Inductor at its defaults and tuned (the fastest of :data:`TUNED_CANDIDATES`), ONNX Runtime
fp32 and its int8 forms (dynamic, and static QDQ calibrated per channel), PT2E int8 with the X86
Inductor quantizer, PyTorch's dynamic int8 ``nn.Linear``; a peer that does not build here is
named with its error (:func:`try_peer`)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from compilers.gate import Request
from compilers.preranking import (
    preranking_dynamic_shapes,
)
from compilers.timing import interleaved_ms

Requests = list[Request]


def onnxruntime_session(
    request: torch.nn.Module,
    example: tuple[torch.Tensor, ...],
    path: Path,
    *,
    dynamic_shapes: Any = None,
    input_names: Sequence[str] = ("user_dense", "user_id", "item_dense", "item_id"),
) -> Callable[..., np.ndarray]:
    """Export the request module to ONNX (dynamic candidate dim; by default the PreRanker's
    request, :func:`preranking_dynamic_shapes`) and open a session on this process's threads."""
    export_onnx(
        request,
        example,
        path,
        dynamic_shapes=preranking_dynamic_shapes() if dynamic_shapes is None else dynamic_shapes,
        input_names=input_names,
    )
    return onnxruntime_run(path)


# --- peers: the same request module under other compilers, fp32 and int8 --------------------

INDUCTOR_TUNED_OPTIONS: dict[str, Any] = {"freezing": True, "cpp_wrapper": True}
"""``inductor_tuned``: weights frozen into the graph (constant folding, prepacked GEMM weights)
and the C++ wrapper in place of the Python one (less per-call overhead)."""

MAX_AUTOTUNE_OPTIONS: dict[str, Any] = {"max_autotune": True}
"""What ``mode="max-autotune"`` sets for a CPU run (its other setting, CUDA graphs, is GPU-only;
``torch.compile`` takes a mode or options, not both). :func:`inductor_tuned_peer` tries it on top
of :data:`INDUCTOR_TUNED_OPTIONS` and keeps it only where it is faster."""

FP32_PEERS = (
    "eager_rows",
    "eager",
    "inductor",
    "inductor_tuned",
    "onnxruntime",
    "cascade_rowwise",
)
"""The fp32 baselines the fp32 package (``cascade``) is divided into: ``speedup_vs_{peer}``."""

STATIC_INT8_PEERS = ("inductor_pt2e_int8", "onnxruntime_static_int8")
"""The int8 peers at their best: static quantization calibrated on real requests, weights per
channel (PT2E with the X86 Inductor quantizer compiled by Inductor; ONNX Runtime QDQ)."""

INT8_PEERS = ("onnxruntime_int8", "eager_int8", *STATIC_INT8_PEERS)
"""The int8 baselines the int8 package (``cascade_int8``) is divided into:
``int8_speedup_vs_{peer}``."""

PEER_NAMES = (
    "inductor",
    "inductor_tuned",
    "cascade_backend",
    "onnxruntime",
    "onnxruntime_int8",
    "eager_int8",
    *STATIC_INT8_PEERS,
)
"""Every peer :func:`build_peers` builds."""

RECOMPILE_LIMIT = 64
"""Dynamo's per-function graph limit while a benchmark runs. Every ``torch.compile`` of one
request module shares its ``forward``'s cache; past the default limit (8) Dynamo would silently
run the later variants eagerly."""


@dataclass
class Peer:
    """One compiled variant: the callable, its build time, and what it compiled."""

    fn: Callable[..., Any]
    compile_s: float
    recompiles: dict[str, int] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    scope: Callable[[], AbstractContextManager[Any]] = nullcontext
    """What untimed calls on inputs the build never saw run under (a recompile may happen
    there): the Inductor settings the peer was built with, when they are global ones."""


def dynamo_graphs(compiled: Callable[..., Any], examples: Sequence[tuple[Any, ...]]) -> int:
    """Graphs Dynamo compiled while ``compiled`` ran every example (its counter, reset first)."""
    from torch._dynamo.utils import counters

    counters["stats"].clear()
    with torch.no_grad():
        for inputs in examples:
            compiled(*inputs)
    return int(counters["stats"]["unique_graphs"])


def inductor_peer(
    module: torch.nn.Module,
    example: tuple[Any, ...],
    shapes: Sequence[tuple[Any, ...]],
    *,
    options: dict[str, Any] | None = None,
    backend: str = "inductor",
) -> Peer:
    """``torch.compile(module, dynamic=True)`` with Inductor ``options``: ``compile_s`` is its
    first call on ``example``; ``recompiles`` counts Dynamo's graphs over that call and every
    input of ``shapes`` (``compiles`` 1 = one graph served them all)."""
    compiled = torch.compile(module, dynamic=True, backend=backend, options=options or None)
    start = time.perf_counter()
    graphs = dynamo_graphs(compiled, [example])
    compile_s = time.perf_counter() - start
    graphs += dynamo_graphs(compiled, shapes)
    recompiles = {"compiles": graphs, "recompiles": max(0, graphs - 1), "shapes": len(shapes)}
    return Peer(compiled, compile_s, recompiles, {"options": dict(options or {})})


TUNED_CANDIDATES: dict[str, dict[str, Any]] = {
    "default": {},
    "max-autotune-no-cudagraphs": {"max_autotune": True, "coordinate_descent_tuning": True},
    "freezing": {"freezing": True},
    "freezing+cpp_wrapper": INDUCTOR_TUNED_OPTIONS,
}
"""What "tuned Inductor" picks from, by name: Inductor's defaults, what
``mode="max-autotune-no-cudagraphs"`` sets (``torch._inductor.list_mode_options``), weights
frozen (``torch._inductor.config.freezing``), and frozen with the C++ wrapper. The fastest on
the trial inputs is kept, so the tuned peer is never slower than the default one there."""


def inductor_tuned_peer(
    module: torch.nn.Module,
    example: tuple[Any, ...],
    shapes: Sequence[tuple[Any, ...]],
    *,
    trial_inputs: tuple[Any, ...] | None = None,
    default: Peer | None = None,
    rounds: int = 3,
    repeats: int = 5,
) -> Peer:
    """Inductor with :data:`INDUCTOR_TUNED_OPTIONS`; with ``trial_inputs``, the best of every
    :data:`TUNED_CANDIDATES` (``default`` reused for Inductor's defaults when given), timed
    interleaved on ``trial_inputs``. ``info`` says which won (``chose``, its ``options``) and
    the trial's medians (``trial_ms``); ``compile_s`` and ``recompiles`` are the kept one's. A
    candidate that fails to compile is left out and named under ``failed``."""
    if trial_inputs is None:
        return inductor_peer(module, example, shapes, options=INDUCTOR_TUNED_OPTIONS)
    candidates: dict[str, Peer] = {}
    failed: dict[str, str] = {}
    for name, options in TUNED_CANDIDATES.items():
        if name == "default" and default is not None:
            candidates[name] = default
            continue
        try:
            candidates[name] = inductor_peer(module, example, shapes, options=options)
        except Exception as exc:  # recorded: a mode this CPU cannot build is no silent gap
            failed[name] = one_line_error(exc)
    if not candidates:
        raise RuntimeError(f"no tuned Inductor candidate compiled: {failed}")
    with torch.no_grad():
        trial = interleaved_ms(
            {name: functools.partial(peer.fn, *trial_inputs) for name, peer in candidates.items()},
            rounds=rounds,
            repeats=repeats,
        )
    best = min(trial, key=trial.__getitem__)
    kept = candidates[best]
    info = {
        "options": dict(TUNED_CANDIDATES[best]),
        "trial_ms": trial,
        "tried": {name: TUNED_CANDIDATES[name] for name in candidates},
        "chose": best,
        "failed": failed,
    }
    return Peer(kept.fn, kept.compile_s, kept.recompiles, info)


def one_line_error(exc: BaseException) -> str:
    """``Type: first line of the message`` (at most 300 characters), for a JSON field."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def export_onnx(
    module: torch.nn.Module,
    example: tuple[torch.Tensor, ...],
    path: Path,
    *,
    dynamic_shapes: Any,
    input_names: Sequence[str],
) -> Path:
    """``module`` exported to ONNX (``torch.onnx.export``, dynamo) at ``path``."""
    torch.onnx.export(
        module,
        example,
        str(path),
        dynamic_shapes=dynamic_shapes,
        input_names=list(input_names),
        dynamo=True,
    )
    return path


def onnxruntime_run(path: Path, *, threads: int | None = None) -> Callable[..., np.ndarray]:
    """A session over the ONNX file on ONNX Runtime's CPU provider (``threads`` intra-op threads,
    by default this process's torch threads); the callable takes the inputs positionally."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or torch.get_num_threads()
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def run(*inputs: torch.Tensor) -> np.ndarray:
        feed = {n: x.contiguous().numpy() for n, x in zip(names, inputs, strict=True)}
        return session.run(None, feed)[0]

    return run


ONNXRUNTIME_INT8 = {
    "quantizer": "onnxruntime.quantization.quantize_dynamic",
    "weight_type": "QInt8",
    "activations": "uint8, ranges computed per call",
    "per_channel": False,
}
"""How ``onnxruntime_int8`` is made: ONNX Runtime's own dynamic quantizer, its defaults, except
``reduce_range`` (:func:`ort_reduce_range`)."""


def ort_reduce_range() -> bool:
    """Whether ONNX Runtime's quantizer should keep weights to 7 bits here: on x86 CPUs without
    VNNI its uint8 x int8 kernels add pairs of products in 16 bits, which saturate on full-range
    weights (ONNX Runtime's quantization guide). Measured on an AVX2 CPU with the tiny test
    module: max |error| 0.20 on logits of up to 0.56 with full-range weights, 0.008 reduced."""
    flags = cpu_flags()
    return bool(flags) and not any("vnni" in flag for flag in flags)


def cpu_flags() -> set[str]:
    """The CPU's feature flags (``/proc/cpuinfo``; empty where it cannot be read)."""
    import contextlib

    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def onnxruntime_int8_file(fp32: Path, out: Path) -> dict[str, Any]:
    """The fp32 ONNX file quantized by ONNX Runtime's dynamic quantizer (int8 weights, dynamic
    uint8 activations) into ``out``; returns :data:`ONNXRUNTIME_INT8`, ``reduce_range`` and the
    integer nodes it made (``int8_nodes``, e.g. MatMulInteger: none means nothing ran in int8)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    reduce_range = ort_reduce_range()
    quantize_dynamic(
        str(fp32),
        str(out),
        weight_type=QuantType.QInt8,
        per_channel=False,
        reduce_range=reduce_range,
    )
    ops = [node.op_type for node in onnx.load(str(out)).graph.node]
    integer = sorted({op for op in ops if "Integer" in op})
    return {
        **ONNXRUNTIME_INT8,
        "reduce_range": reduce_range,
        "int8_nodes": sum(op in integer for op in ops),
        "int8_ops": integer,
    }


ONNXRUNTIME_STATIC_INT8 = {
    "quantizer": "onnxruntime.quantization.quantize_static",
    "format": "QDQ",
    "calibration": "MinMax over the calibration requests (a CalibrationDataReader)",
    "weight_type": "QInt8",
    "activation_type": "QUInt8",
    "per_channel": True,
}
"""How ``onnxruntime_static_int8`` is made: ONNX Runtime's static quantizer at its best for a
CPU, QDQ format, weights per channel, activation ranges calibrated once on real requests
(not per call), then the QDQ pairs fused into integer kernels by the session's optimizer."""


def onnxruntime_static_int8_file(
    fp32: Path, out: Path, calibration: Sequence[tuple[torch.Tensor, ...]]
) -> dict[str, Any]:
    """The fp32 ONNX file statically quantized (:data:`ONNXRUNTIME_STATIC_INT8`) into ``out``,
    its activation ranges calibrated on ``calibration`` (inputs in the file's order); returns the
    settings, ``reduce_range`` and the quantized nodes it made (``int8_nodes``: QuantizeLinear
    and DequantizeLinear pairs; none means nothing would run in int8)."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    if not calibration:
        raise ValueError("static int8 needs calibration requests; pass calibration_inputs")
    names = [i.name for i in onnx.load(str(fp32)).graph.input]

    class Requests(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter(
                [
                    {n: x.contiguous().numpy() for n, x in zip(names, inputs, strict=True)}
                    for inputs in calibration
                ]
            )

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    prepared = out.with_suffix(".pre.onnx")
    try:
        quant_pre_process(str(fp32), str(prepared), skip_symbolic_shape=True)
    except Exception:  # pre-processing only helps: quantize the export as it is
        prepared = fp32
    reduce_range = ort_reduce_range()
    quantize_static(
        str(prepared),
        str(out),
        Requests(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        weight_type=QuantType.QInt8,
        activation_type=QuantType.QUInt8,
        reduce_range=reduce_range,
    )
    ops = [node.op_type for node in onnx.load(str(out)).graph.node]
    return {
        **ONNXRUNTIME_STATIC_INT8,
        "reduce_range": reduce_range,
        "calibration_requests": len(calibration),
        "int8_nodes": sum(op in ("QuantizeLinear", "DequantizeLinear") for op in ops),
    }


PT2E_INT8 = {
    "quantizer": "torchao PT2E X86InductorQuantizer (static, per-channel weights)",
    "calibration": "the calibration requests through the prepared graph",
    "compiler": "torch.compile (Inductor, freezing: the quantized patterns lowered to int8 ops)",
}
"""How ``inductor_pt2e_int8`` is made: PyTorch's own static int8 path for x86, at its best."""


def pt2e_int8_peer(
    module: torch.nn.Module,
    example: tuple[torch.Tensor, ...],
    shapes: Sequence[tuple[Any, ...]],
    *,
    dynamic_shapes: Any,
    calibration: Sequence[tuple[torch.Tensor, ...]],
) -> Peer:
    """``module`` exported, quantized by PT2E with the X86 Inductor quantizer (static, weights per
    channel), calibrated on ``calibration`` and compiled by Inductor with freezing. PT2E left
    ``torch.ao`` for torchao: without torchao this raises ImportError saying so."""
    try:
        # Registers the x86 int8 patterns Inductor's freezing lowers the quantized graph with.
        import torchao.quantization.pt2e.inductor_passes.x86  # noqa: F401
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
            X86InductorQuantizer,
            get_default_x86_inductor_quantization_config,
        )
    except ImportError as exc:
        raise ImportError(
            f"PT2E static quantization needs torchao ({exc}); torch "
            f"{torch.__version__} no longer ships torch.ao.quantization.quantize_pt2e: "
            "pip install torchao"
        ) from exc
    if not calibration:
        raise ValueError("static int8 needs calibration requests; pass calibration_inputs")
    start = time.perf_counter()
    exported = torch.export.export(module.eval(), example, dynamic_shapes=dynamic_shapes)
    quantizer = X86InductorQuantizer()
    quantizer.set_global(get_default_x86_inductor_quantization_config(is_dynamic=False))
    prepared = prepare_pt2e(exported.module(), quantizer)
    with torch.no_grad():
        for inputs in calibration:
            prepared(*inputs)
    converted = convert_pt2e(prepared)
    # Freezing set globally, not only as an option: the int8 weight prepacking is folded into a
    # constant only then (as an option alone, Inductor met the prepack op and refused it).
    with torch._inductor.config.patch(freezing=True):
        peer = inductor_peer(converted, example, shapes, options={"freezing": True})
    ops = [str(n.target) for n in converted.graph.nodes if n.op == "call_function"]
    info = {
        **PT2E_INT8,
        "calibration_requests": len(calibration),
        "int8_nodes": sum("quantize_per" in op for op in ops),
    }
    return Peer(
        peer.fn,
        time.perf_counter() - start,
        peer.recompiles,
        info,
        scope=lambda: torch._inductor.config.patch(freezing=True),
    )


def eager_int8(module: torch.nn.Module) -> tuple[torch.nn.Module, dict[str, Any]]:
    """A copy of ``module`` with every ``nn.Linear`` replaced by PyTorch's dynamically quantized
    one (``torch.ao.quantization.quantize_dynamic``: int8 weights, activations quantized per
    call); returns it and how many layers it converted (``int8_layers``)."""
    import copy
    import warnings

    with warnings.catch_warnings():
        # Deprecated in favour of torchao, which this project does not install; still shipped.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        quantized = torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(module).eval(), {torch.nn.Linear}, dtype=torch.qint8
        )
    dynamic_linear = torch.ao.nn.quantized.dynamic.Linear
    layers = sum(isinstance(m, dynamic_linear) for m in quantized.modules())
    info = {
        "quantizer": "torch.ao.quantization.quantize_dynamic",
        "modules": ["Linear"],
        "int8_layers": layers,
    }
    return quantized, info


def build_peers(
    module: torch.nn.Module,
    example: tuple[torch.Tensor, ...],
    work: Path,
    *,
    names: Sequence[str],
    shapes: Sequence[tuple[Any, ...]],
    dynamic_shapes: Any,
    input_names: Sequence[str],
    trial_inputs: tuple[Any, ...] | None = None,
    onnx_file: Path | None = None,
    calibration_inputs: Sequence[tuple[torch.Tensor, ...]] = (),
    failed: dict[str, str] | None = None,
) -> dict[str, Peer]:
    """The peers of ``names`` (``inductor``, ``inductor_tuned``, ``cascade_backend``,
    ``onnxruntime``, ``onnxruntime_int8``, ``eager_int8``) of the request ``module``.

    Inductor's run every input of ``shapes`` (their Dynamo graphs counted); ``inductor_tuned``
    tries max-autotune on ``trial_inputs`` when given (:func:`inductor_tuned_peer`); the ONNX
    Runtime pair shares one export (``onnx_file`` when given, else one made under ``work``),
    int8 being ONNX Runtime's own quantization of that file (dynamic, or static QDQ calibrated
    on ``calibration_inputs``). The static int8 peers (:data:`STATIC_INT8_PEERS`) that fail to
    build here (a missing package, a CPU without the kernels) are left out and their error
    recorded in ``failed`` when given, else raised."""
    peers: dict[str, Peer] = {}
    known = set(PEER_NAMES)
    unknown = sorted(set(names) - known)
    if unknown:
        raise ValueError(f"unknown peers {unknown}; known: {sorted(known)}")
    module = module.eval()
    if "inductor" in names:
        peers["inductor"] = inductor_peer(module, example, shapes)
    if "inductor_tuned" in names:
        peers["inductor_tuned"] = inductor_tuned_peer(
            module, example, shapes, trial_inputs=trial_inputs, default=peers.get("inductor")
        )
    if "cascade_backend" in names:
        peers["cascade_backend"] = inductor_peer(module, example, shapes, backend="cascade")
    if {"onnxruntime", "onnxruntime_int8", "onnxruntime_static_int8"} & set(names):
        start = time.perf_counter()
        if onnx_file is None:
            onnx_file = export_onnx(
                module,
                example,
                work / "peer.onnx",
                dynamic_shapes=dynamic_shapes,
                input_names=input_names,
            )
        export_s = time.perf_counter() - start
        if "onnxruntime" in names:
            peers["onnxruntime"] = Peer(onnxruntime_run(onnx_file), export_s)
        if "onnxruntime_int8" in names:
            start = time.perf_counter()
            info = onnxruntime_int8_file(onnx_file, onnx_file.with_suffix(".int8.onnx"))
            run = onnxruntime_run(onnx_file.with_suffix(".int8.onnx"))
            peers["onnxruntime_int8"] = Peer(
                run, export_s + time.perf_counter() - start, None, info
            )
        if "onnxruntime_static_int8" in names:

            def static_onnx() -> Peer:
                assert onnx_file is not None
                started = time.perf_counter()
                target = onnx_file.with_suffix(".static-int8.onnx")
                info = onnxruntime_static_int8_file(onnx_file, target, calibration_inputs)
                run = onnxruntime_run(target)
                return Peer(run, export_s + time.perf_counter() - started, None, info)

            built = try_peer("onnxruntime_static_int8", static_onnx, failed)
            if built is not None:
                peers["onnxruntime_static_int8"] = built
    if "eager_int8" in names:
        start = time.perf_counter()
        quantized, info = eager_int8(module)
        peers["eager_int8"] = Peer(quantized, time.perf_counter() - start, None, info)
    if "inductor_pt2e_int8" in names:
        built = try_peer(
            "inductor_pt2e_int8",
            lambda: pt2e_int8_peer(
                module,
                example,
                shapes,
                dynamic_shapes=dynamic_shapes,
                calibration=calibration_inputs,
            ),
            failed,
        )
        if built is not None:
            peers["inductor_pt2e_int8"] = built
    return peers


def try_peer(name: str, build: Callable[[], Peer], failed: dict[str, str] | None) -> Peer | None:
    """``build()``, or None with the reason under ``failed[name]`` (raised without ``failed``)."""
    try:
        return build()
    except Exception as exc:
        if failed is None:
            raise
        failed[name] = one_line_error(exc)
        print(f"[bench compile] peer {name} did not build: {failed[name]}", flush=True)
        return None
