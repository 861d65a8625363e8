"""Loads compiled model packages (AOTInductor ``.pt2``): what serving, the compile gates and the
benchmarks run. The package is built by :mod:`compilers.export`; loading it needs no model
code, so the servers import this, not the compilers."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

_TMPDIR_LOCK = threading.Lock()


@contextmanager
def _scratch_tmpdir() -> Iterator[Path]:
    """``TMPDIR`` pointed at a fresh folder, removed on exit. AOTInductor extracts a package
    (its kernels' ``.so`` and sources, ~3 MB) into a new ``aotinductor_*`` folder under
    ``TMPDIR`` on every load and never removes it, so a server that swaps models, and every
    compile gate, left one behind for good. The loaded kernels stay mapped in the process once
    their file is gone."""
    scratch = Path(tempfile.mkdtemp(prefix="cascade-pt2-"))
    try:
        with _TMPDIR_LOCK:
            before = os.environ.get("TMPDIR")
            os.environ["TMPDIR"] = str(scratch)
            try:
                yield scratch
            finally:
                if before is None:
                    os.environ.pop("TMPDIR", None)
                else:
                    os.environ["TMPDIR"] = before
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def load_package(path: Path) -> Callable[..., Any]:
    """Load a ``.pt2`` package; the callable takes the exported inputs positionally (its
    ``inputs`` attribute: how many).

    The compiled kernels assume the contiguous strides they were exported with and do not check
    them: a column slice of a pandas frame (Fortran order) silently gave wrong scores. So every
    input is made contiguous first (free when it already is).

    The call goes to the package's runner directly with the input and output structure read
    once: the package's own ``__call__`` parses both from JSON and flattens the arguments on
    every call, ~20 us a call (1 user x 1,000 candidates: 180 us -> 150 us on one core).
    """
    from torch.utils import _pytree as pytree

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no compiled artifact at {path}; build it with compilers.export")
    with _scratch_tmpdir():
        loader = torch._inductor.aoti_load_package(str(path)).loader
    in_spec, out_spec = (pytree.treespec_loads(spec) for spec in loader.get_call_spec())
    expected = in_spec.num_leaves

    def run(*inputs: torch.Tensor) -> Any:
        if len(inputs) != expected:
            raise TypeError(f"{path.name} takes {expected} tensors, got {len(inputs)}")
        return pytree.tree_unflatten(loader.boxed_run([x.contiguous() for x in inputs]), out_spec)

    run.inputs = expected  # type: ignore[attr-defined]
    return run
