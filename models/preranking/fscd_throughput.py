"""Throughput of the FSCD cascade's DeepSpeed loop beside the plain PyTorch loop (the
``--throughput-steps`` mode of :mod:`models.preranking.cascade_train`)."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from cascade.results import write_result
from cascade.training.launch import rank_world
from models.preranking.config_registry import CascadeTrainConfig
from models.preranking.fscd_data import prepare
from models.preranking.fscd_phases import PlainTorch, build_network, make_engine, run_steps

THROUGHPUT_REPEATS = 15
"""Timed runs of each loop (in pairs); the reported ratio is the median over the pairs."""


def paired_ratio(plain: list[float], deep: list[float]) -> dict[str, float]:
    """Median, min and max over pairs of ``plain[i] / deep[i]`` (times of the same work run
    back to back): a load change between pairs moves both runs of a pair alike, so it cancels
    out of each ratio, where a ratio of two medians would mix runs from different moments."""
    if not plain or len(plain) != len(deep):
        raise ValueError(f"need pairs of timings, got {len(plain)} and {len(deep)}")
    ratios = [p / d for p, d in zip(plain, deep, strict=True)]
    return {
        "median": float(np.median(ratios)),
        "min": float(min(ratios)),
        "max": float(max(ratios)),
    }


def measure_throughput(config: CascadeTrainConfig, out: Path, steps: int) -> dict[str, Any]:
    """Samples/s of the teacher's DeepSpeed loop (and, on one process, the plain loop).

    On one process both loops run the same ``steps`` batches through the same
    :func:`run_steps` (same data path), on the same thread count, fp32 both: one warm-up run
    each, then :data:`THROUGHPUT_REPEATS` pairs, the order alternating within pairs (plain
    first, then DeepSpeed first) so neither loop always runs on a warmer cache.
    ``ds_vs_torch_throughput`` is the median over pairs of plain time / DeepSpeed time
    (:func:`paired_ratio`), robust to background load on a shared machine, with its range;
    ``deepspeed_samples_per_s`` is the plain loop's median throughput times that ratio
    (``deepspeed_samples_per_s_median``: its own median). Besides wall-clock time it records
    process CPU time per loop: on a loaded machine wall time also counts waiting for a core,
    CPU time only the loop's own work.
    """
    rank, world = rank_world()
    # fp32 for both loops: the plain loop has no bf16 path, and "same model" means same dtype.
    config = dataclasses.replace(config, bf16=False)
    data = prepare(config)
    cardinalities = data.encoder.cardinalities()

    def loop(engine: Any) -> Callable[[], tuple[float, float]]:
        def run() -> tuple[float, float]:
            wall, cpu = time.perf_counter(), time.process_time()
            # The same first batches every repeat: the work per call is identical.
            run_steps(engine, data.train_codes, data.train_labels, config, max_steps=steps)
            if world > 1:
                dist.barrier()
            return time.perf_counter() - wall, time.process_time() - cpu

        return run

    torch.manual_seed(config.seed)
    ds_run = loop(make_engine(build_network("teacher", config, cardinalities), config))
    samples = steps * config.batch_size * world
    result: dict[str, Any] = {
        "world_size": world,
        "steps": steps,
        "repeats": THROUGHPUT_REPEATS,
        "batch_size": config.batch_size,
        "zero_stage": config.zero_stage,
        "precision": "fp32",
        "torch_threads": torch.get_num_threads(),
        "load_average_before": os.getloadavg()[0],
    }
    if world > 1:
        ds_run()  # warm-up
        deep = [ds_run() for _ in range(THROUGHPUT_REPEATS)]
        result["deepspeed_samples_per_s"] = samples / float(np.median([w for w, _ in deep]))
    else:
        torch.manual_seed(config.seed)
        plain_run = loop(PlainTorch(build_network("teacher", config, cardinalities), config))
        plain_run(), ds_run()  # warm-up
        plain, deep = [], []
        for repeat in range(THROUGHPUT_REPEATS):  # interleaved: both see the same load
            if repeat % 2 == 0:
                plain.append(plain_run())
                deep.append(ds_run())
            else:
                deep.append(ds_run())
                plain.append(plain_run())
        wall = paired_ratio([w for w, _ in plain], [w for w, _ in deep])
        cpu = paired_ratio([c for _, c in plain], [c for _, c in deep])
        result["torch_samples_per_s"] = samples / float(np.median([w for w, _ in plain]))
        result["ds_vs_torch_throughput"] = wall["median"]
        result["ds_vs_torch_throughput_range"] = [wall["min"], wall["max"]]
        result["deepspeed_samples_per_s"] = result["torch_samples_per_s"] * wall["median"]
        result["deepspeed_samples_per_s_median"] = samples / float(np.median([w for w, _ in deep]))
        result["torch_cpu_ms_per_step"] = float(np.median([c for _, c in plain])) / steps * 1e3
        result["deepspeed_cpu_ms_per_step"] = float(np.median([c for _, c in deep])) / steps * 1e3
        result["ds_vs_torch_cpu_time"] = cpu["median"]
    result["load_average_after"] = os.getloadavg()[0]
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        write_result(out / "throughput.json", result)
    return result
